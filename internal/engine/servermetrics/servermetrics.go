// Package servermetrics renders a simulated engine's state as a model
// server's Prometheus /metrics page: vLLM's names (current or older) or
// SGLang's. The HTTP simulator serves it; a replay serves the same text for
// its in-process engines, so a router's scraper reads exactly what it would
// read from a real server.
//
// The text is written by hand in the Prometheus text format (0.0.4), shaped
// like prometheus_client's output (which both servers use): HELP and TYPE
// lines, a counter's family named base_total with a base_created gauge
// beside it (histograms too), floats written as Python does ("1.0"), the
// default process and GC collectors first. Routers scrape these exact
// names, so they are kept byte-compatible rather than built on a library.
package servermetrics

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
)

// Flavor selects whose metric names the page uses.
type Flavor string

// Flavors.
const (
	// VLLM is vLLM V1 as of 0.10 and later: vllm:kv_cache_usage_perc,
	// vllm:prefix_cache_queries/hits, vllm:inter_token_latency_seconds.
	VLLM Flavor = "vllm"
	// VLLMOld is vLLM before 0.10: vllm:gpu_cache_usage_perc,
	// vllm:gpu_prefix_cache_queries/hits, vllm:time_per_output_token_seconds.
	VLLMOld Flavor = "vllm-old"
	// SGLang is SGLang started with --enable-metrics: sglang:num_running_reqs,
	// sglang:num_queue_reqs, sglang:token_usage, sglang:cache_hit_rate,
	// sglang:max_total_num_tokens, ...
	SGLang Flavor = "sglang"
)

// Flavors lists every flavor, for flag help.
func Flavors() []Flavor { return []Flavor{VLLM, VLLMOld, SGLang} }

// ParseFlavor returns the flavor named s.
func ParseFlavor(s string) (Flavor, error) {
	for _, f := range Flavors() {
		if string(f) == s {
			return f, nil
		}
	}
	return "", fmt.Errorf("metrics flavor %q: want vllm, vllm-old or sglang", s)
}

// Options configure a page.
type Options struct {
	// Flavor is the servers' naming; empty means VLLM.
	Flavor Flavor
	// MaxLoRAs is the max_lora label of vllm:lora_requests_info (vLLM's
	// --max-loras). vLLM exports that gauge only when LoRA is enabled; the
	// simulator always does, with no adapter running or waiting.
	MaxLoRAs int
	// Started is when the server started (the counters' _created samples);
	// zero means the page's time.
	Started time.Time
	// Exposition is how the server answers a request that names series
	// (name[]=...); empty means DefaultExposition(Flavor).
	Exposition Exposition
	// OmitCacheConfig leaves out the KV cache's size (vllm:cache_config_info,
	// sglang:max_total_num_tokens), as servers that do not report it: a picker must then rely
	// on its configuration and on what responses show.
	OmitCacheConfig bool
}

// Write writes eng's /metrics page in o's flavor.
func Write(w io.Writer, eng *engine.Engine, o Options) error {
	_, err := w.Write(Render(eng.Config(), eng.Stats(), eng.Clock().Now(), o))
	return err
}

// Render returns the /metrics page of an engine configured as cfg whose
// state is st, at time now (vllm:lora_requests_info's value is a
// timestamp, as in vLLM).
func Render(cfg engine.Config, st engine.Stats, now time.Time, o Options) []byte {
	var b bytes.Buffer
	b.Grow(48 << 10)
	if o.Started.IsZero() {
		o.Started = now
	}
	switch o.Flavor {
	case SGLang:
		writeSGLang(&b, cfg, st, o)
	case VLLMOld:
		writeVLLM(&b, cfg, st, now, o, true)
	default:
		writeVLLM(&b, cfg, st, now, o, false)
	}
	return b.Bytes()
}

// page writes families; common is the labels every sample carries.
type page struct {
	b      *bytes.Buffer
	common string
	// created is the value of the _created gauges prometheus_client adds to
	// counters and histograms; empty for collectors that have none.
	created string
	scratch []byte
}

func (p *page) header(name, typ, help string) { p.headerSuffix(name, "", typ, help) }

func (p *page) headerSuffix(name, suffix, typ, help string) {
	for _, s := range [...]string{"# HELP ", name, suffix, " ", help, "\n# TYPE ", name, suffix, " ", typ, "\n"} {
		p.b.WriteString(s)
	}
}

