package pool

import "github.com/prometheus/client_golang/prometheus"

var (
	inflightDesc = prometheus.NewDesc("kvpick_endpoint_inflight_requests",
		"Requests routed to the endpoint whose stream has not ended.", []string{"endpoint"}, nil)
	healthyDesc = prometheus.NewDesc("kvpick_endpoint_healthy",
		"1 while the endpoint passes its health checks, 0 while it is skipped.", []string{"endpoint"}, nil)
	sizeDesc = prometheus.NewDesc("kvpick_pool_endpoints",
		"Endpoints in the pool.", nil, nil)
	readyDesc = prometheus.NewDesc("kvpick_pool_synced",
		"1 once the pool has been populated from its source.", nil, nil)
)

// Collector exports the pool's per-endpoint state; it reads the current snapshot at scrape
// time, so endpoints that leave the pool leave the metrics too.
type Collector struct{ p *Pool }

// NewCollector returns a collector for p.
func NewCollector(p *Pool) *Collector { return &Collector{p: p} }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inflightDesc
	ch <- healthyDesc
	ch <- sizeDesc
	ch <- readyDesc
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	snap := c.p.Snapshot()
	for _, e := range snap {
		ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(e.InFlight()), e.Addr)
		healthy := 0.0
		if e.Healthy() {
			healthy = 1
		}
		ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, healthy, e.Addr)
	}
	ch <- prometheus.MustNewConstMetric(sizeDesc, prometheus.GaugeValue, float64(len(snap)))
	synced := 0.0
	if c.p.Synced() {
		synced = 1
	}
	ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, synced)
}
