package prefix

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/router"
)

// counters is a scrape that reports only the prefix-cache counters.
func counters(queries, hits uint64) *router.Metrics {
	return &router.Metrics{HasPrefixCounters: true, PrefixQueries: queries, PrefixHits: hits}
}

// Trust falls below 1 only where the server's hit share, over the window, falls more than the
// tolerance below what the picks sent there were predicted to find, and only once enough was
// predicted; a server that finds more, a restart, or a scrape without the counters leave it 1.
func TestServerHitShareBelowThePredictionDiscountsAnEndpoint(t *testing.T) {
	type step struct {
		held, total   int    // one pick's prediction (blocks), before the scrape
		picks         int    // how many such picks
		queries, hits uint64 // the scrape's cumulative counters; queries 0: no counters
	}
	tests := []struct {
		name  string
		steps []step
		want  float64
	}{
		{"server finds a quarter of the predicted 80%", []step{
			{queries: 1000, hits: 0},
			{held: 80, total: 100, picks: 10, queries: 1000 + 8000, hits: 2000},
		}, 0.25 / (0.8 * (1 - retentionTolerance))},
		{"server finds more than predicted: full trust", []step{
			{queries: 1000},
			{held: 30, total: 100, picks: 10, queries: 9000, hits: 7000},
		}, 1},
		{"within the tolerance: full trust", []step{
			{queries: 1000},
			{held: 80, total: 100, picks: 10, queries: 9000, hits: 5200},
		}, 1},
		{"too little predicted to conclude", []step{
			{queries: 1000},
			{held: 8, total: 10, picks: 10, queries: 9000, hits: 0},
		}, 1},
		{"the first scrape only sets the baseline", []step{
			{held: 80, total: 100, picks: 10, queries: 8000, hits: 0},
		}, 1},
		{"counters went back (restart): start over", []step{
			{queries: 100000},
			{held: 80, total: 100, picks: 10, queries: 108000, hits: 2000},
			{held: 80, total: 100, picks: 10, queries: 5000, hits: 0},
		}, 1},
		{"a scrape without the counters: full trust", []step{
			{queries: 1000},
			{held: 80, total: 100, picks: 10, queries: 9000, hits: 2000},
			{},
		}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r retention
			ep := router.NewEndpoint("10.0.0.1:8000", 3)
			for _, s := range tc.steps {
				for range s.picks {
					r.picked(ep, s.held, s.total)
				}
				m := &router.Metrics{}
				if s.queries > 0 {
					m = counters(s.queries, s.hits)
				}
				r.metrics(ep, m)
			}
			if got := r.trust(ep.Slot); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("trust %v, want %v", got, tc.want)
			}
			if got := r.trust(7); got != 1 {
				t.Fatalf("an endpoint never scraped: trust %v, want 1", got)
			}
		})
	}
}

// The sums decay per token the server looks up: once the server finds what is predicted again,
// a discount fades within a few windows.
func TestAServerThatRecoversRegainsTrust(t *testing.T) {
	var r retention
	ep := router.NewEndpoint("10.0.0.1:8000", 0)
	q, h := uint64(1000), uint64(0)
	r.metrics(ep, counters(q, h))
	step := func(hitShare float64) {
		for range 10 {
			r.picked(ep, 80, 100)
		}
		q += 16000
		h += uint64(hitShare * 16000)
		r.metrics(ep, counters(q, h))
	}
	for range 5 {
		step(0.2)
	}
	if got := r.trust(0); got > 0.5 {
		t.Fatalf("after a thrashing window trust is %v, want it well below 1", got)
	}
	for range 40 { // ~10 windows of 65,536 tokens
		step(0.8)
	}
	if got := r.trust(0); got != 1 {
		t.Fatalf("after the server found what was predicted again trust is %v, want 1", got)
	}
}

// With serverHitDiscount, a server that loses the prefixes the index credits it with has its
// match scaled down in Score; without it the score is the index's.
func TestServerHitDiscountScalesTheMatch(t *testing.T) {
	for _, on := range []bool{false, true} {
		pl, err := New(Params{BlockSize: 64, MaxBlocksPerRequest: 1000, LRUCapacityPerEndpoint: 10000,
			MinMatchBlocks: 2, PendingTTL: config.Duration(time.Minute), ServerHitDiscount: on}, nil)
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
		// Requests sent to endpoint 0, each predicted to find most of its prompt there, while its
		// server finds none of what it looks up.
		for i := range 40 {
			req := chatRequest(t, longSystem, "question one")
			pl.Prepare(context.Background(), req)
			scores(pl, req, eps)
			pl.Picked(req, eps[0])
			pl.ResponseHeaders(req, eps[0], 500) // nothing committed, the index stays as it is
			pl.Done(req, eps[0])
			pl.MetricsUpdated(eps[0], counters(uint64(1000+(i+1)*2000), 0))
		}
		next := chatRequest(t, longSystem, "question one")
		pl.Prepare(context.Background(), next)
		s := scores(pl, next, eps)
		if on && s[0] != 0 {
			t.Fatalf("discount on: endpoint 0 scored %v, want 0 (its server finds nothing)", s[0])
		}
		if !on && s[0] < 0.9 {
			t.Fatalf("discount off: endpoint 0 scored %v, want the index's match (~1)", s[0])
		}
	}
}
