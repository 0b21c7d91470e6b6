// Package maxscore is the picker that takes the highest combined score. Ties are broken by
// rendezvous hashing of the request's affinity key (the hash of the prompt's first block) when
// there is one, so that every picker replica sends the same new prompt to the same endpoint, and
// uniformly at random otherwise.
package maxscore

import (
	"context"
	"math/rand/v2"

	"github.com/kvpick/kvpick/pkg/router"
)

// Name is the plugin's name in config files.
const Name = "max-score-picker"

// Scores closer than this are ties: weighted sums of ratios are not exact.
const epsilon = 1e-9

// Picker picks the maximum score.
type Picker struct{}

var _ router.Picker = (*Picker)(nil)

// Name implements router.Plugin.
func (*Picker) Name() string { return Name }

// Pick implements router.Picker.
func (*Picker) Pick(_ context.Context, req *router.Request, eps []*router.Endpoint, scores []float64) int {
	best := -1
	var bestScore float64
	var bestTie uint64
	ties := 0
	for i, s := range scores {
		switch {
		case best < 0 || s > bestScore+epsilon:
			best, bestScore, ties = i, s, 1
			bestTie = tieWeight(req.AffinityKey, eps[i])
		case s >= bestScore-epsilon:
			ties++
			if req.AffinityKey != 0 {
				if w := tieWeight(req.AffinityKey, eps[i]); w > bestTie {
					best, bestTie = i, w
				}
			} else if rand.IntN(ties) == 0 {
				// Reservoir sampling: each tied candidate is kept with probability 1/ties.
				best = i
			}
		}
	}
	return best
}

// tieWeight is the rendezvous (highest-random-weight) hash of key and endpoint: a 64-bit
// mix of both, so each key ranks the endpoints in its own, stable order.
func tieWeight(key uint64, e *router.Endpoint) uint64 {
	x := key ^ e.Hash
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
