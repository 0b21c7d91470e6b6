package kvfit_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/plugins/kvfit"
	"github.com/kvpick/kvpick/pkg/plugins/maxscore"
	"github.com/kvpick/kvpick/pkg/pool"
	"github.com/kvpick/kvpick/pkg/prefix"
	"github.com/kvpick/kvpick/pkg/router"
)

func newPrefix(t *testing.T) *prefix.Plugin {
	t.Helper()
	px, err := prefix.New(prefix.Params{BlockSize: 64, MaxBlocksPerRequest: 10000, LRUCapacityPerEndpoint: 1000,
		MinMatchBlocks: 1, PendingTTL: config.Duration(time.Minute)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	px.KeepRunningRecords()
	return px
}

// prompt is a user message that renders to about blocks×64 bytes: with the assumed 4 bytes per
// token, blocks×16 tokens.
func prompt(blocks int) string { return strings.Repeat("x", blocks*64) }

// metrics returns a fresh scrape reporting usage of a cache of capacity tokens (0: size not
// reported) taken when the endpoint had made picks picks.
func metrics(now time.Time, usage float64, capacity int, picks int64) *router.Metrics {
	m := &router.Metrics{KVUsage: usage, HasKVUsage: true, PicksAtScrape: picks,
		ScrapedAt: now, StaleAt: now.Add(time.Second)}
	if capacity > 0 {
		m.NumGPUBlocks, m.BlockSize = capacity/16, 16
	}
	return m
}

func TestScoreIsTheShareOfThePromptThatFitsInTheFreeRoom(t *testing.T) {
	now := time.Now()
	// The prompt: 100 blocks of 64 bytes = 1,600 tokens at 4 bytes per token (the chat
	// rendering's few separator bytes make no further full block), plus 64 tokens of decode room.
	const blocks = 100
	need := float64(blocks)*16 + 64
	tests := []struct {
		name    string
		metrics *router.Metrics // nil: never scraped
		held    string          // "running": a request running there shares the prompt; "cached": one that ended did
		want    float64
	}{
		{"never scraped: no evidence of a shortage", nil, "", 1},
		{"stale scrape: no evidence", &router.Metrics{KVUsage: 1, HasKVUsage: true, NumGPUBlocks: 100, BlockSize: 16,
			ScrapedAt: now.Add(-time.Hour), StaleAt: now.Add(-time.Minute)}, "", 1},
		{"usage not reported: no evidence", &router.Metrics{Waiting: 3, HasQueue: true, NumGPUBlocks: 100, BlockSize: 16,
			ScrapedAt: now, StaleAt: now.Add(time.Second)}, "", 1},
		{"plenty of room", metrics(now, 0.5, 100_000, 0), "", 1},
		{"room for exactly the prompt", metrics(now, 1-need/10_000, 10_000, 0), "", 1},
		{"room for half of it", metrics(now, 1-need/2/10_000, 10_000, 0), "", 0.5},
		{"full", metrics(now, 1, 10_000, 0), "", 0},
		{"usage above 1 is read as full", metrics(now, 1.5, 10_000, 0), "", 0},
		{"cache size not reported: no evidence", metrics(now, 0.9, 0, 0), "", 1},
		{"usage NaN: no evidence", metrics(now, math.NaN(), 10_000, 0), "", 1},
		{"a request running there shares the prompt: only the decode room is needed", metrics(now, 1-64.0/10_000, 10_000, 0), "running", 1},
		{"a request running there shares the prompt, no room to decode", metrics(now, 1-32.0/10_000, 10_000, 0), "running", 0.5},
		// vLLM counts cached blocks that no running request references as free: reusing them
		// takes them out of the free room, so the whole prompt is needed.
		{"the endpoint caches the prompt, nothing running references it", metrics(now, 1-need/2/10_000, 10_000, 0), "cached", 0.5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			px := newPrefix(t)
			eps := routertest.Endpoints(0)
			if tc.metrics != nil {
				eps[0].SetMetrics(tc.metrics)
			}
			if tc.held != "" {
				served := routertest.Chat(t, prompt(blocks))
				px.Prepare(context.Background(), served)
				px.Score(context.Background(), served, eps, make([]float64, 1))
				px.Picked(served, eps[0])
				px.ResponseHeaders(served, eps[0], 200)
				if tc.held == "running" {
					defer px.Done(served, eps[0])
				} else {
					px.Done(served, eps[0])
				}
			}
			req := routertest.Chat(t, prompt(blocks))
			req.Now = now
			px.Prepare(context.Background(), req)
			px.Score(context.Background(), req, eps, make([]float64, 1))
			if m := prefix.MatchesOf(req); m.Total != blocks || m.TokensPerBlock != 16 {
				t.Fatalf("the prompt is %d blocks of %v tokens, the test assumes %d of 16", m.Total, m.TokensPerBlock, blocks)
			}
			s := []float64{-1}
			(&kvfit.Scorer{}).Score(context.Background(), req, eps, s)
			if math.Abs(s[0]-tc.want) > 1e-9 {
				t.Fatalf("score %v, want %v", s[0], tc.want)
			}
		})
	}
}

// TestServersThatReportNoSizeAreSizedByTheEvidence: a server that reports its KV usage but not
// its cache's size scores 1 (no evidence) until its cached_tokens reports have taught the prefix
// scorer a size; from then on that size stands in for the reported one.
func TestServersThatReportNoSizeAreSizedByTheEvidence(t *testing.T) {
	now := time.Now()
	px, err := prefix.New(prefix.Params{BlockSize: 64, MaxBlocksPerRequest: 10000, LRUCapacityPerEndpoint: 1000,
		MinMatchBlocks: 1, PendingTTL: config.Duration(time.Minute), CalibrateCapacity: true,
		CapacityFromMetrics: true, EvictionEvidence: true, LearnCapacity: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	px.KeepRunningRecords()
	eps := routertest.Endpoints(0)
	px.EndpointsChanged(eps, nil)
	const blocks = 100
	// serve runs a prompt on the endpoint to its end; cached < 0: no cached_tokens reported.
	serve := func(text string, cached int) {
		req := routertest.Chat(t, text)
		px.Prepare(context.Background(), req)
		px.Score(context.Background(), req, eps, make([]float64, 1))
		px.Picked(req, eps[0])
		px.ResponseHeaders(req, eps[0], 200)
		px.Usage(req, eps[0], openai.Usage{PromptTokens: blocks * 16, CachedTokens: max(cached, 0), HasCached: cached >= 0})
		px.Done(req, eps[0])
	}
	score := func() (float64, prefix.Matches) {
		eps[0].SetMetrics(metrics(now, 0.8, 0, eps[0].Picks()))
		req := routertest.Chat(t, prompt(blocks))
		req.Now = now
		px.Prepare(context.Background(), req)
		px.Score(context.Background(), req, eps, make([]float64, 1))
		s := []float64{-1}
		(&kvfit.Scorer{}).Score(context.Background(), req, eps, s)
		return s[0], prefix.MatchesOf(req)
	}
	if s, _ := score(); s != 1 {
		t.Fatalf("no size reported (usage 0.8), nothing learned: score %v, want 1", s)
	}
	// Three prompts served, then the server finds nothing of the oldest one: the index trims
	// what it used no later, and bounds the endpoint's capacity by what it kept (the newer
	// prompts: a few hundred blocks, a cache far smaller than this 100-block prompt's need).
	older, target, newer := strings.Repeat("o", blocks*64), strings.Repeat("t", blocks*64), strings.Repeat("n", blocks*64)
	for _, p := range []string{older, target, newer} {
		serve(p, -1)
	}
	serve(target, 0)
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, m := score()
		size := m.LearnedCacheTokens(eps[0])
		if size > 0 {
			need := float64(m.Total)*m.TokensPerBlock + 64
			if want := min(1, 0.2*size/need); math.Abs(s-want) > 1e-9 || s >= 1 {
				t.Fatalf("learned size %v tokens, usage 0.8, need %v: score %v, want %v (below 1)", size, need, s, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no size learned from the report that the server had lost a prompt")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPicksSinceTheScrapeTakeRoom: requests sent to an endpoint after its last scrape are not
// in its reported usage; each counts as needing as much as the request being scored, so that a
// burst does not pile onto the endpoint that had room at the scrape.
func TestPicksSinceTheScrapeTakeRoom(t *testing.T) {
	now := time.Now()
	px := newPrefix(t)
	p := pool.New()
	p.Set([]string{"10.0.0.1:8000", "10.0.0.2:8000"})
	pl, err := router.New(router.Config{Pool: p, Plugins: []router.Plugin{px, &kvfit.Scorer{}, &maxscore.Picker{}}})
	if err != nil {
		t.Fatal(err)
	}
	eps := p.Snapshot()
	const blocks = 100
	need := float64(blocks)*16 + 64
	// Endpoint 0 has room for two and a half such prompts at its scrape, endpoint 1 for 0.9 of
	// one: no two scores tie, so the picks do not depend on the tie-break's hash.
	eps[0].SetMetrics(metrics(now, 1-2.5*need/100_000, 100_000, 0))
	eps[1].SetMetrics(metrics(now, 1-0.9*need/100_000, 100_000, 0))
	var picked []string
	for i := range 4 {
		req := routertest.Chat(t, strings.Repeat(string(rune('a'+i)), blocks*64)) // nothing shared
		req.Now = now
		d, err := pl.Schedule(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		picked = append(picked, d.Endpoint.Addr)
		defer pl.Done(req, d.Endpoint)
	}
	// Room in prompts before each pick (scores): (2.5, 0.9) → (1.5, 0.9) → (0.5, 0.9) →
	// (0.5, -0.1): endpoint 0 wins while a whole prompt fits there, then endpoint 1 while its
	// 0.9 beats 0.5, then 0.5 beats nothing. Without the picks, endpoint 0 would win every time.
	want := []string{"10.0.0.1:8000", "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.1:8000"}
	for i := range want {
		if picked[i] != want[i] {
			t.Fatalf("picks %v, want %v: each pick since the scrape takes a prompt's room", picked, want)
		}
	}
}

// BenchmarkScore64 scores 64 scraped endpoints ("unsized" below). "roomy": most have room for the whole prompt
// (usage i/64 of 200,000 tokens; five do not), kv-fit alone, its running-record lookup cached
// after the first call. "short": no endpoint has room, 4 requests sharing the prompt's first
// half run on each, and each iteration scores with the prefix scorer first (as the pipeline
// does), so the running records are looked up every time; "prefix-only" is that prefix score
// alone, to subtract.
func BenchmarkScore64(b *testing.B) {
	now := time.Now()
	setup := func(b *testing.B, usage func(i int) float64, running bool) (*prefix.Plugin, *router.Request, []*router.Endpoint) {
		px, err := prefix.New(prefix.Params{BlockSize: 64, MaxBlocksPerRequest: 10000, LRUCapacityPerEndpoint: 1000,
			MinMatchBlocks: 1, PendingTTL: config.Duration(time.Minute)}, nil)
		if err != nil {
			b.Fatal(err)
		}
		px.KeepRunningRecords()
		eps := routertest.Endpoints(make([]int64, 64)...)
		for i, e := range eps {
			e.SetMetrics(metrics(now, usage(i), 200_000, 0))
		}
		if running {
			for i, e := range eps {
				for k := range 4 {
					r := routertest.Chat(b, prompt(500)+strings.Repeat(string(rune('a'+k)), 64*(i+1)))
					px.Prepare(context.Background(), r)
					px.Score(context.Background(), r, eps, make([]float64, len(eps)))
					px.Picked(r, e)
					b.Cleanup(func() { px.Done(r, e) })
				}
			}
		}
		req := routertest.Chat(b, prompt(1000))
		req.Now = now
		px.Prepare(context.Background(), req)
		px.Score(context.Background(), req, eps, make([]float64, len(eps)))
		return px, req, eps
	}
	var sc kvfit.Scorer
	b.Run("roomy", func(b *testing.B) {
		_, req, eps := setup(b, func(i int) float64 { return float64(i) / 64 }, false)
		s := make([]float64, len(eps))
		b.ReportAllocs()
		for b.Loop() {
			sc.Score(context.Background(), req, eps, s)
		}
	})
	// "unsized": the servers report their usage but not their size, and nothing has been
	// learned: each endpoint costs the lookup of a learned size that is not there.
	b.Run("unsized", func(b *testing.B) {
		_, req, eps := setup(b, func(i int) float64 { return float64(i) / 64 }, false)
		for i, e := range eps {
			e.SetMetrics(metrics(now, float64(i)/64, 0, 0))
		}
		s := make([]float64, len(eps))
		b.ReportAllocs()
		for b.Loop() {
			sc.Score(context.Background(), req, eps, s)
		}
		if s[63] != 1 {
			b.Fatalf("score %v without a size, want 1", s[63])
		}
	})
	full := func(int) float64 { return 0.99 }
	b.Run("short", func(b *testing.B) {
		px, req, eps := setup(b, full, true)
		s := make([]float64, len(eps))
		b.ReportAllocs()
		for b.Loop() {
			px.Score(context.Background(), req, eps, s)
			sc.Score(context.Background(), req, eps, s)
		}
		if m := prefix.MatchesOf(req); m.RunningBlocks(eps[0]) != 500 {
			b.Fatalf("running blocks %d, want 500", m.RunningBlocks(eps[0]))
		}
	})
	b.Run("prefix-only", func(b *testing.B) {
		px, req, eps := setup(b, full, true)
		s := make([]float64, len(eps))
		b.ReportAllocs()
		for b.Loop() {
			px.Score(context.Background(), req, eps, s)
		}
	})
}
