package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func testConfig() Config {
	c := DefaultConfig()
	c.Model = "m"
	return c
}

// stepConfig has round step costs, so expected times can be worked out by
// hand: a step costs 1 ms + 10 µs per prefill token + a decode term of
// 2 ms × (1 + 0.5 × (d−1)/4) for d decoding requests (2, 2.25, 2.5, 2.75,
// 3 ms); the budget is 100 tokens.
func stepConfig() Config {
	c := testConfig()
	c.MaxNumSeqs = 5
	c.MaxNumBatchedTokens = 100
	c.StepOverhead = time.Millisecond
	c.PrefillPerToken = 10 * time.Microsecond
	c.DecodePerToken = 2 * time.Millisecond
	c.DecodeBatchPenalty = 0.5
	return c
}

// ms is a time in milliseconds after t0.
func ms(v float64) time.Time { return t0.Add(time.Duration(v * float64(time.Millisecond))) }

func newVirtual(t *testing.T, cfg Config) (*Engine, *VirtualClock) {
	t.Helper()
	clk := NewVirtualClock(t0)
	e, err := New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	return e, clk
}

// recorder collects every callback, in order.
type recorder struct {
	mu     sync.Mutex
	done   map[string]Result
	first  map[string]Result
	tokens map[string][]time.Time // LastToken of each Token callback
	order  []string               // "id:first", "id:token", "id:done"
	bad    []string               // callback contract violations
}

func newRecorder() *recorder {
	return &recorder{done: map[string]Result{}, first: map[string]Result{}, tokens: map[string][]time.Time{}}
}

func (r *recorder) cb() Callbacks {
	return Callbacks{
		FirstToken: func(res Result) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.first[res.ID] = res
			r.order = append(r.order, res.ID+":first")
		},
		Token: func(res Result, i int) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if i != len(r.tokens[res.ID]) || res.CompletionTokens != i+1 {
				r.bad = append(r.bad, fmt.Sprintf("%s: token %d after %d, CompletionTokens %d", res.ID, i, len(r.tokens[res.ID]), res.CompletionTokens))
			}
			r.tokens[res.ID] = append(r.tokens[res.ID], res.LastToken)
			r.order = append(r.order, res.ID+":token")
		},
		Done: func(res Result) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if _, dup := r.done[res.ID]; dup {
				r.bad = append(r.bad, res.ID+": Done twice")
			}
			r.done[res.ID] = res
			r.order = append(r.order, res.ID+":done")
		},
	}
}

func (r *recorder) get(id string) (Result, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res, ok := r.done[id]
	return res, ok
}

func (r *recorder) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.bad {
		t.Error(b)
	}
}

func submit(t *testing.T, e *Engine, rec *recorder, req Request) *Handle {
	t.Helper()
	h, err := e.Submit(req, rec.cb())
	if err != nil {
		t.Fatalf("submit %s: %v", req.ID, err)
	}
	return h
}

// run submits req alone and runs the clock until it is done.
func run(t *testing.T, e *Engine, clk *VirtualClock, req Request) Result {
	t.Helper()
	rec := newRecorder()
	h := submit(t, e, rec, req)
	clk.RunUntilIdle()
	res, ok := rec.get(h.ID())
	if !ok {
		t.Fatalf("request %s not done", h.ID())
	}
	rec.check(t)
	return res
}

