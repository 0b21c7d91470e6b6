// Package cacheroom scores endpoints by what a request would push out of their prefix cache.
//
// A prompt's uncached blocks take room in the endpoint's KV cache, and a full cache makes that
// room by evicting its least recently used blocks. On an endpoint whose oldest block was last
// used long ago that costs little; on one whose oldest block is still young it evicts prefixes
// that are being reused, and the requests that come back for them miss. The prefix index knows
// both sides: how many of the prompt's blocks each endpoint holds, and how long ago each
// endpoint last used its least recently used block (Index.TailAges, counted in pool-wide
// commits). Preferring the endpoints with stale tails for new prefixes spreads the pool's
// distinct prefixes by how much each cache can take, the way an LRU cache pool balances itself
// when its eviction ages are equal; prefix affinity and queue cost still decide between
// endpoints that hold the prompt, where nothing is evicted.
//
// The prefix scorer must be listed before this one (it supplies the matches and ages).
package cacheroom

import (
	"context"

	"github.com/kvpick/kvpick/pkg/prefix"
	"github.com/kvpick/kvpick/pkg/router"
)

// Name is the plugin's name in config files.
const Name = "cache-room-scorer"

// Scorer is the cache-room scorer. It has no state of its own.
type Scorer struct{}

var _ router.Scorer = (*Scorer)(nil)

// Name implements router.Plugin.
func (*Scorer) Name() string { return Name }

// Score implements router.Scorer. An endpoint scores 1 when the request would evict nothing
// there (its cache has room, or it holds the whole prompt); otherwise the score falls with the
// share of the prompt it would insert, scaled by how young its eviction tail is relative to the
// stalest tail among the candidates:
//
//	score = 1 - reuse × (uncached blocks / prompt blocks) × (1 - tail age / oldest tail age)
//
// reuse is the pool's recent reuse rate (prefix.Matches.Reuse): what an evicted block is worth
// is the chance that it is asked for again, and when the traffic shares nothing (reuse near 0)
// the term steps aside for the load scorers.
// An endpoint with room counts as infinitely stale, so while any candidate has room the full
// ones score 1 - (uncached share). Relative ages keep the score free of any time unit: ages of
// 900 and 1,000 commits are nearly the same room; 100 and 1,000 are not.
func (*Scorer) Score(_ context.Context, req *router.Request, eps []*router.Endpoint, scores []float64) {
	m := prefix.MatchesOf(req)
	if m.Total == 0 {
		return
	}
	var oldest uint32
	room := false
	for _, e := range eps {
		if a := m.TailAge(e); a != prefix.NotFull {
			oldest = max(oldest, a)
		} else {
			room = true
		}
	}
	if room {
		oldest = prefix.NotFull
	}
	total := float64(m.Total)
	for i, e := range eps {
		a := m.TailAge(e)
		if a == prefix.NotFull || oldest == 0 {
			scores[i] = 1
			continue
		}
		// With room elsewhere (oldest = NotFull) a/oldest is ~0: the full endpoint pays the whole
		// uncached share.
		inserted := float64(m.Total-m.Blocks(e)) / total
		scores[i] = 1 - m.Reuse*inserted*(1-float64(a)/float64(oldest))
	}
}
