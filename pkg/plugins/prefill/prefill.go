// Package prefill scores endpoints by the prefill work a request would wait for there: the
// prompt blocks routed to the endpoint whose prefill is not over yet (its prefill queue), plus
// the blocks of this prompt the endpoint does not hold. That is the picker's estimate of time
// to first token, in one unit, so that cache affinity and load are traded against each other
// the way a router that knew the servers' queues would trade them: a long cached prefix is
// worth a longer queue, a short one is not.
//
// # The queue estimate
//
// Each routed request charges its endpoint with its predicted uncached blocks at pick. The
// charge is paid back when the picker learns that the server's prefill of the request is over,
// from whichever signal comes first:
//
//   - the first byte of a streamed response's body: the first token (vLLM and SGLang send a
//     stream's headers when the request arrives, before any prefill, so headers prove nothing);
//   - the response headers of a non-streamed request (they come at the end of generation) or of
//     a failure;
//   - the end of the request's stream, however it ended;
//   - order: servers prefill in arrival order (vLLM's scheduler is first-come first-served, and
//     a request waits until its first chunk is scheduled), so when a request's prefill is over,
//     so is that of every request picked before it on the same endpoint;
//   - the server's own queue: a fresh metrics scrape that reports W requests waiting, sent after
//     the picker's k-th pick there, leaves at most the newest W+2 of those k requests unfinished
//     (W waiting, and up to two partly prefilled: chunked prefill spreads a long prompt over
//     several steps and admits the next request into the budget its last chunk leaves): the
//     older ones are paid back at once. Requests picked
//     after the scrape was sent are not touched. The scrape's waiting requests that are not the
//     picker's own (other picker replicas, direct clients) are added to the endpoint's cost at
//     the mean work per request, while the scrape is fresh: the signal that several replicas
//     share.
//
// With active picker replicas sharing their picks (pkg/peers), the other replicas' picks are
// charged too, from when this replica learns of them (a poll interval late) until their
// commit or drop, and count among the requests a later scrape could see.
//
// So the estimate holds for streamed, non-streamed and mixed traffic, needs no clock, and
// degrades to the picker's own accounting when the servers export no metrics or the metrics
// are stale. Without metrics and with non-streamed traffic only, a charge lasts until a later
// request on the endpoint completes: the queue then also counts some decode time, alike on
// every endpoint.
//
// The predicted matches come from the prefix scorer, which must be listed before this one.
package prefill

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/kvpick/kvpick/pkg/prefix"
	"github.com/kvpick/kvpick/pkg/router"
)

// Name is the plugin's name in config files.
const Name = "prefill-scorer"

// Params configure the scorer.
type Params struct {
	// RequestOverheadBlocks is the fixed cost of one queued request, in blocks: the scheduling
	// and launch overhead of a prefill, which caching does not shrink.
	RequestOverheadBlocks int `json:"requestOverheadBlocks"`
	// CostScaleBlocks is the least difference in cost, in blocks, that takes an endpoint's score
	// from 1 to 0: differences are weighed against the cheapest endpoint's cost or this,
	// whichever is larger.
	CostScaleBlocks int `json:"costScaleBlocks"`
}

// Validate names the first bad field.
func (p Params) Validate() error {
	if p.RequestOverheadBlocks < 0 {
		return fmt.Errorf("requestOverheadBlocks %d: must not be negative", p.RequestOverheadBlocks)
	}
	if p.CostScaleBlocks < 0 {
		return fmt.Errorf("costScaleBlocks %d: must not be negative", p.CostScaleBlocks)
	}
	return nil
}

// Scorer is the prefill-queue scorer.
type Scorer struct {
	p     Params
	costs sync.Pool // *[]int64 scratch

	mu      sync.Mutex
	queues  map[*router.Endpoint]*queue // outstanding charges per endpoint, in pick order
	avgWork float64                     // mean charge per request (blocks), decayed
	nWork   int                         // picks averaged so far, until the decay takes over
	peers   map[*prefix.PeerPick]*charge
}

// queue is one endpoint's outstanding charges in pick order; discharged ones stay until they
// reach the front, so that the head is always the oldest request still prefilling.
type queue struct {
	charges []*charge
	start   int
	// known counts the requests whose prefill the picker learnt was over (first byte,
	// non-streamed answer, arrival order, or the server's counter below); firsts and
	// knownAtFirsts are the server's first-token count and known at the last scrape.
	known, firsts, knownAtFirsts uint64
	hasFirsts                    bool
	maxSeq                       int64 // the highest pick number charged here
}