func seqTokens(base uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// TestStepSchedule checks the token times of small batches against step
// costs worked out by hand (stepConfig: 1 ms + 10 µs/prefill token +
// decode term 2 / 2.25 / 2.5 ms for 1 / 2 / 3 decodes; budget 100).
func TestStepSchedule(t *testing.T) {
	type req struct {
		id        string
		prompt    int
		maxTokens int
		admitted  float64   // ms
		tokens    []float64 // ms
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		reqs   []req // all submitted at t0, in this order
	}{
		{"alone: a 10-token prefill step, then decode steps of 1+2 ms", nil, []req{
			{"a", 10, 3, 0, []float64{1.1, 4.1, 7.1}},
		}},
		{"a long prompt spreads over steps of 100 tokens", nil, []req{
			// 100 (2 ms), 100 (2 ms), 50 (1.5 ms), then decode (3 ms).
			{"a", 250, 2, 0, []float64{5.5, 8.5}},
		}},
		{"decodes first, then the prefill chunk takes the rest of the budget", nil, []req{
			// Step 1: a 10 + b 90 = 2 ms. Step 2: a decodes, b 99: 1+0.99+2 = 3.99.
			// Step 3: a decodes, b 61: 1+0.61+2 = 3.61. Step 4: a alone: 3.
			{"a", 10, 4, 0, []float64{2, 5.99, 9.6, 12.6}},
			{"b", 250, 1, 0, []float64{9.6}},
		}},
		{"decodes share a step, which grows with the batch", nil, []req{
			// Step 1: 30 prompt tokens = 1.3 ms; then 3 decodes: 1+2.5 = 3.5 ms.
			{"a", 10, 3, 0, []float64{1.3, 4.8, 8.3}},
			{"b", 10, 3, 0, []float64{1.3, 4.8, 8.3}},
			{"c", 10, 3, 0, []float64{1.3, 4.8, 8.3}},
		}},
		{"max_num_seqs: the third waits for a slot", func(c *Config) { c.MaxNumSeqs = 2 }, []req{
			// Decode term 2 ms alone, 3 ms for two. Step 1: a+b 20 tokens = 1.2;
			// step 2: 2 decodes = 4 → 5.2, both done; step 3: c 10 = 1.1; step 4: 3.
			{"a", 10, 2, 0, []float64{1.2, 5.2}},
			{"b", 10, 2, 0, []float64{1.2, 5.2}},
			{"c", 10, 2, 5.2, []float64{6.3, 9.3}},
		}},
		{"a waiting request is admitted only while budget remains", nil, []req{
			// Step 1: a 100 = 2 ms, b waits. Step 2: a 50 + b 10 = 1.6 ms.
			{"a", 150, 1, 0, []float64{3.6}},
			{"b", 10, 1, 2, []float64{3.6}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := stepConfig()
			if tt.mutate != nil {
				tt.mutate(&cfg)
			}
			e, clk := newVirtual(t, cfg)
			rec := newRecorder()
			for i, r := range tt.reqs {
				submit(t, e, rec, Request{ID: r.id, Prompt: seqTokens(uint32(i)*100_000, r.prompt), MaxTokens: r.maxTokens})
			}
			clk.RunUntilIdle()
			rec.check(t)
			const eps = 2 * time.Nanosecond // float rounding of the decode term
			for _, r := range tt.reqs {
				res, ok := rec.get(r.id)
				if !ok || res.Outcome != OutcomeLength || res.CompletionTokens != r.maxTokens {
					t.Fatalf("%s: %+v", r.id, res)
				}
				if !res.Admitted.Equal(ms(r.admitted)) || !res.PrefillStart.Equal(res.Admitted) {
					t.Errorf("%s admitted at %v, want %v", r.id, res.Admitted.Sub(t0), ms(r.admitted).Sub(t0))
				}
				got := rec.tokens[r.id]
				if len(got) != len(r.tokens) {
					t.Fatalf("%s: %d tokens, want %d", r.id, len(got), len(r.tokens))
				}
				for i, want := range r.tokens {
					if d := got[i].Sub(ms(want)); d < -eps || d > eps {
						t.Errorf("%s token %d at %v, want %v", r.id, i, got[i].Sub(t0), ms(want).Sub(t0))
					}
				}
				if !res.FirstToken.Equal(got[0]) || !res.End.Equal(got[len(got)-1]) || !res.LastToken.Equal(res.End) {
					t.Errorf("%s: first %v end %v, tokens %v", r.id, res.FirstToken, res.End, got)
				}
			}
		})
	}
}

// TestStatsHistograms checks vLLM's request and step histograms on the
// schedule of TestStepSchedule's "decodes first" case: steps of 100, 100,
// 62 and 1 tokens ending at 2, 5.99, 9.6 and 12.6 ms; a (10-token prompt, 4
// tokens) and b (250-token prompt, 1 token) are scheduled at once.
func TestStatsHistograms(t *testing.T) {
	e, clk := newVirtual(t, stepConfig())
	rec := newRecorder()
	submit(t, e, rec, Request{ID: "a", Prompt: seqTokens(1, 10), MaxTokens: 4})
	submit(t, e, rec, Request{ID: "b", Prompt: seqTokens(100_000, 250), MaxTokens: 1})
	clk.RunUntilIdle()
	st := e.Stats()
	const ms = 1e-3
	tests := []struct {
		name  string
		h     Histogram
		count uint64
		sum   float64
	}{
		{"iteration tokens", st.IterationTokens, 4, 263},
		{"TTFT", st.TTFT, 2, (2 + 9.6) * ms},
		{"inter-token latency", st.InterTokenLatency, 3, (3.99 + 3.61 + 3) * ms},
		{"time per output token", st.TimePerOutputToken, 1, 10.6 / 3 * ms},
		{"e2e", st.E2E, 2, (12.6 + 9.6) * ms},
		{"queue", st.QueueTime, 2, 0},
		{"prefill", st.PrefillTime, 2, (2 + 9.6) * ms},
		{"decode", st.DecodeTime, 2, 10.6 * ms},
		{"inference", st.InferenceTime, 2, (12.6 + 9.6) * ms},
		{"prompt tokens", st.RequestPromptTokens, 2, 260},
		{"generation tokens", st.RequestGenerationTokens, 2, 5},
		{"max tokens", st.RequestMaxTokens, 2, 5},
		{"n", st.RequestN, 2, 2},
	}
	for _, tt := range tests {
		var n uint64
		for _, c := range tt.h.Counts {
			n += c
		}
		if tt.h.Count != tt.count || n != tt.count || tt.h.Sum < tt.sum-1e-9 || tt.h.Sum > tt.sum+1e-9 {
			t.Errorf("%s: count %d (buckets %d) sum %v, want %d and %v", tt.name, tt.h.Count, n, tt.h.Sum, tt.count, tt.sum)
		}
	}
	if st.PromptTokens != 260 || st.GenerationTokens != 5 || st.Outcomes[OutcomeLength] != 2 {
		t.Errorf("counters %+v", st)
	}
}

// TestLongPrefillSlowsDecodes: a decoding request's tokens come slower while
// another request's prompt shares its steps.
func TestLongPrefillSlowsDecodes(t *testing.T) {
	e, clk := newVirtual(t, stepConfig())
	rec := newRecorder()
	submit(t, e, rec, Request{ID: "a", Prompt: seqTokens(1, 10), MaxTokens: 30})
	clk.AdvanceTo(ms(20)) // a decodes alone: a token every 3 ms
	submit(t, e, rec, Request{ID: "b", Prompt: seqTokens(50_000, 1000), MaxTokens: 1})
	clk.RunUntilIdle()
	toks := rec.tokens["a"]
	b, _ := rec.get("b")
	var alone, beside []time.Duration
	for i := 1; i < len(toks); i++ {
		gap := toks[i].Sub(toks[i-1])
		switch {
		case toks[i].Before(ms(20)):
			alone = append(alone, gap)
		case toks[i-1].After(b.PrefillStart) && toks[i].Before(b.FirstToken):
			beside = append(beside, gap)
		}
	}
	if len(alone) == 0 || len(beside) < 5 {
		t.Fatalf("gaps alone %v, beside b's prefill %v", alone, beside)
	}
	for _, g := range alone {
		if g != 3*time.Millisecond {
			t.Errorf("gap alone %v, want 3ms", g)
		}
	}
	for _, g := range beside {
		// 1 ms + 99 prompt tokens × 10 µs + 2 ms.
		if g != 3990*time.Microsecond {
			t.Errorf("gap beside a 99-token chunk %v, want 3.99ms", g)
		}
	}
	// b's 1,000 tokens took 11 steps: 99 each beside a's decode, 10 in the last.
	if got, want := b.FirstToken.Sub(b.PrefillStart), 10*3990*time.Microsecond+3100*time.Microsecond; got != want {
		t.Errorf("b's prefill took %v, want %v", got, want)
	}
}

func TestWaitingUntilFirstChunk(t *testing.T) {
	e, clk := newVirtual(t, stepConfig())
	rec := newRecorder()
	for i := range 3 {
		submit(t, e, rec, Request{ID: fmt.Sprint(i), Prompt: seqTokens(uint32(i)*1000, 60), MaxTokens: 5})
	}
	steps := []struct {
		at                 time.Time
		running, waiting   int
		pending, decoding  int
		stepEnd            time.Time
		kvBlocksReferenced int
	}{
		// Submitted: nothing scheduled yet.
		{t0.Add(-1), 0, 3, 180, 0, time.Time{}, 0},
		// Step 1: 0 takes 60, 1 takes 40 (partial: running), 2 waits.
		{t0, 2, 1, 20 + 60, 0, ms(2), 4 + 3},
		// Step 2: 0 decodes, 1 takes its last 20, 2 takes 60.
		{ms(2), 3, 0, 0, 1, ms(2 + 1 + 0.8 + 2), 4 + 4 + 4},
	}
	for _, s := range steps {
		if !s.at.Before(t0) {
			clk.AdvanceTo(s.at)
		}
		l := e.Load()
		st := e.Stats()
		if l.Running != s.running || l.Waiting != s.waiting || st.Running != s.running || st.Waiting != s.waiting {
			t.Errorf("at %v: running/waiting %d/%d (stats %d/%d), want %d/%d", s.at.Sub(t0), l.Running, l.Waiting,
				st.Running, st.Waiting, s.running, s.waiting)
		}
		if l.PendingPrefillTokens != s.pending || l.Decoding != s.decoding || !l.StepEnd.Equal(s.stepEnd) {
			t.Errorf("at %v: pending %d decoding %d step end %v, want %d %d %v", s.at.Sub(t0), l.PendingPrefillTokens,
				l.Decoding, l.StepEnd.Sub(t0), s.pending, s.decoding, s.stepEnd.Sub(t0))
		}
		if used := st.UsedBlocks; used != s.kvBlocksReferenced || l.FreeBlocks != st.NumGPUBlocks-used {
			t.Errorf("at %v: %d blocks used, %d free; want %d used", s.at.Sub(t0), used, l.FreeBlocks, s.kvBlocksReferenced)
		}
	}
	clk.RunUntilIdle()
	if l := e.Load(); l.Running != 0 || l.Waiting != 0 || l.PendingPrefillTokens != 0 || !l.StepEnd.IsZero() || l.KVUsage != 0 {
		t.Errorf("idle engine: %+v", l)
	}
}

func TestFIFOAdmission(t *testing.T) {
	cfg := stepConfig()
	cfg.MaxNumSeqs = 2
	e, clk := newVirtual(t, cfg)
	rec := newRecorder()
	for i := range 6 {
		// Varying sizes: a short request behind a long one still waits its turn.
		n := 30
		if i%2 == 0 {
			n = 300
		}
		submit(t, e, rec, Request{ID: fmt.Sprint(i), Prompt: seqTokens(uint32(i)*1000, n), MaxTokens: 3 + i})
		clk.Advance(100 * time.Microsecond)
	}
	maxRunning := 0
	for clk.Step() {
		maxRunning = max(maxRunning, e.Load().Running)
	}
	if maxRunning != 2 {
		t.Errorf("at most %d running, want 2 (max_num_seqs)", maxRunning)
	}
	var prev time.Time
	for i := range 6 {
		res, ok := rec.get(fmt.Sprint(i))
		if !ok || res.CompletionTokens != 3+i {
			t.Fatalf("request %d: %+v", i, res)
		}
		if res.Admitted.Before(prev) {
			t.Errorf("request %d admitted at %v, before request %d (%v): not FIFO", i, res.Admitted.Sub(t0), i-1, prev.Sub(t0))
		}
		prev = res.Admitted
	}
}

func TestPreemption(t *testing.T) {
	tests := []struct {
		name          string
		bPrompt       int
		wantPreempted string
	}{
		// 10 blocks of 4 tokens; a and b hold 4 prompt blocks each and grow a
		// block every 4 tokens: when a needs its 6th block none is free and b,
		// the most recently admitted, is preempted.
		{"the most recent request makes room for an older one", 16, "b"},
		// b has 3 prompt blocks: a takes the last free block first, then b
		// needs one and, being the most recent, preempts itself.
		{"the most recent request preempts itself", 12, "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := stepConfig()
			cfg.BlockSize, cfg.NumGPUBlocks = 4, 10
			e, clk := newVirtual(t, cfg)
			rec := newRecorder()
			submit(t, e, rec, Request{ID: "a", Prompt: seqTokens(1, 16), MaxTokens: 12})
			submit(t, e, rec, Request{ID: "b", Prompt: seqTokens(500, tt.bPrompt), MaxTokens: 12})
			sawWaiting := false
			for clk.Step() {
				l := e.Load()
				if l.Running == 1 && l.Waiting == 1 {
					sawWaiting = true
				}
				if l.KVUsage > 1 {
					t.Fatalf("KV usage %v", l.KVUsage)
				}
			}
			rec.check(t)
			a, _ := rec.get("a")
			b, _ := rec.get("b")
			for _, r := range []Result{a, b} {
				if r.Outcome != OutcomeLength || r.CompletionTokens != 12 {
					t.Fatalf("%s: %+v", r.ID, r)
				}
			}
			if a.Preemptions != 0 || b.Preemptions != 1 || e.Stats().Preemptions != 1 || !sawWaiting {
				t.Errorf("preemptions a %d b %d total %d; b seen waiting again %v", a.Preemptions, b.Preemptions,
					e.Stats().Preemptions, sawWaiting)
			}
			if !b.End.After(a.End) {
				t.Errorf("the preempted request ended at %v, before a (%v)", b.End.Sub(t0), a.End.Sub(t0))
			}
			// b resumed where it was: its tokens keep their order and its text
			// is the same as if it had run alone.
			toks := rec.tokens["b"]
			if !slices.IsSortedFunc(toks, time.Time.Compare) || b.CachedTokens != 0 {
				t.Errorf("b tokens %v cached %d", toks, b.CachedTokens)
			}
			if st := e.Stats(); st.KVUsage != 0 || st.Running != 0 || st.Waiting != 0 {
				t.Errorf("after all: %+v", st)
			}
		})
	}
}

func TestPreemptedRequestResumesFromCache(t *testing.T) {
	// 20 blocks of 4: b is preempted when a grows; its computed blocks stay
	// cached while free, so it resumes with a prefix hit and recomputes less
	// than its prompt and output so far.
	cfg := stepConfig()
	cfg.BlockSize, cfg.NumGPUBlocks = 4, 14
	e, clk := newVirtual(t, cfg)
	rec := newRecorder()
	submit(t, e, rec, Request{ID: "a", Prompt: seqTokens(1, 24), MaxTokens: 20})
	submit(t, e, rec, Request{ID: "b", Prompt: seqTokens(500, 24), MaxTokens: 6})
	var resumedHit int
	for clk.Step() {
		e.mu.Lock()
		for _, r := range e.running {
			if r.res.ID == "b" && r.res.Preemptions == 1 && resumedHit == 0 {
				resumedHit = len(r.blocks)
			}
		}
		e.mu.Unlock()
	}
	b, _ := rec.get("b")
	if b.Preemptions != 1 || b.CompletionTokens != 6 {
		t.Fatalf("b: %+v", b)
	}
	if resumedHit == 0 {
		t.Error("b never ran again")
	}
}

func TestRepeatedPromptHits(t *testing.T) {
	tests := []struct {
		name       string
		promptLen  int
		wantCached int // on the second run
	}{
		{"one partial block", 10, 0},
		{"exactly two blocks: last token recomputed", 32, 16},
		{"two blocks and a bit", 40, 32},
		{"long, over several steps", 5000, 4992},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, clk := newVirtual(t, testConfig())
			req := Request{Prompt: seqTokens(1, tt.promptLen), MaxTokens: 4}
			first := run(t, e, clk, req)
			if first.CachedTokens != 0 {
				t.Errorf("first run cached %d, want 0", first.CachedTokens)
			}
			if got := e.CachedPrefixTokens(req); got != tt.wantCached {
				t.Errorf("CachedPrefixTokens = %d, want %d", got, tt.wantCached)
			}
			second := run(t, e, clk, req)
			if second.CachedTokens != tt.wantCached {
				t.Errorf("second run cached %d, want %d", second.CachedTokens, tt.wantCached)
			}
			if second.TTFT() >= first.TTFT() && tt.wantCached > 0 {
				t.Errorf("TTFT %v with a hit, %v without", second.TTFT(), first.TTFT())
			}
			st := e.Stats()
			if st.PrefixCacheQueries != uint64(2*tt.promptLen) || st.PrefixCacheHits != uint64(tt.wantCached) {
				t.Errorf("queries/hits = %d/%d", st.PrefixCacheQueries, st.PrefixCacheHits)
			}
			// A salt isolates.
			salted := req
			salted.CacheSalt = "tenant-a"
			if got := e.CachedPrefixTokens(salted); got != 0 {
				t.Errorf("salted request would hit %d tokens", got)
			}
		})
	}
}

