package prefill_test

import (
	"context"
	"fmt"
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

// picker numbers picks per endpoint the way router.Pipeline does (Request.PickSeq).
type picker struct{ seq map[*router.Endpoint]int64 }

func (p *picker) pick(pf *prefill.Scorer, req *router.Request, ep *router.Endpoint) {
	if p.seq == nil {
		p.seq = map[*router.Endpoint]int64{}
	}
	p.seq[ep]++
	req.PickSeq = p.seq[ep]
	pf.Picked(req, ep)
}

func streamed(t *testing.T, content string, stream bool) *router.Request {
	t.Helper()
	body := fmt.Appendf(nil, `{"model":"m","stream":%v,"messages":[{"role":"user","content":%q}]}`, stream, content)
	var b openai.Request
	if err := openai.Parse(openai.APIChatCompletions, body, &b); err != nil {
		t.Fatal(err)
	}
	return &router.Request{API: openai.APIChatCompletions, Body: &b, Model: b.Model}
}

// TestChargeIsPaidBackWhenThePrefillIsKnownOver: a stream's headers come when the request
// reaches the server (vLLM, SGLang), before its prefill: they must not pay the charge back; its
// first body byte (the first token) does. A non-streamed response's headers come at the end,
// and a failure's at once: they do. Whatever happened before, the stream's end pays back what
// is left, and nothing is paid back twice.
func TestChargeIsPaidBackWhenThePrefillIsKnownOver(t *testing.T) {
	type step struct {
		event      string // headers-200, headers-500, first-byte, done
		wantQueued bool   // the charge is still on the endpoint after the event
	}
	cases := []struct {
		name   string
		stream bool
		steps  []step
	}{
		{"stream: headers at arrival keep it, the first token pays", true,
			[]step{{"headers-200", true}, {"first-byte", false}, {"done", false}}},
		{"stream cancelled before its first token: the end pays", true,
			[]step{{"headers-200", true}, {"done", false}}},
		{"stream that fails: the error status pays", true,
			[]step{{"headers-500", false}, {"done", false}}},
		{"non-streamed: the headers come at the end and pay", false,
			[]step{{"headers-200", false}, {"first-byte", false}, {"done", false}}},
		{"non-streamed cancelled before any answer: the end pays", false,
			[]step{{"done", false}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			px, pf, eps, _ := setup(t)
			req := streamed(t, strings.Repeat("a brand new prompt. ", 60), tc.stream)
			score(px, pf, req, eps)
			var pk picker
			pk.pick(pf, req, eps[1])
			charged := eps[1].QueuedPrefill()
			if charged < 10 {
				t.Fatalf("a cold ~19-block prompt charged %d blocks", charged)
			}
			for _, st := range tc.steps {
				switch st.event {
				case "headers-200":
					pf.ResponseHeaders(req, eps[1], 200)
				case "headers-500":
					pf.ResponseHeaders(req, eps[1], 500)
				case "first-byte":
					pf.FirstByte(req, eps[1])
				case "done":
					pf.Done(req, eps[1])
				}
				want := int64(0)
				if st.wantQueued {
					want = charged
				}
				if q := eps[1].QueuedPrefill(); q != want {
					t.Fatalf("after %s the queue is %d, want %d", st.event, q, want)
				}
			}
		})
	}
}

// TestAFirstTokenProvesEveryEarlierPrefillOver: servers prefill in arrival order, so the first
// token of a request pays back every request picked before it on that endpoint, and nothing
// picked after it or elsewhere.
func TestAFirstTokenProvesEveryEarlierPrefillOver(t *testing.T) {
	_, pf, eps, _ := setup(t)
	var pk picker
	var on0 []*router.Request
	for range 4 {
		r := &router.Request{API: openai.APIOther} // 2 blocks each
		pk.pick(pf, r, eps[0])
		on0 = append(on0, r)
	}
	other := &router.Request{API: openai.APIOther}
	pk.pick(pf, other, eps[1])

	pf.FirstByte(on0[2], eps[0]) // the third request's first token
	if q := eps[0].QueuedPrefill(); q != 2 {
		t.Fatalf("queue %d on endpoint 0, want 2 (only the fourth request, picked after it)", q)
	}
	if h := eps[0].PrefillHead(); h != 2 {
		t.Fatalf("head %d, want the fourth request's 2 blocks", h)
	}
	if q := eps[1].QueuedPrefill(); q != 2 {
		t.Fatalf("queue %d on endpoint 1, want its own request's 2 blocks untouched", q)
	}
	for _, r := range on0 {
		pf.Done(r, eps[0])
	}
	pf.Done(other, eps[1])
	if q0, q1 := eps[0].QueuedPrefill(), eps[1].QueuedPrefill(); q0 != 0 || q1 != 0 {
		t.Fatalf("queues %d, %d after every stream ended: a charge was paid twice or never", q0, q1)
	}
}

// TestAScrapeSettlesTheQueue: a scrape sent after the picker's k-th pick that reports W waiting
// leaves at most the newest W+2 of those k requests charged (W waiting, two partly prefilled); requests picked after the scrape
// was sent keep their charge; waiting requests that are not the picker's count as external work
// while the scrape is fresh.
func TestAScrapeSettlesTheQueue(t *testing.T) {
	cases := []struct {
		name         string
		picks        int   // requests picked on the endpoint, 2 blocks each
		picksAtSend  int64 // PicksAtScrape
		waiting      int
		wantQueued   int64
		wantExternal bool
	}{
		{"nothing waiting: all but two partly prefilled requests are done", 6, 6, 0, 4, false},
		{"two waiting: four stay charged", 6, 6, 2, 8, false},
		{"more waiting than the picker sent: all stay, the rest is external", 3, 3, 10, 6, true},
		{"picks after the scrape was sent are untouched", 6, 3, 0, 2*2 + 3*2, false},
		{"a scrape sent before any pick changes nothing", 4, 0, 0, 8, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, pf, eps, _ := setup(t)
			ep := eps[0]
			var pk picker
			var reqs []*router.Request
			for range tc.picks {
				r := &router.Request{API: openai.APIOther}
				pk.pick(pf, r, ep)
				reqs = append(reqs, r)
			}
			now := time.Now()
			m := &router.Metrics{Waiting: tc.waiting, HasQueue: true, PicksAtScrape: tc.picksAtSend,
				ScrapedAt: now, StaleAt: now.Add(time.Hour)}
			ep.SetMetrics(m)
			pf.MetricsUpdated(ep, m)
			if q := ep.QueuedPrefill(); q != tc.wantQueued {
				t.Fatalf("queue %d after the scrape, want %d", q, tc.wantQueued)
			}
			if ext := ep.ExternalPrefill(); (ext > 0) != tc.wantExternal {
				t.Fatalf("external prefill %d, want >0: %v", ext, tc.wantExternal)
			}
			for _, r := range reqs {
				pf.Done(r, ep)
			}
			if q := ep.QueuedPrefill(); q != 0 {
				t.Fatalf("queue %d after every stream ended", q)
			}
		})
	}
}

