package cacheroom_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/plugins/cacheroom"
	"github.com/kvpick/kvpick/pkg/prefix"
	"github.com/kvpick/kvpick/pkg/router"
)

func request(t *testing.T, content string) *router.Request { return routertest.Chat(t, content) }

// doc returns a distinct prompt of about n blocks of 64 bytes.
func doc(i, n int) string {
	line := fmt.Sprintf("document %04d says something. ", i)
	return strings.Repeat(line, n*64/len(line)+1)[:n*64]
}

// serve runs a request through the prefix plugin as the pipeline would and commits it to ep.
func serve(t *testing.T, px *prefix.Plugin, eps []*router.Endpoint, ep *router.Endpoint, content string) {
	t.Helper()
	req := request(t, content)
	px.Prepare(context.Background(), req)
	px.Score(context.Background(), req, eps, make([]float64, len(eps)))
	px.Picked(req, ep)
	px.ResponseHeaders(req, ep, 200)
	px.Done(req, ep)
}

func score(t *testing.T, px *prefix.Plugin, eps []*router.Endpoint, content string) []float64 {
	t.Helper()
	req := request(t, content)
	px.Prepare(context.Background(), req)
	px.Score(context.Background(), req, eps, make([]float64, len(eps)))
	s := make([]float64, len(eps))
	(&cacheroom.Scorer{}).Score(context.Background(), req, eps, s)
	px.Done(req, eps[0])
	return s
}

func newPrefix(t *testing.T, capacity int) *prefix.Plugin {
	t.Helper()
	px, err := prefix.New(prefix.Params{BlockSize: 64, MaxBlocksPerRequest: 10000, LRUCapacityPerEndpoint: capacity,
		MinMatchBlocks: 1, PendingTTL: config.Duration(time.Minute)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return px
}

// reused makes the pool's recent traffic reuse what is cached: a prompt that one endpoint holds
// is scored many times (nothing is committed), so the reuse rate approaches 1.
func reused(t *testing.T, px *prefix.Plugin, eps []*router.Endpoint) {
	t.Helper()
	serve(t, px, eps, eps[0], doc(9999, 8))
	for range 1000 {
		req := request(t, doc(9999, 8))
		px.Prepare(context.Background(), req)
		px.Score(context.Background(), req, eps, make([]float64, len(eps)))
		px.Done(req, eps[0])
	}
}

func TestScores(t *testing.T) {
	tests := []struct {
		name    string
		noReuse bool // the traffic shares nothing
		setup   func(t *testing.T, px *prefix.Plugin, eps []*router.Endpoint)
		query   string
		check   func(t *testing.T, s []float64)
	}{
		{
			name:  "caches with room: every endpoint scores 1",
			setup: func(t *testing.T, px *prefix.Plugin, eps []*router.Endpoint) { serve(t, px, eps, eps[0], doc(1, 20)) },
			query: doc(2, 20),
			check: func(t *testing.T, s []float64) {
				if s[0] != 1 || s[1] != 1 {
					t.Errorf("scores %v, want 1 and 1", s)
				}
			},
		},
		{
			name: "a new prompt prefers the endpoint whose least recently used block is older",
			setup: func(t *testing.T, px *prefix.Plugin, eps []*router.Endpoint) {
				// Both full; endpoint 1 was filled first, and endpoint 0 has been busy since.
				serve(t, px, eps, eps[1], doc(10, 100))
				for i := range 10 {
					serve(t, px, eps, eps[0], doc(20+i, 50))
				}
			},
			query: doc(99, 50),
			check: func(t *testing.T, s []float64) {
				if s[1] != 1 || s[0] >= 0.5 {
					t.Errorf("scores %v: the stale endpoint 1 must score 1 and the busy one well below", s)
				}
			},
		},
		{
			name: "an endpoint that holds the whole prompt evicts nothing and scores 1",
			setup: func(t *testing.T, px *prefix.Plugin, eps []*router.Endpoint) {
				serve(t, px, eps, eps[1], doc(10, 100))
				for i := range 10 {
					serve(t, px, eps, eps[0], doc(20+i, 50))
				}
				serve(t, px, eps, eps[0], doc(99, 50))
			},
			query: doc(99, 50),
			check: func(t *testing.T, s []float64) {
				if s[0] < 0.97 {
					t.Errorf("scores %v: endpoint 0 holds the prompt (all but its partial last block)", s)
				}
			},
		},
		{
			name:    "when the traffic shares nothing, eviction costs nothing and the term steps aside",
			noReuse: true,
			setup: func(t *testing.T, px *prefix.Plugin, eps []*router.Endpoint) {
				serve(t, px, eps, eps[1], doc(10, 100))
				for i := range 10 {
					serve(t, px, eps, eps[0], doc(20+i, 50))
				}
			},
			query: doc(99, 50),
			check: func(t *testing.T, s []float64) {
				if s[0] < 0.95 || s[1] != 1 {
					t.Errorf("scores %v: with no reuse both endpoints must score about 1", s)
				}
			},
		},
		{
			name: "an endpoint with room beats a full one",
			setup: func(t *testing.T, px *prefix.Plugin, eps []*router.Endpoint) {
				serve(t, px, eps, eps[0], doc(1, 100))
				serve(t, px, eps, eps[0], doc(2, 100))
				serve(t, px, eps, eps[1], doc(3, 10))
			},
			query: doc(4, 50),
			check: func(t *testing.T, s []float64) {
				if s[1] != 1 || s[0] >= 1 {
					t.Errorf("scores %v: endpoint 1 has room, endpoint 0 would evict", s)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			px := newPrefix(t, 100)
			eps := routertest.Endpoints(0, 0)
			if !tc.noReuse {
				reused(t, px, eps)
			}
			tc.setup(t, px, eps)
			tc.check(t, score(t, px, eps, tc.query))
		})
	}
}

func TestWithoutPrefixScoresScoresNothing(t *testing.T) {
	eps := routertest.Endpoints(0, 0)
	s := []float64{0.5, 0.5}
	(&cacheroom.Scorer{}).Score(context.Background(), request(t, "hi"), eps, s)
	if s[0] != 0.5 || s[1] != 0.5 {
		t.Errorf("scores changed to %v for a request the prefix scorer did not see", s)
	}
}