// TestSameStepSharesChunks: a request scheduled after another in the same
// step hits the blocks that one's chunk just registered, as in vLLM.
func TestSameStepSharesChunks(t *testing.T) {
	e, clk := newVirtual(t, testConfig())
	rec := newRecorder()
	p := seqTokens(7, 800)
	submit(t, e, rec, Request{ID: "a", Prompt: p, MaxTokens: 2})
	submit(t, e, rec, Request{ID: "b", Prompt: p, MaxTokens: 2})
	clk.RunUntilIdle()
	a, _ := rec.get("a")
	b, _ := rec.get("b")
	if a.CachedTokens != 0 || b.CachedTokens != 784 {
		t.Errorf("cached a %d b %d, want 0 and 784", a.CachedTokens, b.CachedTokens)
	}
}

func TestMultiTurnHitGrows(t *testing.T) {
	e, clk := newVirtual(t, testConfig())
	conv := msgs("system", "You are a helpful assistant who answers in detail.", "user", english)
	var prevPrompt, prevOut int
	for turn := range 4 {
		p, err := ChatPrompt(conv, nil)
		if err != nil {
			t.Fatal(err)
		}
		res := run(t, e, clk, Request{Prompt: p})
		if turn > 0 {
			// Everything computed last turn (its prompt and all output but
			// the last token) is cached, in full blocks.
			want := (prevPrompt + prevOut - 1) / 16 * 16
			if res.CachedTokens != want {
				t.Errorf("turn %d: cached %d, want %d (prompt %d)", turn, res.CachedTokens, want, len(p))
			}
			if res.CachedTokens <= prevPrompt-16 {
				t.Errorf("turn %d: hit %d did not grow past the previous prompt %d", turn, res.CachedTokens, prevPrompt)
			}
		}
		prevPrompt, prevOut = len(p), res.CompletionTokens
		conv = append(conv, msgs("assistant", res.Text(0, res.CompletionTokens), "user", fmt.Sprintf("Tell me more, part %d.", turn))...)
	}
}

