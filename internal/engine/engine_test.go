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

func newVirtual(t *testing.T, cfg Config) (*Engine, *VirtualClock) {
	t.Helper()
	clk := NewVirtualClock(t0)
	e, err := New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	return e, clk
}

// recorder collects Done results.
type recorder struct {
	mu    sync.Mutex
	done  map[string]Result
	first map[string]Result
}

func newRecorder() *recorder {
	return &recorder{done: map[string]Result{}, first: map[string]Result{}}
}

func (r *recorder) cb() Callbacks {
	return Callbacks{
		FirstToken: func(res Result) { r.mu.Lock(); r.first[res.ID] = res; r.mu.Unlock() },
		Done:       func(res Result) { r.mu.Lock(); r.done[res.ID] = res; r.mu.Unlock() },
	}
}

func (r *recorder) get(id string) (Result, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res, ok := r.done[id]
	return res, ok
}

// run submits req alone and runs the clock until it is done.
func run(t *testing.T, e *Engine, clk *VirtualClock, req Request) Result {
	t.Helper()
	rec := newRecorder()
	h, err := e.Submit(req, rec.cb())
	if err != nil {
		t.Fatal(err)
	}
	clk.RunUntilIdle()
	res, ok := rec.get(h.ID())
	if !ok {
		t.Fatalf("request %s not done", h.ID())
	}
	return res
}

func seqTokens(base uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
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
		{"long", 1000, 992},
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
	return c
}