var (
	_ router.Scorer            = (*Scorer)(nil)
	_ router.PickObserver      = (*Scorer)(nil)
	_ router.ResponseObserver  = (*Scorer)(nil)
	_ router.FirstByteObserver = (*Scorer)(nil)
	_ router.DoneObserver      = (*Scorer)(nil)
	_ router.MetricsObserver   = (*Scorer)(nil)
	_ router.PoolListener      = (*Scorer)(nil)
	_ prefix.PeerObserver      = (*Scorer)(nil)
)

var stateKey = router.NewStateKey(Name)

// charge is what one request added to an endpoint's prefill queue.
type charge struct {
	ep       *router.Endpoint
	blocks   int64
	seq      int64 // the request's pick number on ep (router.Request.PickSeq)
	streamed bool  // the client asked for a stream: its headers say nothing about prefill
	done     bool  // discharged (under Scorer.mu)
}

// partialPrefills is how many running requests may be partly prefilled at once on a vLLM
// server: the one whose prompt spans several steps, and the next one, admitted into the budget
// left by the first one's last chunk.
const partialPrefills = 2

// avgWorkDecay weighs the mean work per request over the last ~1,000 picks.
const avgWorkDecay = 1.0 / 1024

// New returns the scorer.
func New(p Params) (*Scorer, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Scorer{p: p, queues: map[*router.Endpoint]*queue{}, peers: map[*prefix.PeerPick]*charge{}}, nil
}

// Name implements router.Plugin.
func (*Scorer) Name() string { return Name }

// work is the prefill work, in blocks, that a request with matches m brings to ep.
func (s *Scorer) work(m *prefix.Matches, ep *router.Endpoint) int64 {
	return int64(m.Total - m.Blocks(ep) + s.p.RequestOverheadBlocks)
}

// Score implements router.Scorer: 1 for the cheapest endpoint (queue plus own work), falling
// linearly to 0 at a cost higher by the scale: the cheapest endpoint's cost, or
// CostScaleBlocks if that is more. Relative to the work itself, ten blocks matter less behind
// a queue of ten thousand; but not relative to a tiny cost: between endpoints whose queues are
// nearly empty, a difference of a few short requests is within the estimate's noise (the
// charges of requests whose end the picker has not learnt yet: non-streamed ones, partial
// prefills a scrape cannot tell apart) and within one engine step's budget, and must not
// outweigh the load and cache terms.
//
// The request at the
// head of an endpoint's queue is being prefilled already, on average half done, so half of it
// is taken off: counting it whole made a holder with one long cold prefill in progress look
// as slow as recomputing the whole prompt elsewhere (replay: shared-prefix requests left the
// engine holding their system prompt three times as often as the precise oracle let them).
// Not where the request's match there rests on a pending record: the head is then most likely
// the prefill of its own prefix, picked moments ago, and it waits for all of it.
func (s *Scorer) Score(_ context.Context, req *router.Request, eps []*router.Endpoint, scores []float64) {
	cp, _ := s.costs.Get().(*[]int64)
	if cp == nil {
		cp = new([]int64)
	}
	costs := (*cp)[:0]
	least := int64(-1)
	m := prefix.MatchesOf(req)
	for _, e := range eps {
		c := s.queued(e, &m, req) + s.work(&m, e)
		costs = append(costs, c)
		if least < 0 || c < least {
			least = c
		}
	}
	scale := float64(max(least+1, int64(s.p.CostScaleBlocks)))
	for i, c := range costs {
		scores[i] = max(0, 1-float64(c-least)/scale)
	}
	*cp = costs
	s.costs.Put(cp)
}

// queued is the prefill work a request would wait for on e, in blocks.
func (s *Scorer) queued(e *router.Endpoint, m *prefix.Matches, req *router.Request) int64 {
	q := max(e.QueuedPrefill(), 0)
	if !m.Pending(e) {
		q = max(q-e.PrefillHead()/2, 0)
	}
	if e.FreshMetrics(req.Now) != nil {
		q += max(e.ExternalPrefill(), 0)
	}
	return q
}

