package prefix

import "github.com/prometheus/client_golang/prometheus"

type pluginMetrics struct {
	hitBlocks, reqBlocks prometheus.Counter
	hitRatio             prometheus.Histogram
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
