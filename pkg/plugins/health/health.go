// Package health is the filter that skips endpoints failing their health check
// (pkg/healthcheck), so that a dead or wedged model server stops receiving requests.
package health

import (
	"context"

	"github.com/kvpick/kvpick/pkg/router"
)

// Name is the plugin's name in config files.
const Name = "health-filter"

// Filter keeps healthy endpoints.
type Filter struct{}

var _ router.Filter = (*Filter)(nil)

// Name implements router.Plugin.
func (*Filter) Name() string { return Name }

// Filter implements router.Filter.
func (*Filter) Filter(_ context.Context, _ *router.Request, eps []*router.Endpoint) []*router.Endpoint {
	out := eps[:0]
	for _, e := range eps {
		if e.Healthy() {
			out = append(out, e)
		}
	}
	return out
}
