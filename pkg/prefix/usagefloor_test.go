package prefix

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/router"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// pickOwned picks ep for a chat request with system as its system prompt and turn as its
// question, as the pipeline does with pick number seq; it returns the request and its prompt's
// blocks.
func pickOwned(t *testing.T, pl *Plugin, eps []*router.Endpoint, ep *router.Endpoint, system, turn string, seq int64) (*router.Request, int) {
	t.Helper()
	req := chatRequest(t, system, turn)
	pl.Prepare(context.Background(), req)
	scores(pl, req, eps)
	req.PickSeq = seq
	pl.Picked(req, ep)
	return req, MatchesOf(req).Total
}

// scrapeUsage publishes a scrape of ep reporting usage (no cache size unless blocks > 0).
func scrapeUsage(pl *Plugin, ep *router.Endpoint, usage float64, blocks int) {
	m := &router.Metrics{KVUsage: usage, HasKVUsage: true}
	if blocks > 0 {
		m.NumGPUBlocks, m.BlockSize = blocks, 16
	}
	ep.SetMetrics(m)
	pl.MetricsUpdated(ep, m)
	pl.caps.settle()
}

// TestUsageFloorSizesAServerThatReportsNoSize: the blocks that the picker's requests past their
// prefill reference on an endpoint, over the KV usage its server reports, bound its cache from
// below; the bound sizes the endpoint for kv-fit and lifts its index capacity to 70% of it.
func TestUsageFloorSizesAServerThatReportsNoSize(t *testing.T) {
	const tpb = 16 // tokens per 64-byte block at the assumed 4 bytes per token
	cases := []struct {
		name      string
		learn     bool
		prompts   []string  // system prompts of the requests picked on endpoint 0, pick numbers 1..n
		sameFirst bool      // every prompt shares its first blocks (one system prompt, other questions)
		through   int64     // PrefilledThrough of endpoint 0
		ended     bool      // every request's stream ended before the scrapes
		elsewhere bool      // every request was answered by endpoint 1 (the proxy retried there)
		usages    []float64 // scrapes of endpoint 0
		reported  int       // num_gpu_blocks the server reports (0: none)
		wantUsage float64   // the usage the floor is taken at (0: no floor)
	}{
		{"two scrapes at 25%: the blocks over the usage", true, []string{"a", "b", "c"}, false, 3, false, false, []float64{0.25, 0.25}, 0, 0.25},
		{"the smaller of the last two bounds counts", true, []string{"a", "b", "c"}, false, 3, false, false, []float64{0.2, 0.4}, 0, 0.4},
		{"a floor only rises", true, []string{"a", "b", "c"}, false, 3, false, false, []float64{0.2, 0.2, 0.5, 0.5}, 0, 0.2},
		{"one scrape alone sets nothing", true, []string{"a", "b", "c"}, false, 3, false, false, []float64{0.25}, 0, 0},
		{"requests still in their prefill count for nothing", true, []string{"a", "b", "c"}, false, 0, false, false, []float64{0.25, 0.25}, 0, 0},
		{"only the requests past their prefill count", true, []string{"a", "b", "c"}, false, 1, false, false, []float64{0.25, 0.25}, 0, 0.25},
		{"prompts with one first block count as the longest", true, []string{"a", "b", "c"}, true, 3, false, false, []float64{0.25, 0.25}, 0, 0.25},
		{"ended requests count for nothing", true, []string{"a", "b", "c"}, false, 3, true, false, []float64{0.25, 0.25}, 0, 0},
		{"requests another endpoint answered count for nothing", true, []string{"a", "b", "c"}, false, 3, false, true, []float64{0.25, 0.25}, 0, 0},
		{"a nearly idle cache tells nothing", true, []string{"a", "b", "c"}, false, 3, false, false, []float64{0.04, 0.04}, 0, 0},
		{"a server that reports its size is sized by it", true, []string{"a", "b", "c"}, false, 3, false, false, []float64{0.25, 0.25}, 1000, 0},
		{"learning off", false, []string{"a", "b", "c"}, false, 3, false, false, []float64{0.25, 0.25}, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pl, eps := learnPlugin(t, 100, tc.learn)
			ep := eps[0]
			if tc.reported > 0 {
				scrapeUsage(pl, ep, 0, tc.reported)
			}
			var reqs []*router.Request
			var lens []int
			for i, p := range tc.prompts {
				system, turn := p+" "+longSystem, "q"
				if tc.sameFirst {
					system, turn = longSystem, p+" "+longSystem
				}
				req, n := pickOwned(t, pl, eps, ep, system, turn, int64(i+1))
				reqs, lens = append(reqs, req), append(lens, n)
			}
			ep.SetPrefilledThrough(tc.through)
			if tc.ended {
				for _, r := range reqs {
					pl.Done(r, ep)
				}
			}
			if tc.elsewhere {
				for _, r := range reqs {
					pl.ResponseHeaders(r, eps[1], 200)
				}
				eps[1].SetPrefilledThrough(tc.through)
				scrapeUsage(pl, eps[1], 0.25, 0)
				scrapeUsage(pl, eps[1], 0.25, 0)
				if got := pl.caps.learnedTokens(eps[1]); got != 0 {
					t.Fatalf("endpoint 1 learned %.0f tokens from requests picked for endpoint 0, want none (their pick numbers are endpoint 0's)", got)
				}
			}
			for _, u := range tc.usages {
				scrapeUsage(pl, ep, u, tc.reported)
			}
			// What the floor should count: the prompts past their prefill, the longest once
			// when they share their first block.
			own := 0
			for i, n := range lens {
				if int64(i+1) > tc.through {
					continue
				}
				if tc.sameFirst {
					own = max(own, n)
				} else {
					own += n
				}
			}
			got := pl.caps.learnedTokens(ep)
			if tc.wantUsage == 0 {
				if got != 0 {
					t.Fatalf("learned size %.0f tokens, want none", got)
				}
				if c := pl.index.CapacityOf(ep.Slot); tc.reported == 0 && c != 100 {
					t.Fatalf("index capacity %d, want the configured 100", c)
				}
				return
			}
			want := float64(own) * tpb / tc.wantUsage
			if math.Abs(got-want) > 1 {
				t.Fatalf("learned size %.0f tokens, want %.0f (%d blocks of %d tokens over %.2f)", got, want, own, tpb, tc.wantUsage)
			}
			// Above the configured 100, 70% of the usable floor is learned; below, the endpoint
			// is sized by its usable floor (at least learnMinBlocks), at most the configured 100.
			wantCap := int(math.Round(want * reportedUsableShare * usageFloorIndexShare / tpb))
			if wantCap <= 100 {
				wantCap = min(100, max(learnMinBlocks, int(math.Round(want*reportedUsableShare/tpb))))
			}
			if c := pl.index.CapacityOf(ep.Slot); c != wantCap {
				t.Fatalf("index capacity %d, want %d (70%% of the usable floor above the configured 100, the floor below it)", c, wantCap)
			}
			if c := pl.index.CapacityOf(eps[1].Slot); c != 100 {
				t.Fatalf("endpoint 1 (no scrape) capacity %d, want 100", c)
			}
		})
	}
}

