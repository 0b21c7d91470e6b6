package scrape

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/router"
)

func mustReader(t testing.TB, cfg config.ModelServerMetrics) *reader {
	t.Helper()
	s, err := newSchema(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return newReader(s)
}

var (
	autoCfg   = config.ModelServerMetrics{Engine: "auto"}
	customCfg = config.ModelServerMetrics{Engine: "custom", Names: config.MetricNames{
		Waiting: "myengine_queue_depth", Running: "myengine_active", KVUsage: "myengine_kv_fraction",
		CapacityTokens: "myengine_kv_tokens",
	}}
)

func TestReadPages(t *testing.T) {
	tests := []struct {
		name       string
		cfg        config.ModelServerMetrics
		page       string
		want       router.Metrics
		wantEngine string
		wantResult result
		wantDetail string // substring of the detail
	}{
		{
			name: "vLLM with current names",
			cfg:  autoCfg,
			page: string(VLLMPage{Waiting: []int{3}, Running: []int{5}, KVUsage: []float64{0.4}, NumGPUBlocks: 24000}.Render()),
			want: router.Metrics{Waiting: 3, Running: 5, KVUsage: 0.4, NumGPUBlocks: 24000, BlockSize: 16, HasQueue: true, HasKVUsage: true},
			// no LoRA adapters: max_lora="0", empty lists
			wantEngine: "vllm",
		},
		{
			name:       "vLLM before 0.10 reports only gpu_cache_usage_perc",
			cfg:        autoCfg,
			page:       string(VLLMPage{Waiting: []int{0}, Running: []int{12}, KVUsage: []float64{0.875}, NumGPUBlocks: 1856, OldNames: true}.Render()),
			want:       router.Metrics{Waiting: 0, Running: 12, KVUsage: 0.875, NumGPUBlocks: 1856, BlockSize: 16, HasQueue: true, HasKVUsage: true},
			wantEngine: "vllm",
		},
		{
			name: "the current KV usage name wins over the old one",
			cfg:  config.ModelServerMetrics{Engine: "vllm"},
			page: "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\n" +
				"vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.25\n",
			want:       router.Metrics{Waiting: 1, Running: 2, KVUsage: 0.25, HasQueue: true, HasKVUsage: true},
			wantEngine: "vllm",
		},
		{
			name: "data-parallel engines: counts and caches add up, usage is their mean",
			cfg:  autoCfg,
			page: string(VLLMPage{Waiting: []int{3, 1}, Running: []int{5, 2}, KVUsage: []float64{0.5, 0.25},
				NumGPUBlocks: 24000, BlockSize: 32}.Render()),
			want:       router.Metrics{Waiting: 4, Running: 7, KVUsage: 0.375, NumGPUBlocks: 48000, BlockSize: 32, HasQueue: true, HasKVUsage: true},
			wantEngine: "vllm",
		},
		{
			name: "LoRA: the newest series describes the adapters",
			cfg:  autoCfg,
			page: string(VLLMPage{Waiting: []int{1}, Running: []int{2}, KVUsage: []float64{0.5}, NumGPUBlocks: 100, LoRA: []LoRASeries{
				{Running: "a", Max: 4, Time: 1754000100},
				{Running: "b,c", Waiting: "d", Max: 4, Time: 1754000300},
				{Running: "e", Max: 4, Time: 1754000200},
			}}.Render()),
			want: router.Metrics{Waiting: 1, Running: 2, KVUsage: 0.5, NumGPUBlocks: 100, BlockSize: 16, HasQueue: true, HasKVUsage: true,
				RunningLoRAs: []string{"b", "c"}, WaitingLoRAs: []string{"d"}, MaxLoRA: 4},
			wantEngine: "vllm",
		},
		{
			name:       "SGLang: the token pool is the capacity, in blocks of 1 token",
			cfg:        autoCfg,
			page:       string(SGLangPage(2, 9, 0.7, 500000)),
			want:       router.Metrics{Waiting: 2, Running: 9, KVUsage: 0.7, NumGPUBlocks: 500000, BlockSize: 1, HasQueue: true, HasKVUsage: true},
			wantEngine: "sglang",
		},
		{
			name:       "engine sglang reads SGLang names",
			cfg:        config.ModelServerMetrics{Engine: "sglang"},
			page:       string(SGLangPage(0, 1, 0.125, 65536)),
			want:       router.Metrics{Waiting: 0, Running: 1, KVUsage: 0.125, NumGPUBlocks: 65536, BlockSize: 1, HasQueue: true, HasKVUsage: true},
			wantEngine: "sglang",
		},
		{
			name:       "engine vllm ignores an SGLang page",
			cfg:        config.ModelServerMetrics{Engine: "vllm"},
			page:       string(SGLangPage(2, 9, 0.7, 500000)),
			wantResult: resultMissing,
			wantDetail: "no known metric family",
		},
		{
			name: "custom names",
			cfg:  customCfg,
			page: "# HELP myengine_queue_depth Queued.\n# TYPE myengine_queue_depth gauge\n" +
				"myengine_queue_depth{shard=\"a\"} 4\nmyengine_queue_depth{shard=\"b\"} 6\n" +
				"myengine_active 2\nmyengine_kv_fraction 0.5\nmyengine_kv_tokens 131072\n" +
				"vllm:num_requests_waiting 99\n",
			want:       router.Metrics{Waiting: 10, Running: 2, KVUsage: 0.5, NumGPUBlocks: 131072, BlockSize: 1, HasQueue: true, HasKVUsage: true},
			wantEngine: "custom",
		},
		{
			name: "custom names shorter than 8 bytes",
			cfg:  config.ModelServerMetrics{Engine: "custom", Names: config.MetricNames{Waiting: "q", Running: "run", KVUsage: "kv"}},
			page: "qq 9\nq 4\nrun{a=\"b\"} 2\nrunning 7\nkv 0.5\n",
			want: router.Metrics{Waiting: 4, Running: 2, KVUsage: 0.5, HasQueue: true, HasKVUsage: true}, wantEngine: "custom",
		},
		{
			name: "custom names of 9 to 15 bytes",
			cfg:  config.ModelServerMetrics{Engine: "custom", Names: config.MetricNames{Waiting: "tgi_queue", Running: "tgi_batch_size", KVUsage: "tgi_kv_usage_ratio"}},
			page: "tgi_queue_size 9\ntgi_queue 4\ntgi_batch_size_max 8\ntgi_batch_size 2\ntgi_kv_usage_ratio 0.5\n",
			want: router.Metrics{Waiting: 4, Running: 2, KVUsage: 0.5, HasQueue: true, HasKVUsage: true}, wantEngine: "custom",
		},
		{
			name: "untyped samples, no trailing newline, timestamps and CRLF",
			cfg:  autoCfg,
			page: "vllm:num_requests_waiting{engine=\"0\"} 7 1754000000000\r\nvllm:num_requests_running 3\r\nvllm:kv_cache_usage_perc 1e-1",
			want: router.Metrics{Waiting: 7, Running: 3, KVUsage: 0.1, HasQueue: true, HasKVUsage: true}, wantEngine: "vllm",
		},
		{
			name: "missing queue family: HasQueue false, the rest still read",
			cfg:  autoCfg,
			page: string(VLLMPage{Waiting: []int{3}, Running: []int{5}, KVUsage: []float64{0.4}, NumGPUBlocks: 24000,
				Omit: []string{"vllm:num_requests_waiting"}}.Render()),
			want:       router.Metrics{KVUsage: 0.4, NumGPUBlocks: 24000, BlockSize: 16, HasKVUsage: true},
			wantEngine: "vllm", wantResult: resultMissing, wantDetail: "missing: vllm:num_requests_waiting",
		},
		{
			name: "missing KV usage under both names",
			cfg:  autoCfg,
			page: string(VLLMPage{Waiting: []int{3}, Running: []int{5}, KVUsage: []float64{0.4},
				Omit: []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cache_config_info"}}.Render()),
			want:       router.Metrics{Waiting: 3, Running: 5, HasQueue: true},
			wantEngine: "vllm", wantResult: resultMissing, wantDetail: "vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc",
		},
		{
			name:       "a page without any known family",
			cfg:        autoCfg,
			page:       "# HELP up whatever\nup 1\nprocess_cpu_seconds_total 12\n",
			wantResult: resultMissing, wantDetail: "no known metric family",
		},
		{
			name:       "an HTML error page",
			cfg:        autoCfg,
			page:       "<html><body><h1>502 Bad Gateway</h1></body></html>",
			wantResult: resultMissing, wantDetail: "no known metric family",
		},
		{
			name:       "binary garbage",
			cfg:        autoCfg,
			page:       "\x00\x01\x02\xff\xfe{{{{\n\n\x00vllm:\x00\n#\n# TYPE\n# TYPE \n",
			wantResult: resultMissing,
		},
		{
			name:       "a broken wanted line is unparsable",
			cfg:        autoCfg,
			page:       "vllm:num_requests_waiting{engine=\"0\" 3\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n",
			wantResult: resultUnparsable, wantDetail: "vllm:num_requests_waiting",
		},
		{
			name:       "a non-numeric value is unparsable",
			cfg:        autoCfg,
			page:       "vllm:num_requests_waiting lots\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n",
			wantResult: resultUnparsable,
		},
		{
			name: "a broken line of a family nobody reads does not matter",
			cfg:  autoCfg,
			page: "vllm:time_to_first_token_seconds_bucket{le=\"0.1\" garbage\n" +
				"vllm:num_requests_waiting 1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n",
			want: router.Metrics{Waiting: 1, Running: 1, KVUsage: 0.1, HasQueue: true, HasKVUsage: true}, wantEngine: "vllm",
		},
		{
			name:       "NaN waiting is invalid; the rest is read",
			cfg:        autoCfg,
			page:       "vllm:num_requests_waiting NaN\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n",
			want:       router.Metrics{KVUsage: 0.1, HasKVUsage: true},
			wantEngine: "vllm", wantResult: resultInvalid, wantDetail: "vllm:num_requests_waiting: implausible value NaN",
		},
		{
			name:       "negative running is invalid",
			cfg:        autoCfg,
			page:       "vllm:num_requests_waiting 0\nvllm:num_requests_running -1\nvllm:kv_cache_usage_perc 0.1\n",
			want:       router.Metrics{KVUsage: 0.1, HasKVUsage: true},
			wantEngine: "vllm", wantResult: resultInvalid, wantDetail: "implausible value -1",
		},
		{
			name:       "KV usage in percent is invalid",
			cfg:        autoCfg,
			page:       "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 87\n",
			want:       router.Metrics{Running: 1, HasQueue: true},
			wantEngine: "vllm", wantResult: resultInvalid, wantDetail: "outside 0..1",
		},
		{
			name:       "an invalid new KV name falls back to the old one",
			cfg:        autoCfg,
			page:       "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc +Inf\nvllm:gpu_cache_usage_perc 0.5\n",
			want:       router.Metrics{Running: 1, KVUsage: 0.5, HasQueue: true, HasKVUsage: true},
			wantEngine: "vllm",
		},
		{
			name:       "a histogram under a gauge's name is invalid",
			cfg:        autoCfg,
			page:       "# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting_bucket{le=\"+Inf\"} 1\nvllm:num_requests_waiting_count 1\nvllm:num_requests_waiting_sum 1\nvllm:num_requests_waiting 1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n",
			want:       router.Metrics{KVUsage: 0.1, HasKVUsage: true},
			wantEngine: "vllm", wantResult: resultInvalid, wantDetail: "vllm:num_requests_waiting: not a gauge",
		},
		{
			name: "cache_config_info with a missing block size is invalid",
			cfg:  autoCfg,
			page: "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n" +
				"vllm:cache_config_info{num_gpu_blocks=\"100\"} 1\n",
			want:       router.Metrics{Running: 1, KVUsage: 0.5, HasQueue: true, HasKVUsage: true},
			wantEngine: "vllm", wantResult: resultInvalid, wantDetail: "block_size",
		},
		{
			name: "similar names are not the wanted ones",
			cfg:  autoCfg,
			page: "vllm:num_requests_waiting_by_reason 50\nvllm:num_requests_waitin 50\n" +
				"vllm:num_requests_waiting 5\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n",
			want: router.Metrics{Waiting: 5, Running: 1, KVUsage: 0.5, HasQueue: true, HasKVUsage: true}, wantEngine: "vllm",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rd := mustReader(t, tc.cfg).read([]byte(tc.page))
			if rd.result != tc.wantResult {
				t.Fatalf("result %v (%s), want %v", rd.result, rd.detail, tc.wantResult)
			}
			if !strings.Contains(rd.detail, tc.wantDetail) {
				t.Errorf("detail %q, want it to mention %q", rd.detail, tc.wantDetail)
			}
			if rd.result == resultUnparsable {
				return
			}
			if rd.engine != tc.wantEngine {
				t.Errorf("engine %q, want %q", rd.engine, tc.wantEngine)
			}
			assertMetrics(t, rd.m, tc.want)
		})
	}
}

func assertMetrics(t *testing.T, got, want router.Metrics) {
	t.Helper()
	if math.Abs(got.KVUsage-want.KVUsage) > 1e-9 {
		t.Errorf("KVUsage %v, want %v", got.KVUsage, want.KVUsage)
	}
	got.KVUsage = want.KVUsage
	if !slices.Equal(got.RunningLoRAs, want.RunningLoRAs) || !slices.Equal(got.WaitingLoRAs, want.WaitingLoRAs) {
		t.Errorf("LoRAs running %q waiting %q, want %q %q", got.RunningLoRAs, got.WaitingLoRAs, want.RunningLoRAs, want.WaitingLoRAs)
	}
	got.RunningLoRAs, got.WaitingLoRAs = want.RunningLoRAs, want.WaitingLoRAs
	if !equalMetrics(got, want) {
		t.Errorf("metrics\n got %+v\nwant %+v", got, want)
	}
}

func equalMetrics(a, b router.Metrics) bool {
	return a.Waiting == b.Waiting && a.Running == b.Running && a.KVUsage == b.KVUsage &&
		a.NumGPUBlocks == b.NumGPUBlocks && a.BlockSize == b.BlockSize && a.MaxLoRA == b.MaxLoRA &&
		slices.Equal(a.RunningLoRAs, b.RunningLoRAs) && slices.Equal(a.WaitingLoRAs, b.WaitingLoRAs) &&
		a.HasQueue == b.HasQueue && a.HasKVUsage == b.HasKVUsage
}

// The reader skips the parse of families whose lines did not change; values that did change
// must still come through, in both directions.
func TestReadFollowsChangesAcrossPages(t *testing.T) {
	r := mustReader(t, autoCfg)
	pages := []struct {
		page                       VLLMPage
		waiting, running, capacity int
		lora                       []string
	}{
		{VLLMPage{Waiting: []int{3}, Running: []int{5}, NumGPUBlocks: 100}, 3, 5, 100, nil},
		{VLLMPage{Waiting: []int{3}, Running: []int{5}, NumGPUBlocks: 100}, 3, 5, 100, nil},
		{VLLMPage{Waiting: []int{7}, Running: []int{5}, NumGPUBlocks: 100}, 7, 5, 100, nil},
		{VLLMPage{Waiting: []int{7}, Running: []int{0}, NumGPUBlocks: 200, LoRA: []LoRASeries{{Running: "x", Time: 2e9}}}, 7, 0, 200, []string{"x"}},
		{VLLMPage{Waiting: []int{3}, Running: []int{5}, NumGPUBlocks: 100}, 3, 5, 100, nil},
	}
	for i, p := range pages {
		rd := r.read(p.page.Render())
		if rd.result != resultOK || rd.m.Waiting != p.waiting || rd.m.Running != p.running || rd.m.NumGPUBlocks != p.capacity ||
			!slices.Equal(rd.m.RunningLoRAs, p.lora) {
			t.Fatalf("page %d: %v %+v, want waiting %d running %d blocks %d LoRAs %v", i, rd.result, rd.m, p.waiting, p.running, p.capacity, p.lora)
		}
	}
	// A page that breaks, then heals: the error must not stick, nor the value before it.
	if rd := r.read([]byte("vllm:num_requests_waiting {\n")); rd.result != resultUnparsable {
		t.Fatalf("broken page: %v", rd.result)
	}
	if rd := r.read(pages[2].page.Render()); rd.result != resultOK || rd.m.Waiting != 7 {
		t.Fatalf("healed page: %v %+v", rd.result, rd.m)
	}
}

func TestReadBoundsSeriesPerFamily(t *testing.T) {
	var b strings.Builder
	for i := range maxSeriesPerFamily + 50 {
		b.WriteString("vllm:num_requests_waiting{engine=\"" + strconv.Itoa(i) + "\"} 1\n")
	}
	b.WriteString("vllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n")
	rd := mustReader(t, autoCfg).read([]byte(b.String()))
	if rd.result != resultOK || rd.m.Waiting != maxSeriesPerFamily {
		t.Fatalf("%v %+v: want the first %d series summed", rd.result, rd.m, maxSeriesPerFamily)
	}
	if !strings.Contains(rd.truncated, "vllm:num_requests_waiting") {
		t.Fatalf("truncated %q", rd.truncated)
	}
}

func TestSchemaRejectsOneNameForTwoFields(t *testing.T) {
	_, err := newSchema(config.ModelServerMetrics{Engine: "custom", Names: config.MetricNames{Waiting: "q", Running: "q"}})
	if err == nil || !strings.Contains(err.Error(), `"q" is given for both waiting and running`) {
		t.Fatalf("err = %v", err)
	}
}

// The parse cache holds neither huge lines nor more than its bounds, whatever servers write.
func TestParseCacheIsBounded(t *testing.T) {
	r := mustReader(t, autoCfg)
	huge := "vllm:num_requests_waiting{pad=\"" + strings.Repeat("x", 2*maxCachedKey) + "\"} 1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n"
	if rd := r.read([]byte(huge)); rd.result != resultOK || rd.m.Waiting != 1 {
		t.Fatalf("huge line: %v %+v", rd.result, rd.m)
	}
	for k := range r.s.cache.m {
		if len(k) > maxCachedKey {
			t.Fatalf("a %d-byte key was cached", len(k))
		}
	}
	for k := range r.s.cache.shapes {
		if len(k) > maxCachedKey {
			t.Fatalf("a %d-byte shape was cached", len(k))
		}
	}
	for i := range 3 * maxCached {
		// A new label every time: a new entry and a new shape.
		page := "vllm:num_requests_waiting{i=\"" + strconv.Itoa(i) + "\",pad=\"" + strings.Repeat("y", 500) + "\"} " + strconv.Itoa(i%7) + "\n"
		if rd := r.read([]byte(page)); rd.result != resultMissing || rd.m.HasQueue {
			t.Fatalf("page %d: %v %+v", i, rd.result, rd.m)
		}
		if n, b := len(r.s.cache.m)+len(r.s.cache.shapes), r.s.cache.bytes; n > maxCached || b > maxCachedBytes {
			t.Fatalf("after page %d: %d entries, %d bytes", i, n, b)
		}
	}
	if len(r.s.cache.shapes) == 0 {
		t.Fatal("no shape kept")
	}
}

// Lines read through a kept shape (their values alone parsed) read as expfmt reads them:
// whatever the spacing, labels and values, a reader that has seen pages of the same shape
// gives what a fresh one gives.
func TestShapeReadsAgreeWithExpfmt(t *testing.T) {
	templates := []string{
		"vllm:num_requests_waiting{engine=\"0\",model_name=\"a b\"} %s\nvllm:num_requests_running %s\nvllm:kv_cache_usage_perc{x=\"} \"} %s\n",
		"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting\t%s\nvllm:num_requests_running{a=\"1\"}   %s\nvllm:kv_cache_usage_perc %s\n",
		"vllm:num_requests_waiting %s\nvllm:num_requests_waiting{e=\"1\"} %s\nvllm:kv_cache_usage_perc %s 1700000000000\n",
		"# TYPE vllm:num_requests_waiting counter\nvllm:num_requests_waiting %s\nvllm:num_requests_running %s\nvllm:kv_cache_usage_perc{e=\"0\"} %s\nvllm:kv_cache_usage_perc{e=\"1\"} 0.5\n",
		"# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting %s\nvllm:num_requests_running %s\nvllm:kv_cache_usage_perc %s\n",
		"sglang:num_queue_reqs %s\nsglang:num_running_reqs %s\nsglang:token_usage %s\nsglang:max_total_num_tokens %s\n",
		// A timestamp that may equal the value: its shape must not be kept.
		"vllm:num_requests_waiting 1 %s\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n",
	}
	values := []string{"0", "3", "7.0", "0.25", "1", "1.0000001", "NaN", "+Inf", "-1", "1e308", "0x1p-2", "1_0", "", "12abc", "2e9"}
	warm := mustReader(t, autoCfg)
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		tmpl := templates[i%len(templates)]
		args := make([]any, strings.Count(tmpl, "%s"))
		for j := range args {
			args[j] = values[rnd.IntN(len(values))]
		}
		page := []byte(fmt.Sprintf(tmpl, args...))
		got := warm.read(page)
		want := mustReader(t, autoCfg).read(page)
		if got.result != want.result || !equalMetrics(got.m, want.m) || got.detail != want.detail {
			t.Fatalf("page %q:\nwarm  %v %+v %q\nfresh %v %+v %q", page, got.result, got.m, got.detail, want.result, want.m, want.detail)
		}
	}
	if len(warm.s.cache.shapes) == 0 {
		t.Fatal("no shape was kept: the test does not exercise them")
	}
}

// The server's count of first tokens is read from the _count series of its time-to-first-token
// histogram (summed over data-parallel engines), under the histogram's own TYPE line, which a
// filtered page keeps and which is no sign of an unfiltered one.
func TestReadFirstTokensFromTheTTFTHistogram(t *testing.T) {
	queue := "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n" +
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2\n"
	ttft := "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n" +
		"# TYPE vllm:time_to_first_token_seconds histogram\n" +
		"vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"m\"} 7.0\n" +
		"vllm:time_to_first_token_seconds_count{engine=\"1\",model_name=\"m\"} 5.0\n"
	whole := strings.Replace(ttft, "vllm:time_to_first_token_seconds_count{engine=\"0\"",
		"vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 7.0\n"+
			"vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"m\"} 1.5\n"+
			"vllm:time_to_first_token_seconds_count{engine=\"0\"", 1)
	tests := []struct {
		name       string
		page       string
		want       uint64
		has        bool
		wantOthers int
	}{
		{"filtered page: the count series under the histogram's TYPE line", queue + ttft, 12, true, 0},
		{"whole page: buckets and sum are skipped", queue + whole, 12, true, 0},
		{"no histogram: unknown, not zero", queue, 0, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rd := mustReader(t, config.ModelServerMetrics{Engine: "vllm"}).read([]byte(tc.page))
			if rd.m.HasFirstTokens != tc.has || rd.m.FirstTokens != tc.want {
				t.Fatalf("first tokens %d (reported %v), want %d (%v); result %v %s", rd.m.FirstTokens, rd.m.HasFirstTokens, tc.want, tc.has, rd.result, rd.detail)
			}
			if rd.others != tc.wantOthers {
				t.Fatalf("%d families counted as not asked for, want %d", rd.others, tc.wantOthers)
			}
		})
	}
}