// Picked charges the endpoint with the request's predicted uncached blocks.
func (s *Scorer) Picked(req *router.Request, ep *router.Endpoint) {
	m := prefix.MatchesOf(req)
	n := s.work(&m, ep)
	c := &charge{ep: ep, blocks: n, seq: req.PickSeq, streamed: req.Body != nil && req.Body.Stream}
	s.enqueue(c)
	req.Set(stateKey, c)
}

// PeerPicked charges the endpoint with another replica's pick (pkg/peers), as if this replica
// had made it when it learnt of it: the replicas then see each other's prefills queued, not
// only what the next scrape shows (two replicas with the same view would otherwise send
// their prefills to the same endpoints in pairs). Its end, or the scrape's counts, pay it back.
func (s *Scorer) PeerPicked(p *prefix.PeerPick) {
	c := &charge{ep: p.Endpoint, blocks: int64(p.Uncached + s.p.RequestOverheadBlocks), seq: p.Seq, streamed: true}
	s.enqueue(c)
	s.mu.Lock()
	s.peers[p] = c
	s.mu.Unlock()
}

// PeerEnded pays back a peer's pick: committed, its prefill is over (its first token, or the
// whole answer of a request that does not stream); dropped, it is not coming. Not the
// requests picked before it: the picks of two replicas reach each other late, so the order
// between them is not the servers'.
func (s *Scorer) PeerEnded(p *prefix.PeerPick, committed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.peers[p]
	delete(s.peers, p)
	if c == nil || !s.payLocked(c) {
		return // paid already (the scrape's counts, or a later request's first byte)
	}
	q := s.queues[c.ep]
	if committed {
		q.known++
	}
	s.advanceLocked(c.ep, q)
}

// enqueue adds c to its endpoint's queue.
func (s *Scorer) enqueue(c *charge) {
	ep, n := c.ep, c.blocks
	ep.AddQueuedPrefill(n)
	s.mu.Lock()
	defer s.mu.Unlock()
	// A plain mean over the first picks, then a decayed one.
	s.nWork = min(s.nWork+1, 1/avgWorkDecay)
	s.avgWork += (float64(n) - s.avgWork) / float64(s.nWork)
	q := s.queues[ep]
	if q == nil {
		q = &queue{}
		s.queues[ep] = q
	}
	q.charges = append(q.charges, c)
	q.maxSeq = max(q.maxSeq, c.seq)
	if len(q.charges)-q.start == 1 {
		ep.SetPrefillHead(n)
	}
}

// ResponseHeaders discharges a failed request, and a successful one that does not stream: its
// headers come with the whole answer, so its prefill (and that of every request picked before
// it there) is over. A stream's headers come when the request reaches the server: it stays
// charged until its first byte.
func (s *Scorer) ResponseHeaders(req *router.Request, _ *router.Endpoint, status int) {
	c, _ := req.Get(stateKey).(*charge)
	if c == nil {
		return
	}
	switch {
	case status < 200 || status > 299:
		s.discharge(req, false)
	case !c.streamed:
		s.discharge(req, true)
	}
}

// FirstByte discharges the request and every request picked before it on the same endpoint:
// the first token is out, so the server's prefill of all of them is over.
func (s *Scorer) FirstByte(req *router.Request, _ *router.Endpoint) { s.discharge(req, true) }

// Done discharges a request whose stream ended before its first byte.
func (s *Scorer) Done(req *router.Request, _ *router.Endpoint) { s.discharge(req, false) }

