package openai

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvpick/kvpick/internal/textgen"
)

// countSink is the cheapest possible sink, so the benchmark measures the
// parser and renderer rather than a hasher.
type countSink struct{ n, writes int }

func (c *countSink) Write(p []byte) { c.n += len(p); c.writes++ }

// prose returns about n bytes of chat text (textgen.Prose: sentences, breaks, quoted words and,
// one segment in codeEvery, a code block, which is where escapes get dense: newlines, quotes,
// indentation).
func prose(rng *rand.Rand, n, codeEvery int) string { return textgen.Text(rng, n, codeEvery) }

var benchTools = []any{
	map[string]any{"type": "function", "function": map[string]any{
		"name":        "get_weather",
		"description": "Get the current weather for a location.\nUse this when the user asks about weather.",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{
			"location": map[string]any{"type": "string", "description": "City and country, e.g. \"Paris, France\""},
			"unit":     map[string]any{"type": "string", "enum": []string{"celsius", "fahrenheit"}},
		}, "required": []string{"location"}},
	}},
	map[string]any{"type": "function", "function": map[string]any{
		"name":        "search_docs",
		"description": "Search the internal documentation and return the top matching passages.",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{
			"query": map[string]any{"type": "string"},
			"k":     map[string]any{"type": "integer", "minimum": 1, "maximum": 50},
		}, "required": []string{"query"}},
	}},
}

// chatBody builds a realistic chat body of about size bytes: a system
// prompt, alternating user/assistant turns and a tools array. About one
// segment in 12 of the text is a code block, which gives about 27 escaped
// bytes per KB (internal/textgen's TestEscapeDensity).
func chatBody(size int) []byte { return chatBodyWith(size, 12) }

// codeHeavyBody is chatBody with a code block every 5th segment: about 53
// escaped bytes per KB, a code-review-like worst case.
func codeHeavyBody(size int) []byte { return chatBodyWith(size, 5) }

func chatBodyWith(size, codeEvery int) []byte {
	rng := rand.New(rand.NewPCG(1, uint64(size)))
	msgs := []any{map[string]any{"role": "system", "content": prose(rng, size/8, codeEvery)}}
	req := map[string]any{"model": "meta-llama/Llama-3.1-8B-Instruct", "tools": benchTools,
		"temperature": 0.7, "max_tokens": 512, "stream": true}
	for {
		req["messages"] = msgs
		b, err := json.Marshal(req)
		if err != nil {
			panic(err)
		}
		if len(b) >= size {
			return b
		}
		role := "user"
		if len(msgs)%2 == 0 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]any{"role": role, "content": prose(rng, 200+rng.IntN(1500), codeEvery)})
	}
}

func benchParseRender(b *testing.B, body []byte) {
	var r Request
	var s countSink
	// Warm up so the scratch slices have grown: steady state is what the
	// picker sees.
	if err := Parse(APIChatCompletions, body, &r); err != nil {
		b.Fatal(err)
	}
	r.Render(&s)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := Parse(APIChatCompletions, body, &r); err != nil {
			b.Fatal(err)
		}
		r.Render(&s)
	}
}

// BenchmarkParseRender is the hot path: one Parse and one Render of a
// realistic chat body.
func BenchmarkParseRender(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10, 512 << 10} {
		body := chatBody(size)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) { benchParseRender(b, body) })
	}
}

// BenchmarkParseRenderCodeHeavy is the escape-dense case (one escape per
// ~22 bytes): escapes, not bytes, dominate the cost there.
func BenchmarkParseRenderCodeHeavy(b *testing.B) {
	body := codeHeavyBody(64 << 10)
	b.Run("64KB", func(b *testing.B) { benchParseRender(b, body) })
}

func BenchmarkParse(b *testing.B) {
	body := chatBody(64 << 10)
	var r Request
	if err := Parse(APIChatCompletions, body, &r); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := Parse(APIChatCompletions, body, &r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRender(b *testing.B) {
	body := chatBody(64 << 10)
	var r Request
	var s countSink
	if err := Parse(APIChatCompletions, body, &r); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r.Render(&s)
	}
}
