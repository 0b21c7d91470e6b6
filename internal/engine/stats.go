package engine

import "time"

// Histogram is a snapshot of a histogram: Counts[i] observations fell at or
// below Bounds[i] (and above the previous bound); Counts[len(Bounds)] above
// the last bound.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    float64
}

func newHistogram(bounds []float64) Histogram {
	return Histogram{Bounds: bounds, Counts: make([]uint64, len(bounds)+1)}
}

func (h *Histogram) observe(v float64) {
	i := 0
	for i < len(h.Bounds) && v > h.Bounds[i] {
		i++
	}
	h.Counts[i]++
	h.Count++
	h.Sum += v
}

func (h *Histogram) clone() Histogram {
	return Histogram{Bounds: h.Bounds, Counts: append([]uint64(nil), h.Counts...), Count: h.Count, Sum: h.Sum}
}

// Bucket bounds of vLLM's histograms (vllm/v1/metrics/loggers.py), so that
// the simulator's /metrics has the same series as a real server's.
var (
	// TTFTBuckets: vllm:time_to_first_token_seconds (seconds).
	TTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
		2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	// TokenLatencyBuckets: vllm:inter_token_latency_seconds and the
	// per-request time per output token (seconds).
	TokenLatencyBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	// RequestLatencyBuckets: e2e, queue, prefill, decode and inference time
	// of a request (seconds).
	RequestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	// IterationTokenBuckets: vllm:iteration_tokens_total (tokens per step).
	IterationTokenBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}
	// NParamBuckets: vllm:request_params_n.
	NParamBuckets = []float64{1, 2, 5, 10, 20}
)

// TokenCountBuckets are vLLM's 1-2-5 buckets up to maxModelLen, for the
// per-request token-count histograms.
func TokenCountBuckets(maxModelLen int) []float64 {
	var b []float64
	for scale := 1; ; scale *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*scale > maxModelLen {
				return b
			}
			b = append(b, float64(m*scale))
		}
	}
}

// histograms are the engine's request and step histograms.
type histograms struct {
	ttft, itl, tpot                        Histogram
	e2e, queue, prefill, decode, inference Histogram
	promptToks, genToks, maxTokens, nParam Histogram
	iterationTokens                        Histogram
}

func newHistograms(maxModelLen int) histograms {
	counts := TokenCountBuckets(maxModelLen)
	return histograms{
		ttft: newHistogram(TTFTBuckets), itl: newHistogram(TokenLatencyBuckets), tpot: newHistogram(TokenLatencyBuckets),
		e2e: newHistogram(RequestLatencyBuckets), queue: newHistogram(RequestLatencyBuckets),
		prefill: newHistogram(RequestLatencyBuckets), decode: newHistogram(RequestLatencyBuckets),
		inference:  newHistogram(RequestLatencyBuckets),
		promptToks: newHistogram(counts), genToks: newHistogram(counts), maxTokens: newHistogram(counts),
		nParam: newHistogram(NParamBuckets), iterationTokens: newHistogram(IterationTokenBuckets),
	}
}

// observeFinished records a finished request as vLLM does in its
// finished-request stats: phases from arrival, first scheduling, first and
// last token.
func (h *histograms) observeFinished(r *Result, maxTokens int, maxTokensGiven bool) {
	sec := func(a, b time.Time) float64 {
		if a.IsZero() || b.IsZero() || b.Before(a) {
			return 0
		}
		return b.Sub(a).Seconds()
	}
	last := r.LastToken
	h.e2e.observe(sec(r.Arrival, r.End))
	h.queue.observe(sec(r.Arrival, r.PrefillStart))
	h.prefill.observe(sec(r.PrefillStart, r.FirstToken))
	h.decode.observe(sec(r.FirstToken, last))
	h.inference.observe(sec(r.PrefillStart, last))
	if r.CompletionTokens > 1 {
		h.tpot.observe(sec(r.FirstToken, last) / float64(r.CompletionTokens-1))
	}
	h.promptToks.observe(float64(r.PromptTokens))
	h.genToks.observe(float64(r.CompletionTokens))
	if maxTokensGiven {
		h.maxTokens.observe(float64(maxTokens))
	}
	h.nParam.observe(1)
}

// Stats is a snapshot of the counters a vLLM replica exports.
type Stats struct {
	Running, Waiting int
	// KVUsage is the fraction of blocks referenced by running requests
	// (vllm:kv_cache_usage_perc, 0..1); cached but unreferenced blocks
	// count as free, as in vLLM.
	KVUsage float64
	// UsedBlocks is how many blocks running requests reference.
	UsedBlocks   int
	NumGPUBlocks int
	BlockSize    int
	// CachedBlocks is how many blocks hold a cached key.
	CachedBlocks int
	// PrefixCacheQueries and PrefixCacheHits are in tokens, counted when a
	// request is first scheduled (vllm:prefix_cache_queries/hits).
	PrefixCacheQueries, PrefixCacheHits uint64
	// PromptTokens counts the prompts of requests that got their first
	// token; GenerationTokens every output token.
	PromptTokens, GenerationTokens uint64
	// Preemptions counts preemptions (vllm:num_preemptions).
	Preemptions uint64
	// Outcomes counts requests by how they ended, including refusals.
	Outcomes map[Outcome]uint64

	// Histograms, with vLLM's buckets: time to first token, time between
	// consecutive tokens of a request, and per finished request its mean
	// time per output token, end-to-end latency, time waiting before its
	// first scheduling, prefilling (first scheduling to first token),
	// decoding (first to last token), running (first scheduling to last
	// token), prompt and output length, max_tokens (when given) and n.
	TTFT, InterTokenLatency, TimePerOutputToken  Histogram
	E2E, QueueTime, PrefillTime, DecodeTime      Histogram
	InferenceTime                                Histogram
	RequestPromptTokens, RequestGenerationTokens Histogram
	RequestMaxTokens, RequestN                   Histogram
	// IterationTokens is tokens scheduled per engine step.
	IterationTokens Histogram
}

// Stats returns a snapshot of the engine's counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	capacity := e.pool.capacity()
	h := &e.hist
	s := Stats{
		Running:            len(e.running),
		Waiting:            e.waiting.Len(),
		KVUsage:            float64(capacity-e.pool.free) / float64(capacity),
		UsedBlocks:         capacity - e.pool.free,
		NumGPUBlocks:       capacity,
		BlockSize:          e.cfg.BlockSize,
		CachedBlocks:       len(e.pool.cached),
		PrefixCacheQueries: e.queries,
		PrefixCacheHits:    e.hits,
		PromptTokens:       e.promptToks,
		GenerationTokens:   e.genToks,
		Preemptions:        e.preemptions,
		Outcomes:           make(map[Outcome]uint64, len(AllOutcomes)),

		TTFT: h.ttft.clone(), InterTokenLatency: h.itl.clone(), TimePerOutputToken: h.tpot.clone(),
		E2E: h.e2e.clone(), QueueTime: h.queue.clone(), PrefillTime: h.prefill.clone(),
		DecodeTime: h.decode.clone(), InferenceTime: h.inference.clone(),
		RequestPromptTokens: h.promptToks.clone(), RequestGenerationTokens: h.genToks.clone(),
		RequestMaxTokens: h.maxTokens.clone(), RequestN: h.nParam.clone(),
		IterationTokens: h.iterationTokens.clone(),
	}
	for _, o := range AllOutcomes {
		s.Outcomes[o] = e.outcomes[o]
	}
	return s
}
