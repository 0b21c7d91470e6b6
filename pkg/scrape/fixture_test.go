package scrape

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// VLLMPage describes a vLLM (V1 engine, 0.8-0.10) /metrics page. Render writes it the way the
// server does (prometheus_client: HELP and TYPE lines, _created series, Python float reprs,
// labels engine and model_name) with every family a stock server exports, histograms included,
// so that tests and benchmarks read a page of realistic size and shape (~50 KB for one engine).
type VLLMPage struct {
	Model string
	// Per data-parallel engine (one entry for a plain server).
	Waiting, Running []int
	KVUsage          []float64
	NumGPUBlocks     int // per engine
	BlockSize        int
	// OldNames writes only vllm:gpu_cache_usage_perc (before 0.10); otherwise both names are
	// written, as servers of the transition do.
	OldNames bool
	// LoRA series, in the order the server created them; Time is the gauge's value.
	LoRA []LoRASeries
	// Omit drops every line of these families.
	Omit []string
}

// LoRASeries is one series of vllm:lora_requests_info.
type LoRASeries struct {
	Running, Waiting string
	Max              int
	Time             float64
}

func pyFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsNaN(v):
		return "NaN"
	case v == math.Trunc(v) && math.Abs(v) < 1e16:
		return strconv.FormatFloat(v, 'f', -1, 64) + ".0"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

type page struct {
	b    bytes.Buffer
	omit []string
}

func (p *page) family(name, typ, help string, body func()) {
	for _, o := range p.omit {
		if o == name {
			return
		}
	}
	fmt.Fprintf(&p.b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	body()
}

func (p *page) line(name, labels string, v float64) {
	p.b.WriteString(name)
	if labels != "" {
		p.b.WriteString("{" + labels + "}")
	}
	p.b.WriteString(" " + pyFloat(v) + "\n")
}

const created = 1.7541234567891235e+09

// histogram writes a histogram family with bounds for every label set, as prometheus_client
// does, with plausible cumulative counts.
func (p *page) histogram(name, help string, bounds []float64, labelSets []string) {
	p.family(name, "histogram", help, func() {
		for _, ls := range labelSets {
			sep := ""
			if ls != "" {
				sep = ","
			}
			total := 1234.0
			for i, ub := range bounds {
				p.line(name+"_bucket", ls+sep+`le="`+pyFloat(ub)+`"`, math.Round(total*float64(i+1)/float64(len(bounds)+1)))
			}
			p.line(name+"_bucket", ls+sep+`le="+Inf"`, total)
			p.line(name+"_count", ls, total)
			p.line(name+"_sum", ls, 5678.123456789)
			p.line(name+"_created", ls, created)
		}
	})
}

func (p *page) counter(name, help string, labelSets []string, v float64) {
	p.family(name, "counter", help, func() {
		for _, ls := range labelSets {
			p.line(name+"_total", ls, v)
			p.line(name+"_created", ls, created)
		}
	})
}

func build125(max float64) []float64 {
	var out []float64
	for e := 1.0; ; e *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if m*e > max {
				return out
			}
			out = append(out, m*e)
		}
	}
}

