package prefill_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/plugins/prefill"
	"github.com/kvpick/kvpick/pkg/prefix"
	"github.com/kvpick/kvpick/pkg/router"
)

// setup returns a prefix plugin, the prefill scorer and two idle endpoints, the first of which
// holds a 64-block prompt.
func setup(t *testing.T) (*prefix.Plugin, *prefill.Scorer, []*router.Endpoint, string) {
	t.Helper()
	px, err := prefix.New(prefix.Params{BlockSize: 64, MaxBlocksPerRequest: 10000, LRUCapacityPerEndpoint: 10000,
		MinMatchBlocks: 1, PendingTTL: config.Duration(time.Minute)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pf, err := prefill.New(prefill.Params{RequestOverheadBlocks: 2})
	if err != nil {
		t.Fatal(err)
	}
	eps := routertest.Endpoints(0, 0)
	doc := strings.Repeat("a long shared document. ", 170) // ~4 KB: ~64 blocks
	warm := request(t, doc)
	px.Prepare(context.Background(), warm)
	px.Score(context.Background(), warm, eps, make([]float64, 2))
	px.Picked(warm, eps[0])
	px.ResponseHeaders(warm, eps[0], 200)
	px.Done(warm, eps[0])
	return px, pf, eps, doc
}

func request(t *testing.T, content string) *router.Request { return routertest.Chat(t, content) }

func score(px *prefix.Plugin, pf *prefill.Scorer, req *router.Request, eps []*router.Endpoint) []float64 {
	px.Prepare(context.Background(), req)
	px.Score(context.Background(), req, eps, make([]float64, len(eps)))
	s := make([]float64, len(eps))
	pf.Score(context.Background(), req, eps, s)
	return s
}

func TestCachedPrefixWinsOnAnIdlePool(t *testing.T) {
	px, pf, eps, doc := setup(t)
	s := score(px, pf, request(t, doc+" and a question"), eps)
	if s[0] != 1 || s[1] >= 0.2 {
		t.Fatalf("scores %v: the endpoint holding the prompt must win clearly", s)
	}
}

func TestAQueueOutweighsACachedPrefix(t *testing.T) {
	px, pf, eps, doc := setup(t)
	eps[0].AddQueuedPrefill(500) // ~8 cold prompts of this size queued there
	s := score(px, pf, request(t, doc+" and a question"), eps)
	if s[1] != 1 || s[0] >= s[1] {
		t.Fatalf("scores %v: a long prefill queue must outweigh a 64-block hit", s)
	}
	eps[0].AddQueuedPrefill(-500)
}

func TestChargeIsPaidBackExactlyOnce(t *testing.T) {
	for _, withResponse := range []bool{true, false} {
		px, pf, eps, _ := setup(t)
		req := request(t, strings.Repeat("a brand new prompt. ", 60))
		score(px, pf, req, eps)
		pf.Picked(req, eps[1])
		charged := eps[1].QueuedPrefill()
		if charged < 10 {
			t.Fatalf("a cold ~19-block prompt charged %d blocks", charged)
		}
		if withResponse {
			pf.ResponseHeaders(req, eps[1], 200)
			if q := eps[1].QueuedPrefill(); q != 0 {
				t.Fatalf("after the response the queue is %d", q)
			}
		}
		pf.Done(req, eps[1])
		if q := eps[1].QueuedPrefill(); q != 0 {
			t.Fatalf("withResponse=%v: after the stream ended the queue is %d", withResponse, q)
		}
	}
}

func TestRequestsWithoutPromptCostOnlyTheirOverhead(t *testing.T) {
	_, pf, eps, _ := setup(t)
	req := &router.Request{API: openai.APIOther}
	s := make([]float64, 2)
	pf.Score(context.Background(), req, eps, s)
	if s[0] != 1 || s[1] != 1 {
		t.Fatalf("scores %v on an idle pool", s)
	}
	pf.Picked(req, eps[0])
	if q := eps[0].QueuedPrefill(); q != 2 {
		t.Fatalf("charged %d, want the 2-block overhead", q)
	}
	pf.Done(req, eps[0])
}

func TestValidate(t *testing.T) {
	if _, err := prefill.New(prefill.Params{RequestOverheadBlocks: -1}); err == nil {
		t.Fatal("negative overhead accepted")
	}
}

// TestHeadIsTheOldestRequestStillPrefilling: the head of an endpoint's queue is the charge of the
// oldest request there without a first byte, whatever order the others finish in.
func TestHeadIsTheOldestRequestStillPrefilling(t *testing.T) {
	_, pf, eps, _ := setup(t)
	ep := eps[1]
	var reqs []*router.Request
	var charges []int64
	for i := range 3 {
		req := &router.Request{API: openai.APIOther}
		pf.Picked(req, ep) // 2 blocks each: the overhead
		reqs = append(reqs, req)
		charges = append(charges, 2)
		if h := ep.PrefillHead(); h != charges[0] {
			t.Fatalf("after %d picks the head is %d, want the first request's %d", i+1, h, charges[0])
		}
	}
	steps := []struct {
		name     string
		finish   int
		wantHead int64
	}{
		{"a later request finishes first: the head stays", 1, 2},
		{"the head finishes: the next one still prefilling is the head", 0, 2},
		{"the last one finishes: empty queue, no head", 2, 0},
	}
	for _, st := range steps {
		pf.ResponseHeaders(reqs[st.finish], ep, 200)
		if h := ep.PrefillHead(); h != st.wantHead {
			t.Fatalf("%s: head %d, want %d", st.name, h, st.wantHead)
		}
	}
	if q := ep.QueuedPrefill(); q != 0 {
		t.Fatalf("queue %d after every request finished", q)
	}
	for _, r := range reqs {
		pf.Done(r, ep) // already discharged: nothing moves
	}
	if q, h := ep.QueuedPrefill(), ep.PrefillHead(); q != 0 || h != 0 {
		t.Fatalf("queue %d, head %d after the streams ended", q, h)
	}
}

// TestHalfOfTheHeadCountsAsDone: a holder working on a long prefill of another prompt is worth
// waiting for, since that prefill is on average half done; but a request that would join a
// prefill of its own prefix started moments ago (a pending match) waits for all of it.
func TestHalfOfTheHeadCountsAsDone(t *testing.T) {
	// eps[0] holds doc (committed); a ~64-block prompt of its own is being prefilled there.
	px, pf, eps, doc := setup(t)
	long := request(t, strings.Repeat("another long prompt being prefilled. ", 110))
	score(px, pf, long, eps)
	pf.Picked(long, eps[0])
	head := eps[0].PrefillHead()
	if head < 50 {
		t.Fatalf("head %d, want the long prompt's ~64 blocks", head)
	}
	// A follower of doc: eps[0] holds it; the alternative is recomputing ~64 blocks on eps[1].
	s := score(px, pf, request(t, doc+" and a question"), eps)
	if s[0] != 1 {
		t.Fatalf("scores %v: with half of the head done, waiting on the holder is cheapest", s)
	}

	// The same queue, but the follower's match is a pending record: the long prompt itself,
	// picked moments ago and not answered yet.
	px2, pf2, eps2, _ := setup(t)
	first := request(t, strings.Repeat("a prompt nobody has seen. ", 160))
	score(px2, pf2, first, eps2)
	px2.Picked(first, eps2[0])
	pf2.Picked(first, eps2[0])
	follower := request(t, strings.Repeat("a prompt nobody has seen. ", 160)+" and more")
	s2 := score(px2, pf2, follower, eps2)
	m := prefix.MatchesOf(follower)
	if !m.Pending(eps2[0]) || m.Pending(eps2[1]) {
		t.Fatalf("pending: %v %v, want the match on endpoint 0 to rest on the pending record", m.Pending(eps2[0]), m.Pending(eps2[1]))
	}
	queued, own0 := eps2[0].QueuedPrefill(), int64(m.Total-m.Blocks(eps2[0])+2)
	own1 := int64(m.Total - m.Blocks(eps2[1]) + 2)
	// Costs without discount: queued+own0 on 0, own1 on 1; the scores must say exactly that.
	c0, c1 := queued+own0, own1
	least := min(c0, c1)
	want0 := max(0, 1-float64(c0-least)/float64(least+1))
	if diff := s2[0] - want0; diff > 1e-9 || diff < -1e-9 {
		t.Fatalf("score on the pending holder %.4f, want %.4f (whole head counted: queue %d, own %d, other %d)", s2[0], want0, queued, own0, own1)
	}
}

func TestQueuesOfRemovedEndpointsAreForgotten(t *testing.T) {
	_, pf, eps, _ := setup(t)
	busy, idle := &router.Request{API: openai.APIOther}, &router.Request{API: openai.APIOther}
	pf.Picked(idle, eps[0])
	pf.Done(idle, eps[0]) // eps[0] idle again
	pf.Picked(busy, eps[1])
	for _, e := range eps {
		e.MarkRemoved()
	}
	pf.EndpointsChanged(nil, eps)
	if n := pf.QueuedEndpoints(); n != 1 {
		t.Fatalf("%d queues kept after both endpoints left, want 1 (the one still prefilling)", n)
	}
	pf.Done(busy, eps[1])
	if n := pf.QueuedEndpoints(); n != 0 {
		t.Fatalf("%d queues kept after the last request of a removed endpoint ended", n)
	}
}
