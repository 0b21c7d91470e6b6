package httpserver

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvpick/kvpick/internal/engine"
)

// The exposition is written by hand in the Prometheus text format (0.0.4),
// shaped like vLLM's prometheus_client output: metric names with colons,
// labels engine="0" and model_name, counters typed under their _total
// name, floats written as Python does ("1.0"). Routers scrape these exact
// names, so they are kept byte-compatible rather than built on a library.

func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_ = WriteMetrics(w, s.eng)
}

// WriteMetrics writes eng's /metrics page, so in-process tests and replays
// can feed a router's metrics parser without HTTP.
func WriteMetrics(w io.Writer, eng *engine.Engine) error {
	var b bytes.Buffer
	writeMetrics(&b, eng.Config(), eng.Stats())
	_, err := w.Write(b.Bytes())
	return err
}

type promWriter struct {
	b      *bytes.Buffer
	common string // engine and model_name labels
}

func (p *promWriter) header(name, typ, help string) {
	p.b.WriteString("# HELP " + name + " " + help + "\n")
	p.b.WriteString("# TYPE " + name + " " + typ + "\n")
}

// sample writes name{common,extra} v; extra is pre-rendered `k="v",...`.
func (p *promWriter) sample(name, extra string, v float64) {
	p.b.WriteString(name)
	p.b.WriteByte('{')
	p.b.WriteString(p.common)
	if extra != "" {
		p.b.WriteByte(',')
		p.b.WriteString(extra)
	}
	p.b.WriteString("} ")
	p.b.WriteString(pyFloat(v))
	p.b.WriteByte('\n')
}

func (p *promWriter) gauge(name, help string, v float64) {
	p.header(name, "gauge", help)
	p.sample(name, "", v)
}

func (p *promWriter) counter(name, help string, v float64) {
	p.header(name, "counter", help)
	p.sample(name, "", v)
}

// pyFloat formats like Python's repr of a float, as prometheus_client does.
func pyFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	if v == math.Trunc(v) && math.Abs(v) < 1e16 {
		return strconv.FormatFloat(v, 'f', -1, 64) + ".0"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func label(k, v string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return k + `="` + r.Replace(v) + `"`
}

func writeMetrics(b *bytes.Buffer, cfg engine.Config, st engine.Stats) {
	p := &promWriter{b: b, common: label("engine", "0") + "," + label("model_name", cfg.Model)}

	p.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", float64(st.Running))
	p.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(st.Waiting))
	p.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", st.KVUsage)
	p.gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage. (Deprecated name of vllm:kv_cache_usage_perc.)", st.KVUsage)

	p.header("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
	// vLLM's info gauges carry no model_name; write the labels in order.
	b.WriteString("vllm:cache_config_info{" + strings.Join([]string{
		label("block_size", strconv.Itoa(st.BlockSize)),
		label("cache_dtype", "auto"),
		label("enable_prefix_caching", "True"),
		label("engine", "0"),
		label("gpu_memory_utilization", "0.9"),
		label("num_gpu_blocks", strconv.Itoa(st.NumGPUBlocks)),
	}, ",") + "} 1.0\n")
	p.header("vllm:lora_requests_info", "gauge", "Running stats on lora requests.")
	b.WriteString("vllm:lora_requests_info{" + strings.Join([]string{
		label("max_lora", "0"),
		label("running_lora_adapters", ""),
		label("waiting_lora_adapters", ""),
	}, ",") + "} 1.0\n")

	p.counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", float64(st.PrefixCacheQueries))
	p.counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", float64(st.PrefixCacheHits))
	p.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", float64(st.PromptTokens))
	p.counter("vllm:generation_tokens_total", "Number of generation tokens processed.", float64(st.GenerationTokens))

	p.header("vllm:request_success_total", "counter", "Count of successfully processed requests.")
	for _, o := range []engine.Outcome{engine.OutcomeStop, engine.OutcomeLength, engine.OutcomeAbort} {
		p.sample("vllm:request_success_total", label("finished_reason", string(o)), float64(st.Outcomes[o]))
	}

	name := "vllm:time_to_first_token_seconds"
	p.header(name, "histogram", "Histogram of time to first token in seconds.")
	var cum uint64
	for i, ub := range st.TTFT.Bounds {
		cum += st.TTFT.Counts[i]
		p.sample(name+"_bucket", label("le", pyFloat(ub)), float64(cum))
	}
	p.sample(name+"_bucket", label("le", "+Inf"), float64(st.TTFT.Count))
	p.sample(name+"_count", "", float64(st.TTFT.Count))
	p.sample(name+"_sum", "", st.TTFT.Sum)

	// The simulator's own counters: every request by how it ended,
	// including refusals vLLM does not count.
	p.header("sim:requests_total", "counter", "Requests by outcome (simulator).")
	for _, o := range engine.AllOutcomes {
		p.sample("sim:requests_total", label("outcome", string(o)), float64(st.Outcomes[o]))
	}
	p.gauge("sim:cached_blocks", "KV blocks holding a cached prefix block (simulator).", float64(st.CachedBlocks))
}
