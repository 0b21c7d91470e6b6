package replay

import (
	"bytes"
	"encoding/json"
	"slices"
	"sort"
	"testing"

	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/pkg/openai"
)

// small is a quick size for tests.
func small(seed uint64) Spec { return Spec{Seed: seed, Engines: 4, Requests: 80} }

func generate(t *testing.T, name string, spec Spec) *Workload {
	t.Helper()
	w, err := Generate(name, spec)
	if err != nil {
		t.Fatalf("Generate(%s): %v", name, err)
	}
	return w
}

func TestGenerateIsDeterministicPerSeed(t *testing.T) {
	for _, name := range Workloads() {
		t.Run(name, func(t *testing.T) {
			a, b := generate(t, name, small(7)), generate(t, name, small(7))
			c := generate(t, name, small(8))
			if len(a.Requests) != 80 || len(b.Requests) != 80 {
				t.Fatalf("got %d and %d requests, want 80", len(a.Requests), len(b.Requests))
			}
			same := 0
			for i := range a.Requests {
				x, y := a.Requests[i], b.Requests[i]
				if !bytes.Equal(x.Body, y.Body) || x.At != y.At || x.After != y.After || x.Think != y.Think ||
					x.Group != y.Group || !slices.Equal(x.Prompt, y.Prompt) || x.MaxTokens != y.MaxTokens {
					t.Fatalf("request %d differs between two generations with the same seed", i)
				}
				if i < len(c.Requests) && bytes.Equal(x.Body, c.Requests[i].Body) {
					same++
				}
			}
			if same > len(a.Requests)/10 {
				t.Fatalf("%d of %d bodies are the same under another seed", same, len(a.Requests))
			}
		})
	}
}

func TestDefaultSizesScaleWithEngines(t *testing.T) {
	for _, name := range Workloads() {
		n8, r8, err := DefaultSize(name, 8)
		if err != nil {
			t.Fatal(err)
		}
		n2, r2, _ := DefaultSize(name, 2)
		if n8 != 4*n2 || r8 != 4*r2 || n8 < 1000 {
			t.Errorf("%s: 8 engines %d req at %v/s, 2 engines %d at %v/s", name, n8, r8, n2, r2)
		}
	}
	if _, err := Generate("nope", small(1)); err == nil {
		t.Fatal("an unknown workload was accepted")
	}
}

func TestArrivalsArePoissonAtTheRate(t *testing.T) {
	w := generate(t, "no-sharing", Spec{Seed: 3, Engines: 8, Requests: 2000, Rate: 50})
	last := w.Requests[len(w.Requests)-1].At.Seconds()
	if rate := float64(len(w.Requests)) / last; rate < 45 || rate > 55 {
		t.Fatalf("mean rate %.1f, want about 50", rate)
	}
	for i := 1; i < len(w.Requests); i++ {
		if w.Requests[i].At < w.Requests[i-1].At {
			t.Fatal("arrivals out of order")
		}
	}
}

func chatMessages(t *testing.T, body []byte) []chatMessage {
	t.Helper()
	var b chatBody
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatal(err)
	}
	return b.Messages
}

func TestSharedPrefixGroupsShareTheirSystemPrompt(t *testing.T) {
	w := generate(t, "shared-prefix", Spec{Seed: 1, Engines: 4, Requests: 200})
	systems := map[int]string{}
	perGroup := map[int]int{}
	for _, r := range w.Requests {
		m := chatMessages(t, r.Body)
		if len(m) != 2 || m[0].Role != "system" || m[1].Role != "user" {
			t.Fatalf("request %d: messages %+v", r.ID, m)
		}
		if s, ok := systems[r.Group]; ok && s != m[0].Content {
			t.Fatalf("group %d has two system prompts", r.Group)
		}
		systems[r.Group] = m[0].Content
		perGroup[r.Group]++
		if toks := len(engine.Tokenize(m[0].Content)); toks < 2500 || toks > 6000 {
			t.Fatalf("system prompt of %d tokens, want ~3,000-5,000", toks)
		}
	}
	if len(systems) != 200/16 {
		t.Fatalf("%d groups, want %d", len(systems), 200/16)
	}
	seen := map[string]bool{}
	for g, s := range systems {
		if seen[s] {
			t.Fatalf("group %d shares its system prompt with another group", g)
		}
		seen[s] = true
		if perGroup[g] < 2 {
			t.Fatalf("group %d has %d requests: nothing to share", g, perGroup[g])
		}
	}
	// Requests of a group share their prompt's tokens up to the question.
	var a, b *Request
	for i := range w.Requests {
		r := &w.Requests[i]
		if r.Group != w.Requests[0].Group {
			continue
		}
		if a == nil {
			a = r
		} else if !bytes.Equal(r.Body, a.Body) {
			b = r
			break
		}
	}
	if common := commonPrefix(a.Prompt, b.Prompt); common < len(a.Prompt)*8/10 {
		t.Fatalf("two requests of a group share %d of %d prompt tokens", common, len(a.Prompt))
	}
}

