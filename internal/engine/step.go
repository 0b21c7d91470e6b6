package engine

import (
	"slices"
	"time"
)

// onStep runs when the step in flight ends (or, from kickLocked, when an
// idle engine has work): it applies the step's outputs, plans the next step
// and arms its timer, then delivers the callbacks. One timer per step.
func (e *Engine) onStep() {
	e.mu.Lock()
	now := e.clock.Now()
	start := now
	if e.inFlight {
		e.inFlight = false
		e.completeStepLocked(e.stepEnd)
		// The next step starts where this one ended, as a GPU's would. On a
		// virtual clock that is now; on a real clock the timer fires late (the
		// host's timer latency, a busy machine), and starting the step at the
		// firing would cost the engine that much throughput every step: at the
		// replay's ×10 time scale ~15% of it on a shared 2-core machine, enough
		// to turn a busy pool into an overloaded one. Requests that arrived
		// after the step's start wait for a later step (planLocked).
		if e.stepEnd.Before(now) {
			start = e.stepEnd
		}
	}
	ok := e.planLocked(start)
	if !ok && start.Before(now) {
		// Nothing to run at the past instant, but requests arrived since.
		ok = e.planLocked(now)
	}
	if !ok {
		e.busy = false
	}
	e.deliverUnlock()
}

// planLocked schedules one step starting at start, in vLLM V1's order
// (Scheduler.schedule), and arms the timer for its end. It reports false
// when there is nothing to run.
//
//  1. Running requests, in admission order, while budget remains: a
//     decoding request takes 1 token, a prefilling one min(rest of its
//     prompt, budget). A request that cannot get the blocks for its tokens
//     preempts the most recently admitted running request (which goes back
//     to the front of the waiting queue) until it can, or until it is the
//     one preempted; then no more running requests are scheduled.
//  2. If nothing was preempted: waiting requests in FIFO order, while
//     budget remains and fewer than MaxNumSeqs run, each with its prefix
//     hit and min(uncached tokens, budget); a head whose blocks do not fit
//     blocks the queue.
func (e *Engine) planLocked(start time.Time) bool {
	for attempt := 0; ; attempt++ {
		budget := e.cfg.MaxNumBatchedTokens
		prefill, decodes := 0, 0
		preempted, idleSlow := false, false
		e.step = e.step[:0]
	running:
		for i := 0; i < len(e.running) && budget > 0; i++ {
			r := e.running[i]
			if r.hung {
				continue
			}
			if r.slowInc > 0 {
				if r.credit += r.slowInc; r.credit < 1 {
					// Skipped this step; it stays in the batch.
					idleSlow = true
					if r.produced > 0 {
						decodes++
					}
					continue
				}
				r.credit--
			}
			need := r.numTokens() - r.computed
			n := min(need, budget)
			for !e.allocLocked(r, r.computed+n) {
				victim := e.running[len(e.running)-1]
				e.preemptLocked(victim)
				preempted = true
				if victim == r {
					break running
				}
			}
			if r.produced > 0 && need == 1 {
				decodes++
			} else {
				prefill += n
			}
			e.scheduleLocked(r, n)
			budget -= n
		}
		if !preempted {
			for e.waiting.Len() > 0 && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs {
				head := e.waiting.Front().Value.(*request)
				if head.res.Arrival.After(start) {
					break // it arrived after the step began (onStep's catch-up)
				}
				n, ok := e.admitLocked(head, budget, start)
				if !ok {
					break
				}
				prefill += n
				budget -= n
			}
		}
		if len(e.step) == 0 && !idleSlow {
			// A step that only preempted frees blocks for the waiting queue:
			// plan again, as vLLM's next step would.
			if preempted && attempt == 0 {
				continue
			}
			return false
		}
		if len(e.step) > 0 {
			tokens := 0
			for _, r := range e.step {
				tokens += r.sched
			}
			e.hist.iterationTokens.observe(float64(tokens))
		}
		e.stepEnd = start.Add(e.stepDuration(prefill, decodes))
		e.inFlight = true
		e.clock.AfterFunc(e.stepEnd.Sub(e.clock.Now()), e.onStep)
		return true
	}
}