// The prefix-cache counters are read from their _total series (summed over data-parallel
// engines), under the counter's own TYPE line, with the names of releases before the rename as
// a fallback; both are needed, and a page whose hits exceed its queries reports neither.
func TestReadPrefixCacheCounters(t *testing.T) {
	queue := "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n" +
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2\n"
	counter := func(name string, a, b float64) string {
		return fmt.Sprintf("# HELP %[1]s Tokens.\n# TYPE %[1]s counter\n"+
			"%[1]s_total{engine=\"0\",model_name=\"m\"} %[2]g\n%[1]s_created{engine=\"0\",model_name=\"m\"} 1.7e9\n"+
			"%[1]s_total{engine=\"1\",model_name=\"m\"} %[3]g\n", name, a, b)
	}
	tests := []struct {
		name          string
		page          string
		has           bool
		queries, hits uint64
	}{
		{"current names, two engines summed", queue + counter("vllm:prefix_cache_queries", 1000, 500) + counter("vllm:prefix_cache_hits", 400, 100), true, 1500, 500},
		{"past 2^40 tokens (months of a busy server)", queue + counter("vllm:prefix_cache_queries", 1.5e12, 5e11) + counter("vllm:prefix_cache_hits", 1e12, 0), true, 2e12, 1e12},
		{"names before the rename", queue + counter("vllm:gpu_prefix_cache_queries", 10, 20) + counter("vllm:gpu_prefix_cache_hits", 5, 5), true, 30, 10},
		{"queries without hits: neither", queue + counter("vllm:prefix_cache_queries", 1000, 500), false, 0, 0},
		{"more hits than queries: neither", queue + counter("vllm:prefix_cache_queries", 10, 10) + counter("vllm:prefix_cache_hits", 40, 10), false, 0, 0},
		{"no counters: unknown, not zero", queue, false, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rd := mustReader(t, config.ModelServerMetrics{Engine: "vllm"}).read([]byte(tc.page))
			m := rd.m
			if m.HasPrefixCounters != tc.has || m.PrefixQueries != tc.queries || m.PrefixHits != tc.hits {
				t.Fatalf("counters %d/%d (reported %v), want %d/%d (%v); result %v %s",
					m.PrefixHits, m.PrefixQueries, m.HasPrefixCounters, tc.hits, tc.queries, tc.has, rd.result, rd.detail)
			}
			if !m.HasQueue || rd.others != 0 {
				t.Fatalf("queue read %v, %d families counted as not asked for", m.HasQueue, rd.others)
			}
		})
	}
}