// tinyConfig has 4-token blocks and room for few of them, to test eviction.
func tinyConfig(blocks int) Config {
	c := testConfig()
	c.BlockSize = 4
	c.NumGPUBlocks = blocks
	c.MaxNumSeqs = 4
	c.MaxNumBatchedTokens = 64
	return c
}

func TestTailFirstEviction(t *testing.T) {
	e, clk := newVirtual(t, tinyConfig(10))
	a := Request{Prompt: seqTokens(100, 24), MaxTokens: 1} // 6 full blocks, no decode step
	run(t, e, clk, a)
	keys := BlockKeys(0, a.Prompt, 4)
	for i, k := range keys {
		if !e.pool.isCached(k) {
			t.Fatalf("block %d of A not cached after it finished", i)
		}
	}
	// Free queue: the 4 blocks never used, then A's blocks tail first. B
	// needs 7: the 4 unused and A's last 3. A's head survives.
	run(t, e, clk, Request{Prompt: seqTokens(5000, 28), MaxTokens: 1})
	for i, k := range keys {
		want := i < 3
		if got := e.pool.isCached(k); got != want {
			t.Errorf("A's block %d cached = %v, want %v", i, got, want)
		}
	}
	if got := e.CachedPrefixTokens(a); got != 12 {
		t.Errorf("A would now hit %d tokens, want its 3-block head (12)", got)
	}
}

func TestBlockPoolReleaseOrder(t *testing.T) {
	p := newBlockPool(6)
	ids := p.allocate(4, nil)
	for i, id := range ids {
		p.register(id, uint64(100+i))
	}
	p.release(ids)
	// Free queue: 2 untouched blocks, then ids reversed.
	got := p.allocate(6, nil)
	want := append([]int32{4, 5}, ids[3], ids[2], ids[1], ids[0])
	if !slices.Equal(got, want) {
		t.Errorf("allocation order %v, want %v (tail first)", got, want)
	}
	if len(p.cached) != 0 {
		t.Errorf("%d keys still cached after their blocks were reused", len(p.cached))
	}
}

func TestPinnedBlocksNotEvicted(t *testing.T) {
	cfg := tinyConfig(10)
	cfg.DecodePerToken = time.Second // A stays running a long time
	e, clk := newVirtual(t, cfg)
	rec := newRecorder()
	a := Request{ID: "a", Prompt: seqTokens(100, 32), MaxTokens: 4}  // 8 blocks, a 9th to decode
	b := Request{ID: "b", Prompt: seqTokens(9000, 16), MaxTokens: 1} // 4 blocks
	submit(t, e, rec, a)
	submit(t, e, rec, b)
	clk.Advance(time.Second)
	st := e.Stats()
	if st.Running != 1 || st.Waiting != 1 {
		t.Fatalf("running/waiting = %d/%d, want 1/1: B must wait rather than evict A's pinned blocks", st.Running, st.Waiting)
	}
	if got := e.CachedPrefixTokens(a); got != 28 {
		t.Errorf("A's prompt hit = %d, want 28", got)
	}
	clk.RunUntilIdle()
	ra, _ := rec.get("a")
	rb, ok := rec.get("b")
	if !ok || !rb.Admitted.Equal(ra.End) {
		t.Errorf("B admitted at %v, want when A ended (%v)", rb.Admitted, ra.End)
	}
	// Free queue after A: the block never used, A's 9 blocks tail first. B
	// took the unused one, A's decode block and A's blocks 7 and 6.
	if got := e.CachedPrefixTokens(a); got != 24 {
		t.Errorf("after B, A's prompt hit = %d, want 24", got)
	}
	if st := e.Stats(); st.KVUsage != 0 || st.Running != 0 {
		t.Errorf("after all: usage %v running %d", st.KVUsage, st.Running)
	}
}

