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
}

var (
	_ router.Scorer           = (*Scorer)(nil)
	_ router.PickObserver     = (*Scorer)(nil)
	_ router.ResponseObserver = (*Scorer)(nil)
	_ router.DoneObserver     = (*Scorer)(nil)
)

var stateKey = router.NewStateKey(Name)

// charge is what one request added to an endpoint's prefill queue.
type charge struct {
	ep     *router.Endpoint
	blocks int64
}

// New returns the scorer.
func New(p Params) (*Scorer, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Scorer{p: p}, nil
}

// Name implements router.Plugin.
func (*Scorer) Name() string { return Name }

// work is the prefill work, in blocks, that a request with matches m brings to ep.
func (s *Scorer) work(m prefix.Matches, ep *router.Endpoint) int64 {
	return int64(m.Total - m.Blocks(ep) + s.p.RequestOverheadBlocks)
}

// Score implements router.Scorer: 1 for the cheapest endpoint (queue plus own work), falling
// linearly to 0 at twice its cost, so that differences are weighed against the work itself:
// ten blocks matter on an idle pool, not behind a queue of ten thousand.
func (s *Scorer) Score(_ context.Context, req *router.Request, eps []*router.Endpoint, scores []float64) {
	cp, _ := s.costs.Get().(*[]int64)
	if cp == nil {
		cp = new([]int64)
	}
	costs := (*cp)[:0]
	least := int64(-1)
	m := prefix.MatchesOf(req)
	for _, e := range eps {
		c := max(e.QueuedPrefill(), 0) + s.work(m, e)
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
	ep.AddQueuedPrefill(n)
	req.Set(stateKey, &charge{ep: ep, blocks: n})
}

// ResponseHeaders discharges the request: its prefill is over, or it failed.
func (s *Scorer) ResponseHeaders(req *router.Request, _ *router.Endpoint, _ int) { s.discharge(req) }

// Done discharges a request whose stream ended before its response.
func (s *Scorer) Done(req *router.Request, _ *router.Endpoint) { s.discharge(req) }

func (s *Scorer) discharge(req *router.Request) {
	if c, _ := req.Get(stateKey).(*charge); c != nil {
		c.ep.AddQueuedPrefill(-c.blocks)
		req.Set(stateKey, nil)
	}
}
