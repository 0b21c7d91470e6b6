// Package saturation keeps requests away from model servers that cannot take more, and sheds
// load when none can. An endpoint is saturated when the picker already has its configured
// maximum of requests in flight there, or when a fresh scrape of its metrics shows a waiting
// queue of maxWaitingRequests or more: it gets no new request until a scrape shows the queue
// shorter (within one scrape interval of the server saying so). When every eligible endpoint is
// saturated the request is answered 429 at once, so that clients back off instead of piling
// more work onto queues that are already full.
//
// An endpoint whose KV cache is nearly full (maxKVCacheUsage) while requests wait there is
// avoided too, but softly: a full cache with a queue is a server at its memory limit, which is
// normal under load, so such endpoints are skipped only while another endpoint shows no queue at
// all (or has no fresh scrape), and never cause a 429 by themselves. Skipping them whenever
// another endpoint's cache was not full sent every request under an overload to the one or two
// servers whose caches happened to be below the bound, where requests queued as well: with
// queues everywhere, the other filters and scorers weigh the queues and the cached prefixes.
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
	// MaxWaitingRequests is the scraped waiting queue (vllm:num_requests_waiting,
	// sglang:num_queue_reqs) from which an endpoint takes no new request; 0 disables.
	MaxWaitingRequests int `json:"maxWaitingRequests"`
	// MaxKVCacheUsage is the scraped KV-cache usage (0..1) from which an endpoint with a
	// waiting queue is avoided while another shows no queue; 0 disables.
	MaxKVCacheUsage float64 `json:"maxKVCacheUsage"`
}

// Validate names the first bad field.
func (p Params) Validate() error {
	switch {
	case p.MaxInFlightPerEndpoint < 0:
		return fmt.Errorf("maxInFlightPerEndpoint %d: must not be negative", p.MaxInFlightPerEndpoint)
	case p.MaxWaitingRequests < 0:
		return fmt.Errorf("maxWaitingRequests %d: must not be negative", p.MaxWaitingRequests)
	case p.MaxKVCacheUsage < 0 || p.MaxKVCacheUsage > 1:
		return fmt.Errorf("maxKVCacheUsage %v: want 0..1 (0 disables)", p.MaxKVCacheUsage)
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

// Filter implements router.Filter: saturated endpoints out; endpoints with a full cache and a
// queue out too while another kept endpoint shows no queue.
func (f *Filter) Filter(_ context.Context, req *router.Request, eps []*router.Endpoint) []*router.Endpoint {
	if f.p.MaxInFlightPerEndpoint == 0 && f.p.MaxWaitingRequests == 0 && f.p.MaxKVCacheUsage == 0 {
		return eps
	}
	out := eps[:0]
	full := 0     // endpoints kept that have a full cache and a queue, at the front of out
	idle := false // some kept endpoint shows no queue
	for _, e := range eps {
		m := e.FreshMetrics(req.Now)
		if f.saturated(e, m) {
			continue
		}
		out = append(out, e)
		if f.memoryBound(m) {
			// Keep the full ones at the front, so that dropping them is one reslice.
			out[full], out[len(out)-1] = out[len(out)-1], out[full]
			full++
		} else if !queues(m) {
			idle = true
		}
	}
	if full > 0 && idle {
		return out[full:]
	}
	return out
}

func (f *Filter) saturated(e *router.Endpoint, m *router.Metrics) bool {
	if f.p.MaxInFlightPerEndpoint > 0 && e.InFlight() >= int64(f.p.MaxInFlightPerEndpoint) {
		return true
	}
	return f.p.MaxWaitingRequests > 0 && m != nil && m.HasQueue && m.Waiting >= f.p.MaxWaitingRequests
}

func (f *Filter) memoryBound(m *router.Metrics) bool {
	return f.p.MaxKVCacheUsage > 0 && queues(m) && m.HasKVUsage && m.KVUsage >= f.p.MaxKVCacheUsage
}

// queues reports whether a fresh scrape shows requests waiting (no scrape: not known to).
func queues(m *router.Metrics) bool { return m != nil && m.HasQueue && m.Waiting > 0 }