func TestTailFirstEviction(t *testing.T) {
	e, clk := newVirtual(t, tinyConfig(10))
	a := Request{Prompt: seqTokens(100, 24), MaxTokens: 1} // 6 full blocks, 7 allocated
	run(t, e, clk, a)
	keys := BlockKeys(0, a.Prompt, 4)
	for i, k := range keys {
		if !e.pool.isCached(k) {
			t.Fatalf("block %d of A not cached after it finished", i)
		}
	}
	// B needs 6 blocks: the 3 never used, A's partial block, then A's two
	// tail blocks. A's head survives.
	run(t, e, clk, Request{Prompt: seqTokens(5000, 20), MaxTokens: 1})
	for i, k := range keys {
		want := i < 4
		if got := e.pool.isCached(k); got != want {
			t.Errorf("A's block %d cached = %v, want %v", i, got, want)
		}
	}
	if got := e.CachedPrefixTokens(a); got != 16 {
		t.Errorf("A would now hit %d tokens, want its 4-block head (16)", got)
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
	a := Request{ID: "a", Prompt: seqTokens(100, 16), MaxTokens: 8}  // 6 blocks
	b := Request{ID: "b", Prompt: seqTokens(9000, 16), MaxTokens: 8} // 6 blocks
	if _, err := e.Submit(a, rec.cb()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Submit(b, rec.cb()); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	st := e.Stats()
	if st.Running != 1 || st.Waiting != 1 {
		t.Fatalf("running/waiting = %d/%d, want 1/1: B must wait rather than evict A's pinned blocks", st.Running, st.Waiting)
	}
	if st.KVUsage != 0.6 {
		t.Errorf("KV usage %v, want 0.6", st.KVUsage)
	}
	if got := e.CachedPrefixTokens(a); got != 12 {
		t.Errorf("A's prompt hit = %d, want 12", got)
	}
	clk.RunUntilIdle()
	ra, _ := rec.get("a")
	rb, ok := rec.get("b")
	if !ok || !rb.Admitted.Equal(ra.End) {
		t.Errorf("B admitted at %v, want when A ended (%v)", rb.Admitted, ra.End)
	}
	// B took the 4 unused blocks and A's 2 tail blocks; A's prompt is whole.
	if got := e.CachedPrefixTokens(a); got != 12 {
		t.Errorf("after B, A's prompt hit = %d, want 12", got)
	}
	if st := e.Stats(); st.KVUsage != 0 || st.Running != 0 {
		t.Errorf("after all: usage %v running %d", st.KVUsage, st.Running)
	}
}

func TestTTFTGrowsWithUncached(t *testing.T) {
	cfg := testConfig()
	var prev time.Duration
	for _, n := range []int{64, 512, 4096} {
		e, clk := newVirtual(t, cfg)
		res := run(t, e, clk, Request{Prompt: seqTokens(7, n), MaxTokens: 2})
		want := cfg.PrefillOverhead + time.Duration(n)*cfg.PrefillPerToken
		if res.TTFT() != want || res.QueueWait() != 0 {
			t.Errorf("%d tokens: TTFT %v queue %v, want %v and 0", n, res.TTFT(), res.QueueWait(), want)
		}
		if res.TTFT() <= prev {
			t.Errorf("%d tokens: TTFT %v did not grow from %v", n, res.TTFT(), prev)
		}
		prev = res.TTFT()
		// Same prompt again: only the uncached tail is prefilled.
		again := run(t, e, clk, Request{Prompt: seqTokens(7, n), MaxTokens: 2})
		want = cfg.PrefillOverhead + time.Duration(n-again.CachedTokens)*cfg.PrefillPerToken
		if again.TTFT() != want || again.TTFT() >= res.TTFT() {
			t.Errorf("%d tokens cached %d: TTFT %v, want %v", n, again.CachedTokens, again.TTFT(), want)
		}
		if end := again.FirstToken.Add(cfg.DecodePerToken); !again.End.Equal(end) {
			t.Errorf("end %v, want first token + 1 itl = %v", again.End, end)
		}
	}
}

func TestPrefillQueueSerializes(t *testing.T) {
	cfg := testConfig()
	e, clk := newVirtual(t, cfg)
	rec := newRecorder()
	for i := range 3 {
		if _, err := e.Submit(Request{ID: fmt.Sprint(i), Prompt: seqTokens(uint32(i)*10000, 1000), MaxTokens: 1}, rec.cb()); err != nil {
			t.Fatal(err)
		}
	}
	clk.RunUntilIdle()
	prefill := cfg.PrefillOverhead + 1000*cfg.PrefillPerToken
	for i := range 3 {
		res, _ := rec.get(fmt.Sprint(i))
		if want := time.Duration(i+1) * prefill; res.TTFT() != want {
			t.Errorf("request %d: TTFT %v, want %v", i, res.TTFT(), want)
		}
	}
}

func TestBatchLimitQueues(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 2
	e, clk := newVirtual(t, cfg)
	rec := newRecorder()
	for i := range 5 {
		if _, err := e.Submit(Request{ID: fmt.Sprint(i), Prompt: seqTokens(uint32(i)*1000, 50), MaxTokens: 10}, rec.cb()); err != nil {
			t.Fatal(err)
		}
	}
	if st := e.Stats(); st.Running != 2 || st.Waiting != 3 {
		t.Fatalf("running/waiting = %d/%d, want 2/3", st.Running, st.Waiting)
	}
	clk.RunUntilIdle()
	var prev time.Time
	for i := range 5 {
		res, ok := rec.get(fmt.Sprint(i))
		if !ok || res.Outcome != OutcomeLength || res.CompletionTokens != 10 {
			t.Fatalf("request %d: %+v", i, res)
		}
		if res.Admitted.Before(prev) {
			t.Errorf("request %d admitted before request %d: not FIFO", i, i-1)
		}
		if i >= 2 && res.QueueWait() <= 0 {
			t.Errorf("request %d did not wait", i)
		}
		prev = res.Admitted
	}
	// The full batch decodes slower than a batch of one.
	r0, _ := rec.get("0")
	if want := scale(cfg.DecodePerToken, 1+cfg.DecodeBatchPenalty); r0.InterTokenLatency != want {
		t.Errorf("itl with a full batch %v, want %v", r0.InterTokenLatency, want)
	}
	if st := e.Stats(); st.Outcomes[OutcomeLength] != 5 || st.GenerationTokens != 50 || st.TTFT.Count != 5 {
		t.Errorf("stats %+v", st)
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
	cfg.MaxNumSeqs = 1
	cfg.DecodePerToken = time.Second
	e, _ := newVirtual(t, cfg)
	if _, err := e.Submit(Request{}, Callbacks{}); !errors.Is(err, ErrEmptyPrompt) {
		t.Errorf("empty: %v", err)
	}
	if _, err := e.Submit(Request{Prompt: seqTokens(1, 30), MaxTokens: 11}, Callbacks{}); !errors.Is(err, ErrTooLong) {
		t.Errorf("too long: %v", err)
	}
	for i := range 2 {
		if _, err := e.Submit(Request{Prompt: seqTokens(1, 8), MaxTokens: 2}, Callbacks{}); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
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
		func(c *Config) { c.OutputTokensMax = 0 },
		func(c *Config) { c.ErrorRate = 2 },
		func(c *Config) { c.Model = "" },
	}
	for i, f := range bad {
		c := testConfig()
		f(&c)
		if _, err := New(c, NewVirtualClock(t0)); err == nil {
			t.Errorf("bad config %d accepted", i)
		}
	}
}

func TestFailureInjectionDeterministic(t *testing.T) {
	outcomes := func(seed uint64) []string {
		cfg := testConfig()
		cfg.ErrorRate, cfg.HangRate, cfg.SlowRate, cfg.SlowFactor, cfg.Seed = 0.2, 0.1, 0.2, 3, seed
		e, clk := newVirtual(t, cfg)
		rec := newRecorder()
		var out []string
		var hung []*Handle
		for i := range 500 {
			h, err := e.Submit(Request{ID: fmt.Sprint(i), Prompt: seqTokens(uint32(i), 40), MaxTokens: 4}, rec.cb())
			switch {
			case errors.Is(err, ErrInjected):
				out = append(out, "error")
			case err != nil:
				t.Fatal(err)
			default:
				out = append(out, "ok")
				hung = append(hung, h)
			}
		}
		clk.RunUntilIdle()
		nHung, nSlow := 0, 0
		for _, h := range hung {
			res, ok := rec.get(h.ID())
			if !ok {
				nHung++
				if e.Stats().Running == 0 {
					t.Fatal("hung request not counted as running")
				}
				h.Cancel()
				res, ok = rec.get(h.ID())
				if !ok || res.Outcome != OutcomeAbort || !res.Hung {
					t.Fatalf("cancelled hung request: %+v", res)
				}
				continue
			}
			if res.Slow {
				nSlow++
				out[atoi(res.ID)] = "slow"
				if res.InterTokenLatency < 3*cfgDecode() {
					t.Errorf("slow request itl %v", res.InterTokenLatency)
				}
			}
		}
		errs := 0
		for _, o := range out {
			if o == "error" {
				errs++
			}
		}
		if errs < 70 || errs > 130 || nHung < 25 || nHung > 75 || nSlow < 50 || nSlow > 110 {
			t.Errorf("seed %d: %d errors, %d hung, %d slow of 500", seed, errs, nHung, nSlow)
		}
		if st := e.Stats(); st.Running != 0 || st.KVUsage != 0 || st.Outcomes[OutcomeError] != uint64(errs) {
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

func cfgDecode() time.Duration { return testConfig().DecodePerToken }

func atoi(s string) int {
	var n int
	fmt.Sscan(s, &n)
	return n
}

func TestCancel(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 1
	e, clk := newVirtual(t, cfg)
	rec := newRecorder()
	a, _ := e.Submit(Request{ID: "a", Prompt: seqTokens(1, 100), MaxTokens: 100}, rec.cb())
	b, _ := e.Submit(Request{ID: "b", Prompt: seqTokens(1000, 100), MaxTokens: 100}, rec.cb())
	c, _ := e.Submit(Request{ID: "c", Prompt: seqTokens(2000, 100), MaxTokens: 5}, rec.cb())
	clk.Advance(50 * time.Millisecond) // a is decoding
	b.Cancel()                         // leaves the queue
	a.Cancel()                         // frees the slot: c runs
	a.Cancel()                         // no effect
	if st := e.Stats(); st.Running != 1 || st.Waiting != 0 {
		t.Fatalf("after cancels running/waiting = %d/%d, want 1/0", st.Running, st.Waiting)
	}
	clk.RunUntilIdle()
	ra, _ := rec.get("a")
	rb, _ := rec.get("b")
	rc, _ := rec.get("c")
	if ra.Outcome != OutcomeAbort || ra.CompletionTokens < 20 || ra.CompletionTokens > 26 {
		t.Errorf("a: %+v", ra)
	}
	if rb.Outcome != OutcomeAbort || !rb.FirstToken.IsZero() {
		t.Errorf("b: %+v", rb)
	}
	if rc.Outcome != OutcomeLength || !rc.Admitted.Equal(t0.Add(50*time.Millisecond)) {
		t.Errorf("c: %+v", rc)
	}
	c.Cancel()
	if st := e.Stats(); st.Outcomes[OutcomeAbort] != 2 || st.Outcomes[OutcomeLength] != 1 {
		t.Errorf("outcomes %v", st.Outcomes)
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

// TestVirtualTimeIsFast runs a busy replica through thousands of multi-turn
// requests in virtual time.
func TestVirtualTimeIsFast(t *testing.T) {
	const sessions, turns = 100, 30 // their KV fits in the cache
	cfg := testConfig()
	cfg.MaxWaiting = 0
	e, clk := newVirtual(t, cfg)
	done := 0
	cb := Callbacks{Done: func(Result) { done++ }}
	start := time.Now()
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
	wall := time.Since(start)
	st := e.Stats()
	t.Logf("%d requests, %v simulated, %v wall, hit rate %.2f", done, clk.Now().Sub(t0), wall,
		float64(st.PrefixCacheHits)/float64(st.PrefixCacheQueries))
	if done != sessions*turns {
		t.Fatalf("%d of %d done", done, sessions*turns)
	}
	if hit := float64(st.PrefixCacheHits) / float64(st.PrefixCacheQueries); hit < 0.8 {
		t.Errorf("hit rate %.2f on a multi-turn workload that fits the cache", hit)
	}
	limit := 500 * time.Millisecond // about 20 ms on a laptop core
	if raceEnabled {
		limit = 10 * time.Second
	}
	if wall > limit {
		t.Errorf("%d simulated requests took %v of wall time, limit %v", done, wall, limit)
	}
}

// TestRealClock runs a request in real time and checks callbacks arrive.
func TestRealClock(t *testing.T) {
	cfg := testConfig()
	cfg.DecodePerToken = 100 * time.Microsecond
	e, err := New(cfg, RealClock{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan Result, 1)
	if _, err := e.Submit(Request{Prompt: seqTokens(1, 100), MaxTokens: 20}, Callbacks{Done: func(r Result) { done <- r }}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.Outcome != OutcomeLength || r.CompletionTokens != 20 {
			t.Errorf("%+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no result in real time")
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