// stepDuration is the model's time for a step with prefill prompt tokens
// and decodes decoding requests.
func (e *Engine) stepDuration(prefill, decodes int) time.Duration {
	d := e.cfg.StepOverhead + time.Duration(prefill)*e.cfg.PrefillPerToken
	if decodes > 0 {
		fill := 1.0
		if e.cfg.MaxNumSeqs > 1 {
			fill = float64(min(decodes, e.cfg.MaxNumSeqs)-1) / float64(e.cfg.MaxNumSeqs-1)
		}
		d += time.Duration(float64(e.cfg.DecodePerToken) * (1 + e.cfg.DecodeBatchPenalty*fill))
	}
	return d
}

// admitLocked schedules the waiting queue's head r with up to budget tokens
// if its blocks fit: it takes its prefix hit (the leading cached blocks, at
// most (tokens-1)/BlockSize of them: vLLM always computes the last token),
// then blocks for its first chunk. A hung request takes blocks for its
// whole prompt and no tokens.
func (e *Engine) admitLocked(r *request, budget int, start time.Time) (int, bool) {
	bs := e.cfg.BlockSize
	total := r.numTokens()
	limit := (total - 1) / bs
	e.extendKeysLocked(r, limit)
	hitIDs := e.pool.match(r.keys, limit)
	computed := len(hitIDs) * bs
	n, upto := min(total-computed, budget), 0
	if r.hung {
		n, upto = 0, total
	} else {
		upto = computed + n
	}
	need := (upto+bs-1)/bs - len(hitIDs)
	if need > e.pool.free-e.pool.freeAmong(hitIDs) {
		return 0, false
	}
	e.waiting.Remove(r.elem)
	r.elem = nil
	e.pool.touch(hitIDs)
	r.blocks = e.pool.allocate(need, append(r.blocks[:0], hitIDs...))
	r.nreg = len(hitIDs)
	r.computed = computed
	r.state = stRunning
	e.running = append(e.running, r)
	if !r.admitted {
		// vLLM reports the hit of the first scheduling (num_cached_tokens)
		// and counts prefix-cache queries then.
		r.admitted = true
		r.res.CachedTokens = computed
		r.res.Admitted, r.res.PrefillStart = start, start
		e.queries += uint64(total)
		e.hits += uint64(computed)
	}
	if r.hung {
		e.setPend(r, 0)
		return 0, true
	}
	e.scheduleLocked(r, n)
	return n, true
}

// scheduleLocked gives running request r n tokens in the step being
// planned; its blocks are allocated. Like vLLM's scheduler it counts them
// as computed now and registers the full blocks they complete in the
// prefix cache, so a request scheduled later can hit them at once.
func (e *Engine) scheduleLocked(r *request, n int) {
	r.computed += n
	r.sched = n
	e.registerLocked(r)
	e.setPend(r, r.numTokens()-r.computed)
	e.step = append(e.step, r)
}

// allocLocked gives r the blocks to hold upto tokens; it reports false,
// changing nothing, when too few blocks are free.
func (e *Engine) allocLocked(r *request, upto int) bool {
	need := (upto+e.cfg.BlockSize-1)/e.cfg.BlockSize - len(r.blocks)
	if need <= 0 {
		return true
	}
	if need > e.pool.free {
		return false
	}
	r.blocks = e.pool.allocate(need, r.blocks)
	return true
}

