package replay

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvpick/kvpick/pkg/engine"
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

func TestBucketQuantile(t *testing.T) {
	// 10 observations in (0, 1], 10 in (1, 2], none above.
	bs := []Bucket{{1, 10}, {2, 20}, {4, 20}, {math.Inf(1), 20}}
	for _, tc := range []struct{ q, want float64 }{{0.25, 0.5}, {0.5, 1}, {0.75, 1.5}, {1, 2}} {
		if got := BucketQuantile(tc.q, bs); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("q%v = %v, want %v", tc.q, got, tc.want)
		}
	}
	// A rank in +Inf returns the largest finite bound; no observations is NaN.
	if got := BucketQuantile(0.99, []Bucket{{1, 1}, {math.Inf(1), 10}}); got != 1 {
		t.Errorf("rank in +Inf: %v", got)
	}
	if !math.IsNaN(BucketQuantile(0.5, []Bucket{{1, 0}, {math.Inf(1), 0}})) {
		t.Error("empty histogram is not NaN")
	}
	// One run of a long-lived picker: after − before.
	d := SubtractBuckets([]Bucket{{1, 15}, {2, 30}, {math.Inf(1), 30}}, []Bucket{{1, 5}, {2, 10}, {math.Inf(1), 10}})
	if d[0].Count != 10 || d[1].Count != 20 || d[2].Count != 20 {
		t.Errorf("subtract: %v", d)
	}
}

func TestParseMetrics(t *testing.T) {
	page := `# HELP kvpick_decision_duration_seconds Time.
# TYPE kvpick_decision_duration_seconds histogram
kvpick_decision_duration_seconds_bucket{le="2e-06"} 0
kvpick_decision_duration_seconds_bucket{le="4e-06"} 3
kvpick_decision_duration_seconds_bucket{le="+Inf"} 4
kvpick_decision_duration_seconds_sum 1.2e-05
kvpick_decision_duration_seconds_count 4
kvpick_requests_total{outcome="success",status="200"} 7
kvpick_requests_total{outcome="upstream_error",status="500"} 2
process_resident_memory_bytes 3.3554432e+07
weird{a="x\"y",b="z"} 1
`
	sc, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := sc.Value("process_resident_memory_bytes", nil); v != 32<<20 {
		t.Errorf("rss %v", v)
	}
	if v, _ := sc.Value("kvpick_requests_total", nil); v != 9 {
		t.Errorf("requests total %v", v)
	}
	if v, _ := sc.Value("kvpick_requests_total", map[string]string{"outcome": "success"}); v != 7 {
		t.Errorf("successes %v", v)
	}
	if v, ok := sc.Value("weird", map[string]string{"a": `x"y`, "b": "z"}); !ok || v != 1 {
		t.Errorf("escaped label: %v %v", v, ok)
	}
	bs := sc.Histogram("kvpick_decision_duration_seconds")
	if len(bs) != 3 || bs[1].UpperBound != 4e-6 || bs[1].Count != 3 || !math.IsInf(bs[2].UpperBound, 1) {
		t.Fatalf("buckets %v", bs)
	}
	if _, err := ParseMetrics(strings.NewReader("x{a=\"1\" 2\n")); err == nil {
		t.Error("a broken line was accepted")
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
