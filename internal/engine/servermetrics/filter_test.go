package servermetrics

import (
	"bytes"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// A page as prometheus_client writes it: a gauge, a counter (its _total family and its
// _created family), a histogram (and its _created), an info-style gauge.
const smallPage = `# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# HELP vllm:prompt_tokens_total Prompt tokens.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 5.0
# HELP vllm:prompt_tokens_created Prompt tokens.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e+09
# HELP vllm:e2e_request_latency_seconds Latency.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.1",model_name="m"} 0.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 0.3
# HELP vllm:cache_config_info Cache config.
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0
vllm:cache_config_info{block_size="16",num_gpu_blocks="200"} 1.0
`

// Filter gives what prometheus_client's restricted registry gives (checked against
// prometheus_client's generate_latest(registry.restricted_registry(names)) for these cases,
// but for the order of families, which there follows a Python set).
func TestFilterKeepsTheNamedSeries(t *testing.T) {
	tests := []struct {
		name  string
		names []string
		want  string
	}{
		{"gauges by their family name", []string{"vllm:cache_config_info", "vllm:num_requests_waiting"}, `# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# HELP vllm:cache_config_info Cache config.
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0
vllm:cache_config_info{block_size="16",num_gpu_blocks="200"} 1.0
`},
		{"a counter by its sample name, a histogram's count alone", []string{"vllm:prompt_tokens_total", "vllm:e2e_request_latency_seconds_count"}, `# HELP vllm:prompt_tokens_total Prompt tokens.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 5.0
# HELP vllm:e2e_request_latency_seconds Latency.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 1.0
`},
		{"base names of a counter and a histogram name no sample", []string{"vllm:prompt_tokens", "vllm:e2e_request_latency_seconds"}, ""},
		{"unknown names", []string{"sglang:num_queue_reqs"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Filter([]byte(smallPage), tc.names)
			if string(got) != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestFilterCopesWithPagesWithoutFinalNewlineOrHeaders(t *testing.T) {
	page := "a 1\n# TYPE b gauge\nb{x=\"1\"} 2\nb{x=\"2\"} 3"
	if got, want := string(Filter([]byte(page), []string{"b", "a"})), "a 1\n# TYPE b gauge\nb{x=\"1\"} 2\nb{x=\"2\"} 3\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got := Filter(nil, []string{"a"}); got == nil || len(got) != 0 {
		t.Fatalf("an empty page gives %q, want an empty, non-nil page", got)
	}
}

func TestQueryNamesReadsBothSpellingsAndDropsBlanks(t *testing.T) {
	for _, tc := range []struct{ query, want string }{
		{"name[]=vllm:a&name[]=b", "vllm:a,b"},
		{"name%5B%5D=vllm%3Aa&name%5B%5D=b&other=c", "vllm:a,b"},
		{"name[]=&name[]=a", "a"},
		{"names=a", ""},
		{"", ""},
	} {
		q, err := url.ParseQuery(tc.query)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(QueryNames(q), ","); got != tc.want {
			t.Errorf("%q: got %q, want %q", tc.query, got, tc.want)
		}
	}
}

// familiesOf returns the families (TYPE lines) of a page.
func familiesOf(page []byte) []string {
	var out []string
	for _, l := range strings.Split(string(page), "\n") {
		if f, ok := strings.CutPrefix(l, "# TYPE "); ok {
			out = append(out, strings.Fields(f)[0])
		}
	}
	return out
}

// Each exposition answers the scraper's filtered request on /metrics and /metrics/ as the
// servers it stands for do.
func TestExpositionAnswers(t *testing.T) {
	eng := busyEngine(t)
	vllm := Render(eng.Config(), eng.Stats(), t0, Options{})
	sglang := Render(eng.Config(), eng.Stats(), t0, Options{Flavor: SGLang})
	wanted := []string{"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:cache_config_info", "sglang:num_queue_reqs"}
	tests := []struct {
		name string
		e    Exposition
		page []byte
		path string
		want []string // families of the answer; nil: the whole page
	}{
		{"vLLM on /metrics: the instrumentator's whole page", ExpositionVLLM, vllm, "/metrics", nil},
		{"vLLM on /metrics/: prometheus_client's app filters", ExpositionVLLM, vllm, "/metrics/", wanted[:3]},
		{"prometheus_client's app on /metrics", ExpositionFiltered, vllm, "/metrics", wanted[:3]},
		{"make_asgi_app before 0.23", ExpositionWhole, vllm, "/metrics/", nil},
		{"SGLang's multiprocess registry", ExpositionMultiprocess, sglang, "/metrics", []string{}},
		{"SGLang page filtered by a single-process app", ExpositionFiltered, sglang, "/metrics", wanted[3:]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", tc.path+"?name%5B%5D="+strings.Join(wanted, "&name%5B%5D="), nil)
			w := httptest.NewRecorder()
			tc.e.WriteAnswer(w, r, tc.page)
			body := w.Body.Bytes()
			if cl := w.Header().Get("Content-Length"); cl != strconv.Itoa(len(body)) {
				t.Errorf("Content-Length %q for %d bytes", cl, len(body))
			}
			if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
				t.Errorf("Content-Type %q", ct)
			}
			if tc.want == nil {
				if !bytes.Equal(body, tc.page) {
					t.Fatalf("want the whole page (%d bytes), got %d bytes", len(tc.page), len(body))
				}
				return
			}
			if got := familiesOf(body); !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
				t.Fatalf("families %v, want %v", got, tc.want)
			}
			for _, l := range strings.SplitAfter(string(body), "\n") {
				if !bytes.Contains(tc.page, []byte(l)) {
					t.Fatalf("line %q is not on the page", l)
				}
			}
		})
	}
	// Without name[] every exposition sends the whole page.
	for _, e := range Expositions() {
		if got := e.Answer(vllm, "/metrics/", nil); !bytes.Equal(got, vllm) {
			t.Errorf("%s without names: %d bytes, want the whole page", e, len(got))
		}
	}
}