func TestCallbackOrder(t *testing.T) {
	e, clk := newVirtual(t, stepConfig())
	rec := newRecorder()
	submit(t, e, rec, Request{ID: "a", Prompt: seqTokens(1, 30), MaxTokens: 3})
	submit(t, e, rec, Request{ID: "b", Prompt: seqTokens(900, 130), MaxTokens: 2})
	clk.RunUntilIdle()
	rec.check(t)
	var a, b []string
	for _, o := range rec.order {
		switch o[0] {
		case 'a':
			a = append(a, o[2:])
		case 'b':
			b = append(b, o[2:])
		}
	}
	if want := []string{"first", "token", "token", "token", "done"}; !slices.Equal(a, want) {
		t.Errorf("a's callbacks %v, want %v", a, want)
	}
	if want := []string{"first", "token", "token", "done"}; !slices.Equal(b, want) {
		t.Errorf("b's callbacks %v, want %v", b, want)
	}
}

func TestOutputLength(t *testing.T) {
	cfg := testConfig()
	cfg.OutputTokensMin, cfg.OutputTokensMax = 5, 9
	e, clk := newVirtual(t, cfg)
	seen := map[int]bool{}
	for i := range 50 {
		req := Request{Prompt: seqTokens(uint32(i)*100, 20)}
		a := run(t, e, clk, req)
		b := run(t, e, clk, req)
		if a.CompletionTokens != b.CompletionTokens || a.OutputSeed != b.OutputSeed || a.Outcome != OutcomeStop {
			t.Fatalf("same prompt, different output: %+v %+v", a, b)
		}
		if a.CompletionTokens < 5 || a.CompletionTokens > 9 {
			t.Fatalf("length %d outside [5, 9]", a.CompletionTokens)
		}
		seen[a.CompletionTokens] = true
	}
	if len(seen) < 4 {
		t.Errorf("lengths %v do not spread over the range", seen)
	}
	if r := run(t, e, clk, Request{Prompt: seqTokens(1, 20), MaxTokens: 33}); r.CompletionTokens != 33 || r.Outcome != OutcomeLength {
		t.Errorf("max tokens: %+v", r)
	}
}