// TestUsageFloorSkipsAScrapeRunningFewerRequestsThanCounted: when the server reports fewer
// running requests than the picker counts past their prefill there, some of those are not
// holding their blocks (preempted back to the queue, or still queued behind one that was), and
// the bound would overshoot: such a scrape sets no floor. A server that reports no queue is
// taken as before.
func TestUsageFloorSkipsAScrapeRunningFewerRequestsThanCounted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		queue     bool // the scrapes report waiting and running
		running   int
		wantFloor bool
	}{
		{"running as many as counted", true, 3, true},
		{"running more (other replicas' requests)", true, 5, true},
		{"running fewer than counted", true, 2, false},
		{"no queue reported", false, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl, eps := learnPlugin(t, 100, true)
			ep := eps[0]
			for i := range 3 {
				pickOwned(t, pl, eps, ep, fmt.Sprintf("p%d ", i)+longSystem, "q", int64(i+1))
			}
			ep.SetPrefilledThrough(3)
			for range 2 {
				m := &router.Metrics{KVUsage: 0.25, HasKVUsage: true}
				if tc.queue {
					m.Running, m.Waiting, m.HasQueue = tc.running, 3-min(tc.running, 3), true
				}
				ep.SetMetrics(m)
				pl.MetricsUpdated(ep, m)
				pl.caps.settle()
			}
			if got := pl.caps.learnedTokens(ep) > 0; got != tc.wantFloor {
				t.Fatalf("floor set %v, want %v", got, tc.wantFloor)
			}
		})
	}
}

