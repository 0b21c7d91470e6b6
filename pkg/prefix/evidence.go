package prefix

import (
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/router"
)

// The index predicts which prompt blocks an endpoint holds; the server says, in
// usage.prompt_tokens_details.cached_tokens, how much of the prompt it really found (vLLM with
// --enable-prompt-tokens-details; absent means unknown, never zero). When it found clearly less
// than the index promised, the blocks past what it found had been evicted there — and since
// both the server and the index evict least recently used first, so had every block the index
// last used for that endpoint no later than the last predicted block: the index drops them
// (Index.TrimOlder), so that it stops promising, to later requests, what the server no longer
// has. This is what makes a capacity set too large (no cache size reported, lruCapacityPerEndpoint
// wrong) correct itself: the index's tail is cut back to what the server keeps whenever a
// report shows the difference.
//
// The request's own blocks are not affected: they were committed again when its response
// began, the server having recomputed them.
//
// The same reports size an endpoint whose server does not say how large its cache is
// (learnCapacity): after a trim the entries kept bound what the server keeps of the index's
// blocks, so the capacity drops to them; a reported hit on blocks the index had dropped for
// want of room (its ghost table, ghost.go) raises it to what the server must have kept. The
// two meet where the index holds what the server holds.
//
// A trim's bound is loose when the server lost most of what was predicted: the boundary of its
// cache then lies among the entries the trim kept, by how much is not known. Such a large miss
// also cuts the learned capacity by a fixed share (largeMissCut), so that repeated large misses
// bring a capacity far too large down geometrically, while one miss caused by a burst of load
// (running requests crowd prefixes out for a while) costs only 15%.
const (
	// A report counts as evidence of eviction only when it falls short of the prediction by more
	// than evidenceSlackBlocks plus evidenceTolerance of it: the picker's 64-byte blocks never
	// align exactly with the server's 16-token blocks (chat template, tokenizer), and vLLM
	// recomputes the last prompt token, so a full hit reads up to a block short.
	evidenceSlackBlocks = 2
	evidenceTolerance   = 0.1
	// A large miss: the server found less than largeMissShare of the prediction. It cuts the
	// learned capacity to largeMissCut of what the trim left: ten large misses take a capacity
	// to 0.85^10 ≈ 0.2 of it. Tuning seeds 1-6 (capacity-x10 / x0.1): shared-prefix p90 −28% /
	// −2% with 0.85 or 0.92; a cut to 0.7 gained less, halving lost 24% / 3% (docs/benchmarks.md,
	// "Large misses").
	largeMissShare = 0.5
	largeMissCut   = 0.85
)

// recordPrediction notes, at pick, what the index promised for ep: the leading blocks it held
// (pending records excluded: those are promises about a prefill in progress, not the cache)
// and when ep last used the last of them.
func (pl *Plugin) recordPrediction(st *state, ep *router.Endpoint) {
	st.picked, st.predicted, st.hasPredStmp = ep, 0, false
	n := 0
	if st.scored && ep.Slot < len(st.committed) {
		if n = int(st.committed[ep.Slot]); n < max(pl.p.MinMatchBlocks, 1) {
			n = 0
		}
	}
	if !pl.caps.learn && n == 0 {
		return
	}
	var h uint64
	if n > 0 {
		h = st.hashes[n-1]
	}
	// One read lock for both: the pick path takes the index's lock as few times as it can.
	tick, stamp, held := pl.index.TickAndStamp(ep.Slot, h, n > 0)
	if pl.caps.learn {
		st.pickTick = tick
	}
	st.predicted = n
	st.predStamp, st.hasPredStmp = stamp, held
}

// evidence compares the server's cached_tokens with the prediction and trims the endpoint's
// entries when the server holds less.
func (pl *Plugin) evidence(st *state, served *router.Endpoint, u openai.Usage) {
	if !u.HasCached || served == nil || served != st.picked || served.Removed() {
		return
	}
	tpb := pl.caps.tokensPerBlock()
	if pl.metrics != nil {
		pl.metrics.observeEvidence(served, float64(st.predicted)*tpb, float64(u.CachedTokens))
	}
	if !pl.p.EvictionEvidence {
		return
	}
	found := float64(u.CachedTokens) / tpb
	if st.predicted > 0 && st.hasPredStmp &&
		found < float64(st.predicted)*(1-evidenceTolerance)-evidenceSlackBlocks {
		evicted, kept := pl.index.TrimOlder(served.Slot, st.predStamp)
		if pl.metrics != nil {
			pl.metrics.observeTrim(served, evicted)
		}
		pl.caps.shrink(served, kept, found < float64(st.predicted)*largeMissShare)
		return
	}
	// The server found more than predicted. That alone says little (a multi-turn prompt
	// repeats the last answer, which the server cached as it generated it and the index never
	// saw); but blocks the index had dropped for want of room, and the server still held, show
	// that the capacity the index assumes there is too small.
	hi := min(len(st.hashes), int(found)-evidenceSlackBlocks)
	if !pl.caps.learn || hi <= st.predicted {
		return
	}
	if g, dropped, capacity := pl.index.GhostHits(served.Slot, st.hashes[st.predicted:hi], st.pickTick); g > 0 {
		// The server kept a block that the index dropped, and with it every block used after
		// it: the capacity's worth the index holds and the blocks dropped since that it does
		// not hold again.
		pl.caps.grow(served, g, capacity+dropped+1)
		if pl.metrics != nil {
			pl.metrics.observeGrow(served, g)
		}
	}
}
