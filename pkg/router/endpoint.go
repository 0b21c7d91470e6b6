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

	inflight   atomic.Int64
	picks      atomic.Int64
	prefill    atomic.Int64
	prefillHd  atomic.Int64
	prefillExt atomic.Int64
	prefilled  atomic.Int64
	removed    atomic.Bool
	unhealthy  atomic.Bool
	metrics    atomic.Pointer[Metrics]
}

// NewEndpoint returns a live endpoint.
func NewEndpoint(addr string, slot int) *Endpoint {
	return &Endpoint{Addr: addr, Slot: slot, Hash: xxhash.Sum64String(addr)}
}

// InFlight is the number of requests routed to the endpoint whose stream has not ended yet.
func (e *Endpoint) InFlight() int64 { return e.inflight.Load() }

// AddInFlight moves the in-flight count; the pipeline calls it at pick (+1) and stream end (-1).
func (e *Endpoint) AddInFlight(d int64) { e.inflight.Add(d) }

// Picks counts the requests ever routed to the endpoint (by this replica, and by the others
// it learnt of: CountPeerPick). A metrics scrape records it when it is
// sent (Metrics.PicksAtScrape), so that plugins can tell the picks the scrape cannot reflect yet.
func (e *Endpoint) Picks() int64 { return e.picks.Load() }

// countPick is called by the pipeline once per request routed to the endpoint; it returns the
// request's pick number there (1, 2, ...): the order in which the server will see them.
func (e *Endpoint) countPick() int64 { return e.picks.Add(1) }

// CountPeerPick counts a request another active picker replica routed to the endpoint, when
// this replica learns of it (pkg/peers), and returns its pick number here: the scrape and
// the plugins then see it as they see this replica's own picks, in the order they learnt them.
func (e *Endpoint) CountPeerPick() int64 { return e.picks.Add(1) }

// Load is the number of requests the endpoint is working on or queueing, as well as the picker
// can tell at now: its own in-flight count (exact for one picker replica, from pick to stream
// end), or, when fresh metrics say more (other replicas, clients that bypass the picker), the
// server's running plus waiting requests plus the picks since that scrape was sent, which it
// cannot include yet.
func (e *Endpoint) Load(now time.Time) int64 {
	own := e.inflight.Load()
	m := e.FreshMetrics(now)
	if m == nil || !m.HasQueue {
		return own
	}
	return max(own, int64(m.Running+m.Waiting)+max(0, e.picks.Load()-m.PicksAtScrape))
}

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

// ExternalPrefill is the prefill work, in prefix blocks, that the endpoint's last scrape shows
// queued there beyond the picker's own requests (other picker replicas, direct clients): the
// waiting requests the picker cannot account for, at the picker's mean work per request. The
// prefill scorer maintains it; it is meaningful only while the endpoint's metrics are fresh.
func (e *Endpoint) ExternalPrefill() int64 { return e.prefillExt.Load() }

// SetExternalPrefill publishes ExternalPrefill.
func (e *Endpoint) SetExternalPrefill(n int64) { e.prefillExt.Store(n) }

// PrefilledThrough is the highest pick number (Request.PickSeq) up to which every request
// routed to the endpoint is known to be past its prefill: its prompt is in the server's cache
// even if its answer has not begun (a request that does not stream shows nothing until the
// end). The prefill scorer maintains it from first bytes, answers and the server's counters;
// 0 when nothing is known.
func (e *Endpoint) PrefilledThrough() int64 { return e.prefilled.Load() }

