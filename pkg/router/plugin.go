package router

import (
	"context"

	"github.com/kvpick/kvpick/pkg/openai"
)

// Plugin is anything the pipeline runs. Every plugin also implements at least one of the
// interfaces below; the pipeline discovers which by type assertion.
type Plugin interface {
	Name() string
}

// Preparer computes per-request state once, before filtering (for example the prompt's block
// hashes), so that later stages and the response path reuse it.
type Preparer interface {
	Plugin
	Prepare(ctx context.Context, req *Request)
}

// Filter drops ineligible endpoints. It may reorder and compact eps in place and returns the
// kept prefix; it must not retain eps.
type Filter interface {
	Plugin
	Filter(ctx context.Context, req *Request, eps []*Endpoint) []*Endpoint
}

// Shedder is a Filter that removes endpoints because they are overloaded. When such a filter
// leaves no endpoint, the request is shed (429) instead of failing as unroutable (503).
type Shedder interface {
	Filter
	Sheds() bool
}

// Scorer rates each candidate in [0,1] (1 = best); scores[i] belongs to eps[i]. The pipeline
// combines scorers in a weighted sum.
type Scorer interface {
	Plugin
	Score(ctx context.Context, req *Request, eps []*Endpoint, scores []float64)
}

// Picker chooses one candidate from the combined scores and returns its index in eps.
type Picker interface {
	Plugin
	Pick(ctx context.Context, req *Request, eps []*Endpoint, scores []float64) int
}

// PickObserver learns where a request was sent, right after the pick.
type PickObserver interface {
	Plugin
	Picked(req *Request, ep *Endpoint)
}

// ResponseObserver learns the upstream's response status and the endpoint that actually served
// the request (the proxy may have fallen back to another one). served is nil when the served
// address is not in the pool.
type ResponseObserver interface {
	Plugin
	ResponseHeaders(req *Request, served *Endpoint, status int)
}

// FirstByteObserver learns that the first byte of a successful response's body arrived. For a
// streamed response (SSE) that is the first generated token: the server's prefill of the request
// is over. For a non-streamed response it is the end of generation. Response headers mark
// neither: vLLM and SGLang send a stream's headers when the request arrives, before it is
// queued. Called at most once per request, after ResponseHeaders and before Done; served is nil
// when the served address is not in the pool.
type FirstByteObserver interface {
	Plugin
	FirstByte(req *Request, served *Endpoint)
}

// UsageObserver learns what the server that served the request reported about its prompt: the
// usage object at the end of a 2xx response (a non-streamed body, or a stream whose client asked
// for stream_options.include_usage), when the proxy sends the response body. It is called at most
// once per request, after ResponseHeaders and before Done. served is nil when the served address
// is not in the pool.
type UsageObserver interface {
	Plugin
	Usage(req *Request, served *Endpoint, u openai.Usage)
}

// DoneObserver learns that the request's stream ended, however it ended. It is called exactly
// once per picked request, after any ResponseHeaders call.
type DoneObserver interface {
	Plugin
	Done(req *Request, picked *Endpoint)
}

// MetricsObserver learns each new scrape of an endpoint's model-server metrics, on the
// scraper's goroutine, off the decision path: the place for work that a scrape triggers
// (resizing an index, reconciling a queue estimate). It must not block for long.
type MetricsObserver interface {
	Plugin
	MetricsUpdated(ep *Endpoint, m *Metrics)
}

// PoolListener learns about endpoints that joined or left the pool. Removed endpoints are
// already marked removed; their slots are reused only after all listeners returned.
type PoolListener interface {
	EndpointsChanged(added, removed []*Endpoint)
}
