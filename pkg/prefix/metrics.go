package prefix

import (
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/router"
	"github.com/prometheus/client_golang/prometheus"
)

type pluginMetrics struct {
	predictedCached, reportedCached *prometheus.CounterVec
	trims, trimmed                  *prometheus.CounterVec
	grows, grown                    *prometheus.CounterVec
	capacity, floor                 *prometheus.GaugeVec
	predictedShare, serverShare     *prometheus.GaugeVec
	hitBlocks, reqBlocks            prometheus.Counter
	hitRatio                        prometheus.Histogram
	serverPrompt, serverCached      prometheus.Counter
	serverPromptWithCachedReported  prometheus.Counter
	hotCredits                      prometheus.Counter
}

func newPluginMetrics(pl *Plugin, reg prometheus.Registerer) *pluginMetrics {
	if reg == nil {
		return nil
	}
	m := &pluginMetrics{
		hitBlocks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvpick_prefix_predicted_hit_blocks_total",
			Help: "Prompt blocks that the picked endpoint was predicted to hold (index or pending).",
		}),
		reqBlocks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvpick_prefix_request_blocks_total",
			Help: "Prompt blocks of scored requests; hit_blocks/request_blocks is the predicted prefix-hit ratio.",
		}),
		hitRatio: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvpick_prefix_predicted_hit_ratio",
			Help:    "Per request, the fraction of its prompt blocks predicted to be cached on the picked endpoint.",
			Buckets: []float64{0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1},
		}),
	}
	m.serverPrompt = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvpick_prefix_server_prompt_tokens_total",
		Help: "Prompt tokens of successful responses whose usage report the picker saw (usage.prompt_tokens).",
	})
	m.serverPromptWithCachedReported = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvpick_prefix_server_prompt_with_cached_tokens_total",
		Help: "Prompt tokens of the usage reports that included prompt_tokens_details.cached_tokens.",
	})
	m.serverCached = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvpick_prefix_server_cached_tokens_total",
		Help: "Prompt tokens the servers reported as prefix-cache hits (usage.prompt_tokens_details.cached_tokens); " +
			"divided by kvpick_prefix_server_prompt_with_cached_tokens_total it is the measured hit ratio.",
	})
	m.hotCredits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvpick_prefix_hot_prefix_credits_total",
		Help: "Scored requests whose leading blocks carry more of the traffic than the endpoints holding them (replicateHotPrefixes): every candidate was credited with them, so load chose.",
	})
	reg.MustRegister(m.serverPrompt, m.serverPromptWithCachedReported, m.serverCached, m.hotCredits,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvpick_prefix_tokens_per_block",
			Help: "Server tokens per index block, learned from usage reports (0 until the first report).",
		}, pl.caps.tokensPerBlockMetric),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvpick_prefix_capacity_blocks",
			Help: "Capacity of the index, in its own blocks, of an endpoint that reports no KV cache size: lruCapacityPerEndpoint rescaled by the learned tokens per block (and the pool-wide bound).",
		}, func() float64 { return float64(pl.index.Capacity()) }),
	)
	ev := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"endpoint"})
	}
	m.predictedCached = ev("kvpick_prefix_evidence_predicted_cached_tokens_total",
		"For responses whose usage reported cached_tokens: the prompt tokens the index predicted the serving endpoint held.")
	m.reportedCached = ev("kvpick_prefix_evidence_reported_cached_tokens_total",
		"For the same responses: the cached tokens the server reported (usage.prompt_tokens_details.cached_tokens).")
	m.trims = ev("kvpick_prefix_evidence_trims_total",
		"Times a server reported clearly fewer cached tokens than predicted and the endpoint's older index entries were dropped.")
	m.trimmed = ev("kvpick_prefix_evidence_trimmed_entries_total",
		"Index entries dropped because a server reported fewer cached tokens than predicted.")
	m.grows = ev("kvpick_prefix_evidence_grows_total",
		"Times a server reported cache hits on blocks the index had dropped for want of room, and the endpoint's learned capacity grew.")
	m.grown = ev("kvpick_prefix_evidence_grown_blocks_total",
		"Index blocks added to learned capacities because servers still held blocks the index had dropped.")
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"endpoint"})
	}
	m.capacity = gauge("kvpick_prefix_endpoint_capacity_blocks",
		"Capacity of an endpoint's share of the index, in index blocks: from its reported KV cache, learned from the evidence, or the default.")
	m.floor = gauge("kvpick_prefix_endpoint_usage_floor_tokens",
		"For an endpoint that reports no KV cache size: the usable tokens its cache holds at least, from the blocks the picker's requests running there reference over its reported KV usage.")
	m.predictedShare = gauge("kvpick_prefix_endpoint_predicted_hit_share",
		"Share of their prompts the requests sent to an endpoint were predicted to find cached there (the prefix scorer's match at pick), over the last ~65K prompt tokens its server looked up; set once its server reports prefix-cache counters.")
	m.serverShare = gauge("kvpick_prefix_endpoint_server_hit_share",
		"Share of the prompt tokens an endpoint's server looked up in its prefix cache that it found there (vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total), over the same window: well below the predicted share, the server loses prefixes the picker counts on.")
	reg.MustRegister(m.predictedCached, m.reportedCached, m.trims, m.trimmed, m.grows, m.grown, m.capacity, m.floor,
		m.predictedShare, m.serverShare)
	stat := func(name, help string, f func(Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return f(pl.index.Stats()) })
	}
	reg.MustRegister(m.hitBlocks, m.reqBlocks, m.hitRatio,
		stat("kvpick_prefix_index_entries", "(endpoint, block) entries in the prefix index.",
			func(s Stats) float64 { return float64(s.Entries) }),
		stat("kvpick_prefix_index_blocks", "Distinct blocks in the prefix index.",
			func(s Stats) float64 { return float64(s.Blocks) }),
		stat("kvpick_prefix_index_bytes", "Estimated memory of the prefix index (slab plus maps).",
			func(s Stats) float64 { return float64(s.Bytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvpick_prefix_pending_records", Help: "Picked requests whose response has not arrived yet.",
		}, func() float64 { return float64(pl.pending.len()) }),
	)
	return m
}

