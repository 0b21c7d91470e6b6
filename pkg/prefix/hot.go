package prefix

import (
	"math/bits"
	"sync"

	"github.com/kvpick/kvpick/pkg/router"
)

// A prefix that a large share of the traffic starts with (one system prompt in front of every
// request) needs copies on several endpoints: one endpoint cannot carry all of that traffic, and
// the affinity pull toward the endpoints that already hold it would keep the rest of the pool
// cold and the holders' batches large. Below the load guard's margins that pull wins against
// the in-flight scorer for ever (replay, small caches, one hot prefix: half the engines served
// every request, TTFT p50 and p90 7% above least-loaded's). Warming another copy costs one cold
// prefill, once; the copy then serves its share of the hot traffic.
//
// hotPrefixes counts, in a count-min sketch of decayed weights, the prompts that began with
// each prefix at a few sampled depths (minMatch blocks, then doubling): the share of the
// recent requests that a prefix carries says how many of the candidates should hold it:
// share × candidates, rounded down, so a prefix needs a second copy once one endpoint would
// carry twice its fair share of the traffic (the load guard's relative margin). While fewer
// do, the prefix is under-replicated and the prefix scorer credits every candidate with it:
// the endpoints that hold more of the prompt than that prefix still draw it (a conversation's
// own turns, an agent's own steps), but the shared part no longer decides, so load does. A
// prefix shared by a group among dozens (shared system prompts, multi-turn personas) carries
// less than two endpoints' share and keeps its pull. Rounding to the nearest instead made the
// multi-turn personas' system prompts (8 of them, unevenly drawn) want two copies: multi-turn
// TTFT p90 +5% on the tuning seeds, 2 of 6 worse (docs/benchmarks.md, "Hot prefixes").
const (
	hotWidth = 4096 // cells per sketch row: 64 KiB for both rows
	// hotDecay weighs the last ~1,000 requests, like the prefill scorer's mean work.
	hotDecay = 1.0 / 1024
	// hotMinRequests: below this many requests seen, a share says nothing.
	hotMinRequests = 64
	// hotRescale bounds the growing weights: beyond it all are divided back.
	hotRescale = 1e12
)

type hotPrefixes struct {
	mu    sync.Mutex
	rows  [2][hotWidth]float64
	total float64 // the sum of the weights added, one per request
	w     float64 // the next request's weight: it grows by hotDecay per request
	n     int     // requests seen, up to hotMinRequests
}

func newHotPrefixes() *hotPrefixes { return &hotPrefixes{w: 1} }

// hotCells returns h's cell in each row: the hashes are XXH3, so their bit ranges are independent.
func hotCells(h uint64) (int, int) { return int(h % hotWidth), int((h >> 32) % hotWidth) }

// add counts one routed prompt under each of its sampled prefixes.
func (hp *hotPrefixes) add(hashes []uint64, minMatch int) {
	hp.mu.Lock()
	defer hp.mu.Unlock()
	w := hp.w
	for d := minMatch; d <= len(hashes); d *= 2 {
		a, b := hotCells(hashes[d-1])
		hp.rows[0][a] += w
		hp.rows[1][b] += w
	}
	hp.total += w
	hp.n = min(hp.n+1, hotMinRequests)
	hp.w *= 1 + hotDecay
	if hp.w > hotRescale {
		for r := range hp.rows {
			for i := range hp.rows[r] {
				hp.rows[r][i] /= hp.w
			}
		}
		hp.total /= hp.w
		hp.w = 1
	}
}

// underReplicated returns how many leading blocks of the prompt to credit every candidate
// with: 0, or, where a sampled prefix of d blocks is held (lens, by slot) by fewer candidates
// than its share of the recent traffic asks for, the deepest such d, extended to the shortest
// match among its holders when at least two hold it (below the next sampled depth): two
// endpoints holding the same blocks past d share them through the traffic, not through one
// conversation, so the hot prefix runs that far.
func (hp *hotPrefixes) underReplicated(hashes []uint64, minMatch int, lens []int32, eps []*router.Endpoint) int {
	// The shares are read under the lock (one per doubling: 32 cover any prompt); the
	// candidates are counted outside it, which picks take too.
	var shares [32]float64
	depths := 0
	hp.mu.Lock()
	if hp.n < hotMinRequests || hp.total <= 0 {
		hp.mu.Unlock()
		return 0
	}
	for d := minMatch; d <= len(hashes) && depths < len(shares); d *= 2 {
		a, b := hotCells(hashes[d-1])
		shares[depths] = min(hp.rows[0][a], hp.rows[1][b]) / hp.total
		depths++
	}
	hp.mu.Unlock()
	// A depth can earn credit only if it wants copies on at least two candidates (one holder
	// at least, fewer than wanted): when no depth does, the candidates need not be counted.
	wanted := false
	for i := range depths {
		wanted = wanted || int(shares[i]*float64(len(eps))) >= 2
	}
	if !wanted {
		return 0
	}
	// One pass over the candidates: bucket each by the deepest doubling its match reaches, then
	// accumulate from the deepest bucket up, so that holders[i] counts the candidates holding at
	// least minMatch << i blocks and shortest[i] is the shortest of their matches.
	var holders [32]int
	var shortest [32]int
	for i := range depths {
		shortest[i] = len(hashes)
	}
	for _, e := range eps {
		m := int(lens[e.Slot])
		if m < minMatch {
			continue
		}
		k := min(bits.Len(uint(m/minMatch))-1, depths-1)
		holders[k]++
		shortest[k] = min(shortest[k], m)
	}
	for i := depths - 2; i >= 0; i-- {
		holders[i] += holders[i+1]
		shortest[i] = min(shortest[i], shortest[i+1])
	}
	credit := 0
	for i, d := 0, minMatch; i < depths; i, d = i+1, d*2 {
		if holders[i] == 0 {
			break // deeper prefixes are held by no one either
		}
		if holders[i] < int(shares[i]*float64(len(eps))) {
			credit = d
			if holders[i] >= 2 {
				credit = min(shortest[i], 2*d-1)
			}
		}
	}
	return credit
}
