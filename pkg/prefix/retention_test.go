package prefix

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvpick/kvpick/pkg/router"
)

// counters is a scrape that reports only the prefix-cache counters.
func counters(queries, hits uint64) *router.Metrics {
	return &router.Metrics{HasPrefixCounters: true, PrefixQueries: queries, PrefixHits: hits}
}

// The shares compare what the picks sent to an endpoint were predicted to find with what its
// server found, over the same window; nothing is published before the window holds enough,
// after a restart of the server's counters, or from a scrape without them.
func TestHitSharesPredictedAndFoundByTheServer(t *testing.T) {
	type step struct {
		held, total   int    // one pick's prediction (blocks), before the scrape
		picks         int    // how many such picks
		queries, hits uint64 // the scrape's cumulative counters; queries 0: no counters
	}
	tests := []struct {
		name                    string
		steps                   []step
		ok                      bool
		wantPredicted, wantSeen float64
	}{
		{"server finds a quarter while 80% was predicted", []step{
			{queries: 1000},
			{held: 80, total: 100, picks: 10, queries: 9000, hits: 2000},
		}, true, 0.8, 0.25},
		{"server finds more than predicted", []step{
			{queries: 1000},
			{held: 30, total: 100, picks: 10, queries: 9000, hits: 7000},
		}, true, 0.3, 0.875},
		{"too few prompt blocks to say", []step{
			{queries: 1000},
			{held: 8, total: 10, picks: 10, queries: 9000},
		}, false, 0, 0},
		{"the first scrape only sets the baseline", []step{
			{held: 80, total: 100, picks: 10, queries: 8000},
		}, false, 0, 0},
		{"counters went back (restart): start over", []step{
			{queries: 100000},
			{held: 80, total: 100, picks: 10, queries: 108000, hits: 2000},
			{held: 80, total: 100, picks: 10, queries: 5000},
		}, false, 0, 0},
		{"a scrape without the counters", []step{
			{queries: 1000},
			{held: 80, total: 100, picks: 10, queries: 9000, hits: 2000},
			{},
		}, false, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r retention
			ep := router.NewEndpoint("10.0.0.1:8000", 3)
			var pred, seen float64
			var ok bool
			for _, s := range tc.steps {
				for range s.picks {
					r.picked(ep, s.held, s.total)
				}
				m := &router.Metrics{}
				if s.queries > 0 {
					m = counters(s.queries, s.hits)
				}
				pred, seen, ok = r.metrics(ep, m)
			}
			if ok != tc.ok || math.Abs(pred-tc.wantPredicted) > 1e-9 || math.Abs(seen-tc.wantSeen) > 1e-9 {
				t.Fatalf("shares %v / %v (published %v), want %v / %v (%v)", pred, seen, ok, tc.wantPredicted, tc.wantSeen, tc.ok)
			}
		})
	}
}

// The sums decay per token the server looks up: a few windows after a server starts finding
// what is predicted again, its share has caught up.
func TestTheServerShareFollowsARecovery(t *testing.T) {
	var r retention
	ep := router.NewEndpoint("10.0.0.1:8000", 0)
	q, h := uint64(1000), uint64(0)
	r.metrics(ep, counters(q, h))
	step := func(hitShare float64) (float64, float64) {
		for range 10 {
			r.picked(ep, 80, 100)
		}
		q += 16000
		h += uint64(hitShare * 16000)
		p, s, _ := r.metrics(ep, counters(q, h))
		return p, s
	}
	for range 5 {
		step(0.2)
	}
	if _, s := step(0.2); math.Abs(s-0.2) > 0.01 {
		t.Fatalf("while the server finds 20%%: share %v", s)
	}
	var p, s float64
	for range 40 { // ~10 windows of 65,536 tokens
		p, s = step(0.8)
	}
	if math.Abs(s-0.8) > 0.01 || math.Abs(p-0.8) > 1e-9 {
		t.Fatalf("after the server found 80%% again: shares %v / %v, want 0.8 / 0.8", p, s)
	}
}

// Through the plugin: the prediction is Score's match for the picked endpoint, and both shares
// reach the endpoint's gauges; a removed endpoint's series go.
func TestHitSharesAreExportedPerEndpoint(t *testing.T) {
	reg := prometheus.NewRegistry()
	pl, err := New(testPlugin(t).p, reg)
	if err != nil {
		t.Fatal(err)
	}
	eps := twoEndpoints()
	served := chatRequest(t, longSystem, "question one")
	pl.Prepare(context.Background(), served)
	pl.Picked(served, eps[0])
	pl.ResponseHeaders(served, eps[0], 200)
	pl.Done(served, eps[0])
	pl.MetricsUpdated(eps[0], counters(1000, 0))
	for i := range 40 {
		req := chatRequest(t, longSystem, "question one")
		pl.Prepare(context.Background(), req)
		scores(pl, req, eps)
		pl.Picked(req, eps[0])
		pl.ResponseHeaders(req, eps[0], 500) // nothing new committed: each is predicted a full hit
		pl.Done(req, eps[0])
		pl.MetricsUpdated(eps[0], counters(uint64(1000+(i+1)*2000), uint64((i+1)*500)))
	}
	want := `
# HELP kvpick_prefix_endpoint_server_hit_share Share of the prompt tokens an endpoint's server looked up in its prefix cache that it found there (vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total), over the same window: well below the predicted share, the server loses prefixes the picker counts on.
# TYPE kvpick_prefix_endpoint_server_hit_share gauge
kvpick_prefix_endpoint_server_hit_share{endpoint="10.0.0.1:8000"} 0.25
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvpick_prefix_endpoint_server_hit_share"); err != nil {
		t.Fatal(err)
	}
	got := testutil.ToFloat64(pl.metrics.predictedShare.WithLabelValues(eps[0].Addr))
	if got < 0.9 {
		t.Fatalf("predicted share %v, want ~1 (every prompt matched the committed one)", got)
	}
	pl.EndpointsChanged(nil, eps[:1])
	if n := testutil.CollectAndCount(pl.metrics.serverShare); n != 0 {
		t.Fatalf("%d server-share series left after the endpoint was removed", n)
	}
}