// TestATrimDoesNotCutBelowTheUsageFloor: a server that lost every block predicted trims and
// cuts the learned capacity, but not below the share of its usage floor.
func TestATrimDoesNotCutBelowTheUsageFloor(t *testing.T) {
	for _, withFloor := range []bool{false, true} {
		t.Run(fmt.Sprintf("floor=%v", withFloor), func(t *testing.T) {
			pl, eps := learnPlugin(t, 1000, true)
			ep := eps[0]
			prompts := make([]string, 6)
			for i := range prompts {
				prompts[i] = fmt.Sprintf("prompt %d ", i) + longSystem
			}
			floorBlocks := 0
			if withFloor {
				// Three requests of ~20 blocks at 10% usage: a cache of ~9,600 tokens.
				for i := range 3 {
					_, n := pickOwned(t, pl, eps, ep, fmt.Sprintf("running %d ", i)+longSystem, "q", int64(i+1))
					floorBlocks += n
				}
				ep.SetPrefilledThrough(3)
				scrapeUsage(pl, ep, 0.1, 0)
				scrapeUsage(pl, ep, 0.1, 0)
			}
			for _, p := range prompts {
				serve(t, pl, eps, ep, p, -1)
			}
			for range 10 {
				serve(t, pl, eps, ep, prompts[0], 0) // predicted, and the server had nothing
			}
			least := int(math.Round(float64(floorBlocks) / 0.1 * reportedUsableShare * usageFloorIndexShare))
			got := pl.index.CapacityOf(ep.Slot)
			if withFloor && got != least {
				t.Fatalf("capacity %d blocks after repeated large misses, want the floor's share %d", got, least)
			}
			if !withFloor && got >= 1000/2 {
				t.Fatalf("capacity %d blocks after repeated large misses without a floor, want far below 1,000", got)
			}
		})
	}
}

// TestOwnedBlocksCountsEachFirstBlockOnce: the lower bound on the blocks an endpoint's
// requests reference counts, per first block, the longest prompt past its prefill, and forgets
// an endpoint that left.
func TestOwnedBlocksCountsEachFirstBlockOnce(t *testing.T) {
	ep := router.NewEndpoint("10.0.0.1:8000", 0)
	other := router.NewEndpoint("10.0.0.2:8000", 1)
	o := newOwnedSet()
	now := time.Now()
	sts := make([]*state, 5)
	for i := range sts {
		sts[i] = &state{}
	}
	o.add(ep, sts[0], chain(1, 10), 1, now)
	o.add(ep, sts[1], chain(1, 30), 2, now) // shares the first block: the longest counts
	o.add(ep, sts[2], chain(2, 5), 3, now)
	o.add(ep, sts[3], chain(3, 50), 4, now) // still in its prefill
	o.add(other, sts[4], chain(4, 70), 1, now)
	ep.SetPrefilledThrough(3)
	if got, n := o.blocks(ep, now); got != 35 || n != 3 {
		t.Fatalf("blocks %d of %d requests, want 35 (30 for the group of first block 1, 5) of 3", got, n)
	}
	o.remove(ep, sts[1])
	if got, n := o.blocks(ep, now); got != 15 || n != 2 {
		t.Fatalf("blocks %d of %d requests after the longest ended, want 15 of 2", got, n)
	}
	if got, _ := o.blocks(ep, now.Add(runningTTL+1)); got != 0 {
		t.Fatalf("blocks %d past runningTTL, want 0", got)
	}
	o.forget(other)
	other.SetPrefilledThrough(1)
	if got, _ := o.blocks(other, now); got != 0 {
		t.Fatalf("blocks %d of a forgotten endpoint, want 0", got)
	}
	// An endpoint that left tracks nothing new, and what it still tracked goes with its last
	// request.
	ep.MarkRemoved()
	o.add(ep, &state{}, chain(5, 5), 5, now)
	for _, st := range sts[:4] {
		o.remove(ep, st)
	}
	if _, ok := o.byEp[ep]; ok || len(o.byEp) != 0 {
		t.Fatalf("%d endpoints tracked after the removed one's last request ended, want 0", len(o.byEp))
	}
}