func commonPrefix(a, b []uint32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// rendering is the picker's canonical rendering of a request (docs/rendering.md).
func rendering(t *testing.T, r *Request) []byte {
	t.Helper()
	var req openai.Request
	if err := openai.Parse(openai.APIForPath(r.Path), r.Body, &req); err != nil {
		t.Fatalf("request %d: the picker's parser refuses it: %v", r.ID, err)
	}
	var buf sinkBuffer
	req.Render(&buf)
	return buf.Bytes()
}

type sinkBuffer struct{ bytes.Buffer }

func (s *sinkBuffer) Write(p []byte) { s.Buffer.Write(p) }

// checkFollowUps checks that every follow-up extends the request it follows: in the picker's
// rendering, in the engine's tokens, and with the engine's own answer in between.
func checkFollowUps(t *testing.T, w *Workload, withTools bool) {
	t.Helper()
	cfg := EngineConfig()
	clk := engine.NewVirtualClock(Epoch)
	eng, err := engine.New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	followUps := 0
	sessions := map[int]bool{}
	for i := range w.Requests {
		r := &w.Requests[i]
		sessions[r.Group] = true
		if r.After < 0 {
			continue
		}
		followUps++
		prev := &w.Requests[r.After]
		if prev.Group != r.Group || r.Think <= 0 {
			t.Fatalf("request %d follows %d of another session (or without think time)", r.ID, prev.ID)
		}
		if p, n := rendering(t, prev), rendering(t, r); !bytes.HasPrefix(n, p) || len(n) <= len(p) {
			t.Fatalf("request %d's rendering does not extend request %d's", r.ID, prev.ID)
		}
		if !slices.Equal(r.Prompt[:len(prev.Prompt)], prev.Prompt) {
			t.Fatalf("request %d's prompt tokens do not extend request %d's", r.ID, prev.ID)
		}
		// The assistant message is what the engine answered to the previous request.
		var res engine.Result
		if _, err := eng.Submit(engine.Request{Prompt: prev.Prompt, MaxTokens: prev.MaxTokens},
			engine.Callbacks{Done: func(x engine.Result) { res = x }}); err != nil {
			t.Fatal(err)
		}
		clk.RunUntilIdle()
		msgs, pm := chatMessages(t, r.Body), chatMessages(t, prev.Body)
		asst := msgs[len(pm)]
		if asst.Role != "assistant" || asst.Content != res.Text(0, res.CompletionTokens) {
			t.Fatalf("request %d: message %d is %q, not the engine's answer", r.ID, len(pm), asst.Role)
		}
		if withTools && (len(asst.ToolCalls) != 1 || msgs[len(pm)+1].Role != "tool" || msgs[len(pm)+1].ToolCallID != asst.ToolCalls[0].ID) {
			t.Fatalf("request %d: an agent step must append a tool call and its result", r.ID)
		}
		// The answer re-tokenizes to the tokens the engine generated, so the blocks it cached
		// while generating are hit.
		ans := engine.Tokenize(asst.Content)
		if got := r.Prompt[len(prev.Prompt) : len(prev.Prompt)+len(ans)-1]; !slices.Equal(got, ans[:len(ans)-1]) {
			t.Fatalf("request %d: the answer does not re-tokenize to the engine's output", r.ID)
		}
	}
	if followUps < len(w.Requests)/2 || len(sessions) < 5 {
		t.Fatalf("%d follow-ups in %d sessions among %d requests", followUps, len(sessions), len(w.Requests))
	}
}

func TestMultiTurnTurnsExtendTheConversation(t *testing.T) {
	checkFollowUps(t, generate(t, "multi-turn", small(2)), false)
}

func TestAgentStepsAppendToolCallsAndResults(t *testing.T) {
	w := generate(t, "agent", small(2))
	checkFollowUps(t, w, true)
	var b chatBody
	if err := json.Unmarshal(w.Requests[0].Body, &b); err != nil {
		t.Fatal(err)
	}
	tools, _ := json.Marshal(b.Tools)
	if n := len(engine.Tokenize(string(tools))); len(b.Tools) < 14 || n < 2000 {
		t.Fatalf("%d tools, %d tokens: want a long tool-definition prompt", len(b.Tools), n)
	}
}

func TestHotPrefixSharesOnePrefix(t *testing.T) {
	w := generate(t, "hot-prefix", small(4))
	first := chatMessages(t, w.Requests[0].Body)[0].Content
	users := map[string]bool{}
	for _, r := range w.Requests {
		m := chatMessages(t, r.Body)
		if m[0].Content != first {
			t.Fatalf("request %d has another system prompt", r.ID)
		}
		users[m[1].Content] = true
		if len(engine.Tokenize(m[1].Content)) > 500 {
			t.Fatalf("request %d's suffix is long", r.ID)
		}
	}
	if len(users) != len(w.Requests) {
		t.Fatalf("%d distinct suffixes among %d requests", len(users), len(w.Requests))
	}
}

func TestNoSharingHasShareGPTLikeLengths(t *testing.T) {
	w := generate(t, "no-sharing", Spec{Seed: 5, Engines: 4, Requests: 800})
	var in, out []int
	seen := map[string]bool{}
	for _, r := range w.Requests {
		m := chatMessages(t, r.Body)
		if len(m) != 1 || seen[m[0].Content[:40]] {
			t.Fatalf("request %d shares its beginning with another", r.ID)
		}
		seen[m[0].Content[:40]] = true
		in = append(in, len(engine.Tokenize(m[0].Content)))
		out = append(out, r.MaxTokens)
	}
	sort.Ints(in)
	sort.Ints(out)
	med, p99 := in[len(in)/2], in[len(in)*99/100]
	if med < 230 || med > 400 || p99 < 1500 || in[len(in)-1] > 9000 {
		t.Fatalf("input tokens: median %d, p99 %d, max %d; want ~300, a few thousand, capped", med, p99, in[len(in)-1])
	}
	if m := out[len(out)/2]; m < 160 || m > 250 {
		t.Fatalf("output median %d, want ~200", m)
	}
}

func TestErrorRateMarksTheSameRequests(t *testing.T) {
	spec := small(9)
	spec.ErrorRate = 0.25
	a, b := generate(t, "hot-prefix", spec), generate(t, "hot-prefix", spec)
	spec.ErrorRate = 0
	c := generate(t, "hot-prefix", spec)
	fails := 0
	for i := range a.Requests {
		if a.Requests[i].Fail != b.Requests[i].Fail || !bytes.Equal(a.Requests[i].Body, c.Requests[i].Body) || c.Requests[i].Fail {
			t.Fatal("error injection is not deterministic, or changes the workload")
		}
		if a.Requests[i].Fail {
			fails++
		}
	}
	if fails < 10 || fails > 30 {
		t.Fatalf("%d of 80 requests fail at rate 0.25", fails)
	}
}

// TestStreamMixIsDrawnPerRequestFromTheSeed: the share of streamed requests and of streams with
// usage follow the mix; the bodies say so (the picker reads them); the mix changes nothing else.
func TestStreamMixIsDrawnPerRequestFromTheSeed(t *testing.T) {
	half := StreamMix{Fraction: 0.5, UsageFraction: 0.5}
	all := StreamMix{Fraction: 1, UsageFraction: 1}
	a := generate(t, "shared-prefix", Spec{Seed: 3, Engines: 4, Requests: 400, Streaming: &half})
	b := generate(t, "shared-prefix", Spec{Seed: 3, Engines: 4, Requests: 400, Streaming: &half})
	c := generate(t, "shared-prefix", Spec{Seed: 3, Engines: 4, Requests: 400, Streaming: &all})
	streamed, usage := 0, 0
	for i, r := range a.Requests {
		var body struct {
			Stream        *bool `json:"stream"`
			StreamOptions *struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.Unmarshal(r.Body, &body); err != nil || body.Stream == nil {
			t.Fatalf("request %d: %v %s", i, err, r.Body[:80])
		}
		if *body.Stream != r.Stream || (body.StreamOptions != nil && body.StreamOptions.IncludeUsage) != r.IncludeUsage {
			t.Fatalf("request %d: body says stream %v, request %v/%v", i, *body.Stream, r.Stream, r.IncludeUsage)
		}
		if r.IncludeUsage && !r.Stream {
			t.Fatalf("request %d: usage option without a stream", i)
		}
		if r.Stream {
			streamed++
		}
		if r.IncludeUsage {
			usage++
		}
		if r.Stream != b.Requests[i].Stream || r.IncludeUsage != b.Requests[i].IncludeUsage {
			t.Fatalf("request %d: the same seed drew another mix", i)
		}
		x := c.Requests[i]
		if !slices.Equal(r.Prompt, x.Prompt) || r.At != x.At || r.MaxTokens != x.MaxTokens || !x.Stream || !x.IncludeUsage {
			t.Fatalf("request %d: the mix changed more than the stream flags", i)
		}
	}
	// 400 draws at 0.5: 200 ± 3σ (σ = 10); streams with usage 100 ± 3σ (σ ≈ 8.7).
	if streamed < 170 || streamed > 230 || usage < 74 || usage > 126 {
		t.Fatalf("%d streamed, %d with usage, of 400 at half and half", streamed, usage)
	}
	if _, err := Generate("hot-prefix", Spec{Seed: 1, Requests: 10, Streaming: &StreamMix{Fraction: 1.5}}); err == nil {
		t.Fatal("a stream fraction of 1.5 was accepted")
	}
}
