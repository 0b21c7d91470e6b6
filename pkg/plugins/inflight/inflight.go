// Package inflight scores endpoints by their request load (router.Endpoint.Load): the requests
// the picker has in flight on them, counted from pick to the end of the request's stream on
// every path (success, error, cancel) — exact for a single picker replica and reacting within
// one request — or, when a fresh scrape of the server's metrics shows more running and waiting
// requests (other replicas, direct clients), that.
package inflight

import (
	"context"

	"github.com/kvpick/kvpick/pkg/router"
)

// Name is the plugin's name in config files.
const Name = "inflight-scorer"

// Scorer rates an endpoint 1 - load/(maxLoad+1): the least-loaded candidate scores highest,
// an idle pool scores 1 everywhere, and the score reflects relative load (10 vs 11 requests
// differ little, 0 vs 1 a lot) rather than min-max rank, so that a one-request difference
// does not outweigh a real prefix match.
type Scorer struct{}

var _ router.Scorer = (*Scorer)(nil)

// Name implements router.Plugin.
func (*Scorer) Name() string { return Name }

// Score implements router.Scorer.
func (*Scorer) Score(_ context.Context, req *router.Request, eps []*router.Endpoint, scores []float64) {
	var most int64
	for i, e := range eps {
		l := max(e.Load(req.Now), 0)
		scores[i] = float64(l)
		most = max(most, l)
	}
	d := float64(most + 1)
	for i := range eps {
		scores[i] = 1 - scores[i]/d
	}
}
