package promtext

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
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
# TYPE kvpick_requests_total counter
kvpick_requests_total{outcome="routed",status="200"} 3
kvpick_requests_total{outcome="rejected",status="429"} 2
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 1.0
vllm:time_to_first_token_seconds_count{engine="0"} 1.0
vllm:time_to_first_token_seconds_sum{engine="0"} 0.05
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 1.0
vllm:time_to_first_token_seconds_count{engine="1"} 1.0
vllm:time_to_first_token_seconds_sum{engine="1"} 0.5
go_goroutines 12
process_resident_memory_bytes 2.0971520e+07
nan_metric NaN
`

func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader(sampleMetrics))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		want float64
	}{
		{"kvpick_endpoint_inflight_requests", 7}, // summed over its series
		{"go_goroutines", 12},
		{"process_resident_memory_bytes", 20971520},
		{"weird_labels", 1500},
		{"kvpick_requests_total", 5},
		{"kvpick_decision_duration_seconds_count", 40}, // a histogram's count and sum
		{"kvpick_decision_duration_seconds_sum", 0.0008},
		{"vllm:num_requests_waiting", 2}, // colons in names, as vLLM writes them
		{"vllm:time_to_first_token_seconds_count", 2},
	} {
		if got := m.Value(c.name); got != c.want || !m.Has(c.name) || m.Sum(c.name) != c.want {
			t.Errorf("%s = %v (has %v), want %v", c.name, got, m.Has(c.name), c.want)
		}
	}
	if !math.IsNaN(m.Value("absent")) || m.Sum("absent") != 0 || m.Has("absent") {
		t.Error("absent metric: want NaN value, 0 sum")
	}
	// A histogram's own name is no series (only _bucket, _sum, _count are).
	if m.Has("kvpick_decision_duration_seconds") {
		t.Error("a histogram's base name counts as a series")
	}
	if !m.Has("nan_metric") || !math.IsNaN(m.Value("nan_metric")) {
		t.Error("NaN value not parsed")
	}
	h := m.Histogram("kvpick_decision_duration_seconds")
	want := []Bucket{{1e-5, 10}, {2e-5, 20}, {4e-5, 40}, {math.Inf(1), 40}}
	if len(h) != len(want) {
		t.Fatalf("histogram %+v", h)
	}
	for i := range want {
		if h[i] != want[i] {
			t.Errorf("bucket %d = %+v, want %+v", i, h[i], want[i])
		}
	}
	// Two series of one histogram add up bucket by bucket; Python-style float counts parse.
	v := m.Histogram("vllm:time_to_first_token_seconds")
	if len(v) != 3 || v[0] != (Bucket{0.1, 1}) || v[1] != (Bucket{1, 2}) || v[2] != (Bucket{math.Inf(1), 2}) {
		t.Errorf("vllm histogram %+v", v)
	}
	if m.Histogram("go_goroutines") != nil || m.Histogram("absent") != nil {
		t.Error("a gauge or an absent metric read as a histogram")
	}
	for _, bad := range []string{
		"broken{a=\"x\" 1\n", // unterminated labels
		"novalue\n",          // no value
		"# TYPE x counter\nx 1\n# TYPE x counter\nx 2\n", // a family twice
	} {
		if _, err := ParseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

func TestScraper(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			_, _ = w.Write([]byte(sampleMetrics))
		case "/garbage":
			_, _ = w.Write([]byte("x{\n"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	m, err := NewScraper(srv.URL + "/metrics").Scrape(ctx)
	if err != nil || m.Value("go_goroutines") != 12 {
		t.Fatalf("scrape: %v, %v", m, err)
	}
	if _, err := NewScraper(srv.URL + "/nope").Scrape(ctx); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("404: %v", err)
	}
	if _, err := NewScraper(srv.URL + "/garbage").Scrape(ctx); err == nil {
		t.Error("unparsable page: want an error")
	}
	if m, err := NewScraper("").Scrape(ctx); m != nil || err != nil {
		t.Errorf("no URL: %v, %v", m, err)
	}
	if m.Has("x") || (*Metrics)(nil).Has("go_goroutines") || !math.IsNaN((*Metrics)(nil).Value("go_goroutines")) {
		t.Error("nil Metrics")
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
