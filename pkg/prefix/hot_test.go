package prefix

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/router"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func hotPlugin(t *testing.T, on bool) *Plugin { return hotPluginOn(t, on, nil) }

func hotPluginOn(t *testing.T, on bool, reg prometheus.Registerer) *Plugin {
	t.Helper()
	pl, err := New(Params{BlockSize: 64, MaxBlocksPerRequest: 1000, LRUCapacityPerEndpoint: 100000,
		MinMatchBlocks: 2, PendingTTL: config.Duration(time.Minute), ReplicateHotPrefixes: on}, reg)
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// serveWhole routes req to ep and answers it whole with 200: its blocks are committed there.
func serveWhole(t *testing.T, pl *Plugin, eps []*router.Endpoint, req *router.Request, ep *router.Endpoint) {
	t.Helper()
	pl.Prepare(context.Background(), req)
	scores(pl, req, eps)
	pl.Picked(req, ep)
	pl.ResponseHeaders(req, ep, 200)
	pl.Done(req, ep)
}

func systemPrompt(i int) string {
	return fmt.Sprintf("You are assistant %d of the shop. ", i) + strings.Repeat(fmt.Sprintf("Policy %d applies to every order, read it in full. ", i), 40)
}

func TestHotPrefixIsCreditedToEveryCandidateUntilItHasItsCopies(t *testing.T) {
	tests := []struct {
		name     string
		on       bool
		prompts  int // traffic spread evenly over this many system prompts
		holders  int // endpoints serving each prompt's traffic
		requests int
		credited bool // endpoints that do not hold the prompt score as its holders do
	}{
		{"one prompt in front of all traffic, held by two of eight", true, 1, 2, 200, true},
		{"the same with replication off", false, 1, 2, 200, false},
		{"two prompts, half the traffic each, held by two: want four copies", true, 2, 2, 200, true},
		{"two prompts held by four each: enough copies", true, 2, 4, 200, false},
		{"sixteen prompts: under two endpoints' share each", true, 16, 1, 320, false},
		{"five prompts, a fifth of the traffic each (1.6 endpoints' share), held by one", true, 5, 1, 300, false},
		{"three prompts, a third each (2.7 endpoints' share), held by one", true, 3, 1, 300, true},
		{"one hot prompt, too few requests seen to tell", true, 1, 2, hotMinRequests - 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pl, eps := hotPlugin(t, tc.on), endpoints(8)
			for i := range tc.requests {
				p := i % tc.prompts
				ep := eps[(p*tc.holders+i/tc.prompts%tc.holders)%len(eps)]
				serveWhole(t, pl, eps, chatRequest(t, systemPrompt(p), fmt.Sprintf("question %d", i)), ep)
			}
			req := chatRequest(t, systemPrompt(0), "a new question")
			pl.Prepare(context.Background(), req)
			s := scores(pl, req, eps)
			if s[0] == 0 {
				t.Fatalf("the prompt's holder scores 0: %v", s)
			}
			cold := s[len(eps)-1]
			switch {
			case !tc.credited && cold != 0:
				t.Fatalf("endpoint without the prompt scores %.3f, want 0 (holder %.3f)", cold, s[0])
			case tc.credited && tc.holders >= 2 && cold != s[0]:
				// Two holders of the same blocks show how far the shared prefix runs.
				t.Fatalf("endpoint without the prompt scores %.3f, want its holders' %.3f", cold, s[0])
			case tc.credited && tc.holders == 1 && !(cold >= 0.4 && cold < s[0]):
				// One holder: only the sampled depth (a power of two blocks) is known to be hot.
				t.Fatalf("endpoint without the prompt scores %.3f, want the sampled part of its holder's %.3f", cold, s[0])
			}
		})
	}
}

func TestAMatchBeyondTheHotPrefixStillDraws(t *testing.T) {
	pl, eps := hotPlugin(t, true), endpoints(8)
	for i := range 200 {
		serveWhole(t, pl, eps, chatRequest(t, systemPrompt(0), fmt.Sprintf("question %d", i)), eps[i%2])
	}
	// One conversation goes on on endpoint 1: its earlier turn is there only.
	long := strings.Repeat("the order number is 12345 and it has not arrived yet. ", 30)
	serveWhole(t, pl, eps, chatRequest(t, systemPrompt(0), long), eps[1])
	req := chatRequest(t, systemPrompt(0), long, "and now?")
	pl.Prepare(context.Background(), req)
	s := scores(pl, req, eps)
	if !(s[1] > s[0] && s[0] == s[7] && s[7] > 0) {
		t.Fatalf("scores %v: want the conversation's endpoint first, the hot prefix credited alike to the rest", s)
	}
}

func TestAPrefixStopsBeingHotWhenTheTrafficMoves(t *testing.T) {
	hp := newHotPrefixes()
	hot := make([]uint64, 64)
	for i := range hot {
		hot[i] = uint64(i+1) * 0x9E3779B97F4A7C15
	}
	eps := endpoints(8)
	lens := make([]int32, 8)
	lens[0], lens[1] = 64, 64
	for range 200 {
		hp.add(hot, 2)
	}
	if got := hp.underReplicated(hot, 2, lens, eps); got != 64 {
		t.Fatalf("hot prefix credit %d blocks, want 64", got)
	}
	// 40,000 requests later (past the weights' rescale), half the traffic still starts so.
	other := make([]uint64, 64)
	for i := range 40000 {
		if i%2 == 0 {
			hp.add(hot, 2)
			continue
		}
		for j := range other {
			other[j] = uint64(i)<<20 | uint64(j+1)
		}
		hp.add(other, 2)
	}
	if hp.w > hotRescale {
		t.Fatalf("weights grew to %g, past the rescale bound", hp.w)
	}
	if got := hp.underReplicated(hot, 2, lens, eps); got != 64 {
		t.Fatalf("after a rescale, half of the traffic: credit %d blocks, want 64 (4 copies wanted, 2 held)", got)
	}
	// Then 10,000 requests that share nothing: the prefix's share decays to nothing.
	for i := range 10000 {
		for j := range other {
			other[j] = uint64(i+50000)<<20 | uint64(j+1)
		}
		hp.add(other, 2)
	}
	if got := hp.underReplicated(hot, 2, lens, eps); got != 0 {
		t.Fatalf("after the traffic moved: credit %d blocks, want 0", got)
	}
}