// MetricsUpdated reconciles the endpoint's queue with a fresh scrape (see the package doc).
func (s *Scorer) MetricsUpdated(ep *router.Endpoint, m *router.Metrics) {
	if m == nil || !m.HasQueue {
		ep.SetExternalPrefill(0)
	}
	if m == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Checked under the lock: EndpointsChanged, which forgets a removed endpoint's idle queue,
	// takes it too, so a queue made here for an endpoint being removed is forgotten there.
	if ep.Removed() {
		return
	}
	q := s.queues[ep]
	if q == nil {
		q = &queue{}
		s.queues[ep] = q
	}
	paid := false
	if m.HasFirstTokens {
		// The server's count of first tokens since the last scrape, less the ones the picker
		// saw for itself, is how many of its requests there finished their prefill unseen
		// (non-streamed ones): the oldest outstanding ones, servers prefilling in order.
		if q.hasFirsts && m.FirstTokens >= q.firsts {
			seen := q.known - q.knownAtFirsts
			if unseen := m.FirstTokens - q.firsts; unseen > seen {
				paid = s.payOldestLocked(q, m.PicksAtScrape, int64(unseen-seen)) || paid
			}
		}
		q.firsts, q.knownAtFirsts, q.hasFirsts = m.FirstTokens, q.known, true
	}
	var seen int64 // own outstanding requests the scrape could see
	if m.HasQueue {
		waiting := int64(max(m.Waiting, 0))
		for _, c := range q.charges[q.start:] {
			if !c.done && c.seq <= m.PicksAtScrape {
				seen++
			}
		}
		// All but the newest waiting+partialPrefills of them have been prefilled.
		if over := seen - (waiting + partialPrefills); over > 0 {
			paid = s.payOldestLocked(q, m.PicksAtScrape, over) || paid
		}
		ep.SetExternalPrefill(int64(math.Round(float64(max(waiting-seen, 0)) * s.avgWork)))
	}
	if paid {
		s.advanceLocked(ep, q)
	}
}

// payOldestLocked pays the n oldest outstanding charges picked no later than pick number
// upTo, counting them as known to be prefilled; it reports whether it paid any.
func (s *Scorer) payOldestLocked(q *queue, upTo, n int64) bool {
	paid := false
	for _, c := range q.charges[q.start:] {
		if n == 0 {
			break
		}
		if !c.done && c.seq <= upTo {
			s.payLocked(c)
			q.known++
			n--
			paid = true
		}
	}
	return paid
}

// QueuedEndpoints is the number of endpoints whose queue the scorer keeps (for tests).
func (s *Scorer) QueuedEndpoints() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queues)
}

// EndpointsChanged forgets the queues of endpoints that left the pool idle; one that still has
// requests prefilling is forgotten when its last one is discharged.
func (s *Scorer) EndpointsChanged(_, removed []*router.Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range removed {
		if q := s.queues[e]; q != nil && q.start == len(q.charges) {
			delete(s.queues, e)
		}
	}
}

// discharge pays back the request's charge; older, when the request's prefill is known to be
// over, also pays back every charge picked before it on the endpoint (servers prefill in order).
func (s *Scorer) discharge(req *router.Request, older bool) {
	c, _ := req.Get(stateKey).(*charge)
	if c == nil {
		return
	}
	req.Set(stateKey, nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[c.ep]
	if older {
		for _, o := range q.charges[q.start:] {
			if o.seq < c.seq && s.payLocked(o) {
				q.known++
			}
		}
	}
	if s.payLocked(c) && older {
		q.known++
	}
	s.advanceLocked(c.ep, q)
}

// payLocked discharges one charge; it reports false if it was paid already.
func (s *Scorer) payLocked(c *charge) bool {
	if c.done {
		return false
	}
	c.done = true
	c.ep.AddQueuedPrefill(-c.blocks)
	return true
}

// advanceLocked drops discharged charges from the queue's front and publishes the new head.
func (s *Scorer) advanceLocked(ep *router.Endpoint, q *queue) {
	for q.start < len(q.charges) && q.charges[q.start].done {
		q.charges[q.start] = nil
		q.start++
	}
	// Every request charged here before the oldest one still charged is past its prefill (or
	// gone: its pending prefix record is dropped anyway), which tells the prefix scorer that a
	// prompt that does not stream is in the cache long before its answer says so.
	through := q.maxSeq
	for _, c := range q.charges[q.start:] {
		if !c.done {
			through = min(through, c.seq-1)
		}
	}
	ep.SetPrefilledThrough(through)
	switch {
	case q.start == len(q.charges):
		q.charges, q.start = q.charges[:0], 0 // kept for the next request: no allocation per pick
		if ep.Removed() {
			delete(s.queues, ep) // nothing kept for an endpoint that left the pool
		}
		ep.SetPrefillHead(0)
	default:
		if q.start > len(q.charges)/2 { // reuse the front half of the slice
			q.charges = q.charges[:copy(q.charges, q.charges[q.start:])]
			q.start = 0
		}
		ep.SetPrefillHead(q.charges[q.start].blocks)
	}
}
