package replay

import (
	"context"
	"testing"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
)

func runVirtual(t *testing.T, w *Workload, policy string, engines int) *Summary {
	t.Helper()
	res, err := Run(context.Background(), RunConfig{Workload: w, Policy: policy, Engines: engines, Clock: ClockVirtual})
	if err != nil {
		t.Fatalf("%s / %s: %v", w.Name, policy, err)
	}
	s := Summarize(res)
	if s.Completed != len(w.Requests) || s.Errors != 0 {
		t.Fatalf("%s / %s: %d of %d completed, errors %v", w.Name, policy, s.Completed, len(w.Requests), s.ErrorsByKind)
	}
	return s
}

func TestRoundRobinSpreadsEvenly(t *testing.T) {
	w := generate(t, "shared-prefix", Spec{Seed: 1, Engines: 4, Requests: 203})
	s := runVirtual(t, w, RoundRobin, 4)
	for e, n := range s.RequestsPerEngine {
		if n != 50 && n != 51 {
			t.Fatalf("engine %d got %d requests: %v", e, n, s.RequestsPerEngine)
		}
	}
}

func TestLeastLoadedBalances(t *testing.T) {
	w := generate(t, "no-sharing", Spec{Seed: 1, Engines: 4, Requests: 400})
	ll, rr := runVirtual(t, w, LeastLoaded, 4), runVirtual(t, w, RoundRobin, 4)
	if ll.PeakImbalance > 1.25 || ll.PeakImbalance > rr.PeakImbalance || ll.RequestImbalance > 1.2 {
		t.Fatalf("least-loaded: peak imbalance %.2f (round-robin %.2f), request imbalance %.2f",
			ll.PeakImbalance, rr.PeakImbalance, ll.RequestImbalance)
	}
}

func TestPreciseBeatsRoundRobinOnSharedPrefix(t *testing.T) {
	w := generate(t, "shared-prefix", Spec{Seed: 1, Engines: 4, Requests: 400})
	p, rr := runVirtual(t, w, Precise, 4), runVirtual(t, w, RoundRobin, 4)
	if p.HitRatio < rr.HitRatio+0.2 || p.HitRatio < 0.7 {
		t.Fatalf("hit ratio: precise %.2f, round-robin %.2f", p.HitRatio, rr.HitRatio)
	}
	if p.TTFT.P50 >= rr.TTFT.P50 || p.TTFT.P90 >= rr.TTFT.P90 {
		t.Fatalf("TTFT p50/p90: precise %v/%v, round-robin %v/%v", p.TTFT.P50, p.TTFT.P90, rr.TTFT.P50, rr.TTFT.P90)
	}
	if p.RequestImbalance > 2 {
		t.Fatalf("precise piles requests up: imbalance %.2f", p.RequestImbalance)
	}
}

func TestVirtualRunIsDeterministic(t *testing.T) {
	w := generate(t, "multi-turn", Spec{Seed: 3, Engines: 3, Requests: 150})
	a, b := runVirtual(t, w, Precise, 3), runVirtual(t, w, Precise, 3)
	if a.CachedTokens != b.CachedTokens || a.TTFT != b.TTFT || a.Duration != b.Duration {
		t.Fatalf("two virtual runs differ: %+v vs %+v", a.TTFT, b.TTFT)
	}
}

// TestFollowUpsWaitForTheirPredecessor: a closed-loop request arrives its think time after the
// request it follows ended.
func TestFollowUpsWaitForTheirPredecessor(t *testing.T) {
	w := generate(t, "agent", Spec{Seed: 4, Engines: 2, Requests: 60})
	res, err := Run(context.Background(), RunConfig{Workload: w, Policy: LeastLoaded, Engines: 2, Clock: ClockVirtual})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range w.Requests {
		if r.After < 0 {
			if got := res.Records[i].Arrival.Sub(Epoch); got != r.At {
				t.Fatalf("request %d arrived at %v, want %v", i, got, r.At)
			}
			continue
		}
		if got, want := res.Records[i].Arrival, res.Records[r.After].Result.End.Add(r.Think); !got.Equal(want) {
			t.Fatalf("request %d arrived at %v, want its predecessor's end + %v = %v", i, got.Sub(Epoch), r.Think, want.Sub(Epoch))
		}
	}
}

func TestRealClockRun(t *testing.T) {
	w := generate(t, "hot-prefix", Spec{Seed: 1, Engines: 2, Requests: 40, Rate: 40})
	start := time.Now()
	res, err := Run(context.Background(), RunConfig{Workload: w, Policy: Precise, Engines: 2, Clock: ClockReal, TimeScale: 20})
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(res)
	// ~1 s of arrivals plus the last answers (~5 s) of simulated time, at 20× real time.
	if s.Completed != 40 || time.Since(start) > 5*time.Second || s.HitRatio < 0.8 {
		t.Fatalf("completed %d in %v, hit ratio %.2f", s.Completed, time.Since(start), s.HitRatio)
	}
}

