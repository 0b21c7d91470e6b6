package replay

import (
	"slices"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
)

// Policy names.
const (
	RoundRobin  = "round-robin"
	LeastLoaded = "least-loaded"
	Precise     = "precise"
	KVPick      = "kvpick"
)

// Policies lists every policy, in report order.
func Policies() []string { return []string{RoundRobin, LeastLoaded, Precise, KVPick} }

// policy is an in-process router. The driver serializes its calls: pick is followed at once by
// submitted when the engine accepted the request; firstToken and done report the engine's
// callbacks.
type policy interface {
	pick(r *Request, now time.Time) int
	submitted(e int, r *Request, now time.Time)
	firstToken(e int, r *Request, res engine.Result)
	done(e int, r *Request, res engine.Result)
}

func newPolicy(name string, engs []*engine.Engine, cfg engine.Config) policy {
	switch name {
	case RoundRobin:
		return &roundRobin{n: len(engs)}
	case LeastLoaded:
		return &leastLoaded{engs: engs}
	case Precise:
		return newPrecise(engs, cfg)
	}

	return nil
}

// noHooks is for policies that keep no state about requests in flight.
type noHooks struct{}

func (noHooks) submitted(int, *Request, time.Time)      {}
func (noHooks) firstToken(int, *Request, engine.Result) {}
func (noHooks) done(int, *Request, engine.Result)       {}

// roundRobin sends request k to engine k mod N.
type roundRobin struct {
	noHooks
	n, next int
}

func (p *roundRobin) pick(*Request, time.Time) int {
	e := p.next
	p.next = (p.next + 1) % p.n
	return e
}

// leastLoaded sends each request to the engine with the fewest requests running or waiting;
// ties go round-robin, so an idle pool is used evenly.
type leastLoaded struct {
	noHooks
	engs []*engine.Engine
	next int
}

func (p *leastLoaded) pick(*Request, time.Time) int {
	n := len(p.engs)
	best, bestLoad := -1, 0
	for k := range n {
		e := (p.next + k) % n
		l := p.engs[e].Load()
		if load := l.Running + l.Waiting; best < 0 || load < bestLoad {
			best, bestLoad = e, load
		}
	}
	p.next = (best + 1) % n
	return best
}

// precise is the yardstick: it sees every engine's cache exactly (Engine.CachedPrefixTokens),
// its queue (Engine.Load) and, from the engines' callbacks, when every request in flight got
// its first token and when it will end. For each engine it estimates the request's time to
// first token as
//
//	start   = max(prefill queue drains, a batch slot frees, enough KV blocks free)
//	TTFT    = start − now + PrefillOverhead + uncached prompt tokens × PrefillPerToken
//
// replaying the engine's own model (package engine's doc): prefills run one after another in
// FIFO order; a request is admitted when fewer than MaxNumSeqs run. To the estimate it adds a
// tenth of the request's decode slowdown on that engine (decodeWeight), and picks the smallest
// sum; sums within 1 ms (or 2 %) of the best are a tie, broken by the fewest requests running or
// waiting, then round-robin.
type precise struct {
	engs []*engine.Engine
	cfg  engine.Config
	st   []*shadow
	next int
	// est is the estimated prefill of the request just picked, for submitted.
	est  time.Duration
	ends []time.Time // scratch
}

// decodeWeight weighs the decode slowdown a request would suffer on an engine (its inter-token
// latency grows with the batch it joins) against its TTFT. Pure TTFT-greedy routing (0) piles a
// prefix that every request shares onto the few engines that already hold it until their
// batches are full, then pays cold prefills at the worst moment: p90 TTFT on hot-prefix 225 ms
// against 13 ms with 0.1, which changes the other workloads by a few percent (docs/replay.md).
const decodeWeight = 0.1

// shadow is what precise knows of one engine's requests in flight.
type shadow struct {
	// pending are the requests submitted that have no first token yet, in submission order
	// (the engine's FIFO), with their estimated prefill time.
	pending []pendingReq
	// ends are the known end times of the requests decoding, by request id.
	ends map[int]time.Time
	// lastFirst is when the engine last produced a first token: the prefill queue's head
	// started no earlier.
	lastFirst time.Time
}

type pendingReq struct {
	id        int
	submitted time.Time
	prefill   time.Duration
	n         int
}

func newPrecise(engs []*engine.Engine, cfg engine.Config) *precise {
	p := &precise{engs: engs, cfg: cfg}
	for range engs {
		p.st = append(p.st, &shadow{ends: map[int]time.Time{}})
	}
	return p
}

func (p *precise) prefill(prompt, cached int) time.Duration {
	return p.cfg.PrefillOverhead + time.Duration(prompt-cached)*p.cfg.PrefillPerToken
}

