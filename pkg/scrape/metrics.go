package scrape

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// result is how one scrape ended: the result label of kvpick_model_server_scrapes_total.
type result int

const (
	resultOK         result = iota // every field the picker routes on was read
	resultError                    // connection refused or reset, bad URL, ...
	resultTimeout                  // no complete answer within pool.metrics.timeout
	resultBadStatus                // an HTTP status other than 200
	resultTooLarge                 // a page over pool.metrics.maxBodyBytes
	resultUnparsable               // a wanted family's lines are not the Prometheus text format
	resultInvalid                  // a wanted value is implausible (NaN, negative, usage over 1)
	resultMissing                  // the page lacks a queue or KV-usage family
	numResults
)

var resultNames = [numResults]string{"ok", "error", "timeout", "bad_status", "too_large", "unparsable", "invalid_values", "missing_metrics"}

func (r result) String() string { return resultNames[r] }

// publishes reports whether a scrape with this result replaces the endpoint's metrics: a page
// that was read, even if it lacks a family (the Has flags say so). A scrape that failed keeps
// the last good metrics, which go stale by themselves.
func (r result) publishes() bool { return r == resultOK || r == resultInvalid || r == resultMissing }

var (
	scrapesDesc = prometheus.NewDesc("kvpick_model_server_scrapes_total",
		"Scrapes of the endpoint's metrics page, by result (ok, error, timeout, bad_status, too_large, unparsable, invalid_values, missing_metrics).",
		[]string{"endpoint", "result"}, nil)
	waitingDesc = prometheus.NewDesc("kvpick_model_server_requests_waiting",
		"Requests waiting on the endpoint, as its last good scrape reported.", []string{"endpoint"}, nil)
	runningDesc = prometheus.NewDesc("kvpick_model_server_requests_running",
		"Requests running on the endpoint, as its last good scrape reported.", []string{"endpoint"}, nil)
	kvUsageDesc = prometheus.NewDesc("kvpick_model_server_kv_cache_usage_ratio",
		"Used fraction of the endpoint's KV cache (0-1), as its last good scrape reported.", []string{"endpoint"}, nil)
	blocksDesc = prometheus.NewDesc("kvpick_model_server_num_gpu_blocks",
		"KV cache blocks of the endpoint (SGLang: tokens), as its last good scrape reported.", []string{"endpoint"}, nil)
	blockSizeDesc = prometheus.NewDesc("kvpick_model_server_block_size_tokens",
		"Tokens per KV cache block of the endpoint (SGLang: 1).", []string{"endpoint"}, nil)
	pageBytesDesc = prometheus.NewDesc("kvpick_model_server_metrics_page_bytes",
		"Size of the endpoint's last metrics page: ~1 KB when the server filters it by name (pool.metrics.filterFamilies), ~50 KB for a whole vLLM page.",
		[]string{"endpoint"}, nil)
	ageDesc = prometheus.NewDesc("kvpick_model_server_metrics_age_seconds",
		"Time since the endpoint's last good scrape; beyond pool.metrics.stalenessThreshold the picker ignores it.",
		[]string{"endpoint"}, nil)
)

// collector exports every scraped endpoint's counters and last good metrics. It reads them at
// collection time, so an endpoint that leaves the pool leaves the metrics too.
type collector Scraper

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{scrapesDesc, waitingDesc, runningDesc, kvUsageDesc, blocksDesc, blockSizeDesc, pageBytesDesc, ageDesc} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := (*Scraper)(c)
	s.mu.Lock()
	loops := make([]*loop, 0, len(s.loops))
	for _, l := range s.loops {
		loops = append(loops, l)
	}
	s.mu.Unlock()
	now := time.Now()
	gauge := func(d *prometheus.Desc, v float64, addr string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, addr)
	}
	for _, l := range loops {
		addr := l.ep.Addr
		for r := range numResults {
			// ok is always exported, so that a dashboard sees every endpoint; the failures once
			// they happened.
			if n := l.counts[r].Load(); n > 0 || r == resultOK {
				ch <- prometheus.MustNewConstMetric(scrapesDesc, prometheus.CounterValue, float64(n), addr, r.String())
			}
		}
		if n := l.pageBytes.Load(); n > 0 {
			gauge(pageBytesDesc, float64(n), addr)
		}
		m := l.ep.Metrics()
		if m == nil {
			continue
		}
		if m.HasQueue {
			gauge(waitingDesc, float64(m.Waiting), addr)
			gauge(runningDesc, float64(m.Running), addr)
		}
		if m.HasKVUsage {
			gauge(kvUsageDesc, m.KVUsage, addr)
		}
		if m.NumGPUBlocks > 0 {
			gauge(blocksDesc, float64(m.NumGPUBlocks), addr)
			gauge(blockSizeDesc, float64(m.BlockSize), addr)
		}
		gauge(ageDesc, now.Sub(m.ScrapedAt).Seconds(), addr)
	}
}
