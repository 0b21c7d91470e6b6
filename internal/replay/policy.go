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
		return newPrecise(engs)
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

// precise is the yardstick: it sees every engine's cache exactly (Engine.CachedPrefixTokens) and
// its scheduler's state (Engine.Load: running, waiting, decoding, the prompt tokens queued, free
// blocks, the step in flight; Engine.RunningRemaining: the tokens each running request has
// left), and replays the engine's step model (package engine's doc) to estimate the request's
// time to first token there:
//
//	C      = MaxNumBatchedTokens − decoding      prompt tokens a step has room for
//	step   = StepOverhead + decode(decoding)     a step's cost besides its prompt tokens
//	W, U   = prompt tokens queued ahead, the request's own uncached prompt tokens
//	slot   = when a batch slot frees, if running + waiting ≥ MaxNumSeqs: the k-th smallest
//	         remaining output × step, k = running + waiting − MaxNumSeqs + 1
//	TTFT   = rest of the step in flight
//	       + (W+U) × PrefillPerToken + ⌈(W+U)/C⌉ × step             if slot ≤ the queue's time
//	       + slot + U × PrefillPerToken + ⌈U/C⌉ × step                otherwise
//	       (+ the first running request's end when its prompt's blocks, beyond those the queue
//	       ahead needs, are not free: it would wait or preempt)
//
// To the estimate it adds a tenth of the request's decode slowdown on that engine (decodeWeight),
// and picks the smallest sum; sums within 1 ms (or 2 %) of the best are a tie, broken by the
// fewest requests running or waiting, then round-robin.
type precise struct {
	noHooks
	engs []*engine.Engine
	cfgs []engine.Config
	next int
	rem  []int // scratch
	cs   []cand
}

type cand struct {
	cost time.Duration
	load int
}

// decodeWeight weighs the decode slowdown a request would suffer on an engine (the decode term
// of every step grows with the batch it joins) against its TTFT. Pure TTFT-greedy routing (0)
// piles a prefix that every request shares onto the few engines that already hold it until
// their batches are full, then pays cold prefills at the worst moment (docs/replay.md).
const decodeWeight = 0.1

func newPrecise(engs []*engine.Engine) *precise {
	p := &precise{engs: engs, cs: make([]cand, len(engs))}
	for _, e := range engs {
		p.cfgs = append(p.cfgs, e.Config())
	}
	return p
}

// decodeTerm is the engine's decode cost of a step with d decoding requests.
func decodeTerm(c *engine.Config, d int) time.Duration {
	if d <= 0 {
		return 0
	}
	fill := 1.0
	if c.MaxNumSeqs > 1 {
		fill = float64(min(d, c.MaxNumSeqs)-1) / float64(c.MaxNumSeqs-1)
	}
	return time.Duration(float64(c.DecodePerToken) * (1 + c.DecodeBatchPenalty*fill))
}

// prefillTime is the time to compute tok prompt tokens at room tokens per step.
func prefillTime(c *engine.Config, tok, room int, step time.Duration) time.Duration {
	if tok <= 0 {
		return 0
	}
	return time.Duration(tok)*c.PrefillPerToken + time.Duration((tok+room-1)/room)*step
}

// estimate returns the cost of r on engine e (estimated TTFT plus weighted decode slowdown) and
// the engine's requests in flight.
func (p *precise) estimate(e int, r *Request, now time.Time) (cost time.Duration, load int) {
	eng, c := p.engs[e], &p.cfgs[e]
	req := engine.Request{Prompt: r.Prompt, MaxTokens: r.MaxTokens, CacheSalt: r.CacheSalt}
	cached := eng.CachedPrefixTokens(req)
	l := eng.Load()
	load = l.Running + l.Waiting

	room := max(1, c.MaxNumBatchedTokens-l.Decoding)
	step := c.StepOverhead + decodeTerm(c, l.Decoding)
	w, u := l.PendingPrefillTokens, len(r.Prompt)-cached
	var ttft time.Duration
	if !l.StepEnd.IsZero() && l.StepEnd.After(now) {
		ttft = l.StepEnd.Sub(now)
	}
	// Batch slots, and KV blocks: the remaining outputs of the running requests say when they
	// free theirs.
	var slot, firstEnd time.Duration
	bs := c.BlockSize
	need := (len(r.Prompt)+bs-1)/bs - cached/bs
	short := need > l.FreeBlocks-(w+bs-1)/bs
	if k := load - c.MaxNumSeqs + 1; k > 0 || short {
		p.rem = eng.RunningRemaining(p.rem[:0])
		slices.Sort(p.rem)
		if len(p.rem) > 0 {
			if k > 0 {
				slot = time.Duration(p.rem[min(k, len(p.rem))-1]) * step
			}
			firstEnd = time.Duration(p.rem[0]) * step
		}
	}
	if queue := prefillTime(c, w, room, step); slot <= queue {
		ttft += prefillTime(c, w+u, room, step)
	} else {
		ttft += slot + prefillTime(c, u, room, step)
	}
	if short {
		ttft += firstEnd
	}
	cost = ttft
	// The part of its decode time that depends on the batch it joins.
	n := r.MaxTokens
	if n <= 0 {
		n = (c.OutputTokensMin + c.OutputTokensMax) / 2
	}
	if c.MaxNumSeqs > 1 {
		b := float64(min(l.Running, c.MaxNumSeqs-1))
		cost += time.Duration(decodeWeight * float64(n-1) * float64(c.DecodePerToken) * c.DecodeBatchPenalty *
			b / float64(c.MaxNumSeqs-1))
	}
	return cost, load
}

func (p *precise) pick(r *Request, now time.Time) int {
	n := len(p.engs)
	best := time.Duration(1<<63 - 1)
	for e := range n {
		cost, load := p.estimate(e, r, now)
		p.cs[e] = cand{cost, load}
		best = min(best, cost)
	}
	tol := max(time.Millisecond, best/50)
	chosen := -1
	for k := range n {
		e := (p.next + k) % n
		if p.cs[e].cost > best+tol {
			continue
		}
		if chosen < 0 || p.cs[e].load < p.cs[chosen].load {
			chosen = e
		}
	}
	p.next = (chosen + 1) % n
	return chosen
}
