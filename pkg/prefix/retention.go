package prefix

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/kvpick/kvpick/pkg/router"
)

// Retention: how much of what the picker predicts an endpoint's server really finds cached, from
// the server's prefix-cache counters (vllm:prefix_cache_queries_total and _hits_total: prompt
// tokens looked up, and found, when a request is first scheduled). The index remembers what each
// endpoint served and the pending and running records what it is serving; a server short of KV
// room (an overload, a cache far smaller than the index assumes) evicts a prefix seconds after
// it was used, and a response's cached_tokens (evidence.go) says so only when the request ends,
// tens of seconds later under such a load. The counters say it every scrape: over the last
// window the server found H of Q tokens cached, while the requests the picker sent there were
// predicted to find P of their T blocks (Score's match for the picked endpoint: index, pending
// and running records). Both shares are exported per endpoint; with ServerHitDiscount the
// matches on an endpoint whose server finds clearly less than predicted are scaled by
// H/Q ÷ (P/T × (1 − retentionTolerance)) (trust), so that the load and prefill scorers stop
// seeing the server that loses its prefixes as the cheapest.
//
// The comparison pairs two windows of different requests (the counters count at admission, the
// predictions at pick; under a long queue those are different requests), so it holds for a
// steady traffic, not for a single request. Trust is 1 where the server finds as much as
// predicted or more (multi-turn prompts repeat an answer the index never saw): it only ever
// discounts.
const (
	// retentionWindowTokens is the decay length of the sums, in prompt tokens the server looked
	// up: they decay by e per that many tokens, not per second, so that the window holds as many
	// requests whatever the load (and a simulation's clock does not matter). 65,536 tokens is
	// ~15 long prompts (4-5 K tokens: a shared system prompt and a question), ~4 s of one
	// server's admissions at the small-caches scenario's 0.85 load.
	retentionWindowTokens = 1 << 16
	// retentionTolerance is how far the server's hit share may fall below the prediction before
	// trust drops below 1: the picker's byte blocks never align with the server's token blocks,
	// vLLM recomputes a prompt's last token, and a follower admitted before its leader's prefill
	// finished finds less than its pending record promised. Tuning seeds 1-6, 0.85 load,
	// shared-prefix: 0.1 cost p50 1.51×, 0.2 1.22× (p90 0.90×, p99 0.73×), 0.3 1.18× (p90
	// 0.92×, p99 0.83×) (docs/benchmarks.md, "Server hit shares").
	retentionTolerance = 0.2
	// retentionMinBlocks is the decayed predicted hits (index blocks, ~16 tokens each) below
	// which nothing is concluded: a few requests' worth.
	retentionMinBlocks = 256
)

// retention keeps, per endpoint slot, the picks' predictions since the last scrape, the decayed
// sums and the resulting trust. Picks add with atomics (the pick path takes no lock); a scrape
// folds them in under mu. Growing the slots (an endpoint in a new slot) copies them: a pick that
// adds to the old copy at that moment is lost, which only delays the first verdict.
type retention struct {
	mu    sync.Mutex
	slots atomic.Pointer[[]retained] // grown under mu; readers may hold an older copy
	// observed is told an endpoint's predicted and server hit shares after a scrape that
	// concluded something, under mu (metrics); nil: nobody listens.
	observed func(ep *router.Endpoint, predicted, server float64)
}

type retained struct {
	predicted, total atomic.Uint64 // blocks predicted found, and prompt blocks, since the last scrape
	discount         atomic.Uint64 // float64 bits of 1 − trust: 0 (the zero value) is full trust

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
		d.discount.Store(c.discount.Load())
		d.ep, d.p, d.t, d.h, d.q, d.lastQ, d.lastH, d.hasLast = c.ep, c.p, c.t, c.h, c.q, c.lastQ, c.lastH, c.hasLast
	}
	r.slots.Store(&n)
	return &n[s]
}

// trust is the factor the matches on the endpoint in slot are worth, 1 when nothing says
// otherwise.
func (r *retention) trust(slot int) float64 {
	if x := r.slot(slot); x != nil {
		return 1 - math.Float64frombits(x.discount.Load())
	}
	return 1
}

// scale multiplies each candidate's match by its endpoint's trust.
func (r *retention) scale(eps []*router.Endpoint, lens []int32) {
	for _, e := range eps {
		if t := r.trust(e.Slot); t < 1 && e.Slot < len(lens) {
			lens[e.Slot] = int32(float64(lens[e.Slot]) * t)
		}
	}
}

// metrics folds a scrape's counters and the picks since the last one into ep's sums.
func (r *retention) metrics(ep *router.Endpoint, m *router.Metrics) {
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.growLocked(ep.Slot)
	if x.ep != ep { // a new endpoint in a reused slot
		x.ep, x.p, x.t, x.h, x.q, x.hasLast = ep, 0, 0, 0, 0, false
		x.discount.Store(0)
	}
	dp, dt := float64(x.predicted.Swap(0)), float64(x.total.Swap(0))
	if m == nil || !m.HasPrefixCounters {
		x.hasLast = false
		x.discount.Store(0)
		return
	}
	if !x.hasLast || m.PrefixQueries < x.lastQ || m.PrefixHits < x.lastH {
		// The first scrape with the counters, or the server restarted (they went back): start
		// over.
		x.lastQ, x.lastH, x.hasLast = m.PrefixQueries, m.PrefixHits, true
		x.p, x.t, x.h, x.q = 0, 0, 0, 0
		x.discount.Store(0)
		return
	}
	dq, dh := float64(m.PrefixQueries-x.lastQ), float64(m.PrefixHits-x.lastH)
	d := math.Exp(-dq / retentionWindowTokens)
	x.p, x.t = x.p*d+dp, x.t*d+dt
	x.h, x.q = x.h*d+dh, x.q*d+dq
	x.lastQ, x.lastH = m.PrefixQueries, m.PrefixHits
	if x.p < retentionMinBlocks || x.t <= 0 || x.q <= 0 {
		x.discount.Store(0)
		return
	}
	predicted, server := x.p/x.t, min(1, x.h/x.q)
	trust := 1.0
	if want := predicted * (1 - retentionTolerance); server < want {
		trust = server / want
	}
	x.discount.Store(math.Float64bits(1 - trust))
	if r.observed != nil {
		r.observed(ep, predicted, server)
	}
}

// forget resets a removed endpoint's slot.
func (r *retention) forget(ep *router.Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if x := r.slot(ep.Slot); x != nil && x.ep == ep {
		x.ep, x.hasLast = nil, false
		x.discount.Store(0)
		x.predicted.Store(0)
		x.total.Store(0)
	}
}