func TestSubmitErrors(t *testing.T) {
	cfg := tinyConfig(10)
	cfg.MaxWaiting = 1
	e, _ := newVirtual(t, cfg)
	if _, err := e.Submit(Request{}, Callbacks{}); !errors.Is(err, ErrEmptyPrompt) {
		t.Errorf("empty: %v", err)
	}
	if _, err := e.Submit(Request{Prompt: seqTokens(1, 30), MaxTokens: 11}, Callbacks{}); !errors.Is(err, ErrTooLong) {
		t.Errorf("too long: %v", err)
	}
	// The clock does not run: the first request stays waiting.
	if _, err := e.Submit(Request{Prompt: seqTokens(1, 8), MaxTokens: 2}, Callbacks{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Submit(Request{Prompt: seqTokens(1, 8), MaxTokens: 2}, Callbacks{}); !errors.Is(err, ErrOverloaded) {
		t.Errorf("overloaded: %v", err)
	}
	st := e.Stats()
	if st.Outcomes[OutcomeInvalid] != 2 || st.Outcomes[OutcomeOverloaded] != 1 {
		t.Errorf("outcomes %v", st.Outcomes)
	}
	bad := []func(*Config){
		func(c *Config) { c.BlockSize = 0 },
		func(c *Config) { c.NumGPUBlocks = 0 },
		func(c *Config) { c.MaxNumSeqs = 0 },
		func(c *Config) { c.MaxNumBatchedTokens = c.MaxNumSeqs - 1 },
		func(c *Config) { c.OutputTokensMax = 0 },
		func(c *Config) { c.ErrorRate = 2 },
		func(c *Config) { c.LateErrorRate = -1 },
		func(c *Config) { c.Model = "" },
		func(c *Config) { c.StepOverhead, c.PrefillPerToken = 0, 0 },
	}
	for i, f := range bad {
		c := testConfig()
		f(&c)
		if _, err := New(c, NewVirtualClock(t0)); err == nil {
			t.Errorf("bad config %d accepted", i)
		}
	}
}

func TestLateError(t *testing.T) {
	cfg := stepConfig()
	cfg.LateErrorRate = 1
	e, clk := newVirtual(t, cfg)
	for _, tt := range []struct{ n, want int }{{10, 5}, {7, 4}, {2, 1}} {
		res := run(t, e, clk, Request{Prompt: seqTokens(1, 20), MaxTokens: tt.n})
		if res.Outcome != OutcomeError || res.CompletionTokens != tt.want || res.FirstToken.IsZero() {
			t.Errorf("max tokens %d: outcome %s after %d tokens, want error after %d", tt.n, res.Outcome, res.CompletionTokens, tt.want)
		}
	}
	// One token: nothing to fail after.
	if res := run(t, e, clk, Request{Prompt: seqTokens(1, 20), MaxTokens: 1}); res.Outcome != OutcomeLength {
		t.Errorf("one token: %s", res.Outcome)
	}
	if st := e.Stats(); st.Running != 0 || st.KVUsage != 0 || st.Outcomes[OutcomeError] != 3 {
		t.Errorf("stats %+v", st)
	}
}

func TestSlowRequestGetsEveryNthStep(t *testing.T) {
	cfg := stepConfig()
	cfg.SlowRate, cfg.SlowFactor = 1, 4
	e, clk := newVirtual(t, cfg)
	rec := newRecorder()
	submit(t, e, rec, Request{ID: "s", Prompt: seqTokens(1, 10), MaxTokens: 4})
	clk.RunUntilIdle()
	res, _ := rec.get("s")
	toks := rec.tokens["s"]
	if !res.Slow || len(toks) != 4 {
		t.Fatalf("%+v", res)
	}
	// Its first chunk runs at admission (1.1 ms); then it gets a token every
	// 4th step of 1 + 2 ms.
	want := []time.Time{ms(1.1), ms(13.1), ms(25.1), ms(37.1)}
	if !slices.EqualFunc(toks, want, time.Time.Equal) {
		t.Errorf("token times %v, want %v", toks, want)
	}
}

func TestFailureInjectionDeterministic(t *testing.T) {
	outcomes := func(seed uint64) []string {
		cfg := testConfig()
		cfg.ErrorRate, cfg.HangRate, cfg.SlowRate, cfg.SlowFactor, cfg.LateErrorRate, cfg.Seed = 0.2, 0.1, 0.2, 3, 0.1, seed
		e, clk := newVirtual(t, cfg)
		rec := newRecorder()
		var out []string
		var accepted []*Handle
		for i := range 500 {
			h, err := e.Submit(Request{ID: fmt.Sprint(i), Prompt: seqTokens(uint32(i), 40), MaxTokens: 4}, rec.cb())
			switch {
			case errors.Is(err, ErrInjected):
				out = append(out, "error")
			case err != nil:
				t.Fatal(err)
			default:
				out = append(out, "ok")
				accepted = append(accepted, h)
			}
		}
		clk.RunUntilIdle()
		nHung, nSlow, nLate := 0, 0, 0
		for _, h := range accepted {
			res, ok := rec.get(h.ID())
			if !ok {
				nHung++
				if e.Stats().Running == 0 {
					t.Fatal("hung request not counted as running")
				}
				h.Cancel()
				res, ok = rec.get(h.ID())
				if !ok || res.Outcome != OutcomeAbort || !res.Hung || res.CompletionTokens != 0 {
					t.Fatalf("cancelled hung request: %+v", res)
				}
				continue
			}
			if res.Outcome == OutcomeError {
				nLate++
				out[atoi(res.ID)] = "late"
			} else if res.Slow {
				nSlow++
				out[atoi(res.ID)] = "slow"
			}
		}
		errs := 0
		for _, o := range out {
			if o == "error" {
				errs++
			}
		}
		if errs < 70 || errs > 130 || nHung < 25 || nHung > 75 || nSlow < 40 || nSlow > 110 || nLate < 15 || nLate > 60 {
			t.Errorf("seed %d: %d errors, %d hung, %d slow, %d late of 500", seed, errs, nHung, nSlow, nLate)
		}
		if st := e.Stats(); st.Running != 0 || st.KVUsage != 0 || st.Outcomes[OutcomeError] != uint64(errs+nLate) {
			t.Errorf("after cancelling hung requests: %+v", st)
		}
		return out
	}
	a, b, c := outcomes(7), outcomes(7), outcomes(8)
	if !slices.Equal(a, b) {
		t.Error("same seed, different outcomes")
	}
	if slices.Equal(a, c) {
		t.Error("different seeds, same outcomes")
	}
}

func atoi(s string) int {
	var n int
	fmt.Sscan(s, &n)
	return n
}

// TestCancel cancels a request in every state it can be in and checks that
// it ends with OutcomeAbort, gives back what it held, and lets the others
// run.
func TestCancel(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, e *Engine, clk *VirtualClock, rec *recorder) *Handle
		// wantTokens: output tokens the cancelled request had produced.
		wantTokens int
	}{
		{"waiting, never scheduled", func(t *testing.T, e *Engine, clk *VirtualClock, rec *recorder) *Handle {
			return submit(t, e, rec, Request{ID: "x", Prompt: seqTokens(1, 50), MaxTokens: 5})
		}, 0},
		{"waiting behind a full batch", func(t *testing.T, e *Engine, clk *VirtualClock, rec *recorder) *Handle {
			for i := range 5 {
				submit(t, e, rec, Request{ID: fmt.Sprint("o", i), Prompt: seqTokens(uint32(i)*1000+10_000, 20), MaxTokens: 50})
			}
			h := submit(t, e, rec, Request{ID: "x", Prompt: seqTokens(1, 50), MaxTokens: 5})
			clk.AdvanceTo(ms(10))
			if l := e.Load(); l.Waiting != 1 {
				t.Fatalf("load %+v", l)
			}
			return h
		}, 0},
		{"prefilling, with a chunk in flight", func(t *testing.T, e *Engine, clk *VirtualClock, rec *recorder) *Handle {
			h := submit(t, e, rec, Request{ID: "x", Prompt: seqTokens(1, 350), MaxTokens: 5})
			clk.AdvanceTo(ms(3)) // 100-token chunks of 2 ms: the second is in flight
			if l := e.Load(); l.Running != 1 || l.Decoding != 0 || l.StepEnd.IsZero() {
				t.Fatalf("load %+v", l)
			}
			return h
		}, 0},
		{"decoding", func(t *testing.T, e *Engine, clk *VirtualClock, rec *recorder) *Handle {
			h := submit(t, e, rec, Request{ID: "x", Prompt: seqTokens(1, 50), MaxTokens: 100})
			clk.AdvanceTo(ms(1.5 + 3*3 + 0.5)) // first token at 1.5 ms, then one every 3 ms
			return h
		}, 4},
		{"preempted, back in the queue", func(t *testing.T, e *Engine, clk *VirtualClock, rec *recorder) *Handle {
			// As in TestPreemption: b loses its blocks when a grows.
			submit(t, e, rec, Request{ID: "a", Prompt: seqTokens(1, 16), MaxTokens: 12})
			h := submit(t, e, rec, Request{ID: "x", Prompt: seqTokens(500, 16), MaxTokens: 12})
			for clk.Step() {
				if h.r.res.Preemptions > 0 {
					break
				}
			}
			if l := e.Load(); l.Waiting != 1 || h.r.state != stWaiting {
				t.Fatalf("not preempted: %+v", l)
			}
			return h
		}, 5},
		{"hung", func(t *testing.T, e *Engine, clk *VirtualClock, rec *recorder) *Handle {
			e.cfg.HangRate = 1
			h := submit(t, e, rec, Request{ID: "x", Prompt: seqTokens(1, 50), MaxTokens: 5})
			e.cfg.HangRate = 0
			clk.RunUntilIdle()
			if l := e.Load(); l.Running != 1 || l.KVUsage == 0 {
				t.Fatalf("hung request not holding its slot: %+v", l)
			}
			return h
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := stepConfig()
			if tt.name == "preempted, back in the queue" {
				cfg.BlockSize, cfg.NumGPUBlocks = 4, 10
			}
			e, clk := newVirtual(t, cfg)
			rec := newRecorder()
			h := tt.setup(t, e, clk, rec)
			before := e.Stats().Outcomes[OutcomeAbort]
			h.Cancel()
			res, ok := rec.get("x")
			if !ok || res.Outcome != OutcomeAbort || res.CompletionTokens != tt.wantTokens || !res.End.Equal(clk.Now()) {
				t.Fatalf("cancelled: %v %+v", ok, res)
			}
			h.Cancel() // no effect
			if got := e.Stats().Outcomes[OutcomeAbort]; got != before+1 {
				t.Errorf("abort count %d, want %d", got, before+1)
			}
			// A new request still runs, and everything else finishes.
			submit(t, e, rec, Request{ID: "after", Prompt: seqTokens(77_777, 30), MaxTokens: 3})
			clk.RunUntilIdle()
			rec.check(t)
			if r, ok := rec.get("after"); !ok || r.Outcome != OutcomeLength {
				t.Errorf("a request after the cancel: %+v", r)
			}
			st := e.Stats()
			if st.Running != 0 || st.Waiting != 0 || st.KVUsage != 0 || e.Load().PendingPrefillTokens != 0 {
				t.Errorf("after all: running %d waiting %d usage %v pending %d", st.Running, st.Waiting, st.KVUsage,
					e.Load().PendingPrefillTokens)
			}
			if n := len(rec.tokens["x"]); n != tt.wantTokens {
				t.Errorf("%d tokens reported after the cancel, want %d", n, tt.wantTokens)
			}
		})
	}
}

