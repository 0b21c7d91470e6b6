// Package subset is the filter that honours the proxy's subset hint: when the data plane names
// the endpoints a request may use (filter metadata envoy.lb.subset_hint), only those are
// eligible. A hint that names none of the pool's endpoints leaves nothing, and the request
// fails with 503 rather than going somewhere the proxy did not allow.
package subset

import (
	"context"

	"github.com/kvpick/kvpick/pkg/router"
)

// Name is the plugin's name in config files.
const Name = "subset-filter"

// Filter keeps the endpoints named by the request's subset hint.
type Filter struct{}

var _ router.Filter = (*Filter)(nil)

// Name implements router.Plugin.
func (*Filter) Name() string { return Name }

// Filter implements router.Filter.
func (*Filter) Filter(_ context.Context, req *router.Request, eps []*router.Endpoint) []*router.Endpoint {
	if !req.HasSubset {
		return eps
	}
	out := eps[:0]
	for _, e := range eps {
		for _, a := range req.Subset {
			if a == e.Addr {
				out = append(out, e)
				break
			}
		}
	}
	return out
}