// fullITL is the inter-token latency of a full batch, used for requests whose decode has not
// started.
func (p *precise) fullITL() time.Duration {
	return time.Duration(float64(p.cfg.DecodePerToken) * (1 + p.cfg.DecodeBatchPenalty))
}

// estimate returns the cost of r on engine e (estimated TTFT plus weighted decode slowdown), the
// request's prefill, and the engine's requests in flight.
func (p *precise) estimate(e int, r *Request, now time.Time) (cost, prefill time.Duration, load int) {
	eng, st := p.engs[e], p.st[e]
	req := engine.Request{Prompt: r.Prompt, MaxTokens: r.MaxTokens, CacheSalt: r.CacheSalt}
	cached := eng.CachedPrefixTokens(req)
	prefill = p.prefill(len(r.Prompt), cached)

	// The prefill queue: the head started when the previous first token came out, or when it
	// was submitted if the queue was idle then; everything pending runs before us.
	drain := now
	if len(st.pending) > 0 {
		head := st.pending[0].submitted
		if st.lastFirst.After(head) {
			head = st.lastFirst
		}
		var backlog time.Duration
		for _, q := range st.pending {
			backlog += q.prefill
		}
		drain = maxTime(now, head.Add(backlog))
	}

	// Batch slots: with running + waiting ≥ MaxNumSeqs we wait for that many − MaxNumSeqs + 1
	// requests to end. Requests still in prefill end after the queue drains and a full decode.
	l := eng.Load()
	load = l.Running + l.Waiting
	ends := p.ends[:0]
	for _, t := range st.ends {
		ends = append(ends, t)
	}
	for _, q := range st.pending {
		ends = append(ends, drain.Add(time.Duration(q.n)*p.fullITL()))
	}
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	p.ends = ends
	start := drain
	if k := load - p.cfg.MaxNumSeqs; k >= 0 && k < len(ends) {
		start = maxTime(start, ends[k])
	} else if k >= len(ends) && len(ends) > 0 {
		start = maxTime(start, ends[len(ends)-1])
	}
	// KV blocks: a request that does not fit waits for the first request to end.
	bs := p.cfg.BlockSize
	n := r.MaxTokens
	if n <= 0 {
		n = (p.cfg.OutputTokensMin + p.cfg.OutputTokensMax) / 2
	}
	need := (len(r.Prompt)+n+bs-1)/bs - cached/bs
	free := int((1 - l.KVUsage) * float64(p.cfg.NumGPUBlocks))
	if need > free && len(ends) > 0 {
		start = maxTime(start, ends[0])
	}
	cost = start.Sub(now) + prefill
	// The part of its decode time that depends on the batch it joins.
	if p.cfg.MaxNumSeqs > 1 {
		b := float64(min(l.Running, p.cfg.MaxNumSeqs-1))
		cost += time.Duration(decodeWeight * float64(n-1) * float64(p.cfg.DecodePerToken) * p.cfg.DecodeBatchPenalty *
			b / float64(p.cfg.MaxNumSeqs-1))
	}
	return cost, prefill, load
}

func (p *precise) pick(r *Request, now time.Time) int {
	n := len(p.engs)
	type cand struct {
		e       int
		cost    time.Duration
		prefill time.Duration
		load    int
	}
	cs := make([]cand, n)
	best := time.Duration(1<<63 - 1)
	for e := range n {
		t, pf, load := p.estimate(e, r, now)
		cs[e] = cand{e, t, pf, load}
		best = min(best, t)
	}
	tol := max(time.Millisecond, best/50)
	chosen := -1
	for k := range n {
		c := cs[(p.next+k)%n]
		if c.cost > best+tol {
			continue
		}
		if chosen < 0 || c.load < cs[chosen].load {
			chosen = c.e
		}
	}
	p.next = (chosen + 1) % n
	p.est = cs[chosen].prefill
	return chosen
}

func (p *precise) submitted(e int, r *Request, now time.Time) {
	n := r.MaxTokens
	if n <= 0 {
		n = (p.cfg.OutputTokensMin + p.cfg.OutputTokensMax) / 2
	}
	st := p.st[e]
	st.pending = append(st.pending, pendingReq{id: r.ID, submitted: now, prefill: p.est, n: n})
}

func (p *precise) firstToken(e int, r *Request, res engine.Result) {
	st := p.st[e]
	st.pending = slices.DeleteFunc(st.pending, func(q pendingReq) bool { return q.id == r.ID })
	if !res.Slow {
		st.lastFirst = maxTime(st.lastFirst, res.FirstToken)
	}
	st.ends[r.ID] = res.TokenTime(res.PlannedTokens - 1)
}

func (p *precise) done(e int, r *Request, _ engine.Result) {
	st := p.st[e]
	st.pending = slices.DeleteFunc(st.pending, func(q pendingReq) bool { return q.id == r.ID })
	delete(st.ends, r.ID)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
