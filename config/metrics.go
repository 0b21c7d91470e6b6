package config

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// ModelServerMetrics configures the scrape of every endpoint's Prometheus metrics (queue, KV
// cache usage and size, LoRA adapters): pool.metrics in the config file.
type ModelServerMetrics struct {
	// Path is the metrics page on each endpoint's address.
	Path string `json:"path"`
	// FilterFamilies asks for only the families the scraper reads (the query
	// name[]=<family>&..., which Python's prometheus_client honours): a page of ~1 KB instead
	// of ~50 KB. A server that ignores the query answers the whole page, which is read as
	// usual; one that answers with none of the families is asked for the whole page.
	FilterFamilies bool `json:"filterFamilies"`
	// RefreshInterval is the time between two scrapes of one endpoint; 0 disables scraping.
	RefreshInterval Duration `json:"refreshInterval"`
	// Timeout bounds one scrape, from sending the request to the end of the body.
	Timeout Duration `json:"timeout"`
	// StalenessThreshold is how long after it arrived a scrape is still trusted.
	StalenessThreshold Duration `json:"stalenessThreshold"`
	// MaxBodyBytes bounds the metrics page read from one endpoint.
	MaxBodyBytes int64 `json:"maxBodyBytes"`
	// Engine selects the metric names: auto (vLLM or SGLang, detected per endpoint), vllm,
	// sglang, or custom (Names).
	Engine string `json:"engine"`
	// Names are the metric names of a custom engine.
	Names MetricNames `json:"names"`
}

// MetricNames are the metric families the scraper reads, for engine: custom. An empty name is a
// value the engine does not report.
type MetricNames struct {
	// Waiting and Running are gauges of queued and running requests (series are summed).
	Waiting string `json:"waiting"`
	Running string `json:"running"`
	// KVUsage is a gauge of the KV cache's used fraction, 0..1 (series are averaged).
	KVUsage string `json:"kvUsage"`
	// CacheConfigInfo is an info gauge whose labels block_size and num_gpu_blocks give the KV
	// cache's size, as vLLM's cache_config_info.
	CacheConfigInfo string `json:"cacheConfigInfo"`
	// CapacityTokens is a gauge of the KV cache's size in tokens, as SGLang's
	// max_total_num_tokens (used when CacheConfigInfo is absent).
	CapacityTokens string `json:"capacityTokens"`
	// LoRAInfo is a gauge whose labels running_lora_adapters, waiting_lora_adapters and max_lora
	// describe the adapters, the newest series (highest value) winning, as vLLM's
	// lora_requests_info.
	LoRAInfo string `json:"loraInfo"`
	// FirstTokens is a counter of requests that produced their first token (the _count series of
	// a time-to-first-token histogram, as vllm:time_to_first_token_seconds_count): how many
	// prefills the server finished, which tells the picker when non-streamed requests' prefills
	// are over.
	FirstTokens string `json:"firstTokens"`
	// PrefixQueries and PrefixHits are counters of prompt tokens looked up in the prefix cache
	// and of those found cached (as vllm:prefix_cache_queries_total and
	// vllm:prefix_cache_hits_total): the server's real reuse, which the prefix plugin exports
	// per endpoint beside what it predicted. Both or neither. Left out of a written config when
	// empty, so that a replay of this build can still configure picker binaries built before
	// them (which refuse unknown fields).
	PrefixQueries string `json:"prefixQueries,omitempty"`
	PrefixHits    string `json:"prefixHits,omitempty"`
}

// MetricEngines are the values ModelServerMetrics.Engine accepts.
var MetricEngines = []string{"auto", "vllm", "sglang", "custom"}

func (m *ModelServerMetrics) validate() error {
	if m.RefreshInterval < 0 {
		return fmt.Errorf("pool.metrics.refreshInterval %v: must not be negative (0 disables scraping)", m.RefreshInterval.D())
	}
	if !slices.Contains(MetricEngines, m.Engine) {
		return fmt.Errorf("pool.metrics.engine %q: want one of %s", m.Engine, strings.Join(MetricEngines, ", "))
	}
	if m.Engine == "custom" {
		n := m.Names
		if n.Waiting == "" && n.Running == "" && n.KVUsage == "" && n.CacheConfigInfo == "" && n.CapacityTokens == "" && n.LoRAInfo == "" {
			return fmt.Errorf("pool.metrics.names: engine custom needs at least one metric name of waiting, running, kvUsage, cacheConfigInfo, capacityTokens, loraInfo (firstTokens and the prefix-cache counters alone are not enough)")
		}
		for field, name := range map[string]string{"waiting": n.Waiting, "running": n.Running, "kvUsage": n.KVUsage,
			"cacheConfigInfo": n.CacheConfigInfo, "capacityTokens": n.CapacityTokens, "loraInfo": n.LoRAInfo,
			"firstTokens": n.FirstTokens, "prefixQueries": n.PrefixQueries, "prefixHits": n.PrefixHits} {
			if name != "" && !validMetricName(name) {
				return fmt.Errorf("pool.metrics.names.%s %q: not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)", field, name)
			}
		}
		if (n.PrefixQueries == "") != (n.PrefixHits == "") {
			return fmt.Errorf("pool.metrics.names: prefixQueries and prefixHits go together (one without the other is not read)")
		}
	} else if m.Names != (MetricNames{}) {
		return fmt.Errorf("pool.metrics.names: only used with engine: custom (engine is %q)", m.Engine)
	}
	if m.RefreshInterval == 0 {
		return nil // scraping is off: the other fields are not used
	}
	switch {
	case m.RefreshInterval.D() < time.Millisecond:
		return fmt.Errorf("pool.metrics.refreshInterval %v: want at least 1ms (or 0 to disable scraping)", m.RefreshInterval.D())
	case !strings.HasPrefix(m.Path, "/"):
		return fmt.Errorf("pool.metrics.path %q: want an absolute path such as /metrics", m.Path)
	case strings.ContainsFunc(m.Path, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return fmt.Errorf("pool.metrics.path %q: spaces and control characters must be %%-encoded", m.Path)
	case m.Timeout <= 0:
		return fmt.Errorf("pool.metrics.timeout %v: want more than 0", m.Timeout.D())
	case m.StalenessThreshold < 2*m.RefreshInterval:
		return fmt.Errorf("pool.metrics.stalenessThreshold %v (--metrics-staleness-threshold): want at least twice "+
			"refreshInterval %v (--refresh-metrics-interval), or every late scrape makes the metrics stale",
			m.StalenessThreshold.D(), m.RefreshInterval.D())
	case m.MaxBodyBytes < 1024 || m.MaxBodyBytes > 64<<20:
		return fmt.Errorf("pool.metrics.maxBodyBytes %d: want 1024..67108864 (64 MiB)", m.MaxBodyBytes)
	}
	return nil
}

// validMetricName reports whether s is a classic Prometheus metric name.
func validMetricName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9')
		if !ok {
			return false
		}
	}
	return s != ""
}