// preemptLocked takes the last running request v out of the batch (vLLM's
// recompute preemption): its blocks are freed, tail first, and stay cached
// until evicted; it goes back to the front of the waiting queue and will
// recompute its prompt and output so far, minus whatever is still cached.
func (e *Engine) preemptLocked(v *request) {
	e.running[len(e.running)-1] = nil
	e.running = e.running[:len(e.running)-1]
	e.pool.release(v.blocks)
	v.blocks = v.blocks[:0]
	v.nreg, v.computed, v.sched, v.credit = 0, 0, 0, 0
	v.state = stWaiting
	v.elem = e.waiting.PushFront(v)
	v.res.Preemptions++
	e.preemptions++
	total := v.numTokens()
	limit := (total - 1) / e.cfg.BlockSize
	e.extendKeysLocked(v, limit)
	e.setPend(v, total-e.pool.matchCount(v.keys, limit)*e.cfg.BlockSize)
}

// completeStepLocked applies the outputs of the step that ended at end:
// every request scheduled in it whose tokens are all computed samples a
// token (a partial prefill chunk samples nothing).
func (e *Engine) completeStepLocked(end time.Time) {
	for _, r := range e.step {
		if r.state != stRunning || r.sched == 0 {
			continue // cancelled while the step ran
		}
		r.sched = 0
		if r.computed < r.numTokens() {
			continue
		}
		i := r.produced
		r.produced++
		r.res.CompletionTokens = r.produced
		e.genToks++
		if i == 0 {
			r.res.FirstToken = end
			e.promptToks += uint64(len(r.prompt))
			e.hist.ttft.observe(end.Sub(r.res.Arrival).Seconds())
			e.emitLocked(evFirst, r, 0)
		} else {
			e.hist.itl.observe(end.Sub(r.res.LastToken).Seconds())
		}
		r.res.LastToken = end
		e.emitLocked(evToken, r, i)
		switch {
		case r.produced >= r.n:
			e.finishLocked(r, r.reason, end)
		case r.failAt > 0 && r.produced >= r.failAt:
			e.finishLocked(r, OutcomeError, end)
		}
	}
	clear(e.step)
	e.step = e.step[:0]
	e.running = slices.DeleteFunc(e.running, func(r *request) bool { return r.state != stRunning })
}

// finishLocked ends r (the caller takes it out of the running list or the
// waiting queue): its blocks return to the free queue tail first, so its
// tail is evicted before its head (vLLM frees a request's blocks in reverse
// order); the full blocks it computed stay cached.
func (e *Engine) finishLocked(r *request, outcome Outcome, end time.Time) {
	e.pool.release(r.blocks)
	r.blocks = nil
	r.state = stDone
	e.setPend(r, 0)
	e.outcomes[outcome]++
	r.res.Outcome = outcome
	r.res.End = end
	e.hist.observeFinished(&r.res, r.n, r.reason == OutcomeLength)
	e.emitLocked(evDone, r, 0)
}

// registerLocked registers in the prefix cache the full blocks among r's
// computed tokens that are not registered yet.
func (e *Engine) registerLocked(r *request) {
	full := r.computed / e.cfg.BlockSize
	if full <= r.nreg {
		return
	}
	e.extendKeysLocked(r, full)
	for b := r.nreg; b < full; b++ {
		e.pool.register(r.blocks[b], r.keys[b])
	}
	r.nreg = full
}

// extendKeysLocked computes r's block keys up to block n (exclusive) over
// its prompt and output tokens.
func (e *Engine) extendKeysLocked(r *request, n int) {
	bs := e.cfg.BlockSize
	p := len(r.prompt)
	for b := len(r.keys); b < n; b++ {
		prev := r.root
		if b > 0 {
			prev = r.keys[b-1]
		}
		toks := e.tokBuf[:0]
		for i := b * bs; i < (b+1)*bs; i++ {
			if i < p {
				toks = append(toks, r.prompt[i])
			} else {
				toks = append(toks, TokenID(OutputPiece(r.res.OutputSeed, i-p)))
			}
		}
		r.keys = append(r.keys, blockKey(e.keyBuf, prev, toks))
	}
}
