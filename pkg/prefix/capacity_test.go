package prefix

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/router"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// poolPlugin returns a plugin with p (and the fields every capacity test shares) and opts in
// front of four endpoints.
func poolPlugin(t *testing.T, p Params, opts ...Option) (*Plugin, []*router.Endpoint) {
	t.Helper()
	p.BlockSize, p.MaxBlocksPerRequest, p.MinMatchBlocks = 64, 1000, 2
	p.PendingTTL, p.CalibrateCapacity, p.EvictionEvidence = config.Duration(time.Minute), true, true
	pl, err := New(p, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	eps := endpoints(4)
	pl.EndpointsChanged(eps, nil)
	return pl, eps
}

// checkCapacities checks the index capacity of each of the four endpoints, by slot.
func checkCapacities(t *testing.T, pl *Plugin, when string, want [4]int) {
	t.Helper()
	for ep, w := range want {
		if got := pl.index.CapacityOf(ep); got != w {
			t.Errorf("%s: endpoint %d capacity %d, want %d", when, ep, got, w)
		}
	}
}

func capPlugin(t *testing.T, fromMetrics bool, maxEntries int) (*Plugin, []*router.Endpoint) {
	t.Helper()
	pl, eps := poolPlugin(t, Params{LRUCapacityPerEndpoint: 10000, CapacityFromMetrics: fromMetrics, MaxIndexEntries: maxEntries})
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
			if m := MatchesOf(req); m.Blocks(eps[0]) < 10 {
				t.Fatalf("target predicted %d blocks on endpoint 0, want all of it", m.Blocks(eps[0]))
			}
			pl.Picked(req, eps[0])
			pl.ResponseHeaders(req, eps[0], 200) // the server recomputed it: committed again
			pl.Usage(req, eps[0], openai.Usage{PromptTokens: 1000, CachedTokens: tc.cached, HasCached: tc.hasCached})
			pl.Done(req, eps[0])

			probe := func(system string) int {
				r := chatRequest(t, system, "q")
				pl.Prepare(context.Background(), r)
				scores(pl, r, eps[:2])
				m := MatchesOf(r)
				n := m.Blocks(eps[0])
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

func learnPlugin(t *testing.T, configured int, learn bool) (*Plugin, []*router.Endpoint) {
	t.Helper()
	pl, eps := poolPlugin(t, Params{LRUCapacityPerEndpoint: configured, CapacityFromMetrics: true, LearnCapacity: learn})
	pl.caps.settle()
	return pl, eps
}

// serve runs one request for system through pl to ep: picked, answered 200, its usage
// reported with cached tokens (cached < 0: no cached_tokens in the report). It returns the
// blocks predicted on ep and the prompt's blocks.
func serve(t *testing.T, pl *Plugin, eps []*router.Endpoint, ep *router.Endpoint, system string, cached int) (predicted, total int) {
	t.Helper()
	req := chatRequest(t, system, "q")
	pl.Prepare(context.Background(), req)
	scores(pl, req, eps)
	// The prediction the evidence checks: the blocks the index holds (the scorers may also see
	// pending records and ghost credit, GhostMatch).
	predicted, total = int(pl.state(req).committed[ep.Slot]), MatchesOf(req).Total
	pl.Picked(req, ep)
	pl.ResponseHeaders(req, ep, 200)
	pl.Usage(req, ep, openai.Usage{PromptTokens: total * 16, CachedTokens: max(cached, 0), HasCached: cached >= 0})
	pl.Done(req, ep)
	pl.caps.settle()
	return predicted, total
}

// TestLearnedCapacityGrowsWhenTheServerHeldWhatTheIndexDropped: lruCapacityPerEndpoint 100 is
// far below what the servers hold. A prompt of ~290 blocks does not fit; when the server
// reports the whole prompt cached the next time, the blocks the index had dropped for want of
// room show the capacity too small: it grows to hold the prompt, on that endpoint and on the
// others that no trim has bounded. With learnCapacity off it stays at 100.
func TestLearnedCapacityGrowsWhenTheServerHeldWhatTheIndexDropped(t *testing.T) {
	long := strings.Repeat("You are a careful assistant that answers in full sentences. ", 300)
	for _, learn := range []bool{true, false} {
		t.Run(fmt.Sprintf("learnCapacity=%v", learn), func(t *testing.T) {
			pl, eps := learnPlugin(t, 100, learn)
			_, total := serve(t, pl, eps, eps[0], long, 0)
			if total < 250 {
				t.Fatalf("prompt of %d blocks, want over 250 for this test", total)
			}
			pred, _ := serve(t, pl, eps, eps[0], long, total*16)
			if pred != 100 {
				t.Fatalf("predicted %d blocks, want the 100 the index could keep", pred)
			}
			got := pl.index.CapacityOf(0)
			if !learn {
				if got != 100 {
					t.Fatalf("capacity %d with learning off, want 100", got)
				}
				return
			}
			if got < total-3 || got > total+3 {
				t.Fatalf("learned capacity %d, want about the %d-block prompt the server held", got, total)
			}
			if other := pl.index.CapacityOf(2); other != got {
				t.Fatalf("endpoint 2 (no evidence of its own) capacity %d, want lifted to %d", other, got)
			}
			serve(t, pl, eps, eps[0], long, total*16) // commits the prompt under the new capacity
			if pred, _ := serve(t, pl, eps, eps[0], long, total*16); pred < total-3 {
				t.Fatalf("after learning: %d of %d blocks predicted", pred, total)
			}
		})
	}
}

// TestLearnedCapacityShrinksToWhatATrimKept: lruCapacityPerEndpoint far above what the server
// holds. A report that the server lost a prompt trims the endpoint and bounds its capacity by
// what the index kept (at least learnMinBlocks); the others keep theirs: one short report says
// little about other servers (following it cost shared-prefix 9 points of hit ratio in the
// replay's capacity-x10 scenario). Growth seen on another endpoint lifts the endpoints no trim
// has bounded, not the bounded one, nor one whose server reports its size.
func TestLearnedCapacityShrinksToWhatATrimKept(t *testing.T) {
	pl, eps := learnPlugin(t, 10000, true)
	report(pl, eps[3], 1000, 16) // 850 index blocks, from the server
	pl.caps.settle()
	older, target, newer := "older "+longSystem, "target "+longSystem, "newer "+longSystem
	for _, s := range []string{older, target, newer} {
		serve(t, pl, eps, eps[0], s, -1)
	}
	if got := pl.index.CapacityOf(1); got != 10000 {
		t.Fatalf("capacity before any evidence %d, want the configured 10000", got)
	}
	pred, _ := serve(t, pl, eps, eps[0], target, 0) // the server found nothing
	if pred < 10 {
		t.Fatalf("target predicted %d blocks before the trim, want all of it", pred)
	}
	checkCapacities(t, pl, "after the trim", [4]int{learnMinBlocks, 10000, 10000, 850})
	if !pl.index.eps[0].trimmed || pl.index.eps[1].trimmed {
		t.Errorf("ghost credit ended: trimmed endpoint 0 %v, untrimmed endpoint 1 %v; want true, false",
			pl.index.eps[0].trimmed, pl.index.eps[1].trimmed)
	}
	// Growth adds the blocks the server was shown to hold, at least up to what the evidence
	// shows, and lifts the unbounded others to it.
	pl.caps.grow(eps[1], 10, 500)
	pl.caps.settle()
	checkCapacities(t, pl, "after growth on endpoint 1 to 500", [4]int{learnMinBlocks, 10010, 10000, 850})
	pl.caps.grow(eps[2], 10, 30000)
	pl.caps.settle()
	checkCapacities(t, pl, "after growth on endpoint 2 to 30000", [4]int{learnMinBlocks, 30000, 30000, 850})
	// A trimmed endpoint grows to what the evidence shows.
	pl.caps.grow(eps[0], 10, 100)
	pl.caps.settle()
	checkCapacities(t, pl, "after growth on the trimmed endpoint 0 to 100", [4]int{100, 30000, 30000, 850})
}

// TestGrowthLiftsAnotherEndpointOnlyUpToItsUsageFloor: growth seen on one endpoint lifts the
// unbounded others to what it showed, except that an endpoint with a usage floor is lifted only
// up to its floor (its own server's evidence); one whose floor is higher keeps its floor's
// share; an endpoint's own growth is not bounded by its floor.
func TestGrowthLiftsAnotherEndpointOnlyUpToItsUsageFloor(t *testing.T) {
	pl, eps := learnPlugin(t, 1000, true) // 16 tokens per 64-byte index block
	report(pl, eps[3], 1000, 16)          // 850 index blocks, from the server
	setFloor := func(ep *router.Endpoint, blocks float64) {
		pl.caps.floor(ep, blocks*16) // twice: the smaller of the last two bounds counts
		pl.caps.floor(ep, blocks*16)
	}
	setFloor(eps[1], 3000) // raises its capacity to the floor's share, 0.7 × 3,000
	setFloor(eps[2], 8000) // 5,600
	pl.caps.settle()
	checkCapacities(t, pl, "after the floors", [4]int{1000, 2100, 5600, 850})
	pl.caps.grow(eps[0], 10, 5000)
	pl.caps.settle()
	checkCapacities(t, pl, "after growth on endpoint 0 to 5,000", [4]int{5000, 3000, 5600, 850})
	pl.caps.grow(eps[1], 10, 4000)
	pl.caps.settle()
	checkCapacities(t, pl, "after growth on endpoint 1 to 4,000", [4]int{5000, 4000, 5600, 850})
	pl.caps.grow(eps[2], 10, 9000)
	pl.caps.settle()
	checkCapacities(t, pl, "after growth on endpoint 2 to 9,000", [4]int{9000, 4000, 9000, 850})
}

// TestCapacityChangesAreLoggedAtDebugLevel: with a logger, each change of an endpoint's index
// capacity is one debug line naming the endpoint, the new capacity and what it came from (the
// server's report, learning, the usage floor); a logger above debug level gets nothing.
func TestCapacityChangesAreLoggedAtDebugLevel(t *testing.T) {
	for _, level := range []zapcore.Level{zapcore.DebugLevel, zapcore.InfoLevel} {
		t.Run(level.String(), func(t *testing.T) {
			core, logs := observer.New(level)
			pl, eps := poolPlugin(t, Params{LRUCapacityPerEndpoint: 1000, CapacityFromMetrics: true, LearnCapacity: true},
				WithLogger(zap.New(core)))
			pl.caps.settle()
			report(pl, eps[1], 1000, 16) // 850 index blocks, from the server
			pl.caps.settle()
			for range 2 { // the smaller of two bounds counts
				pl.caps.floor(eps[2], 500*pl.caps.tokensPerBlock())
			}
			pl.caps.settle()
			// The growth below lifts endpoint 2 only up to its floor: no change, no line.
			pl.caps.grow(eps[0], 10, 3000)
			pl.caps.settle()
			lines := logs.FilterMessage("prefix index capacity").All()
			if level > zapcore.DebugLevel {
				if len(lines) != 0 {
					t.Fatalf("%d capacity lines at %s, want none", len(lines), level)
				}
				return
			}
			got := map[string]string{}
			for _, l := range lines {
				f := l.ContextMap()
				got[fmt.Sprint(f["endpoint"])] = fmt.Sprintf("%v/%v", f["blocks"], f["source"])
			}
			want := map[string]string{eps[0].Addr: "3000/learned", eps[1].Addr: "850/reported", eps[2].Addr: "500/floor"}
			for ep, w := range want {
				if got[ep] != w {
					t.Errorf("last capacity line for %s: %q, want %q (all: %v)", ep, got[ep], w, got)
				}
			}
		})
	}
}

// TestLearnedCacheTokensAreWhatTheEvidenceTaught: for servers that report no cache size, the
// size learned from their cached_tokens reports is published for the decision path (kv-fit's
// free room), as the whole cache: the learned index capacity over the reusable share. Nothing
// before evidence touched an endpoint (the configured figure is not trusted), nothing for a
// server that reports its own size, nothing for an endpoint that left or another one that took
// its slot.
func TestLearnedCacheTokensAreWhatTheEvidenceTaught(t *testing.T) {
	pl, eps := learnPlugin(t, 10000, true)
	report(pl, eps[3], 1000, 16)
	pl.caps.settle()
	learned := func() [4]float64 {
		t.Helper()
		req := chatRequest(t, "unrelated "+longSystem, "q")
		pl.Prepare(context.Background(), req)
		scores(pl, req, eps)
		m := MatchesOf(req)
		if m.Total == 0 {
			t.Fatal("the probe request has no scored prompt")
		}
		var got [4]float64
		for i, e := range eps {
			got[i] = m.LearnedCacheTokens(e)
		}
		return got
	}
	const tpb = 16 // 64-byte blocks at the assumed 4 bytes per token
	if got := learned(); got != [4]float64{} {
		t.Fatalf("before any evidence: learned sizes %v, want none", got)
	}
	older, target, newer := "older "+longSystem, "target "+longSystem, "newer "+longSystem
	for _, s := range []string{older, target, newer} {
		serve(t, pl, eps, eps[0], s, -1)
	}
	serve(t, pl, eps, eps[0], target, 0) // the server found nothing: trimmed to learnMinBlocks
	want := [4]float64{learnMinBlocks * tpb / reportedUsableShare, 0, 0, 0}
	same := func(a, b [4]float64) bool {
		for i := range a {
			if math.Abs(a[i]-b[i]) > 1e-6*b[i] {
				return false
			}
		}
		return true
	}
	if got := learned(); !same(got, want) {
		t.Fatalf("after the trim on endpoint 0: learned sizes %v, want %v", got, want)
	}
	pl.caps.grow(eps[1], 10, 500) // 10 more on endpoint 1; endpoint 2 (unbounded) to at least 500
	pl.caps.settle()
	want = [4]float64{learnMinBlocks * tpb / reportedUsableShare, 10010 * tpb / reportedUsableShare,
		10000 * tpb / reportedUsableShare, 0}
	if got := learned(); !same(got, want) {
		t.Fatalf("after growth on endpoint 1: learned sizes %v, want %v", got, want)
	}
	pl.EndpointsChanged(nil, eps[1:2])
	pl.caps.settle()
	newcomer := router.NewEndpoint("10.0.0.9:8000", eps[1].Slot)
	pl.EndpointsChanged([]*router.Endpoint{newcomer}, nil)
	pl.caps.settle()
	eps[1] = newcomer
	if got := learned(); got[1] != 0 {
		t.Fatalf("an endpoint in a departed endpoint's slot: learned size %v, want none", got[1])
	}
}

// TestALargeMissCutsTheCapacityBelowWhatTheTrimKept: the index predicts a prompt that is the
// oldest of ten on an endpoint whose configured capacity is far too large. When the server
// reports it found little of it, the trim evicts nothing older (there is nothing older) and
// bounds the capacity by the ten prompts it kept; a report of under half the prediction also
// cuts that bound to largeMissCut, one of half or more leaves it. A server that reports its
// size is never cut.
func TestALargeMissCutsTheCapacityBelowWhatTheTrimKept(t *testing.T) {
	cases := []struct {
		name     string
		found    float64 // share of the prediction the server reports cached
		reported bool    // the server reports its cache size
		cut      bool
	}{
		{"found nothing: cut", 0, false, true},
		{"found 40%: cut", 0.4, false, true},
		{"found 60%: trimmed, not cut", 0.6, false, false},
		{"found nothing, size reported: neither", 0, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pl, eps := learnPlugin(t, 10000, true)
			if tc.reported {
				report(pl, eps[0], 1000, 16) // 850 index blocks, from the server
				pl.caps.settle()
			}
			prompts := make([]string, 10)
			for i := range prompts {
				prompts[i] = fmt.Sprintf("prompt %d ", i) + longSystem
				serve(t, pl, eps, eps[0], prompts[i], -1)
			}
			held := pl.index.eps[0].n
			r := chatRequest(t, prompts[0], "q")
			pl.Prepare(context.Background(), r)
			scores(pl, r, eps)
			total := MatchesOf(r).Total
			pl.Done(r, eps[0])
			// The oldest prompt again, found at the given share.
			pred, _ := serve(t, pl, eps, eps[0], prompts[0], int(tc.found*float64(total))*16)
			if pred < total-2 {
				t.Fatalf("predicted %d of %d blocks, want the whole prompt", pred, total)
			}
			if held*3/4 < learnMinBlocks {
				t.Fatalf("the prompts hold %d blocks, too few to see a cut above learnMinBlocks", held)
			}
			want := held // the trims evicted nothing: every prompt is newer than the predicted one
			switch {
			case tc.reported:
				want = 850
			case tc.cut:
				want = int(math.Round(float64(held) * largeMissCut))
			}
			if got := pl.index.CapacityOf(0); got != want {
				t.Fatalf("capacity %d after the report (the prompts held %d), want %d", got, held, want)
			}
			if got := pl.index.CapacityOf(1); got != 10000 {
				t.Fatalf("endpoint 1 capacity %d, want the configured 10000: one server's miss says nothing of another", got)
			}
		})
	}
}

// TestEndpointsWithoutEvidenceTakeThePoolsLearnedCapacity: once half of the endpoints that
// report no size (and at least two) have learned a capacity smaller than the configured one,
// the endpoints with no evidence of their own take the largest learned capacity; one learned
// endpoint is not enough, a learned capacity above the configured one lowers nothing, and a
// server that reports its size keeps its own.
func TestEndpointsWithoutEvidenceTakeThePoolsLearnedCapacity(t *testing.T) {
	pl, eps := learnPlugin(t, 10000, true)
	report(pl, eps[3], 1000, 16) // 850 index blocks, from the server; three endpoints report none
	pl.caps.settle()
	pl.caps.shrink(eps[0], 300, false)
	pl.caps.settle()
	checkCapacities(t, pl, "one endpoint learned", [4]int{300, 10000, 10000, 850})
	pl.caps.shrink(eps[1], 500, false)
	pl.caps.settle()
	checkCapacities(t, pl, "two of three learned", [4]int{300, 500, 500, 850})

	// Two learned, the larger above the configured figure: endpoint 2 keeps the configured one.
	pl, eps = learnPlugin(t, 10000, true)
	report(pl, eps[3], 1000, 16)
	pl.caps.shrink(eps[0], 300, false)
	pl.caps.mu.Lock()
	pl.caps.learnLocked(eps[1], func(_, tpb float64) float64 { return 20000 * tpb }) // no lift
	pl.caps.mu.Unlock()
	pl.caps.kick()
	pl.caps.settle()
	checkCapacities(t, pl, "a learned capacity above the configured one", [4]int{300, 20000, 10000, 850})

	off, offEps := learnPlugin(t, 10000, false)
	off.caps.shrink(offEps[0], 300, false)
	off.caps.shrink(offEps[1], 500, false)
	off.caps.settle()
	if got := off.index.CapacityOf(2); got != 10000 {
		t.Errorf("learnCapacity off: endpoint 2 capacity %d, want the configured 10000", got)
	}
}

// TestGrowthSeesAGhostHitOnAPromptShorterThanTheCapacity: a prompt that fits in the capacity is
// dropped for room, then served again on the same endpoint, and the server reports it cached in
// full. The report comes after the request's own blocks were committed again (at its first
// byte, here its response headers); they still count as ghost hits, because they were ghosts
// when the request was picked, so the capacity grows. A prompt the index held at pick is no
// evidence of room.
func TestGrowthSeesAGhostHitOnAPromptShorterThanTheCapacity(t *testing.T) {
	pl, eps := learnPlugin(t, 100, true)
	prompts := make([]string, 8)
	for i := range prompts {
		prompts[i] = fmt.Sprintf("prompt %d ", i) + longSystem
	}
	_, total := serve(t, pl, eps, eps[0], prompts[0], -1)
	if total*2 > 100 || total*7 < 110 {
		t.Fatalf("prompt of %d blocks: want two to fit in the capacity of 100, seven not", total)
	}
	for _, p := range prompts[1:] {
		serve(t, pl, eps, eps[0], p, -1) // pushes prompt 0 out of the index
	}
	pred, _ := serve(t, pl, eps, eps[0], prompts[7], total*16) // held at pick: no growth
	if pred < total-2 {
		t.Fatalf("prompt 7 predicted %d of %d blocks, want all", pred, total)
	}
	if got := pl.index.CapacityOf(0); got != 100 {
		t.Fatalf("capacity %d after a hit the index predicted, want 100", got)
	}
	pred, _ = serve(t, pl, eps, eps[0], prompts[0], total*16) // dropped, and the server held it
	if pred != 0 {
		t.Fatalf("prompt 0 predicted %d blocks, want none (dropped)", pred)
	}
	if got := pl.index.CapacityOf(0); got <= 100 {
		t.Fatalf("capacity %d after the server held a prompt the index had dropped, want above 100", got)
	}
}