// sample writes name{common,extra} v; extra is pre-rendered `k="v",...`.
func (p *page) sample(name, extra string, v float64) { p.sampleSuffix(name, "", extra, v) }

// sampleSuffix writes name+suffix{common,extra} v.
func (p *page) sampleSuffix(name, suffix, extra string, v float64) {
	p.open(name, suffix, extra)
	p.value(v)
}

// open writes name+suffix{common,extra}, or just the name.
func (p *page) open(name, suffix, extra string) {
	p.b.WriteString(name)
	p.b.WriteString(suffix)
	if p.common != "" || extra != "" {
		p.b.WriteByte('{')
		p.b.WriteString(p.common)
		if p.common != "" && extra != "" {
			p.b.WriteByte(',')
		}
		p.b.WriteString(extra)
		p.b.WriteByte('}')
	}
}

// value ends a sample line with v.
func (p *page) value(v float64) {
	p.b.WriteByte(' ')
	p.scratch = appendPyFloat(p.scratch[:0], v)
	p.b.Write(p.scratch)
	p.b.WriteByte('\n')
}

func (p *page) gauge(name, help string, v float64) {
	p.header(name, "gauge", help)
	p.sample(name, "", v)
}

// createdGauge writes the base_created gauge of a counter or histogram, one
// sample per label set.
func (p *page) createdGauge(base, help string, extras ...string) {
	if p.created == "" {
		return
	}
	if len(extras) == 0 {
		extras = []string{""}
	}
	p.headerSuffix(base, "_created", "gauge", help)
	for _, x := range extras {
		p.open(base, "_created", x)
		p.b.WriteByte(' ')
		p.b.WriteString(p.created)
		p.b.WriteByte('\n')
	}
}

// counter writes a counter as prometheus_client does in the text format:
// the family is base_total, with a base_created gauge beside it.
func (p *page) counter(base, help string, v float64) {
	p.headerSuffix(base, "_total", "counter", help)
	p.sampleSuffix(base, "_total", "", v)
	p.createdGauge(base, help)
}

// labeledCounter writes one counter family with a sample per label value.
func (p *page) labeledCounter(base, help, label string, values []string, v func(string) float64) {
	p.headerSuffix(base, "_total", "counter", help)
	extras := make([]string, len(values))
	for i, lv := range values {
		extras[i] = labelPair(label, lv)
		p.sampleSuffix(base, "_total", extras[i], v(lv))
	}
	p.createdGauge(base, help, extras...)
}

func (p *page) histogram(name, help string, h engine.Histogram) {
	p.header(name, "histogram", help)
	var cum uint64
	for i, ub := range h.Bounds {
		cum += h.Counts[i]
		p.bucket(name, ub, float64(cum))
	}
	p.sampleSuffix(name, "_bucket", `le="+Inf"`, float64(h.Count))
	p.sampleSuffix(name, "_count", "", float64(h.Count))
	p.sampleSuffix(name, "_sum", "", h.Sum)
	p.createdGauge(name, help)
}

// bucket writes name_bucket{common,le="ub"} v without building the label.
func (p *page) bucket(name string, ub, v float64) {
	p.b.WriteString(name)
	p.b.WriteString("_bucket{")
	if p.common != "" {
		p.b.WriteString(p.common)
		p.b.WriteByte(',')
	}
	p.b.WriteString(`le="`)
	p.scratch = appendPyFloat(p.scratch[:0], ub)
	p.b.Write(p.scratch)
	p.b.WriteString(`"}`)
	p.value(v)
}

// pyFloat formats like Python's repr of a float, as prometheus_client does.
func pyFloat(v float64) string { return string(appendPyFloat(nil, v)) }