// TestUsageFloorUnderConcurrentRequestsAndScrapes: requests picked and ended on several
// goroutines while the scraper's goroutine takes the floor (run with -race); every tracked
// request is gone once every stream ended.
func TestUsageFloorUnderConcurrentRequestsAndScrapes(t *testing.T) {
	pl, eps := learnPlugin(t, 100, true)
	done := make(chan struct{})
	scraped := make(chan struct{})
	go func() {
		defer close(scraped)
		for {
			select {
			case <-done:
				return
			default:
			}
			for _, e := range eps {
				m := &router.Metrics{KVUsage: 0.5, HasKVUsage: true}
				e.SetMetrics(m)
				pl.MetricsUpdated(e, m)
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				ep := eps[(g+i)%len(eps)]
				req, _ := pickOwned(t, pl, eps, ep, fmt.Sprintf("g%d r%d ", g, i)+longSystem, "q", int64(i+1))
				ep.SetPrefilledThrough(int64(i + 1))
				pl.ResponseHeaders(req, ep, 200)
				pl.Done(req, ep)
			}
		}()
	}
	wg.Wait()
	close(done)
	<-scraped
	for _, e := range eps {
		if n, _ := pl.owned.blocks(e, time.Now()); n != 0 {
			t.Fatalf("endpoint %d: %d blocks tracked after every stream ended, want 0", e.Slot, n)
		}
	}
}

// TestUsageFloorIsExportedPerEndpoint: kvpick_prefix_endpoint_usage_floor_tokens shows each
// endpoint's floor, and its series goes with the endpoint.
func TestUsageFloorIsExportedPerEndpoint(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := Params{LRUCapacityPerEndpoint: 100, CapacityFromMetrics: true, LearnCapacity: true,
		BlockSize: 64, MaxBlocksPerRequest: 1000, MinMatchBlocks: 2, PendingTTL: config.Duration(time.Minute),
		CalibrateCapacity: true, EvictionEvidence: true}
	pl, err := New(p, reg)
	if err != nil {
		t.Fatal(err)
	}
	eps := twoEndpoints()
	pl.EndpointsChanged(eps, nil)
	_, n := pickOwned(t, pl, eps, eps[0], longSystem, "q", 1)
	eps[0].SetPrefilledThrough(1)
	scrapeUsage(pl, eps[0], 0.5, 0)
	scrapeUsage(pl, eps[0], 0.5, 0)
	want := float64(n) * 16 / 0.5 * reportedUsableShare
	if got := testutil.ToFloat64(pl.metrics.floor.WithLabelValues("10.0.0.1:8000")); math.Abs(got-want) > 1e-6 {
		t.Fatalf("exported floor %.1f tokens, want %.1f", got, want)
	}
	eps[0].MarkRemoved()
	pl.EndpointsChanged(nil, eps[:1])
	pl.caps.settle()
	if c := testutil.CollectAndCount(pl.metrics.floor); c != 0 {
		t.Fatalf("%d floor series after the endpoint left, want 0", c)
	}
}

// TestUsageFloorRiseIsLoggedAtDebugLevel: a scrape that raises an endpoint's usage floor logs,
// at debug level, the floor and what it was taken from (the picker's blocks there, the scraped
// usage and queue); a scrape that leaves the floor where it was logs nothing.
func TestUsageFloorRiseIsLoggedAtDebugLevel(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	pl, eps := poolPlugin(t, Params{LRUCapacityPerEndpoint: 1000, CapacityFromMetrics: true, LearnCapacity: true},
		WithLogger(zap.New(core)))
	ep := eps[0]
	own := 0
	for i := range 2 {
		_, n := pickOwned(t, pl, eps, ep, fmt.Sprintf("running %d ", i)+longSystem, "q", int64(i+1))
		own += n
	}
	ep.SetPrefilledThrough(2)
	floorLines := func() []observer.LoggedEntry { return logs.FilterMessage("prefix usage floor").All() }
	scrapeUsage(pl, ep, 0.1, 0) // the first bound alone sets no floor (the smaller of two counts)
	if n := len(floorLines()); n != 0 {
		t.Fatalf("%d floor lines after one scrape, want none", n)
	}
	scrapeUsage(pl, ep, 0.1, 0)
	lines := floorLines()
	if len(lines) != 1 {
		t.Fatalf("%d floor lines after the floor rose, want 1", len(lines))
	}
	f := lines[0].ContextMap()
	want := math.Round(float64(own) * 16 / 0.1 * reportedUsableShare)
	if f["endpoint"] != ep.Addr || f["own_blocks"] != int64(own) || f["kv_usage"] != 0.1 || f["usage_floor_tokens"] != want {
		t.Errorf("floor line %v, want endpoint %s, own_blocks %d, kv_usage 0.1, usage_floor_tokens %v", f, ep.Addr, own, want)
	}
	scrapeUsage(pl, ep, 0.1, 0) // the same bound: the floor stays
	scrapeUsage(pl, ep, 0.2, 0) // a lower bound: the floor stays
	if n := len(floorLines()); n != 1 {
		t.Errorf("%d floor lines after scrapes that left the floor, want still 1", n)
	}
}
