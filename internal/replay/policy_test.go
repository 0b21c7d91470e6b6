package replay

import (
	"context"
	"testing"
	"time"
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