// SetPrefilledThrough raises PrefilledThrough to seq (it never goes back).
func (e *Endpoint) SetPrefilledThrough(seq int64) {
	for {
		cur := e.prefilled.Load()
		if seq <= cur || e.prefilled.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// Removed reports whether the endpoint has left the pool.
func (e *Endpoint) Removed() bool { return e.removed.Load() }

// MarkRemoved is called by the pool before it tells listeners about the removal.
func (e *Endpoint) MarkRemoved() { e.removed.Store(true) }

// Healthy reports whether the endpoint passes its health checks. A new endpoint is healthy
// unless a pool hook marks it otherwise before the pool publishes it: with health checks on,
// the checker does (pkg/healthcheck, pool.OnAdd), so an endpoint is unhealthy until its first
// good probe; with them off, endpoints are healthy at once.
func (e *Endpoint) Healthy() bool { return !e.unhealthy.Load() }

// SetHealthy records the health checker's verdict.
func (e *Endpoint) SetHealthy(ok bool) { e.unhealthy.Store(!ok) }

// Metrics is the latest scraped model-server state, or nil when none has been scraped yet or
// the last scrape failed. It may be stale: use FreshMetrics on the decision path.
func (e *Endpoint) Metrics() *Metrics { return e.metrics.Load() }

// FreshMetrics is Metrics when it was scraped recently enough to trust at now (before its
// StaleAt), else nil. Plugins must treat nil as "unknown", never as "idle".
func (e *Endpoint) FreshMetrics(now time.Time) *Metrics {
	m := e.metrics.Load()
	if m == nil || !now.Before(m.StaleAt) {
		return nil
	}
	return m
}

// SetMetrics publishes a new scrape (nil forgets the last one). The value must not be modified
// afterwards.
func (e *Endpoint) SetMetrics(m *Metrics) { e.metrics.Store(m) }

// Metrics is what a model server reports about itself on /metrics (vLLM or SGLang names, or
// the names a pool configures). A field the server does not report keeps its zero value and
// its Has flag is false.
type Metrics struct {
	Waiting int // requests queued, not yet scheduled (vllm:num_requests_waiting)
	Running int // requests in the running batch (vllm:num_requests_running)
	// KVUsage is the fraction of KV-cache blocks in use by running requests, 0..1.
	KVUsage float64
	// NumGPUBlocks and BlockSize are the KV cache's capacity (blocks of BlockSize tokens), from
	// vllm:cache_config_info; 0 when not reported. SGLang reports tokens (max_total_num_tokens):
	// the scraper gives it as NumGPUBlocks = tokens, BlockSize = 1.
	NumGPUBlocks int
	BlockSize    int
	// LoRA adapters (vllm:lora_requests_info): running and waiting adapter names, and the
	// server's max_lora (0 when not reported).
	RunningLoRAs []string
	WaitingLoRAs []string
	MaxLoRA      int

	// FirstTokens is the server's cumulative count of requests that produced their first token
	// (the count of vllm:time_to_first_token_seconds, sglang:time_to_first_token_seconds): how
	// many prefills it finished, streamed or not.
	FirstTokens uint64

	// PrefixQueries and PrefixHits are the server's cumulative counts of prompt tokens looked up
	// in its prefix cache and of those it found there (vllm:prefix_cache_queries_total and
	// vllm:prefix_cache_hits_total, counted when a request is first scheduled): what the
	// server really reused, to hold the index's predictions against.
	PrefixQueries, PrefixHits uint64

	HasQueue          bool // Waiting and Running were reported
	HasKVUsage        bool // KVUsage was reported
	HasFirstTokens    bool // FirstTokens was reported
	HasPrefixCounters bool // PrefixQueries and PrefixHits were both reported

	// ScrapedAt is when the scrape's answer arrived; StaleAt when it stops being trusted.
	ScrapedAt time.Time
	StaleAt   time.Time
	// PicksAtScrape is Endpoint.Picks when the scrape was sent: picks beyond it are requests
	// the scrape's counts cannot include.
	PicksAtScrape int64
}

// CapacityTokens is the KV cache's size in tokens, 0 when not reported.
func (m *Metrics) CapacityTokens() int64 {
	if m == nil || m.NumGPUBlocks <= 0 || m.BlockSize <= 0 {
		return 0
	}
	return int64(m.NumGPUBlocks) * int64(m.BlockSize)
}