func seq(base uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// TestPreciseEstimateIsTheEngineTTFT: with no decodes in the way, precise's estimate is the
// engine's own TTFT, worked out by hand from EngineConfig (2 ms a step, 60 µs a prompt token,
// 2,048 tokens a step).
func TestPreciseEstimateIsTheEngineTTFT(t *testing.T) {
	tests := []struct {
		name   string
		before []int // prompts already submitted (waiting), in order
		prompt int
		want   time.Duration
	}{
		{"idle engine", nil, 1000, 2*time.Millisecond + 1000*60*time.Microsecond},
		{"one chunk is not enough", nil, 3000,
			// 2,048 then 952 tokens: two steps.
			4*time.Millisecond + 3000*60*time.Microsecond},
		{"behind a queued prompt", []int{3000}, 500,
			// 3,500 tokens over two steps; the request's 500 ride in the second.
			4*time.Millisecond + 3500*60*time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := engine.NewVirtualClock(Epoch)
			eng, err := engine.New(EngineConfig(), clk)
			if err != nil {
				t.Fatal(err)
			}
			for i, n := range tt.before {
				if _, err := eng.Submit(engine.Request{Prompt: seq(uint32(i+1)*100_000, n), MaxTokens: 10}, engine.Callbacks{}); err != nil {
					t.Fatal(err)
				}
			}
			p := newPrecise([]*engine.Engine{eng})
			r := &Request{Prompt: seq(7, tt.prompt), MaxTokens: 10}
			est, _ := p.estimate(0, r, clk.Now())
			var got engine.Result
			if _, err := eng.Submit(engine.Request{Prompt: r.Prompt, MaxTokens: r.MaxTokens},
				engine.Callbacks{FirstToken: func(res engine.Result) { got = res }}); err != nil {
				t.Fatal(err)
			}
			clk.RunUntilIdle()
			if got.TTFT() != tt.want {
				t.Fatalf("the engine's TTFT %v, want %v: the hand arithmetic is off", got.TTFT(), tt.want)
			}
			if est != tt.want {
				t.Errorf("precise estimated %v, the engine took %v", est, got.TTFT())
			}
		})
	}
}

// TestPrecisePicks: the engine that holds the prompt's prefix, unless its queue costs more than
// a cold prefill elsewhere.
func TestPrecisePicks(t *testing.T) {
	shared := seq(1, 3000)
	tests := []struct {
		name  string
		setup func(engs []*engine.Engine, clk *engine.VirtualClock)
		want  int
	}{
		{"the engine holding the prefix", func(engs []*engine.Engine, clk *engine.VirtualClock) {
			_, _ = engs[1].Submit(engine.Request{Prompt: shared, MaxTokens: 1}, engine.Callbacks{})
			clk.RunUntilIdle()
		}, 1},
		{"a cold idle engine rather than a hit behind a long queue", func(engs []*engine.Engine, clk *engine.VirtualClock) {
			_, _ = engs[1].Submit(engine.Request{Prompt: shared, MaxTokens: 1}, engine.Callbacks{})
			clk.RunUntilIdle()
			for i := range 4 { // 24,000 uncached tokens queued on engine 1
				_, _ = engs[1].Submit(engine.Request{Prompt: seq(uint32(i+1)*1_000_000, 6000), MaxTokens: 5}, engine.Callbacks{})
			}
			// Engine 0 is busy too, but with less: 3,000 tokens.
			_, _ = engs[0].Submit(engine.Request{Prompt: seq(9_000_000, 3000), MaxTokens: 5}, engine.Callbacks{})
		}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := engine.NewVirtualClock(Epoch)
			var engs []*engine.Engine
			for range 3 {
				e, err := engine.New(EngineConfig(), clk)
				if err != nil {
					t.Fatal(err)
				}
				engs = append(engs, e)
			}
			tt.setup(engs, clk)
			p := newPrecise(engs)
			r := &Request{Prompt: append(append([]uint32(nil), shared...), seq(5_000_000, 50)...), MaxTokens: 10}
			if got := p.pick(r, clk.Now()); got != tt.want {
				for e := range engs {
					c, _ := p.estimate(e, r, clk.Now())
					t.Logf("engine %d: cost %v, load %+v", e, c, engs[e].Load())
				}
				t.Errorf("picked engine %d, want %d", got, tt.want)
			}
		})
	}
}
