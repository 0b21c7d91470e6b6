package prefix

import (
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/prometheus/client_golang/prometheus"
)

type pluginMetrics struct {
	hitBlocks, reqBlocks           prometheus.Counter
	hitRatio                       prometheus.Histogram
	serverPrompt, serverCached     prometheus.Counter
	serverPromptWithCachedReported prometheus.Counter
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
	reg.MustRegister(m.serverPrompt, m.serverPromptWithCachedReported, m.serverCached,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvpick_prefix_tokens_per_block",
			Help: "Server tokens per index block, learned from usage reports (0 until the first report).",
		}, pl.calib.tokensPerBlock),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvpick_prefix_capacity_blocks",
			Help: "Per-endpoint capacity of the index in its own blocks: lruCapacityPerEndpoint rescaled by the learned tokens per block.",
		}, func() float64 { return float64(pl.index.Capacity()) }),
	)
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
