package promtext

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

const sampleMetrics = `# HELP kvpick_endpoint_inflight_requests Requests routed to the endpoint whose stream has not ended.
# TYPE kvpick_endpoint_inflight_requests gauge
kvpick_endpoint_inflight_requests{endpoint="10.0.0.1:8000"} 3
kvpick_endpoint_inflight_requests{endpoint="10.0.0.2:8000"} 4
# TYPE kvpick_decision_duration_seconds histogram
kvpick_decision_duration_seconds_bucket{le="1e-05"} 10
kvpick_decision_duration_seconds_bucket{le="2e-05"} 20
kvpick_decision_duration_seconds_bucket{le="4e-05"} 40
kvpick_decision_duration_seconds_bucket{le="+Inf"} 40
kvpick_decision_duration_seconds_sum 0.0008
kvpick_decision_duration_seconds_count 40
weird_labels{a="x,y",b="say \"hi\"",c="back\\slash"} 1.5e3 1700000000000
go_goroutines 12
process_resident_memory_bytes 2.0971520e+07
nan_metric NaN
`

func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader(sampleMetrics))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Sum("kvpick_endpoint_inflight_requests"); got != 7 {
		t.Errorf("in-flight sum %v, want 7", got)
	}
	if got := m.Value("go_goroutines"); got != 12 {
		t.Errorf("goroutines %v", got)
	}
	if got := m.Value("process_resident_memory_bytes"); got != 20971520 {
		t.Errorf("rss %v", got)
	}
	if !math.IsNaN(m.Value("absent")) || m.Sum("absent") != 0 || m.Has("absent") {
		t.Error("absent metric: want NaN value, 0 sum")
	}
	if !math.IsNaN(m.Value("nan_metric")) {
		t.Error("NaN value not parsed")
	}
	w := m.Series["weird_labels"]
	if len(w) != 1 || w[0].Value != 1500 || w[0].Labels["a"] != "x,y" || w[0].Labels["b"] != `say "hi"` || w[0].Labels["c"] != `back\slash` {
		t.Errorf("weird labels parsed as %+v", w)
	}
	h := m.Histogram("kvpick_decision_duration_seconds")
	if len(h) != 4 || !math.IsInf(h[3].UpperBound, 1) || h[3].Count != 40 || h[0].UpperBound != 1e-5 {
		t.Errorf("histogram %+v", h)
	}
	if _, err := ParseMetrics(strings.NewReader("broken{a=\"x\" 1\n")); err == nil {
		t.Error("unterminated labels: want an error")
	}
	if _, err := ParseMetrics(strings.NewReader("novalue\n")); err == nil {
		t.Error("no value: want an error")
	}
}

func TestBucketQuantile(t *testing.T) {
	b := []Bucket{{1, 10}, {2, 20}, {4, 40}, {math.Inf(1), 40}}
	for _, c := range []struct{ q, want float64 }{
		{0.25, 1},   // rank 10: the top of the first bucket
		{0.3, 1.2},  // rank 12: 2/10 into (1,2]
		{0.5, 2},    // rank 20
		{0.75, 3},   // rank 30: half way into (2,4]
		{1, 4},      // rank 40
		{0.05, 0.2}, // first bucket interpolates from 0
	} {
		if got := BucketQuantile(c.q, b); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("q=%v: %v, want %v", c.q, got, c.want)
		}
	}
	// Ranks in the +Inf bucket return the largest finite bound, as histogram_quantile does.
	inf := []Bucket{{1, 10}, {math.Inf(1), 20}}
	if got := BucketQuantile(0.9, inf); got != 1 {
		t.Errorf("+Inf bucket: %v, want 1", got)
	}
	if !math.IsNaN(BucketQuantile(0.5, nil)) || !math.IsNaN(BucketQuantile(0.5, []Bucket{{1, 0}, {math.Inf(1), 0}})) {
		t.Error("no observations: want NaN")
	}
	// A window: after − before.
	before := []Bucket{{1, 5}, {2, 5}, {math.Inf(1), 5}}
	after := []Bucket{{1, 5}, {2, 15}, {math.Inf(1), 15}}
	d := SubBuckets(after, before)
	if d[0].Count != 0 || d[1].Count != 10 || d[2].Count != 10 {
		t.Errorf("SubBuckets = %+v", d)
	}
	if got := BucketQuantile(0.5, d); got != 1.5 {
		t.Errorf("windowed median %v, want 1.5", got)
	}
}

func TestNumJSON(t *testing.T) {
	b, err := json.Marshal(struct {
		A, B Num
	}{Num(math.NaN()), 2.5})
	if err != nil || string(b) != `{"A":null,"B":2.5}` {
		t.Fatalf("%s %v", b, err)
	}
	var back struct{ A, B Num }
	if err := json.Unmarshal(b, &back); err != nil || !math.IsNaN(float64(back.A)) || back.B != 2.5 {
		t.Fatalf("%+v %v", back, err)
	}
}