// TestCancelInsideCallback: a callback may call back into the engine; the
// Done of a request it cancels follows after it, in order.
func TestCancelInsideCallback(t *testing.T) {
	e, clk := newVirtual(t, stepConfig())
	var order []string
	var hb *Handle
	ha, err := e.Submit(Request{ID: "a", Prompt: seqTokens(1, 10), MaxTokens: 3}, Callbacks{
		FirstToken: func(Result) { order = append(order, "a first"); hb.Cancel(); order = append(order, "a cancelled b") },
		Done:       func(Result) { order = append(order, "a done") },
	})
	if err != nil {
		t.Fatal(err)
	}
	hb, err = e.Submit(Request{ID: "b", Prompt: seqTokens(500, 300), MaxTokens: 3}, Callbacks{
		Done: func(r Result) { order = append(order, "b done "+string(r.Outcome)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	clk.RunUntilIdle()
	want := []string{"a first", "a cancelled b", "b done abort", "a done"}
	if !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	_ = ha
}

// TestDeterministic: the same submissions on a fresh virtual clock give the
// same results, to the nanosecond.
func TestDeterministic(t *testing.T) {
	runOnce := func() []Result {
		cfg := stepConfig()
		cfg.BlockSize, cfg.NumGPUBlocks = 16, 40 // tight: preemptions happen
		cfg.SlowRate, cfg.LateErrorRate = 0.1, 0.05
		e, clk := newVirtual(t, cfg)
		rec := newRecorder()
		for i := range 80 {
			clk.AdvanceTo(t0.Add(time.Duration(i*i%37) * time.Millisecond))
			prompt := append(seqTokens(1, 200+(i%5)*16), seqTokens(uint32(i)*1000+10_000, 60+i%50)...)
			submit(t, e, rec, Request{ID: fmt.Sprint(i), Prompt: prompt, MaxTokens: 10 + i%40})
		}
		clk.RunUntilIdle()
		rec.check(t)
		var out []Result
		for i := range 80 {
			r, ok := rec.get(fmt.Sprint(i))
			if !ok {
				t.Fatalf("request %d not done", i)
			}
			out = append(out, r)
		}
		if e.Stats().Preemptions == 0 {
			t.Error("no preemption: the test does not exercise it")
		}
		return out
	}
	a, b := runOnce(), runOnce()
	if !slices.Equal(a, b) {
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("request %d differs:\n%+v\n%+v", i, a[i], b[i])
			}
		}
	}
}

func TestMultiTurnWorkloadHits(t *testing.T) {
	const sessions, turns = 40, 10 // their KV fits in the cache
	cfg := testConfig()
	cfg.MaxWaiting = 0
	e, clk := newVirtual(t, cfg)
	done := 0
	cb := Callbacks{Done: func(Result) { done++ }}
	prompts := make([][]uint32, sessions)
	for s := range prompts {
		prompts[s] = seqTokens(uint32(s)*1_000_000, 200)
	}
	at := t0
	for turn := range turns {
		for s := range prompts {
			at = at.Add(3 * time.Millisecond)
			clk.AdvanceTo(at)
			prompts[s] = append(prompts[s], seqTokens(uint32(s*1_000_000+turn*1000+500), 30)...)
			if _, err := e.Submit(Request{Prompt: prompts[s], MaxTokens: 32}, cb); err != nil {
				t.Fatal(err)
			}
		}
	}
	clk.RunUntilIdle()
	st := e.Stats()
	if done != sessions*turns {
		t.Fatalf("%d of %d done", done, sessions*turns)
	}
	if hit := float64(st.PrefixCacheHits) / float64(st.PrefixCacheQueries); hit < 0.8 {
		t.Errorf("hit rate %.2f on a multi-turn workload that fits the cache", hit)
	}
}

// BenchmarkVirtualMultiTurn measures a busy replica's simulation cost in
// virtual time: per op, 3,000 multi-turn requests of ~200-1,100 tokens.
func BenchmarkVirtualMultiTurn(b *testing.B) {
	const sessions, turns = 100, 30
	cfg := testConfig()
	cfg.MaxWaiting = 0
	for b.Loop() {
		clk := NewVirtualClock(t0)
		e, _ := New(cfg, clk)
		prompts := make([][]uint32, sessions)
		for s := range prompts {
			prompts[s] = seqTokens(uint32(s)*1_000_000, 200)
		}
		at := t0
		for turn := range turns {
			for s := range prompts {
				at = at.Add(3 * time.Millisecond)
				clk.AdvanceTo(at)
				prompts[s] = append(prompts[s], seqTokens(uint32(s*1_000_000+turn*1000+500), 30)...)
				if _, err := e.Submit(Request{Prompt: prompts[s], MaxTokens: 32}, Callbacks{}); err != nil {
					b.Fatal(err)
				}
			}
		}
		clk.RunUntilIdle()
	}
}

func TestVirtualClock(t *testing.T) {
	clk := NewVirtualClock(t0)
	var got []int
	clk.AfterFunc(3*time.Second, func() { got = append(got, 3) })
	clk.AfterFunc(time.Second, func() {
		got = append(got, 1)
		clk.AfterFunc(time.Second, func() { got = append(got, 2) }) // at 2s
	})
	stop := clk.AfterFunc(2*time.Second, func() { got = append(got, -1) })
	clk.AfterFunc(time.Second, func() { got = append(got, 11) }) // same time, later
	if !stop.Stop() || stop.Stop() {
		t.Error("Stop should succeed once")
	}
	if n := clk.AdvanceTo(t0.Add(2 * time.Second)); n != 3 {
		t.Errorf("ran %d callbacks, want 3", n)
	}
	if !slices.Equal(got, []int{1, 11, 2}) || !clk.Now().Equal(t0.Add(2*time.Second)) {
		t.Errorf("got %v at %v", got, clk.Now())
	}
	if next, ok := clk.Next(); !ok || !next.Equal(t0.Add(3*time.Second)) {
		t.Errorf("next %v %v", next, ok)
	}
	clk.RunUntilIdle()
	if !slices.Equal(got, []int{1, 11, 2, 3}) || clk.Pending() != 0 {
		t.Errorf("got %v", got)
	}
}

// TestRealClock runs requests concurrently in real time and checks every
// callback arrives, in order per request.
func TestRealClock(t *testing.T) {
	cfg := testConfig()
	cfg.DecodePerToken = 100 * time.Microsecond
	cfg.StepOverhead = 50 * time.Microsecond
	e, err := New(cfg, RealClock{})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	var wg sync.WaitGroup
	done := make(chan Result, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cb := rec.cb()
			inner := cb.Done
			cb.Done = func(r Result) { inner(r); done <- r }
			if _, err := e.Submit(Request{ID: fmt.Sprint(i), Prompt: seqTokens(uint32(i)*1000, 100+i*300), MaxTokens: 20}, cb); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for range 8 {
		select {
		case r := <-done:
			if r.Outcome != OutcomeLength || r.CompletionTokens != 20 {
				t.Errorf("%+v", r)
			}
		case <-time.After(30 * time.Second): // a hang, not a speed limit
			t.Fatal("no result in real time")
		}
	}
	rec.check(t)
	for i := range 8 {
		if n := len(rec.tokens[fmt.Sprint(i)]); n != 20 {
			t.Errorf("request %d: %d token callbacks", i, n)
		}
	}
}

func TestSleepUntil(t *testing.T) {
	clk := NewVirtualClock(t0)
	errc := make(chan error, 1)
	go func() { errc <- SleepUntil(context.Background(), clk, t0.Add(time.Second)) }()
	waitPending(t, clk, 1)
	clk.Advance(time.Second)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { errc <- SleepUntil(ctx, clk, t0.Add(time.Hour)) }()
	waitPending(t, clk, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sleep: %v", err)
	}
	if clk.Pending() != 0 {
		t.Error("cancelled sleep left its timer")
	}
	if err := SleepUntil(context.Background(), clk, t0); err != nil {
		t.Errorf("sleep into the past: %v", err)
	}
}

func waitPending(t *testing.T, clk *VirtualClock, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for clk.Pending() != n {
		if time.Now().After(deadline) {
			t.Fatalf("pending %d, want %d", clk.Pending(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLoadDoesNotAllocate: routers read every engine's Load on every
// decision.
func TestLoadDoesNotAllocate(t *testing.T) {
	e, clk := newVirtual(t, stepConfig())
	for i := range 8 {
		submit(t, e, newRecorder(), Request{Prompt: seqTokens(uint32(i)*1000, 150), MaxTokens: 20})
	}
	clk.AdvanceTo(ms(5))
	var l Load
	if n := testing.AllocsPerRun(100, func() { l = e.Load() }); n != 0 {
		t.Errorf("Load allocates %v times", n)
	}
	if l.Running+l.Waiting != 8 || l.Running == 0 || l.Waiting == 0 {
		t.Errorf("load %+v", l)
	}
}

// lateClock fires every timer with a delay late after its time, as a real clock's timers fire
// on a busy host (kicks of an idle engine, d = 0, stay on time).
type lateClock struct {
	*VirtualClock
	late time.Duration
}

func (c lateClock) AfterFunc(d time.Duration, f func()) Timer {
	if d > 0 {
		d += c.late
	}
	return c.VirtualClock.AfterFunc(d, f)
}

// Timers that fire late cost the engine no throughput: each step starts where the previous one
// ended, not when its timer fired, so the requests' simulated times are those of an on-time
// clock; and no request is admitted into a step that began before it arrived.
func TestLateTimersCostNoThroughput(t *testing.T) {
	type arrival struct {
		at  time.Duration
		req Request
	}
	var together, staggered []arrival
	for i := range 12 {
		r := Request{ID: fmt.Sprint(i), Prompt: append(seqTokens(1, 64), seqTokens(uint32(i+1)*1000, 40+i*7)...), MaxTokens: 20 + i}
		together = append(together, arrival{0, r})
		staggered = append(staggered, arrival{time.Duration(i) * 3500 * time.Microsecond, r})
	}
	runWith := func(t *testing.T, late time.Duration, arrivals []arrival) map[string]Result {
		t.Helper()
		vc := NewVirtualClock(t0)
		e, err := New(stepConfig(), lateClock{vc, late})
		if err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		for _, a := range arrivals {
			vc.AdvanceTo(t0.Add(a.at))
			submit(t, e, rec, a.req)
		}
		vc.RunUntilIdle()
		rec.check(t)
		out := map[string]Result{}
		for _, a := range arrivals {
			r, ok := rec.get(a.req.ID)
			if !ok {
				t.Fatalf("request %s not done", a.req.ID)
			}
			if r.PrefillStart.Before(r.Arrival) {
				t.Errorf("request %s: prefill began at %v, before its arrival at %v", r.ID, r.PrefillStart.Sub(t0), r.Arrival.Sub(t0))
			}
			out[r.ID] = r
		}
		return out
	}
	lastEnd := func(rs map[string]Result) time.Time {
		var end time.Time
		for _, r := range rs {
			if r.End.After(end) {
				end = r.End
			}
		}
		return end
	}
	t.Run("arriving together: the same times as on time", func(t *testing.T) {
		onTime, late := runWith(t, 0, together), runWith(t, 700*time.Microsecond, together)
		for id, want := range onTime {
			got := late[id]
			if !got.PrefillStart.Equal(want.PrefillStart) || !got.FirstToken.Equal(want.FirstToken) || !got.End.Equal(want.End) {
				t.Errorf("request %s with late timers: prefill %v, first token %v, end %v; on time %v, %v, %v", id,
					got.PrefillStart.Sub(t0), got.FirstToken.Sub(t0), got.End.Sub(t0),
					want.PrefillStart.Sub(t0), want.FirstToken.Sub(t0), want.End.Sub(t0))
			}
		}
	})
	t.Run("staggered: arrivals wait for the next step, the work ends as soon", func(t *testing.T) {
		onTime, late := runWith(t, 0, staggered), runWith(t, 700*time.Microsecond, staggered)
		// Late timers shift no step but the last one's delivery: the work ends when it does on
		// time, give or take one step's lateness where an arrival fell into a late window.
		if d := lastEnd(late).Sub(lastEnd(onTime)); d < -700*time.Microsecond || d > 700*time.Microsecond {
			t.Errorf("the last request ends %v after the on-time run's (late timers cost throughput)", d)
		}
	})
}
