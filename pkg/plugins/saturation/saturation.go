// Package saturation sheds load: it removes endpoints that already carry their configured
// maximum of in-flight requests. When no endpoint is left the request is answered 429 at once,
// so that clients back off instead of piling more work onto queues that are already full.
package saturation

import (
	"context"
	"fmt"

	"github.com/kvpick/kvpick/pkg/router"
)

// Name is the plugin's name in config files.
const Name = "saturation-filter"

// Params configure the filter.
type Params struct {
	// MaxInFlightPerEndpoint is the most requests one endpoint may have in flight; 0 disables.
	MaxInFlightPerEndpoint int `json:"maxInFlightPerEndpoint"`
}

// Validate names the first bad field.
func (p Params) Validate() error {
	if p.MaxInFlightPerEndpoint < 0 {
		return fmt.Errorf("maxInFlightPerEndpoint %d: must not be negative", p.MaxInFlightPerEndpoint)
	}
	return nil
}

// Filter is the saturation filter.
type Filter struct{ p Params }

var _ router.Shedder = (*Filter)(nil)

// New returns the filter.
func New(p Params) (*Filter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Filter{p: p}, nil
}

// Name implements router.Plugin.
func (*Filter) Name() string { return Name }

// Sheds implements router.Shedder: an empty result means overload, not misconfiguration.
func (*Filter) Sheds() bool { return true }

// Filter implements router.Filter.
func (f *Filter) Filter(_ context.Context, _ *router.Request, eps []*router.Endpoint) []*router.Endpoint {
	if f.p.MaxInFlightPerEndpoint == 0 {
		return eps
	}
	out := eps[:0]
	for _, e := range eps {
		if e.InFlight() < int64(f.p.MaxInFlightPerEndpoint) {
			out = append(out, e)
		}
	}
	return out
}
