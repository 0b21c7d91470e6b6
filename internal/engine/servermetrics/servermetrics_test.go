package servermetrics

import (
	"bytes"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvpick/kvpick/internal/engine"
)

var t0 = time.Unix(1_700_000_000, 0)

// busyEngine returns an engine with 3 finished requests (two sharing a
// prompt), 2 running and 1 waiting, at a known time.
func busyEngine(t *testing.T) *engine.Engine {
	t.Helper()
	cfg := engine.DefaultConfig()
	cfg.Model = "test/model"
	cfg.NumGPUBlocks = 1234
	cfg.MaxNumSeqs = 2
	clk := engine.NewVirtualClock(t0)
	eng, err := engine.New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	prompt := func(base uint32, n int) []uint32 {
		p := make([]uint32, n)
		for i := range p {
			p[i] = base + uint32(i)
		}
		return p
	}
	for i, p := range [][]uint32{prompt(1, 100), prompt(1, 100), prompt(5000, 40)} {
		if _, err := eng.Submit(engine.Request{Prompt: p, MaxTokens: 4 + i}, engine.Callbacks{}); err != nil {
			t.Fatal(err)
		}
		clk.RunUntilIdle()
	}
	for i := range 3 {
		if _, err := eng.Submit(engine.Request{Prompt: prompt(uint32(i)*1000+9000, 50), MaxTokens: 500}, engine.Callbacks{}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(20 * time.Millisecond)
	return eng
}

func parse(t *testing.T, text []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("expfmt rejects the page: %v", err)
	}
	return fams
}

func label(m *dto.Metric, name string) (string, bool) {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}

// value returns the single sample of family name (gauge, counter or
// untyped), checking its model_name label when it must have one.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, typ dto.MetricType, modelLabel bool) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no family %s", name)
	}
	if f.GetType() != typ || len(f.GetMetric()) != 1 {
		t.Fatalf("%s: type %v with %d samples, want %v with 1", name, f.GetType(), len(f.GetMetric()), typ)
	}
	m := f.GetMetric()[0]
	if mn, _ := label(m, "model_name"); modelLabel && mn != "test/model" {
		t.Errorf("%s: model_name %q", name, mn)
	}
	switch typ {
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	}
	return m.GetUntyped().GetValue()
}