func (m *pluginMetrics) observe(hit, total int) {
	m.hitBlocks.Add(float64(hit))
	m.reqBlocks.Add(float64(total))
	m.hitRatio.Observe(float64(hit) / float64(total))
}

func (m *pluginMetrics) observeUsage(u openai.Usage) {
	m.serverPrompt.Add(float64(u.PromptTokens))
	if u.HasCached {
		m.serverPromptWithCachedReported.Add(float64(u.PromptTokens))
		m.serverCached.Add(float64(u.CachedTokens))
	}
}

func (m *pluginMetrics) observeEvidence(ep *router.Endpoint, predicted, reported float64) {
	m.predictedCached.WithLabelValues(ep.Addr).Add(predicted)
	m.reportedCached.WithLabelValues(ep.Addr).Add(reported)
}

func (m *pluginMetrics) observeTrim(ep *router.Endpoint, evicted int) {
	m.trims.WithLabelValues(ep.Addr).Inc()
	m.trimmed.WithLabelValues(ep.Addr).Add(float64(evicted))
}

func (m *pluginMetrics) observeGrow(ep *router.Endpoint, blocks int) {
	m.grows.WithLabelValues(ep.Addr).Inc()
	m.grown.WithLabelValues(ep.Addr).Add(float64(blocks))
}

func (m *pluginMetrics) setCapacity(ep *router.Endpoint, blocks int) {
	m.capacity.WithLabelValues(ep.Addr).Set(float64(blocks))
}

func (m *pluginMetrics) setHitShares(ep *router.Endpoint, predicted, server float64) {
	m.predictedShare.WithLabelValues(ep.Addr).Set(predicted)
	m.serverShare.WithLabelValues(ep.Addr).Set(server)
}

func (m *pluginMetrics) setFloor(ep *router.Endpoint, tokens float64) {
	m.floor.WithLabelValues(ep.Addr).Set(tokens)
}

// forget drops a removed endpoint's series.
func (m *pluginMetrics) forget(ep *router.Endpoint) {
	m.capacity.DeleteLabelValues(ep.Addr)
	m.floor.DeleteLabelValues(ep.Addr)
	m.predictedShare.DeleteLabelValues(ep.Addr)
	m.serverShare.DeleteLabelValues(ep.Addr)
	for _, v := range []*prometheus.CounterVec{m.predictedCached, m.reportedCached, m.trims, m.trimmed, m.grows, m.grown} {
		v.DeleteLabelValues(ep.Addr)
	}
}