// Render writes the page.
func (v VLLMPage) Render() []byte {
	if v.Model == "" {
		v.Model = "meta-llama/Llama-3.1-8B-Instruct"
	}
	if v.BlockSize == 0 {
		v.BlockSize = 16
	}
	engines := max(len(v.Waiting), 1)
	p := &page{omit: v.Omit}
	var per []string
	for e := range engines {
		per = append(per, fmt.Sprintf(`engine="%d",model_name="%s"`, e, v.Model))
	}
	at := func(s []int, i int) float64 {
		if i < len(s) {
			return float64(s[i])
		}
		return 0
	}
	// The Python process and the HTTP server's instrumentation come first.
	p.family("python_gc_objects_collected_total", "counter", "Objects collected during gc", func() {
		for g := range 3 {
			p.line("python_gc_objects_collected_total", fmt.Sprintf(`generation="%d"`, g), float64(12345*(g+1)))
		}
	})
	p.family("python_gc_objects_uncollectable_total", "counter", "Uncollectable objects found during GC", func() {
		for g := range 3 {
			p.line("python_gc_objects_uncollectable_total", fmt.Sprintf(`generation="%d"`, g), 0)
		}
	})
	p.family("python_gc_collections_total", "counter", "Number of times this generation was collected", func() {
		for g := range 3 {
			p.line("python_gc_collections_total", fmt.Sprintf(`generation="%d"`, g), float64(321*(g+1)))
		}
	})
	p.family("python_info", "gauge", "Python platform information", func() {
		p.line("python_info", `implementation="CPython",major="3",minor="12",patchlevel="11",version="3.12.11"`, 1)
	})
	for _, g := range []struct{ n, h string }{
		{"process_virtual_memory_bytes", "Virtual memory size in bytes."},
		{"process_resident_memory_bytes", "Resident memory size in bytes."},
		{"process_start_time_seconds", "Start time of the process since unix epoch in seconds."},
		{"process_open_fds", "Number of open file descriptors."},
		{"process_max_fds", "Maximum number of open file descriptors."},
	} {
		p.family(g.n, "gauge", g.h, func() { p.line(g.n, "", 1.23456789e+10) })
	}
	p.family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", func() {
		p.line("process_cpu_seconds_total", "", 12345.67)
	})
	handlers := []string{"/v1/chat/completions", "/v1/completions", "/health", "/metrics", "/v1/models"}
	p.family("http_requests_total", "counter", "Total number of requests by method, status and handler.", func() {
		for _, h := range handlers {
			p.line("http_requests_total", `handler="`+h+`",method="GET",status="2xx"`, 98765)
		}
		for _, h := range handlers {
			p.line("http_requests_created", `handler="`+h+`",method="GET",status="2xx"`, created)
		}
	})
	for _, sz := range []string{"http_request_size_bytes", "http_response_size_bytes"} {
		p.family(sz, "summary", "Content length of incoming requests by handler. Only value of header is respected. Otherwise ignored. No percentile calculated. ", func() {
			for _, h := range handlers {
				p.line(sz+"_count", `handler="`+h+`"`, 98765)
				p.line(sz+"_sum", `handler="`+h+`"`, 1.2345678e+08)
			}
			for _, h := range handlers {
				p.line(sz+"_created", `handler="`+h+`"`, created)
			}
		})
	}
	p.histogram("http_request_duration_highr_seconds", "Latency with many buckets but no API specific labels. Made for more accurate percentile calculations. ",
		[]float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 7.5, 10, 30, 60}, []string{""})
	var hls []string
	for _, h := range handlers {
		hls = append(hls, `handler="`+h+`",method="POST"`)
	}
	p.histogram("http_request_duration_seconds", "Latency with only few buckets by handler. Made to be only used if aggregation by handler is important. ",
		[]float64{0.1, 0.5, 1}, hls)

	// vLLM's own families.
	p.family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", func() {
		for e, ls := range per {
			p.line("vllm:num_requests_running", ls, at(v.Running, e))
		}
	})
	p.family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", func() {
		for e, ls := range per {
			p.line("vllm:num_requests_waiting", ls, at(v.Waiting, e))
		}
	})
	usage := func(name string) {
		p.family(name, "gauge", "KV-cache usage. 1 means 100 percent usage.", func() {
			for e, ls := range per {
				u := 0.0
				if e < len(v.KVUsage) {
					u = v.KVUsage[e]
				}
				p.line(name, ls, u)
			}
		})
	}
	usage("vllm:gpu_cache_usage_perc")
	if !v.OldNames {
		usage("vllm:kv_cache_usage_perc")
	}
	p.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", per, 17)
	p.counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", per, 123456789)
	p.counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", per, 98765432)
	p.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", per, 123456789)
	p.counter("vllm:generation_tokens", "Number of generation tokens processed.", per, 23456789)
	p.family("vllm:request_success_total", "counter", "Count of successfully processed requests.", func() {
		for _, ls := range per {
			for _, r := range []string{"stop", "length", "abort"} {
				p.line("vllm:request_success_total", ls+`,finished_reason="`+r+`"`, 4567)
			}
		}
		for _, ls := range per {
			for _, r := range []string{"stop", "length", "abort"} {
				p.line("vllm:request_success_created", ls+`,finished_reason="`+r+`"`, created)
			}
		}
	})
	tokens := build125(131072)
	p.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens, per)
	p.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", tokens, per)
	p.histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
		[]float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}, per)
	p.histogram("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", tokens, per)
	p.histogram("vllm:request_params_n", "Histogram of the n request parameter.", []float64{1, 2, 5, 10, 20}, per)
	p.histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens, per)
	ttft := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	tpot := []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	lat := []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	p.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft, per)
	p.histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", tpot, per)
	p.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tpot, per)
	p.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lat, per)
	p.histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", lat, per)
	p.histogram("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", lat, per)
	p.histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", lat, per)
	p.histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", lat, per)

	p.family("vllm:lora_requests_info", "gauge", "Running stats on lora requests.", func() {
		series := v.LoRA
		if len(series) == 0 {
			series = []LoRASeries{{Time: created}}
		}
		for _, s := range series {
			p.line("vllm:lora_requests_info", fmt.Sprintf(`max_lora="%d",running_lora_adapters="%s",waiting_lora_adapters="%s"`, s.Max, s.Running, s.Waiting), s.Time)
		}
	})
	p.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", func() {
		for e := range engines {
			p.line("vllm:cache_config_info", fmt.Sprintf(`block_size="%d",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",`+
				`enable_prefix_caching="True",engine="%d",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",`+
				`num_gpu_blocks="%d",num_gpu_blocks_override="None",prefix_caching_hash_algo="builtin",sliding_window="None",`+
				`swap_space="4",swap_space_bytes="4294967296"`, v.BlockSize, e, v.NumGPUBlocks), 1)
		}
	})
	return p.b.Bytes()
}

// SGLangPage renders an SGLang (--enable-metrics) page.
func SGLangPage(waiting, running int, usage float64, maxTokens int, omit ...string) []byte {
	p := &page{omit: omit}
	ls := `model_name="Qwen/Qwen2.5-7B-Instruct"`
	p.counter("sglang:prompt_tokens", "Number of prefill tokens processed.", []string{ls}, 1234567)
	p.counter("sglang:generation_tokens", "Number of generation tokens processed.", []string{ls}, 234567)
	for _, g := range []struct {
		n string
		v float64
	}{
		{"sglang:num_running_reqs", float64(running)}, {"sglang:num_used_tokens", 12345},
		{"sglang:token_usage", usage}, {"sglang:gen_throughput", 1234.5}, {"sglang:num_queue_reqs", float64(waiting)},
		{"sglang:cache_hit_rate", 0.42}, {"sglang:max_total_num_tokens", float64(maxTokens)},
	} {
		p.family(g.n, "gauge", "The "+strings.TrimPrefix(g.n, "sglang:")+".", func() { p.line(g.n, ls, g.v) })
	}
	p.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
		[]float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 120, 160}, []string{ls})
	p.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
		[]float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800}, []string{ls})
	return p.b.Bytes()
}
