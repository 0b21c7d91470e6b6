package openai

import (
	"strings"
	"testing"
)

func TestParseUsage(t *testing.T) {
	tests := []struct {
		name string
		tail string
		want Usage
		ok   bool
	}{
		{"non-streamed body with details",
			`{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1234,"completion_tokens":5,"total_tokens":1239,"prompt_tokens_details":{"cached_tokens":1024}}}`,
			Usage{PromptTokens: 1234, CachedTokens: 1024, HasCached: true}, true},
		{"stream's usage event then DONE",
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":77,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n",
			Usage{PromptTokens: 77}, true},
		{"whitespace around colons (pretty-printed)",
			"{\n  \"usage\" : {\n    \"prompt_tokens\" : 10,\n    \"prompt_tokens_details\" : { \"cached_tokens\" : 8 }\n  }\n}",
			Usage{PromptTokens: 10, CachedTokens: 8, HasCached: true}, true},
		{"details with null cached_tokens",
			`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":null}}}`,
			Usage{PromptTokens: 10}, true},
		{"the last usage object wins (earlier events with usage null are ignored)",
			`data: {"usage":null}` + "\n\n" + `data: {"usage":{"prompt_tokens":9}}`,
			Usage{PromptTokens: 9}, true},
		{"keys inside content strings are escaped and do not count",
			`{"choices":[{"message":{"content":"\"usage\":{\"prompt_tokens\":5}"}}]}`,
			Usage{}, false},
		{"a key of a later object is not read", `{"usage":{"completion_tokens":3},"x":{"prompt_tokens":5}}`, Usage{}, false},
		{"no usage", `{"choices":[]}`, Usage{}, false},
		{"usage null", `{"usage":null}`, Usage{}, false},
		{"number cut by the end of the data", `{"usage":{"prompt_tokens":12`, Usage{}, false},
		{"negative count", `{"usage":{"prompt_tokens":-4}}`, Usage{}, false},
		{"absurd count", `{"usage":{"prompt_tokens":99999999999999999999}}`, Usage{}, false},
		{"cut before the object", `"usage"`, Usage{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseUsage([]byte(tc.tail))
			if ok != tc.ok || got != tc.want {
				t.Errorf("ParseUsage = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestParseUsageFromTailOfLongStream(t *testing.T) {
	var b strings.Builder
	for range 200 {
		b.WriteString(`data: {"choices":[{"delta":{"content":"token"}}],"usage":null}` + "\n\n")
	}
	b.WriteString(`data: {"choices":[],"usage":{"prompt_tokens":4000,"completion_tokens":200,"prompt_tokens_details":{"cached_tokens":3984}}}` + "\n\ndata: [DONE]\n\n")
	s := b.String()
	got, ok := ParseUsage([]byte(s[len(s)-UsageTailBytes:]))
	if want := (Usage{PromptTokens: 4000, CachedTokens: 3984, HasCached: true}); !ok || got != want {
		t.Errorf("got %+v, %v; want %+v", got, ok, want)
	}
}

func FuzzParseUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`))
	f.Add([]byte(`data: {"usage":{"prompt_tokens":12`))
	f.Add([]byte(`"usage":{"a":"}\"{","prompt_tokens":3}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, ok := ParseUsage(b)
		if ok && (u.PromptTokens < 0 || u.CachedTokens < 0 || (!u.HasCached && u.CachedTokens != 0)) {
			t.Fatalf("bad usage %+v from %q", u, b)
		}
		if !ok && u != (Usage{}) {
			t.Fatalf("usage %+v reported with ok=false", u)
		}
	})
}