// TestExternalWorkCountsOnlyWhileFresh: other replicas' waiting requests make an endpoint look
// busier while the scrape that showed them is fresh, and stop counting when it goes stale.
func TestExternalWorkCountsOnlyWhileFresh(t *testing.T) {
	_, pf, eps, _ := setup(t)
	var pk picker
	warm := &router.Request{API: openai.APIOther}
	pk.pick(pf, warm, eps[1]) // teaches the mean work per request
	pf.Done(warm, eps[1])
	now := time.Now()
	busy := &router.Metrics{Waiting: 50, HasQueue: true, ScrapedAt: now, StaleAt: now.Add(time.Hour)}
	eps[0].SetMetrics(busy)
	pf.MetricsUpdated(eps[0], busy)
	req := &router.Request{API: openai.APIOther, Now: now}
	s := make([]float64, 2)
	pf.Score(context.Background(), req, eps, s)
	if s[0] >= s[1] {
		t.Fatalf("scores %v: 50 requests waiting there from elsewhere must make endpoint 0 costlier", s)
	}
	req.Now = now.Add(2 * time.Hour) // the scrape is stale by then
	pf.Score(context.Background(), req, eps, s)
	if s[0] != s[1] {
		t.Fatalf("scores %v: a stale scrape must not count", s)
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
	for _, p := range []prefill.Params{{RequestOverheadBlocks: -1}, {CostScaleBlocks: -1}} {
		if _, err := prefill.New(p); err == nil {
			t.Errorf("%+v accepted", p)
		}
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
	// Against the same queue with the match committed (setup's doc), the pending holder must
	// look costlier: it waits for the whole head, not half of it.
	px3, pf3, eps3, doc3 := setup(t)
	other := request(t, strings.Repeat("a prompt nobody has seen. ", 160))
	score(px3, pf3, other, eps3)
	pf3.Picked(other, eps3[0])
	s3 := score(px3, pf3, request(t, doc3+" and a question"), eps3)
	if !(s2[0] < s3[0]) {
		t.Fatalf("holder scores %.3f (pending match) vs %.3f (committed match): the pending one must count the whole head", s2[0], s3[0])
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

// TestSmallCostDifferencesAreWeighedAgainstTheScale: between nearly idle endpoints a queue of a
// few short requests is within the estimate's noise: with a cost scale of 1,024 blocks it
// moves the score a little; without one (relative to the cheapest cost alone) it decides.
func TestSmallCostDifferencesAreWeighedAgainstTheScale(t *testing.T) {
	cases := []struct {
		scale    int
		wantLow  float64 // the busier endpoint's score lies in [wantLow, wantHigh]
		wantHigh float64
	}{
		{0, 0, 0.5},
		{1024, 0.95, 0.99},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("scale=%d", tc.scale), func(t *testing.T) {
			pf, err := prefill.New(prefill.Params{RequestOverheadBlocks: 2, CostScaleBlocks: tc.scale})
			if err != nil {
				t.Fatal(err)
			}
			eps := routertest.Endpoints(0, 0)
			eps[1].AddQueuedPrefill(20) // one short request queued there
			s := make([]float64, 2)
			pf.Score(context.Background(), &router.Request{API: openai.APIOther}, eps, s)
			if s[0] != 1 || s[1] < tc.wantLow || s[1] > tc.wantHigh {
				t.Fatalf("scores %v, want [1, %v..%v]", s, tc.wantLow, tc.wantHigh)
			}
		})
	}
}

// TestTheServersFirstTokenCountSettlesNonStreamedRequests: non-streamed requests show nothing
// until their answer ends; the server's count of first tokens does. Of the first tokens it
// counted since the last scrape, those the picker did not see for itself (a stream's first
// byte) finished the prefill of its oldest outstanding requests there.
func TestTheServersFirstTokenCountSettlesNonStreamedRequests(t *testing.T) {
	_, pf, eps, _ := setup(t)
	ep := eps[0]
	var pk picker
	var reqs []*router.Request
	for range 5 {
		r := streamed(t, strings.Repeat("x", 60), false) // non-streamed, 2-3 blocks each
		pk.pick(pf, r, ep)
		reqs = append(reqs, r)
	}
	stream := streamed(t, strings.Repeat("y", 60), true)
	pk.pick(pf, stream, ep)
	total := ep.QueuedPrefill()
	scrape := func(firsts uint64) {
		now := time.Now()
		m := &router.Metrics{Waiting: 6, HasQueue: true, FirstTokens: firsts, HasFirstTokens: true,
			PicksAtScrape: 6, ScrapedAt: now, StaleAt: now.Add(time.Hour)}
		ep.SetMetrics(m)
		pf.MetricsUpdated(ep, m)
	}
	scrape(100) // the baseline: nothing can be said yet
	if q := ep.QueuedPrefill(); q != total {
		t.Fatalf("a first scrape paid %d blocks back: it only sets the baseline", total-q)
	}
	if got := ep.PrefilledThrough(); got != 0 {
		t.Fatalf("prefilled through pick %d before anything was known", got)
	}
	pf.FirstByte(stream, ep) // the picker sees the stream's first token: it pays everything older
	if q := ep.QueuedPrefill(); q != 0 {
		t.Fatalf("queue %d after the newest request's first byte, want 0 (arrival order)", q)
	}
	if got := ep.PrefilledThrough(); got != 6 {
		t.Fatalf("prefilled through pick %d after the sixth pick's first byte, want 6", got)
	}
	for _, r := range append(reqs, stream) {
		pf.Done(r, ep)
	}

	// Now without a later stream: only the server's count can tell.
	reqs = reqs[:0]
	var blocks []int64
	for range 4 {
		before := ep.QueuedPrefill()
		r := streamed(t, strings.Repeat("z", 60), false)
		pk.pick(pf, r, ep)
		blocks = append(blocks, ep.QueuedPrefill()-before)
		reqs = append(reqs, r)
	}
	now := time.Now()
	m := &router.Metrics{Waiting: 4, HasQueue: true, FirstTokens: 100 + 6 + 2, HasFirstTokens: true,
		PicksAtScrape: pk.seq[ep], ScrapedAt: now, StaleAt: now.Add(time.Hour)}
	// Since the baseline the server counted 8 first tokens: 6 the picker learnt of (five by
	// arrival order, one first byte), 2 it did not: its two oldest outstanding requests.
	pf.MetricsUpdated(ep, m)
	if q, want := ep.QueuedPrefill(), blocks[2]+blocks[3]; q != want {
		t.Fatalf("queue %d, want %d: the two oldest of four paid back", q, want)
	}
	// Picks 7-10 are the four; the two oldest are known prefilled, although neither has answered.
	if got := ep.PrefilledThrough(); got != 8 {
		t.Fatalf("prefilled through pick %d, want 8", got)
	}
	pf.Done(reqs[3], ep) // the newest ends early (a client hang-up): that says nothing of pick 9
	if got := ep.PrefilledThrough(); got != 8 {
		t.Fatalf("prefilled through pick %d after pick 10 ended early, want 8", got)
	}
	for _, r := range reqs {
		pf.Done(r, ep)
	}
	if q := ep.QueuedPrefill(); q != 0 {
		t.Fatalf("queue %d after every stream ended", q)
	}
}

// blocksOf returns n made-up chained block hashes starting at first.
func blocksOf(first uint64, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = first + uint64(i)
	}
	return h
}

// TestOtherReplicasPicksAreQueuedHere: with active replicas, each one's picks reach the others
// (pkg/peers, through the prefix plugin) and are charged there as if made there: the endpoint
// looks as busy as it is before any scrape shows it; the pick's end pays the charge back once,
// whichever comes first of its end, this replica's later first byte there, or a scrape; and
// a scrape counts the peers' picks as seen, not as external work on top of their charge.
func TestOtherReplicasPicksAreQueuedHere(t *testing.T) {
	px, pf, eps, _ := setup(t)
	px.EndpointsChanged(eps, nil)
	px.ObservePeers(pf)
	ctx := context.Background()
	unrelated := func() []float64 {
		s := make([]float64, 2)
		pf.Score(ctx, &router.Request{API: openai.APIOther, Now: time.Now()}, eps, s)
		return s
	}

	px.ApplyPeerPick(7, 1, eps[1].Addr, blocksOf(100, 40))
	if q := eps[1].QueuedPrefill(); q != 40+2 {
		t.Fatalf("queue %d on the peer's endpoint, want its 40 uncached blocks and the overhead of 2", q)
	}
	if s := unrelated(); s[0] <= s[1] {
		t.Fatalf("scores %v: the endpoint with the peer's prefill queued must cost more", s)
	}
	px.ApplyPeerCommit(7, 1, eps[1].Addr, blocksOf(100, 40))
	if q := eps[1].QueuedPrefill(); q != 0 {
		t.Fatalf("queue %d after the peer's commit, want 0", q)
	}

	// A peer's pick, then one of this replica's own there: the own request's first token
	// proves the peer's prefill (picked before it) over too.
	px.ApplyPeerPick(7, 2, eps[1].Addr, blocksOf(200, 10))
	var pk picker
	pk.seq = map[*router.Endpoint]int64{eps[1]: eps[1].Picks()}
	own := &router.Request{API: openai.APIOther}
	pk.pick(pf, own, eps[1])
	pf.FirstByte(own, eps[1])
	if q := eps[1].QueuedPrefill(); q != 0 {
		t.Fatalf("queue %d after a later own first byte, want 0", q)
	}
	px.ApplyPeerDrop(7, 2) // its end, late: nothing left to pay
	pf.Done(own, eps[1])
	if q := eps[1].QueuedPrefill(); q != 0 {
		t.Fatalf("queue %d after the peer's late drop, want 0 (paid twice?)", q)
	}

	// Five peer picks; a scrape sent after them shows one waiting: of the five it saw, all but
	// the newest three (one waiting, two partly prefilled) are paid, and nothing counts as
	// external work.
	for id := range uint64(5) {
		px.ApplyPeerPick(8, id, eps[0].Addr, blocksOf(1000*(id+1), 10))
	}
	now := time.Now()
	m := &router.Metrics{Waiting: 1, HasQueue: true, PicksAtScrape: eps[0].Picks(), ScrapedAt: now, StaleAt: now.Add(time.Hour)}
	eps[0].SetMetrics(m)
	pf.MetricsUpdated(eps[0], m)
	if q, ext := eps[0].QueuedPrefill(), eps[0].ExternalPrefill(); q != 3*12 || ext != 0 {
		t.Fatalf("after the scrape queue %d, external %d; want the newest 3 peer picks (36 blocks) and no external work", q, ext)
	}
	for id := range uint64(5) {
		px.ApplyPeerDrop(8, id)
	}
	if q := eps[0].QueuedPrefill(); q != 0 {
		t.Fatalf("queue %d after every peer pick ended, want 0", q)
	}
}
