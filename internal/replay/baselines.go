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
// the metrics snapshot the routers that scrape model-server metrics read. The routers that run
// as a service of their own (gie, sglang) run as replicas instances side by side when replicas
// is above 1 (replicated); the others are references and always see everything.
func newBaseline(name string, engs []*engine.Engine, cfg engine.Config, board *metricsBoard, seed uint64, replicas int) policy {
	var insts []policy
	for k := range max(1, replicas) {
		// Each replica its own random tie-breaks; the first one's as a lone router's.
		s := seed + uint64(k)<<32
		switch name {
		case GIE:
			insts = append(insts, newGIE(len(engs), board, s))
		case SGLang:
			insts = append(insts, newSGLang(len(engs), s))
		default:
			return newPolicy(name, engs, cfg)
		}
	}
	if len(insts) == 1 {
		return insts[0]
	}
	return &replicated{insts: insts, owner: map[int]policy{}}
}

// replicated is several instances of a router active side by side behind a proxy's
// round-robin: the k-th request in arrival order goes to instance k mod n, whose hooks then
// follow that request; the instances share only what they read from the engines (the metrics
// board), as replicas of a router do.
type replicated struct {
	insts []policy
	next  int
	owner map[int]policy // request ID → the instance that routed it, until it is done
}

func (p *replicated) pick(r *Request, now time.Time) int {
	in := p.insts[p.next]
	p.next = (p.next + 1) % len(p.insts)
	p.owner[r.ID] = in
	return in.pick(r, now)
}

func (p *replicated) submitted(e int, r *Request, now time.Time) {
	if in := p.owner[r.ID]; in != nil {
		in.submitted(e, r, now)
	}
}

func (p *replicated) firstToken(e int, r *Request, res engine.Result) {
	if in := p.owner[r.ID]; in != nil {
		in.firstToken(e, r, res)
	}
}

func (p *replicated) done(e int, r *Request, res engine.Result) {
	if in := p.owner[r.ID]; in != nil {
		in.done(e, r, res)
		delete(p.owner, r.ID)
	}
}

// Interfaces of policy.go, asserted here.
var (
	_ policy = (*gie)(nil)
	_ policy = (*sglang)(nil)
	_ policy = (*replicated)(nil)
)

// hooksNone is for the baselines that keep no state about requests in flight.
type hooksNone struct{}

func (hooksNone) submitted(int, *Request, time.Time)      {}
func (hooksNone) firstToken(int, *Request, engine.Result) {}
func (hooksNone) done(int, *Request, engine.Result)       {}
