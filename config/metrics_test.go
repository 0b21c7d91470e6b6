package config

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestModelServerMetricsDefaults(t *testing.T) {
	m := Default().Pool.Metrics
	if m.Path != "/metrics" || m.RefreshInterval.D() != 50*time.Millisecond || m.Timeout.D() != 250*time.Millisecond ||
		m.StalenessThreshold.D() != 500*time.Millisecond || m.MaxBodyBytes != 1<<20 || m.Engine != "auto" || m.Names != (MetricNames{}) ||
		!m.FilterFamilies {
		t.Fatalf("pool.metrics defaults %+v", m)
	}
	c, err := Parse([]byte("pool:\n  metrics:\n    filterFamilies: false\n"))
	if err != nil || c.Pool.Metrics.FilterFamilies {
		t.Fatalf("filterFamilies: false gives %v, %v", c.Pool.Metrics.FilterFamilies, err)
	}
}

func TestModelServerMetricsConfig(t *testing.T) {
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"custom names", "pool:\n  metrics:\n    engine: custom\n    names:\n      waiting: tgi_queue_size\n      kvUsage: tgi:kv_usage\n", ""},
		{"scraping off needs no other field", "pool:\n  metrics:\n    refreshInterval: 0s\n    timeout: 0s\n    path: ''\n", ""},
		{"sglang", "pool:\n  metrics:\n    engine: sglang\n", ""},
		{"unknown engine", "pool:\n  metrics:\n    engine: tgi\n", `pool.metrics.engine "tgi": want one of auto, vllm, sglang, custom`},
		{"custom without names", "pool:\n  metrics:\n    engine: custom\n", "pool.metrics.names: engine custom needs at least one metric name"},
		{"custom prefix-cache counters", "pool:\n  metrics:\n    engine: custom\n    names:\n      waiting: q\n      prefixQueries: lookups_total\n      prefixHits: hits_total\n", ""},
		{"custom prefix-cache queries without hits", "pool:\n  metrics:\n    engine: custom\n    names:\n      waiting: q\n      prefixQueries: lookups_total\n",
			"pool.metrics.names: prefixQueries and prefixHits go together"},
		{"names without custom", "pool:\n  metrics:\n    names:\n      waiting: q\n", `pool.metrics.names: only used with engine: custom (engine is "auto")`},
		{"bad metric name", "pool:\n  metrics:\n    engine: custom\n    names:\n      running: 'requests running'\n", "pool.metrics.names.running \"requests running\": not a Prometheus metric name"},
		{"unknown name field", "pool:\n  metrics:\n    engine: custom\n    names:\n      queue: q\n", `unknown field "queue"`},
		{"negative interval", "pool:\n  metrics:\n    refreshInterval: -1s\n", "pool.metrics.refreshInterval -1s: must not be negative"},
		{"sub-millisecond interval", "pool:\n  metrics:\n    refreshInterval: 100us\n", "pool.metrics.refreshInterval 100µs: want at least 1ms"},
		{"relative path", "pool:\n  metrics:\n    path: metrics\n", `pool.metrics.path "metrics": want an absolute path`},
		{"path with a space", "pool:\n  metrics:\n    path: '/metrics page'\n", `pool.metrics.path "/metrics page": spaces and control characters must be %-encoded`},
		{"path with a query", "pool:\n  metrics:\n    path: '/metrics?name[]=vllm:num_requests_waiting'\n", ""},
		{"filter off", "pool:\n  metrics:\n    filterFamilies: false\n", ""},
		{"filter not a boolean", "pool:\n  metrics:\n    filterFamilies: sometimes\n", "filterFamilies"},
		{"no timeout", "pool:\n  metrics:\n    timeout: 0s\n", "pool.metrics.timeout 0s: want more than 0"},
		{"staleness under two intervals", "pool:\n  metrics:\n    refreshInterval: 1s\n",
			"pool.metrics.stalenessThreshold 500ms (--metrics-staleness-threshold): want at least twice refreshInterval 1s (--refresh-metrics-interval)"},
		{"tiny body limit", "pool:\n  metrics:\n    maxBodyBytes: 100\n", "pool.metrics.maxBodyBytes 100: want 1024..67108864"},
		{"bad duration", "pool:\n  metrics:\n    timeout: soon\n", "invalid duration"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("err = %v, want it to mention %q", err, tc.wantErr)
			}
		})
	}
}

// A written configuration (the replay marshals one for each picker it starts) leaves out empty
// prefix-cache counter names: picker binaries built before those fields existed refuse unknown
// fields, and must still start from a configuration this build writes.
func TestWrittenConfigLeavesOutEmptyCounterNames(t *testing.T) {
	b, err := json.Marshal(Default())
	if err != nil {
		t.Fatal(err)
	}
	// Fields added since: a picker built before them refuses a configuration naming them.
	for _, f := range []string{"prefixQueries", "prefixHits", "peers"} {
		if strings.Contains(string(b), `"`+f+`"`) {
			t.Fatalf("the default configuration, written, names %s: %s", f, b)
		}
	}
	c := Default()
	c.Pool.Metrics.Engine = "custom"
	c.Pool.Metrics.Names = MetricNames{Waiting: "q", PrefixQueries: "lookups_total", PrefixHits: "hits_total"}
	b, err = json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"prefixHits":"hits_total"`) {
		t.Fatalf("a set name was left out: %s", b)
	}
	c.Peers.Addresses = []string{"kvpick-peers:9090"}
	if b, err = json.Marshal(c); err != nil || !strings.Contains(string(b), `"peers":{"addresses":["kvpick-peers:9090"],"interval":"20ms"`) {
		t.Fatalf("peers with addresses left out: %v %s", err, b)
	}
}