func TestFlavors(t *testing.T) {
	eng := busyEngine(t)
	st := eng.Stats()
	if st.Running != 2 || st.Waiting != 1 || st.PrefixCacheHits == 0 {
		t.Fatalf("test engine state %+v", st)
	}
	gauge, counter := dto.MetricType_GAUGE, dto.MetricType_COUNTER
	tests := []struct {
		flavor  Flavor
		present []string // families that must be there
		absent  []string
		check   func(t *testing.T, fams map[string]*dto.MetricFamily)
	}{
		{VLLM, []string{"vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
			"vllm:request_prompt_tokens", "vllm:iteration_tokens_total", "vllm:request_success_total", "vllm:num_preemptions_total",
			"vllm:prompt_tokens_created", "process_resident_memory_bytes"},
			[]string{"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hits_total", "sglang:num_running_reqs"},
			func(t *testing.T, fams map[string]*dto.MetricFamily) {
				if v := value(t, fams, "vllm:kv_cache_usage_perc", gauge, true); v != st.KVUsage || v <= 0 {
					t.Errorf("kv usage %v, engine %v", v, st.KVUsage)
				}
				if v := value(t, fams, "vllm:prefix_cache_hits_total", counter, true); v != float64(st.PrefixCacheHits) {
					t.Errorf("hits %v", v)
				}
				if v := value(t, fams, "vllm:prefix_cache_queries_total", counter, true); v != float64(st.PrefixCacheQueries) {
					t.Errorf("queries %v", v)
				}
			}},
		{VLLMOld, []string{"vllm:time_per_output_token_seconds", "vllm:num_requests_swapped"},
			[]string{"vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total", "vllm:inter_token_latency_seconds"},
			func(t *testing.T, fams map[string]*dto.MetricFamily) {
				if v := value(t, fams, "vllm:gpu_cache_usage_perc", gauge, true); v != st.KVUsage {
					t.Errorf("gpu cache usage %v, engine %v", v, st.KVUsage)
				}
				if v := value(t, fams, "vllm:gpu_prefix_cache_hits_total", counter, true); v != float64(st.PrefixCacheHits) {
					t.Errorf("hits %v", v)
				}
			}},
		{SGLang, []string{"sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds", "sglang:prompt_tokens_total"},
			[]string{"vllm:num_requests_running", "vllm:cache_config_info"},
			func(t *testing.T, fams map[string]*dto.MetricFamily) {
				if v := value(t, fams, "sglang:num_running_reqs", gauge, true); v != 2 {
					t.Errorf("running %v", v)
				}
				if v := value(t, fams, "sglang:num_queue_reqs", gauge, true); v != 1 {
					t.Errorf("queue %v", v)
				}
				if v := value(t, fams, "sglang:token_usage", gauge, true); v != st.KVUsage {
					t.Errorf("token usage %v, engine %v", v, st.KVUsage)
				}
				if v := value(t, fams, "sglang:max_total_num_tokens", gauge, true); v != 1234*16 {
					t.Errorf("max total tokens %v", v)
				}
				want := float64(st.PrefixCacheHits) / float64(st.PrefixCacheQueries)
				if v := value(t, fams, "sglang:cache_hit_rate", gauge, true); v != want || v <= 0 || v >= 1 {
					t.Errorf("cache hit rate %v, want %v", v, want)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(string(tt.flavor), func(t *testing.T) {
			text := Render(eng.Config(), st, t0.Add(time.Minute), Options{Flavor: tt.flavor, MaxLoRAs: 2, Started: t0})
			fams := parse(t, text)
			if len(text) < 10_000 {
				t.Errorf("page of %d bytes; a real server's is tens of KB", len(text))
			}
			for _, name := range tt.present {
				if fams[name] == nil {
					t.Errorf("no %s", name)
				}
			}
			for _, name := range tt.absent {
				if fams[name] != nil {
					t.Errorf("%s should not be there", name)
				}
			}
			if tt.flavor != SGLang {
				if v := value(t, fams, "vllm:num_requests_running", gauge, true); v != 2 {
					t.Errorf("running %v", v)
				}
				if v := value(t, fams, "vllm:num_requests_waiting", gauge, true); v != 1 {
					t.Errorf("waiting %v", v)
				}
				cc := fams["vllm:cache_config_info"].GetMetric()[0]
				for k, want := range map[string]string{"block_size": "16", "num_gpu_blocks": "1234", "enable_prefix_caching": "True"} {
					if got, _ := label(cc, k); got != want {
						t.Errorf("cache_config_info %s=%q, want %q", k, got, want)
					}
				}
				if v := value(t, fams, "vllm:cache_config_info", gauge, false); v != 1 {
					t.Errorf("cache_config_info %v", v)
				}
				lora := fams["vllm:lora_requests_info"].GetMetric()[0]
				for k, want := range map[string]string{"max_lora": "2", "running_lora_adapters": "", "waiting_lora_adapters": ""} {
					if got, ok := label(lora, k); !ok || got != want {
						t.Errorf("lora_requests_info %s=%q (%v), want %q", k, got, ok, want)
					}
				}
				if v := value(t, fams, "vllm:lora_requests_info", gauge, false); v != float64(t0.Add(time.Minute).Unix()) {
					t.Errorf("lora_requests_info %v, want the page's time", v)
				}
				success := fams["vllm:request_success_total"]
				total := 0.0
				for _, m := range success.GetMetric() {
					total += m.GetCounter().GetValue()
				}
				if success.GetType() != counter || total != 3 {
					t.Errorf("request_success_total %v (%v)", total, success.GetType())
				}
			}
			ttftName := "vllm:time_to_first_token_seconds"
			if tt.flavor == SGLang {
				ttftName = "sglang:time_to_first_token_seconds"
			}
			h := fams[ttftName]
			if h.GetType() != dto.MetricType_HISTOGRAM {
				t.Fatalf("%s type %v", ttftName, h.GetType())
			}
			hist := h.GetMetric()[0].GetHistogram()
			if hist.GetSampleCount() != st.TTFT.Count || hist.GetSampleCount() != 5 || len(hist.GetBucket()) != len(engine.TTFTBuckets)+1 { // +Inf is a bucket too
				t.Errorf("TTFT histogram: %d samples (engine %d), %d buckets", hist.GetSampleCount(), st.TTFT.Count, len(hist.GetBucket()))
			}
			var prev uint64
			for _, b := range hist.GetBucket() {
				if b.GetCumulativeCount() < prev {
					t.Errorf("buckets not cumulative: %v", hist.GetBucket())
				}
				prev = b.GetCumulativeCount()
			}
		})
	}
}

func TestWriteUsesTheEngineClock(t *testing.T) {
	eng := busyEngine(t)
	var b bytes.Buffer
	if err := Write(&b, eng, Options{}); err != nil {
		t.Fatal(err)
	}
	fams := parse(t, b.Bytes())
	if v := value(t, fams, "vllm:lora_requests_info", dto.MetricType_GAUGE, false); v != float64(eng.Clock().Now().UnixNano())/1e9 {
		t.Errorf("lora_requests_info %v at %v", v, eng.Clock().Now())
	}
	if v := value(t, fams, "vllm:num_requests_running", dto.MetricType_GAUGE, true); v != 2 {
		t.Errorf("running %v", v)
	}
}

func TestParseFlavor(t *testing.T) {
	for _, f := range Flavors() {
		if got, err := ParseFlavor(string(f)); err != nil || got != f {
			t.Errorf("ParseFlavor(%q) = %q, %v", f, got, err)
		}
	}
	if _, err := ParseFlavor("tgi"); err == nil {
		t.Error("unknown flavor accepted")
	}
}

func TestPyFloat(t *testing.T) {
	for v, want := range map[float64]string{0: "0.0", 1: "1.0", 0.5: "0.5", 1e6: "1000000.0", 0.001: "0.001", 2.5e-7: "2.5e-07"} {
		if got := pyFloat(v); got != want {
			t.Errorf("pyFloat(%v) = %q, want %q", v, got, want)
		}
	}
}

// BenchmarkRender measures rendering a busy engine's page, which a replay
// does for every engine at every scrape.
func BenchmarkRender(b *testing.B) {
	t := &testing.T{}
	eng := busyEngine(t)
	cfg, st, now := eng.Config(), eng.Stats(), eng.Clock().Now()
	b.ReportAllocs()
	var n int
	for b.Loop() {
		n = len(Render(cfg, st, now, Options{}))
	}
	b.ReportMetric(float64(n), "bytes/page")
}

// TestOmitCacheConfigHidesTheCacheSize: a server that does not report its KV cache's size has
// neither vLLM's cache_config_info nor SGLang's max_total_num_tokens on its page, and keeps
// everything else.
func TestOmitCacheConfigHidesTheCacheSize(t *testing.T) {
	eng := busyEngine(t)
	for _, tc := range []struct {
		flavor    Flavor
		size, has string
	}{
		{VLLM, "vllm:cache_config_info", "vllm:num_requests_running"},
		{SGLang, "sglang:max_total_num_tokens", "sglang:num_running_reqs"},
	} {
		for _, omit := range []bool{false, true} {
			var b bytes.Buffer
			if err := Write(&b, eng, Options{Flavor: tc.flavor, OmitCacheConfig: omit}); err != nil {
				t.Fatal(err)
			}
			fams := parse(t, b.Bytes())
			if _, ok := fams[tc.size]; ok == omit {
				t.Errorf("%s, omit=%v: %s present: %v", tc.flavor, omit, tc.size, ok)
			}
			if _, ok := fams[tc.has]; !ok {
				t.Errorf("%s, omit=%v: %s missing", tc.flavor, omit, tc.has)
			}
		}
	}
}
