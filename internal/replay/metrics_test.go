package replay

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
)

func TestPercentileNearestRank(t *testing.T) {
	v := []float64{15, 20, 35, 40, 50}
	for _, tc := range []struct{ p, want float64 }{
		{5, 15}, {20, 15}, {30, 20}, {40, 20}, {50, 35}, {90, 50}, {100, 50},
	} {
		if got := Percentile(append([]float64(nil), v...), tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	// Unsorted input; one value; none.
	if got := Percentile([]float64{3, 1, 2}, 50); got != 2 {
		t.Errorf("median of 3,1,2 = %v", got)
	}
	if got := Percentile([]float64{7}, 99); got != 7 {
		t.Errorf("p99 of one value = %v", got)
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("percentile of nothing is not NaN")
	}
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(100 - i)
	}
	if Percentile(hundred, 99) != 99 || Percentile(hundred, 90) != 90 || Percentile(hundred, 50) != 50 {
		t.Error("percentiles of 1..100")
	}
}

func TestImbalance(t *testing.T) {
	for _, tc := range []struct {
		counts []int
		want   float64
	}{
		{[]int{5, 5, 5, 5}, 1},
		{[]int{8, 0, 0, 0}, 4},
		{[]int{3, 1}, 1.5},
		{[]int{0, 0}, 1},
		{nil, 1},
	} {
		if got := Imbalance(tc.counts); got != tc.want {
			t.Errorf("Imbalance(%v) = %v, want %v", tc.counts, got, tc.want)
		}
	}
}

// TestSummarize checks the report's arithmetic on a hand-made run: two engines, four requests
// (one injected failure, one picker rejection).
func TestSummarize(t *testing.T) {
	at := func(ms int) time.Time { return Epoch.Add(time.Duration(ms) * time.Millisecond) }
	ok := func(e, prompt, cached, out int, arrive, first, end int) Record {
		return Record{Engine: e, Status: 200, Arrival: at(arrive), Decision: 100 * time.Microsecond,
			Result: engine.Result{PromptTokens: prompt, CachedTokens: cached, CompletionTokens: out,
				Arrival: at(arrive), Admitted: at(arrive), PrefillStart: at(arrive), FirstToken: at(first), End: at(end)}}
	}
	res := &RunResult{
		Config: RunConfig{Workload: &Workload{Name: "w"}, Policy: "p", Engines: 2, Engine: EngineConfig()},
		Records: []Record{
			ok(0, 100, 50, 10, 0, 100, 1000),
			ok(0, 100, 0, 30, 500, 800, 2000),
			{Engine: 1, Status: 500, Arrival: at(1000)},
			{Engine: -1, Status: 429, Rejected: true, Arrival: at(1500)},
		},
		PeakInFlight: []int{2, 0},
	}
	s := Summarize(res)
	if s.Requests != 4 || s.Completed != 2 || s.Errors != 2 || s.ErrorsByKind["injected"] != 1 || s.ErrorsByKind["picker-429"] != 1 {
		t.Fatalf("counts: %+v", s)
	}
	if s.HitRatio != 0.25 || s.PromptTokens != 200 || s.CachedTokens != 50 {
		t.Errorf("hit ratio %v", s.HitRatio)
	}
	if s.TTFT.P50 != 0.1 || s.TTFT.P99 != 0.3 || math.Abs(float64(s.TTFT.Mean)-0.2) > 1e-9 {
		t.Errorf("TTFT %+v", s.TTFT)
	}
	// 40 output tokens and 2 requests from the first arrival (0) to the last end (2 s).
	if s.Duration != 2 || s.OutputTokPerSec != 20 || s.ReqPerSec != 1 {
		t.Errorf("throughput: %v s, %v tok/s, %v req/s", s.Duration, s.OutputTokPerSec, s.ReqPerSec)
	}
	if s.RequestsPerEngine[0] != 2 || s.RequestsPerEngine[1] != 1 || s.RequestImbalance != 4.0/3 || s.PeakImbalance != 2 {
		t.Errorf("imbalance: %v %v %v", s.RequestsPerEngine, s.RequestImbalance, s.PeakImbalance)
	}
	// Prefill busy 100 ms + 300 ms over a 1.5 s window on two engines.
	if math.Abs(s.PrefillUtil-0.4/3) > 1e-9 {
		t.Errorf("prefill utilisation %v", s.PrefillUtil)
	}
	// Not measured: written as null.
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"predictedHitRatio":null`) || !strings.Contains(string(b), `"decision":{"p50":null`) {
		t.Errorf("NaN fields not null in JSON: %s", b)
	}
}
