package prefix

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/kvpick/kvpick/pkg/router"
)

// Retention: how much of what the picker predicts an endpoint's server really finds cached, from
// the server's prefix-cache counters (vllm:prefix_cache_queries_total and _hits_total: prompt
// tokens looked up, and found, when a request is first scheduled). A response's cached_tokens
// (evidence.go) comes when the request ends, tens of seconds late under an overload, while a
// server short of KV room loses a prefix seconds after it was used. The counters say every
// scrape what share of what it looks up the server finds; beside it the plugin keeps the share
// of their prompts the requests it sent there were predicted to find (Score's match at pick:
// index and pending records), over the same window, and exports both per endpoint: a
// server finding far less than predicted is one the picker over-promises.
//
// The two windows hold different requests (the counters count at admission, the predictions at
// pick; under a long queue a pick is admitted seconds later), so they compare a steady traffic,
// not one request. Scaling the matches on such an endpoint by the ratio was tried and not kept
// (docs/benchmarks.md, "Server hit shares").
const (
	// retentionWindowTokens is the decay length of the sums, in prompt tokens the server looked
	// up: they decay by e per that many tokens, not per second, so that the window holds as many
	// requests whatever the load (and a simulation's clock does not matter). 65,536 tokens is
	// ~15 long prompts (4-5 K tokens: a shared system prompt and a question), ~4 s of one
	// server's admissions at 0.85 of the small-caches scenario's load.
	retentionWindowTokens = 1 << 16
	// retentionMinBlocks is the decayed predicted prompt blocks (index blocks, ~16 tokens each)
	// below which no share is published: a few requests' worth.
	retentionMinBlocks = 256
)

// retention keeps, per endpoint slot, the picks' predictions since the last scrape and the
// decayed sums. Picks add with atomics (the pick path takes no lock); a scrape folds them in
// under mu. Growing the slots (an endpoint in a new slot) copies them: a pick that adds to the
// old copy at that moment is lost, which only delays the first published share.
type retention struct {
	mu    sync.Mutex
	slots atomic.Pointer[[]retained] // grown under mu; readers may hold an older copy
	// observed is told an endpoint's predicted and server hit shares after each scrape once the
	// window holds enough, under mu (metrics); nil: nobody listens.
	observed func(ep *router.Endpoint, predicted, server float64)
}

type retained struct {
	predicted, total atomic.Uint64 // blocks predicted found, and prompt blocks, since the last scrape

	// Under mu.
	ep           *router.Endpoint
	p, t, h, q   float64 // decayed sums: predicted and prompt blocks; hit and queried tokens
	lastQ, lastH uint64
	hasLast      bool
}

func (r *retention) slot(s int) *retained {
	if sl := r.slots.Load(); sl != nil && s < len(*sl) {
		return &(*sl)[s]
	}
	return nil
}

// picked adds a pick's prediction: held of its total blocks predicted found on the endpoint.
func (r *retention) picked(ep *router.Endpoint, held, total int) {
	x := r.slot(ep.Slot)
	if x == nil {
		r.mu.Lock()
		x = r.growLocked(ep.Slot)
		r.mu.Unlock()
	}
	x.predicted.Add(uint64(held))
	x.total.Add(uint64(total))
}

func (r *retention) growLocked(s int) *retained {
	var cur []retained
	if sl := r.slots.Load(); sl != nil {
		cur = *sl
	}
	if s < len(cur) {
		return &cur[s]
	}
	n := make([]retained, max(s+1, 2*len(cur), 8))
	for i := range cur {
		c, d := &cur[i], &n[i]
		d.predicted.Store(c.predicted.Load())
		d.total.Store(c.total.Load())
		d.ep, d.p, d.t, d.h, d.q, d.lastQ, d.lastH, d.hasLast = c.ep, c.p, c.t, c.h, c.q, c.lastQ, c.lastH, c.hasLast
	}
	r.slots.Store(&n)
	return &n[s]
}

// metrics folds a scrape's counters and the picks since the last one into ep's sums and
// returns the two shares; ok is false while the window holds too little (or the server
// reports no counters).
func (r *retention) metrics(ep *router.Endpoint, m *router.Metrics) (predicted, server float64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.growLocked(ep.Slot)
	if x.ep != ep { // a new endpoint in a reused slot
		x.ep, x.p, x.t, x.h, x.q, x.hasLast = ep, 0, 0, 0, 0, false
	}
	dp, dt := float64(x.predicted.Swap(0)), float64(x.total.Swap(0))
	if m == nil || !m.HasPrefixCounters {
		x.hasLast = false
		return 0, 0, false
	}
	if !x.hasLast || m.PrefixQueries < x.lastQ || m.PrefixHits < x.lastH {
		// The first scrape with the counters, or the server restarted (they went back): start
		// over.
		x.lastQ, x.lastH, x.hasLast = m.PrefixQueries, m.PrefixHits, true
		x.p, x.t, x.h, x.q = 0, 0, 0, 0
		return 0, 0, false
	}
	dq, dh := float64(m.PrefixQueries-x.lastQ), float64(m.PrefixHits-x.lastH)
	d := math.Exp(-dq / retentionWindowTokens)
	x.p, x.t = x.p*d+dp, x.t*d+dt
	x.h, x.q = x.h*d+dh, x.q*d+dq
	x.lastQ, x.lastH = m.PrefixQueries, m.PrefixHits
	if x.t < retentionMinBlocks || x.q <= 0 {
		return 0, 0, false
	}
	predicted, server = x.p/x.t, min(1, x.h/x.q)
	if r.observed != nil {
		r.observed(ep, predicted, server)
	}
	return predicted, server, true
}

// forget resets a removed endpoint's slot.
func (r *retention) forget(ep *router.Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if x := r.slot(ep.Slot); x != nil && x.ep == ep {
		x.ep, x.hasLast = nil, false
		x.predicted.Store(0)
		x.total.Store(0)
	}
}
