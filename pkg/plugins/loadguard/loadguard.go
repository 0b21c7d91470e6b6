// Package loadguard keeps affinity from building hot spots. Prefix affinity wants to send a
// prompt where its cache lives; when that endpoint already carries clearly more requests than
// the least-loaded one, queueing there costs more than recomputing the prefix elsewhere. The
// guard removes every endpoint whose in-flight load exceeds the least-loaded candidate's by
// both an absolute and a relative margin, so that scoring can only choose among endpoints
// whose load is comparable; if the best-cached endpoint is overloaded, load wins. Load is
// router.Endpoint.Load: the picker's in-flight count, or the server's scraped running and
// waiting requests when a fresh scrape shows more.
package loadguard

import (
	"context"
	"fmt"
	"math"

	"github.com/kvpick/kvpick/pkg/router"
)

// Name is the plugin's name in config files.
const Name = "load-guard"

// Params configure the guard. Both margins must be exceeded for an endpoint to be excluded:
// the absolute one keeps small pools at low load from flapping (3 vs 1 is +200% but harmless),
// the relative one keeps big loads from tripping on noise (105 vs 100 is +5 absolute).
type Params struct {
	AbsoluteMargin int     `json:"absoluteMargin"`
	RelativeMargin float64 `json:"relativeMargin"`
}

// Validate names the first bad field.
func (p Params) Validate() error {
	if p.AbsoluteMargin < 0 {
		return fmt.Errorf("absoluteMargin %d: must not be negative", p.AbsoluteMargin)
	}
	if p.RelativeMargin < 0 {
		return fmt.Errorf("relativeMargin %v: must not be negative", p.RelativeMargin)
	}
	return nil
}

// Filter is the load guard.
type Filter struct{ p Params }

var _ router.Filter = (*Filter)(nil)

// New returns the guard.
func New(p Params) (*Filter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Filter{p: p}, nil
}

// Name implements router.Plugin.
func (*Filter) Name() string { return Name }

// Filter implements router.Filter. It never removes every endpoint: the least-loaded one stays.
func (f *Filter) Filter(_ context.Context, req *router.Request, eps []*router.Endpoint) []*router.Endpoint {
	if len(eps) < 2 {
		return eps
	}
	// Each endpoint's load is read once: Load reads two counters and the scraped metrics, and
	// one snapshot keeps both passes consistent while other requests pick and end.
	var buf [256]int64
	loads := buf[:0]
	if len(eps) > len(buf) {
		loads = make([]int64, 0, len(eps))
	}
	least := int64(math.MaxInt64)
	for _, e := range eps {
		l := e.Load(req.Now)
		loads = append(loads, l)
		least = min(least, l)
	}
	out := eps[:0]
	for i, e := range eps {
		if !f.Over(loads[i], least) {
			out = append(out, e)
		}
	}
	return out
}

// Over reports whether load exceeds least by both margins.
func (f *Filter) Over(load, least int64) bool {
	return load-least > int64(f.p.AbsoluteMargin) && float64(load) > float64(least)*(1+f.p.RelativeMargin)
}
