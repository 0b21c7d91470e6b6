package prefix

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/router"
)

func capPlugin(t *testing.T, fromMetrics bool, maxEntries int) (*Plugin, []*router.Endpoint) {
	t.Helper()
	pl, err := New(Params{BlockSize: 64, MaxBlocksPerRequest: 1000, LRUCapacityPerEndpoint: 10000,
		MinMatchBlocks: 2, PendingTTL: config.Duration(time.Minute), CalibrateCapacity: true,
		CapacityFromMetrics: fromMetrics, MaxIndexEntries: maxEntries, EvictionEvidence: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var eps []*router.Endpoint
	for i := range 4 {
		eps = append(eps, router.NewEndpoint(fmt.Sprintf("10.0.0.%d:8000", i+1), i))
	}
	pl.EndpointsChanged(eps, nil)
	for _, e := range eps {
		pl.index.Insert(e.Slot, chain(uint64(e.Slot), 1)) // give every endpoint its LRU
	}
	return pl, eps
}

func report(pl *Plugin, ep *router.Endpoint, numGPUBlocks, blockSize int) {
	m := &router.Metrics{NumGPUBlocks: numGPUBlocks, BlockSize: blockSize}
	ep.SetMetrics(m)
	pl.MetricsUpdated(ep, m)
}

// TestCapacityFollowsTheServersReports: an endpoint whose server reports its KV cache gets an
// index share of 85% of it (at 4 bytes per token: 16 tokens per 64-byte block), following
// changes; the others keep lruCapacityPerEndpoint; with capacityFromMetrics off the reports
// change nothing.
func TestCapacityFollowsTheServersReports(t *testing.T) {
	cases := []struct {
		name        string
		fromMetrics bool
		reports     [][2]int // per report to endpoint 0: num_gpu_blocks, block_size
		want0       int
	}{
		{"no report: the configured capacity", true, nil, 10000},
		{"1,000 blocks of 16 tokens: 850 index blocks", true, [][2]int{{1000, 16}}, 850},
		{"SGLang's tokens (block size 1)", true, [][2]int{{32000, 1}}, 1700},
		{"a new report is followed", true, [][2]int{{1000, 16}, {2000, 16}}, 1700},
		{"pinned by config", false, [][2]int{{1000, 16}}, 10000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pl, eps := capPlugin(t, tc.fromMetrics, 0)
			for _, r := range tc.reports {
				report(pl, eps[0], r[0], r[1])
				pl.caps.settle()
			}
			pl.caps.settle()
			if got := pl.index.CapacityOf(0); got != tc.want0 {
				t.Fatalf("endpoint 0 capacity %d, want %d", got, tc.want0)
			}
			if got := pl.index.CapacityOf(1); got != 10000 {
				t.Fatalf("endpoint 1 (no report) capacity %d, want 10000", got)
			}
		})
	}
}

// TestPoolWideBoundScalesEveryEndpoint: capacities that add up to more than maxIndexEntries are
// scaled down alike, and an endpoint leaving gives its share back.
func TestPoolWideBoundScalesEveryEndpoint(t *testing.T) {
	pl, eps := capPlugin(t, true, 20000)
	pl.caps.settle()
	for _, e := range eps {
		if got := pl.index.CapacityOf(e.Slot); got != 5000 {
			t.Fatalf("endpoint %d capacity %d, want 5000 (4 x 10000 bounded to 20000)", e.Slot, got)
		}
	}
	eps[3].MarkRemoved()
	pl.EndpointsChanged(nil, eps[3:])
	pl.caps.settle()
	if got := pl.index.CapacityOf(0); got != 6666 {
		t.Fatalf("after one of four left: capacity %d, want 6666", got)
	}
}

// TestCapacityChangesDoNotHoldUpTheResponsePath: a usage report that moves the calibration
// returns at once even while the index is busy; the rescale happens in the background.
func TestCapacityChangesDoNotHoldUpTheResponsePath(t *testing.T) {
	pl, eps := capPlugin(t, true, 0)
	var reqs []*router.Request
	for i := range calibMinSamples {
		req := chatRequest(t, longSystem, fmt.Sprintf("question %d", i))
		pl.Prepare(context.Background(), req)
		scores(pl, req, eps[:2])
		pl.Picked(req, eps[0])
		reqs = append(reqs, req)
	}
	pl.index.mu.Lock() // the index is busy (a long commit, say)
	done := make(chan struct{})
	go func() {
		for _, req := range reqs {
			st := pl.state(req)
			pl.Usage(req, eps[0], openai.Usage{PromptTokens: st.rendered / 8}) // 8 bytes per token
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("usage reports blocked on the index lock: the rescale runs on the response path")
	}
	pl.index.mu.Unlock()
	pl.caps.settle()
	if got := pl.index.CapacityOf(0); got < 19800 || got > 20200 {
		t.Fatalf("capacity %d after the rescale, want 20000±1%% (8 bytes per token)", got)
	}
	for _, req := range reqs {
		pl.Done(req, eps[0])
	}
}

// TestEvictionEvidenceTrimsWhatTheServerNoLongerHolds: the index promises a prompt the server
// has evicted (its capacity was set too large); the server's cached_tokens says so, and the
// endpoint's entries last used no later than that prompt are dropped, newer ones kept. A report
// that matches the prediction, or one without cached_tokens, changes nothing.
func TestEvictionEvidenceTrimsWhatTheServerNoLongerHolds(t *testing.T) {
	cases := []struct {
		name       string
		cached     int
		hasCached  bool
		wantOldHit bool // the older prompt is still predicted afterwards
	}{
		{"server found nothing: trimmed", 0, true, false},
		{"server found all of it: kept", 1 << 20, true, true},
		{"no cached_tokens reported: kept", 0, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pl, eps := capPlugin(t, true, 0)
			commit := func(system string) {
				req := chatRequest(t, system, "q")
				pl.Prepare(context.Background(), req)
				scores(pl, req, eps[:2])
				pl.Picked(req, eps[0])
				pl.ResponseHeaders(req, eps[0], 200)
				pl.Done(req, eps[0])
			}
			older, target, newer := "older "+longSystem, "target "+longSystem, "newer "+longSystem
			commit(older)
			commit(target)
			commit(newer)
			req := chatRequest(t, target, "q")
			pl.Prepare(context.Background(), req)
			scores(pl, req, eps[:2])
			if m := MatchesOf(req).Blocks(eps[0]); m < 10 {
				t.Fatalf("target predicted %d blocks on endpoint 0, want all of it", m)
			}
			pl.Picked(req, eps[0])
			pl.ResponseHeaders(req, eps[0], 200) // the server recomputed it: committed again
			pl.Usage(req, eps[0], openai.Usage{PromptTokens: 1000, CachedTokens: tc.cached, HasCached: tc.hasCached})
			pl.Done(req, eps[0])

			probe := func(system string) int {
				r := chatRequest(t, system, "q")
				pl.Prepare(context.Background(), r)
				scores(pl, r, eps[:2])
				n := MatchesOf(r).Blocks(eps[0])
				pl.Done(r, eps[0])
				return n
			}
			if got := probe(older) > 0; got != tc.wantOldHit {
				t.Fatalf("older prompt still predicted: %v, want %v", got, tc.wantOldHit)
			}
			if probe(target) == 0 || probe(newer) == 0 {
				t.Fatal("the request's own prompt (recomputed) and newer prompts must stay")
			}
		})
	}
}