func TestHotPrefixesUnderConcurrentPicksAndScores(t *testing.T) {
	pl, eps := hotPlugin(t, true), endpoints(8)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 100 {
				serveWhole(t, pl, eps, chatRequest(t, systemPrompt(g%2), fmt.Sprintf("q %d %d", g, i)), eps[(g+i)%2])
			}
		})
	}
	wg.Wait()
	req := chatRequest(t, systemPrompt(0), "last")
	pl.Prepare(context.Background(), req)
	if s := scores(pl, req, eps); s[7] == 0 || s[7] != s[0] {
		t.Fatalf("scores %v: half the traffic held by two of eight wants about four copies", s)
	}
}

func TestHotPrefixCreditsAreCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	pl, eps := hotPluginOn(t, true, reg), endpoints(8)
	for i := range hotMinRequests {
		serveWhole(t, pl, eps, chatRequest(t, systemPrompt(0), fmt.Sprintf("question %d", i)), eps[i%2])
	}
	before := testutil.ToFloat64(pl.metrics.hotCredits)
	req := chatRequest(t, systemPrompt(0), "one more")
	pl.Prepare(context.Background(), req)
	scores(pl, req, eps)
	if got := testutil.ToFloat64(pl.metrics.hotCredits) - before; got != 1 {
		t.Fatalf("kvpick_prefix_hot_prefix_credits_total rose by %v for one credited request, want 1", got)
	}
	other := chatRequest(t, systemPrompt(9), "a prompt nobody holds")
	pl.Prepare(context.Background(), other)
	scores(pl, other, eps)
	if got := testutil.ToFloat64(pl.metrics.hotCredits) - before; got != 1 {
		t.Fatalf("kvpick_prefix_hot_prefix_credits_total rose to %v after a request with nothing hot, want 1", got)
	}
}

// underReplicatedByDepth is the credit computed the plain way, one pass over the candidates per
// doubling: the reference the one-pass underReplicated must agree with.
func underReplicatedByDepth(shares []float64, hashes int, minMatch int, lens []int32, eps []*router.Endpoint) int {
	credit := 0
	for i, d := 0, minMatch; i < len(shares); i, d = i+1, d*2 {
		holders, shortest := 0, hashes
		for _, e := range eps {
			if m := int(lens[e.Slot]); m >= d {
				holders++
				shortest = min(shortest, m)
			}
		}
		if holders == 0 {
			break
		}
		if holders < int(shares[i]*float64(len(eps))) {
			credit = d
			if holders >= 2 {
				credit = min(shortest, 2*d-1)
			}
		}
	}
	return credit
}

func TestUnderReplicatedAgreesWithOnePassPerDepth(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	credited := 0
	const trials = 2000
	for trial := range trials {
		hp := newHotPrefixes()
		n := 1 + rng.IntN(200)
		hashes := make([]uint64, n)
		for i := range hashes {
			hashes[i] = rng.Uint64()
		}
		minMatch := 1 + rng.IntN(8)
		// Traffic: a share of the requests (different in each trial) start with a random depth
		// of this prompt, the rest with prompts of their own.
		hot := 1 + rng.IntN(9)
		for range hotMinRequests + rng.IntN(400) {
			if rng.IntN(10) < hot {
				hp.add(hashes[:n-rng.IntN(1+n/4)], minMatch)
			} else {
				hp.add([]uint64{rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64()}, minMatch)
			}
		}
		eps := endpoints(1 + rng.IntN(64))
		lens := make([]int32, len(eps))
		for i := range lens {
			switch rng.IntN(6) {
			case 0:
				lens[i] = int32(rng.IntN(n + 1))
			case 1:
				lens[i] = int32(n)
			default: // holds nothing
			}
		}
		var shares []float64
		hp.mu.Lock()
		for d := minMatch; d <= n && len(shares) < 32; d *= 2 {
			a, b := hotCells(hashes[d-1])
			shares = append(shares, min(hp.rows[0][a], hp.rows[1][b])/hp.total)
		}
		hp.mu.Unlock()
		want := underReplicatedByDepth(shares, n, minMatch, lens, eps)
		if got := hp.underReplicated(hashes, minMatch, lens, eps); got != want {
			t.Fatalf("trial %d (prompt %d blocks, minMatch %d, lens %v): credit %d, the per-depth passes give %d", trial, n, minMatch, lens, got, want)
		}
		if want > 0 {
			credited++
		}
	}
	// The comparison must cover credits, not only the no-credit answer.
	if credited < trials/10 {
		t.Fatalf("only %d of %d trials gave the prefix any credit: the test no longer covers credits", credited, trials)
	}
	t.Logf("%d of %d trials credited", credited, trials)
}
