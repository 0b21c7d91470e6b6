package extproc

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the server's own Prometheus metrics.
type Metrics struct {
	requests *prometheus.CounterVec
	decision prometheus.Histogram
	streams  prometheus.Gauge
	panics   prometheus.Counter
	degraded *prometheus.CounterVec
}

// NewMetrics registers the server's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvpick_requests_total",
			Help: "Requests by outcome (success: 2xx upstream; upstream_error: other upstream status; " +
				"rejected: answered by the picker; cancelled: stream ended before a response) and HTTP status.",
		}, []string{"outcome", "status"}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvpick_decision_duration_seconds",
			Help: "Time from the complete request body to the routing decision (parse, hash, match, score, pick).",
			// 2 µs .. ~130 ms in powers of two: the hot path is microseconds, outliers matter.
			Buckets: prometheus.ExponentialBuckets(2e-6, 2, 17),
		}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvpick_open_streams",
			Help: "ext_proc streams currently open.",
		}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvpick_extproc_panics_total",
			Help: "Panics recovered while handling a stream (a bug: the stream failed, the picker went on).",
		}),
		degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvpick_extproc_degraded_mode_streams_total",
			Help: "Routed requests whose stream showed a processing mode that breaks the picker's accounting: " +
				"response_body_none (the stream ended at the response headers: the request stopped counting in flight " +
				"while it was generated), response_headers_skipped (the picker never saw the response: nothing was " +
				"committed to the prefix index). Fix the proxy's processing_mode (README, Envoy).",
		}, []string{"reason"}),
	}
	for _, r := range degradedReasons {
		m.degraded.WithLabelValues(r) // export zeros: an alert can tell "none" from "not scraped"
	}
	reg.MustRegister(m.requests, m.decision, m.streams, m.panics, m.degraded)
	return m
}

func (m *Metrics) observeRequest(outcome string, status int) {
	s := ""
	if status != 0 {
		s = strconv.Itoa(status)
	}
	m.requests.WithLabelValues(outcome, s).Inc()
}
