package router

import (
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Endpoint is one model server of the pool, addressed as "ip:port". Its identity is the pointer:
// an address that leaves the pool and comes back is a new Endpoint, so state that a removed
// endpoint left behind (in-flight requests finishing, late response hooks) can never be
// attributed to its successor.
type Endpoint struct {
	// Addr is "ip:port", the value sent in x-gateway-destination-endpoint.
	Addr string
	// Slot is a small dense number, unique among the pool's live endpoints, that plugins use to
	// index per-endpoint arrays. A slot is reused only after every pool listener has been told
	// that its previous owner was removed.
	Slot int
	// Hash is xxhash(Addr): the endpoint's weight in rendezvous tie-breaks, identical on every
	// picker replica.
	Hash uint64

	inflight  atomic.Int64
	prefill   atomic.Int64
	prefillHd atomic.Int64
	removed   atomic.Bool
	unhealthy atomic.Bool
	metrics   atomic.Pointer[Metrics]
}

// NewEndpoint returns a live endpoint.
func NewEndpoint(addr string, slot int) *Endpoint {
	return &Endpoint{Addr: addr, Slot: slot, Hash: xxhash.Sum64String(addr)}
}

// InFlight is the number of requests routed to the endpoint whose stream has not ended yet.
func (e *Endpoint) InFlight() int64 { return e.inflight.Load() }

// AddInFlight moves the in-flight count; the pipeline calls it at pick (+1) and stream end (-1).
func (e *Endpoint) AddInFlight(d int64) { e.inflight.Add(d) }

// QueuedPrefill is the prompt work, in prefix blocks, routed to the endpoint that has not
// produced a first response byte yet: the prefill queue the picker has built there.
func (e *Endpoint) QueuedPrefill() int64 { return e.prefill.Load() }

// AddQueuedPrefill moves QueuedPrefill; the prefill scorer charges at pick and discharges at the
// response or the stream's end. Keeping it on the Endpoint, whose identity is the pointer,
// means a late discharge can never land on an endpoint that later reused the same slot.
func (e *Endpoint) AddQueuedPrefill(d int64) { e.prefill.Add(d) }

// PrefillHead is the part of QueuedPrefill that the endpoint is working on now: the charge of the
// oldest request routed there that has not produced a first byte yet (servers prefill in
// arrival order), 0 when the queue is empty. The prefill scorer maintains it.
func (e *Endpoint) PrefillHead() int64 { return e.prefillHd.Load() }

// SetPrefillHead publishes the head of the endpoint's prefill queue.
func (e *Endpoint) SetPrefillHead(n int64) { e.prefillHd.Store(n) }

// Removed reports whether the endpoint has left the pool.
func (e *Endpoint) Removed() bool { return e.removed.Load() }

// MarkRemoved is called by the pool before it tells listeners about the removal.
func (e *Endpoint) MarkRemoved() { e.removed.Store(true) }

// Healthy reports whether the endpoint passes its health checks. New endpoints are healthy
// until a check says otherwise, so that a fresh picker routes at once.
func (e *Endpoint) Healthy() bool { return !e.unhealthy.Load() }

// SetHealthy records the health checker's verdict.
func (e *Endpoint) SetHealthy(ok bool) { e.unhealthy.Store(!ok) }

// Metrics is the latest scraped model-server state, or nil when none has been scraped yet.
// Scorers that read it must treat nil as "unknown", not as "idle".
func (e *Endpoint) Metrics() *Metrics { return e.metrics.Load() }

// SetMetrics publishes a new scrape. The value must not be modified afterwards.
func (e *Endpoint) SetMetrics(m *Metrics) { e.metrics.Store(m) }

// Metrics is what a model server reports about itself on /metrics (vLLM or SGLang names).
type Metrics struct {
	Waiting      int     // requests queued, not yet scheduled
	Running      int     // requests in the running batch
	KVUsage      float64 // fraction of KV-cache blocks in use, 0..1
	NumGPUBlocks int     // KV-cache capacity in blocks, 0 when not reported
	BlockSize    int     // tokens per KV block, 0 when not reported
	UpdatedAt    time.Time
}