func appendPyFloat(dst []byte, v float64) []byte {
	switch {
	case math.IsInf(v, 1):
		return append(dst, "+Inf"...)
	case math.IsInf(v, -1):
		return append(dst, "-Inf"...)
	case math.IsNaN(v):
		return append(dst, "NaN"...)
	}
	if v == math.Trunc(v) && math.Abs(v) < 1e16 {
		return append(strconv.AppendFloat(dst, v, 'f', -1, 64), ".0"...)
	}
	return strconv.AppendFloat(dst, v, 'g', -1, 64)
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func labelPair(k, v string) string { return k + `="` + labelEscaper.Replace(v) + `"` }

func joinLabels(kv ...string) string {
	parts := make([]string, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		parts = append(parts, labelPair(kv[i], kv[i+1]))
	}
	return strings.Join(parts, ",")
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// writeProcess writes the collectors prometheus_client registers by default
// in a Python server. Their values are fixed: they only give the page the
// size and shape of a real one.
func writeProcess(b *bytes.Buffer, started time.Time) {
	p := &page{b: b}
	p.header("python_gc_objects_collected_total", "counter", "Objects collected during gc")
	for g, v := range []float64{12873, 4211, 937} {
		p.sample("python_gc_objects_collected_total", labelPair("generation", strconv.Itoa(g)), v)
	}
	p.header("python_gc_objects_uncollectable_total", "counter", "Uncollectable objects found during GC")
	for g := range 3 {
		p.sample("python_gc_objects_uncollectable_total", labelPair("generation", strconv.Itoa(g)), 0)
	}
	p.header("python_gc_collections_total", "counter", "Number of times this generation was collected")
	for g, v := range []float64{1520, 138, 9} {
		p.sample("python_gc_collections_total", labelPair("generation", strconv.Itoa(g)), v)
	}
	p.header("python_info", "gauge", "Python platform information")
	p.sample("python_info", joinLabels("implementation", "CPython", "major", "3", "minor", "12", "patchlevel", "11", "version", "3.12.11"), 1)
	p.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", 9.6e10)
	p.gauge("process_resident_memory_bytes", "Resident memory size in bytes.", 3.1e9)
	p.gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", math.Floor(unix(started)*100)/100)
	p.counter("process_cpu_seconds", "Total user and system CPU time spent in seconds.", 0)
	p.gauge("process_open_fds", "Number of open file descriptors.", 87)
	p.gauge("process_max_fds", "Maximum number of open file descriptors.", 1048576)
}

func writeVLLM(b *bytes.Buffer, cfg engine.Config, st engine.Stats, now time.Time, o Options, old bool) {
	writeProcess(b, o.Started)
	p := &page{b: b, common: joinLabels("model_name", cfg.Model, "engine", "0"), created: pyFloat(unix(o.Started))}

	p.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", float64(st.Running))
	p.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(st.Waiting))
	if old {
		p.gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", 0)
		p.gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", st.KVUsage)
	} else {
		p.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", st.KVUsage)
	}
	counter := p.counter
	prefix := "vllm:prefix_cache_"
	if old {
		prefix = "vllm:gpu_prefix_cache_"
	}
	counter(prefix+"queries", "Prefix cache queries, in terms of number of queried tokens.", float64(st.PrefixCacheQueries))
	counter(prefix+"hits", "Prefix cache hits, in terms of number of cached tokens.", float64(st.PrefixCacheHits))
	counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", float64(st.Preemptions))
	counter("vllm:prompt_tokens", "Number of prefill tokens processed.", float64(st.PromptTokens))
	counter("vllm:generation_tokens", "Number of generation tokens processed.", float64(st.GenerationTokens))
	// vLLM's finish reasons: an injected failure after some output ends as an abort.
	p.labeledCounter("vllm:request_success", "Count of successfully processed requests.", "finished_reason",
		[]string{"stop", "length", "abort"}, func(r string) float64 {
			v := float64(st.Outcomes[engine.Outcome(r)])
			if r == "abort" {
				v += float64(st.Outcomes[engine.OutcomeError])
			}
			return v
		})

	p.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", st.RequestPromptTokens)
	p.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", st.RequestGenerationTokens)
	p.histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", st.IterationTokens)
	p.histogram("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", st.RequestGenerationTokens)
	p.histogram("vllm:request_params_n", "Histogram of the n request parameter.", st.RequestN)
	p.histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", st.RequestMaxTokens)
	p.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", st.TTFT)
	if old {
		p.histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", st.InterTokenLatency)
	} else {
		p.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", st.InterTokenLatency)
		p.histogram("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", st.TimePerOutputToken)
	}
	p.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", st.E2E)
	p.histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", st.QueueTime)
	p.histogram("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", st.InferenceTime)
	p.histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", st.PrefillTime)
	p.histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", st.DecodeTime)

	// The info gauges carry their own labels, not model_name.
	info := &page{b: b}
	info.header("vllm:lora_requests_info", "gauge", "Running stats on lora requests.")
	info.sample("vllm:lora_requests_info", joinLabels("max_lora", strconv.Itoa(o.MaxLoRAs),
		"waiting_lora_adapters", "", "running_lora_adapters", ""), unix(now))
	if !o.OmitCacheConfig {
		info.header("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
		info.sample("vllm:cache_config_info", joinLabels(
			"block_size", strconv.Itoa(st.BlockSize),
			"cache_dtype", "auto",
			"calculate_kv_scales", "False",
			"cpu_offload_gb", "0",
			"enable_prefix_caching", "True",
			"engine", "0",
			"gpu_memory_utilization", "0.9",
			"is_attention_free", "False",
			"num_cpu_blocks", "None",
			"num_gpu_blocks", strconv.Itoa(st.NumGPUBlocks),
			"num_gpu_blocks_override", "None",
			"prefix_caching_hash_algo", "sha256",
			"sliding_window", "None",
			"swap_space", "4",
			"swap_space_bytes", "4294967296",
		), 1)
	}

	writeSim(b, st)
}

// writeSim writes the simulator's own series: every request by how it
// ended, including refusals a real server does not count.
func writeSim(b *bytes.Buffer, st engine.Stats) {
	p := &page{b: b}
	p.header("sim:requests_total", "counter", "Requests by outcome (simulator).")
	for _, o := range engine.AllOutcomes {
		p.sample("sim:requests_total", labelPair("outcome", string(o)), float64(st.Outcomes[o]))
	}
	p.gauge("sim:cached_blocks", "KV blocks holding a cached prefix block (simulator).", float64(st.CachedBlocks))
}

func writeSGLang(b *bytes.Buffer, cfg engine.Config, st engine.Stats, o Options) {
	writeProcess(b, o.Started)
	p := &page{b: b, common: labelPair("model_name", cfg.Model), created: pyFloat(unix(o.Started))}
	maxTokens := st.NumGPUBlocks * st.BlockSize
	hitRate := 0.0
	if st.PrefixCacheQueries > 0 {
		hitRate = float64(st.PrefixCacheHits) / float64(st.PrefixCacheQueries)
	}
	p.gauge("sglang:num_running_reqs", "The number of running requests.", float64(st.Running))
	p.gauge("sglang:num_used_tokens", "The number of used tokens.", float64(st.UsedBlocks*st.BlockSize))
	p.gauge("sglang:token_usage", "The token usage.", st.KVUsage)
	p.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", float64(st.Waiting))
	p.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", hitRate)
	if !o.OmitCacheConfig {
		p.gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", float64(maxTokens))
	}
	p.gauge("sglang:context_len", "The context length.", float64(cfg.MaxModelLen))
	p.gauge("sglang:page_size", "The page size of the KV cache.", float64(st.BlockSize))
	p.gauge("sglang:num_retracted_reqs", "The number of retracted requests.", 0)
	counter := p.counter
	finished := st.Outcomes[engine.OutcomeStop] + st.Outcomes[engine.OutcomeLength]
	counter("sglang:prompt_tokens", "Number of prefill tokens processed.", float64(st.PromptTokens))
	counter("sglang:generation_tokens", "Number of generation tokens processed.", float64(st.GenerationTokens))
	counter("sglang:cached_tokens", "Number of cached prompt tokens.", float64(st.PrefixCacheHits))
	counter("sglang:num_requests", "Number of requests processed.", float64(finished))
	counter("sglang:num_aborted_requests", "Number of requests aborted.", float64(st.Outcomes[engine.OutcomeAbort]+st.Outcomes[engine.OutcomeError]))
	counter("sglang:num_retractions", "Number of retracted (preempted) requests.", float64(st.Preemptions))
	p.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", st.TTFT)
	p.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", st.InterTokenLatency)
	p.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", st.E2E)
	p.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", st.QueueTime)
	p.histogram("sglang:prompt_tokens_histogram", "Histogram of prompt token length.", st.RequestPromptTokens)
	p.histogram("sglang:generation_tokens_histogram", "Histogram of generation token length.", st.RequestGenerationTokens)
	writeSim(b, st)
}
