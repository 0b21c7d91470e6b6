// Package prefill scores endpoints by the prefill work a request would wait for there: the
// prompt blocks the picker has sent to the endpoint that have not produced a first byte yet
// (its prefill queue), plus the blocks of this prompt the endpoint does not hold. That is the
// picker's own estimate of time to first token, in one unit, so that cache affinity and load
// are traded against each other the way a router that knew the servers' queues would trade
// them: a long cached prefix is worth a longer queue, a short one is not.
//
// The queue needs no model-server metrics: it is charged at pick with the request's predicted
// uncached blocks and discharged when the response headers arrive (for streaming responses, the
// first token: prefill is over) or the stream ends. The predicted matches come from the prefix
// scorer, which must be listed before this one.
package prefill

import (
	"context"
	"fmt"
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
}

// Validate names the first bad field.
func (p Params) Validate() error {
	if p.RequestOverheadBlocks < 0 {
		return fmt.Errorf("requestOverheadBlocks %d: must not be negative", p.RequestOverheadBlocks)
	}
	return nil
}

// Scorer is the prefill-queue scorer.
type Scorer struct {
	p     Params
	costs sync.Pool // *[]int64 scratch

	mu     sync.Mutex
	queues map[*router.Endpoint]*queue // outstanding charges per endpoint, in pick order
}

// queue is one endpoint's outstanding charges in pick order; discharged ones stay until they
// reach the front, so that the head is always the oldest request still prefilling.
type queue struct {
	charges []*charge
	start   int
}

var (
	_ router.Scorer           = (*Scorer)(nil)
	_ router.PickObserver     = (*Scorer)(nil)
	_ router.ResponseObserver = (*Scorer)(nil)
	_ router.DoneObserver     = (*Scorer)(nil)
	_ router.PoolListener     = (*Scorer)(nil)
)

var stateKey = router.NewStateKey(Name)

// charge is what one request added to an endpoint's prefill queue.
type charge struct {
	ep     *router.Endpoint
	blocks int64
	done   bool // discharged (under Scorer.mu)
}

// New returns the scorer.
func New(p Params) (*Scorer, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Scorer{p: p, queues: map[*router.Endpoint]*queue{}}, nil
}

// Name implements router.Plugin.
func (*Scorer) Name() string { return Name }

// work is the prefill work, in blocks, that a request with matches m brings to ep.
func (s *Scorer) work(m prefix.Matches, ep *router.Endpoint) int64 {
	return int64(m.Total - m.Blocks(ep) + s.p.RequestOverheadBlocks)
}

// Score implements router.Scorer: 1 for the cheapest endpoint (queue plus own work), falling
// linearly to 0 at twice its cost, so that differences are weighed against the work itself:
// ten blocks matter on an idle pool, not behind a queue of ten thousand. The request at the
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
		queued := max(e.QueuedPrefill(), 0)
		if !m.Pending(e) {
			queued = max(queued-e.PrefillHead()/2, 0)
		}
		c := queued + s.work(m, e)
		costs = append(costs, c)
		if least < 0 || c < least {
			least = c
		}
	}
	for i, c := range costs {
		scores[i] = max(0, 1-float64(c-least)/float64(least+1))
	}
	*cp = costs
	s.costs.Put(cp)
}

// Picked charges the endpoint with the request's predicted uncached blocks.
func (s *Scorer) Picked(req *router.Request, ep *router.Endpoint) {
	n := s.work(prefix.MatchesOf(req), ep)
	c := &charge{ep: ep, blocks: n}
	ep.AddQueuedPrefill(n)
	s.mu.Lock()
	q := s.queues[ep]
	if q == nil {
		q = &queue{}
		s.queues[ep] = q
	}
	q.charges = append(q.charges, c)
	if len(q.charges)-q.start == 1 {
		ep.SetPrefillHead(n)
	}
	s.mu.Unlock()
	req.Set(stateKey, c)
}

// ResponseHeaders discharges the request: its prefill is over, or it failed.
func (s *Scorer) ResponseHeaders(req *router.Request, _ *router.Endpoint, _ int) { s.discharge(req) }

// Done discharges a request whose stream ended before its response.
func (s *Scorer) Done(req *router.Request, _ *router.Endpoint) { s.discharge(req) }

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

func (s *Scorer) discharge(req *router.Request) {
	c, _ := req.Get(stateKey).(*charge)
	if c == nil {
		return
	}
	req.Set(stateKey, nil)
	s.mu.Lock()
	c.done = true
	c.ep.AddQueuedPrefill(-c.blocks)
	q := s.queues[c.ep]
	for q.start < len(q.charges) && q.charges[q.start].done {
		q.charges[q.start] = nil
		q.start++
	}
	switch {
	case q.start == len(q.charges):
		q.charges, q.start = q.charges[:0], 0 // kept for the next request: no allocation per pick
		if c.ep.Removed() {
			delete(s.queues, c.ep) // nothing kept for an endpoint that left the pool
		}
		c.ep.SetPrefillHead(0)
	default:
		if q.start > len(q.charges)/2 { // reuse the front half of the slice
			q.charges = q.charges[:copy(q.charges, q.charges[q.start:])]
			q.start = 0
		}
		c.ep.SetPrefillHead(q.charges[q.start].blocks)
	}
	s.mu.Unlock()
}
