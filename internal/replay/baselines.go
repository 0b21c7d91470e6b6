package replay

import (
	"time"

	"github.com/kvpick/kvpick/internal/engine"
)

// The baselines users would pick instead of kvpick (docs/replay.md, "Policies").
const (
	// GIE is the Gateway API Inference Extension endpoint picker with its documented default
	// scheduling profile (gie.go).
	GIE = "gie"
	// SGLang is SGLang's cache-aware router (sgl-router) with its launch defaults (sglang.go).
	SGLang = "sglang"
)

// PolicyNames lists every policy, in report order: the simple baselines, the oracle, the
// routers users would pick instead, and the picker.
func PolicyNames() []string {
	return []string{RoundRobin, LeastLoaded, Precise, GIE, SGLang, KVPick}
}

// newBaseline returns the in-process router of that name (nil when there is none). board is
// the metrics snapshot the routers that scrape model-server metrics read.
func newBaseline(name string, engs []*engine.Engine, cfg engine.Config, board *metricsBoard, seed uint64) policy {
	switch name {
	case GIE:
		return newGIE(len(engs), board, seed)
	case SGLang:
		return newSGLang(len(engs), seed)
	}
	return newPolicy(name, engs, cfg)
}

// Interfaces of policy.go, asserted here.
var (
	_ policy = (*gie)(nil)
	_ policy = (*sglang)(nil)
)

// hooksNone is for the baselines that keep no state about requests in flight.
type hooksNone struct{}

func (hooksNone) submitted(int, *Request, time.Time)      {}
func (hooksNone) firstToken(int, *Request, engine.Result) {}
func (hooksNone) done(int, *Request, engine.Result)       {}
