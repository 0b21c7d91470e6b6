package scrape

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/httpserver"
	"github.com/kvpick/kvpick/internal/engine/servermetrics"
)

func filterCfg() config.ModelServerMetrics {
	c := testCfg()
	c.FilterFamilies = true
	return c
}

// The filtered request names exactly the families the configured engine is read with,
// percent-encoded as a query; the trailing-slash variant exists only for a plain path.
func TestRequestPathsNameTheEngineFamilies(t *testing.T) {
	auto := []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
		"vllm:gpu_cache_usage_perc", "vllm:cache_config_info", "vllm:lora_requests_info", "vllm:time_to_first_token_seconds_count",
		"vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
		"vllm:gpu_prefix_cache_hits_total", "sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:max_total_num_tokens",
		"sglang:time_to_first_token_seconds_count"}
	tests := []struct {
		name            string
		cfg             func(*config.ModelServerMetrics)
		names           []string // of the filtered request, in order
		filtered, whole string
		slash           string
	}{
		{"auto: vLLM's current and older names and SGLang's", nil, auto, "/metrics?", "/metrics", "/metrics/?"},
		{"vllm", func(c *config.ModelServerMetrics) { c.Engine = "vllm" }, auto[:11], "/metrics?", "/metrics", "/metrics/?"},
		{"sglang", func(c *config.ModelServerMetrics) { c.Engine = "sglang" }, auto[11:], "/metrics?", "/metrics", "/metrics/?"},
		{"custom: the configured names", func(c *config.ModelServerMetrics) { c.Engine, c.Names = customCfg.Engine, customCfg.Names },
			[]string{"myengine_queue_depth", "myengine_active", "myengine_kv_fraction", "myengine_kv_tokens"}, "/metrics?", "/metrics", "/metrics/?"},
		{"path with a trailing slash: no slash variant", func(c *config.ModelServerMetrics) { c.Path = "/metrics/" }, auto, "/metrics/?", "/metrics/", ""},
		{"path with a query of its own", func(c *config.ModelServerMetrics) { c.Path = "/m?x=1" }, auto, "/m?x=1&", "/m?x=1", ""},
		{"filter off: the whole page only", func(c *config.ModelServerMetrics) { c.FilterFamilies = false }, nil, "", "/metrics", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filterCfg()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			s, err := New(cfg, Options{})
			if err != nil {
				t.Fatal(err)
			}
			p := s.paths
			if p[variantWhole] != tc.whole {
				t.Errorf("whole %q, want %q", p[variantWhole], tc.whole)
			}
			if tc.filtered == "" {
				if p[variantFiltered] != "" || p[variantSlash] != "" {
					t.Fatalf("filter off, but requests %q", p)
				}
				return
			}
			query, ok := strings.CutPrefix(p[variantFiltered], tc.filtered)
			if !ok {
				t.Fatalf("filtered %q, want it to start with %q", p[variantFiltered], tc.filtered)
			}
			if strings.ContainsAny(query, "[]:") {
				t.Errorf("query %q: brackets and colons must be percent-encoded", query)
			}
			var names []string
			for _, kv := range strings.Split(query, "&") {
				k, v, _ := strings.Cut(kv, "=")
				if k != "name%5B%5D" {
					t.Fatalf("parameter %q in %q", k, query)
				}
				n, err := url.QueryUnescape(v)
				if err != nil {
					t.Fatal(err)
				}
				names = append(names, n)
			}
			if !slices.Equal(names, tc.names) {
				t.Errorf("names %v, want %v", names, tc.names)
			}
			if tc.slash == "" {
				if p[variantSlash] != "" {
					t.Errorf("slash variant %q, want none", p[variantSlash])
				}
			} else if p[variantSlash] != tc.slash+query {
				t.Errorf("slash variant %q, want %q", p[variantSlash], tc.slash+query)
			}
		})
	}
}

// How the choice of request follows the answers, step by step.
func TestChoiceFollowsTheAnswers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	paths := requestPaths("/metrics", true, []string{"a"})
	type step struct {
		at       time.Duration // after t0
		sent     variant
		got      answer
		again    bool    // another request within the same scrape
		next     variant // that request, when again
		thenUses variant
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a filtering server keeps the filtered request", []step{
			{0, variantFiltered, answerFiltered, false, 0, variantFiltered},
			{time.Hour, variantFiltered, answerFiltered, false, 0, variantFiltered},
		}},
		{"a whole page makes the next scrape try the trailing slash, which is kept when it filters", []step{
			{0, variantFiltered, answerWhole, false, 0, variantSlash},
			{time.Second, variantSlash, answerFiltered, false, 0, variantSlash},
		}},
		{"a trailing slash that ignores the filter too is given up on for filterRetry", []step{
			{0, variantFiltered, answerWhole, false, 0, variantSlash},
			{time.Second, variantSlash, answerWhole, false, 0, variantFiltered},
			{2 * time.Second, variantFiltered, answerWhole, false, 0, variantFiltered},
			{time.Second + filterRetry, variantFiltered, answerWhole, false, 0, variantSlash},
		}},
		{"a trailing slash that is not found falls back to the filtered request at once", []step{
			{0, variantFiltered, answerWhole, false, 0, variantSlash},
			{time.Second, variantSlash, answerNone, true, variantFiltered, variantFiltered},
			{time.Second, variantFiltered, answerWhole, false, 0, variantFiltered},
			{2 * time.Second, variantFiltered, answerWhole, false, 0, variantFiltered},
		}},
		{"an answer without the families falls back to the whole page at once, and the filter is tried again after filterRetry", []step{
			{0, variantFiltered, answerNone, true, variantWhole, variantWhole},
			{0, variantWhole, answerWhole, false, 0, variantWhole},
			{time.Minute, variantWhole, answerWhole, false, 0, variantWhole},
			{filterRetry, variantWhole, answerWhole, false, 0, variantFiltered},
			{filterRetry + time.Second, variantFiltered, answerFiltered, false, 0, variantFiltered},
		}},
		{"an adopted trailing slash that stops answering falls back through the filtered request", []step{
			{0, variantFiltered, answerWhole, false, 0, variantSlash},
			{time.Second, variantSlash, answerFiltered, false, 0, variantSlash},
			{time.Hour, variantSlash, answerNone, true, variantFiltered, variantFiltered},
			{time.Hour, variantFiltered, answerNone, true, variantWhole, variantWhole},
		}},
		{"failures teach nothing", []step{
			{0, variantFiltered, answerFailed, false, 0, variantFiltered},
			{0, variantFiltered, answerWhole, false, 0, variantSlash},
			{time.Second, variantSlash, answerFailed, false, 0, variantSlash},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newChoice(paths)
			for i, s := range tc.steps {
				if s.sent != c.use && (i == 0 || !tc.steps[i-1].again) {
					t.Fatalf("step %d: the loop would send %s, the test sends %s", i, c.use, s.sent)
				}
				next, again := c.after(s.sent, s.got, t0.Add(s.at))
				if again != s.again || (again && next != s.next) || c.use != s.thenUses {
					t.Fatalf("step %d (%s answered %d): again %v next %s, uses %s; want again %v next %s, uses %s",
						i, s.sent, s.got, again, next, c.use, s.again, s.next, s.thenUses)
				}
			}
		})
	}
	if c := newChoice(requestPaths("/metrics", false, []string{"a"})); c.use != variantWhole {
		t.Fatalf("filter off: uses %s", c.use)
	}
	c := newChoice(requestPaths("/metrics/", true, []string{"a"}))
	if c.after(variantFiltered, answerWhole, t0); c.use != variantFiltered {
		t.Fatalf("no slash variant: a whole page must keep the filtered request, uses %s", c.use)
	}
}

// requestLog records the request targets a server got, by kind.
type requestLog struct {
	mu    sync.Mutex
	kinds map[string]int // filtered, slash, whole, other
	order []string
}

func (l *requestLog) note(r *http.Request) {
	kind := "other"
	switch filtered := strings.Contains(r.URL.RawQuery, "name%5B%5D="); {
	case r.URL.Path == "/metrics" && filtered:
		kind = "filtered"
	case r.URL.Path == "/metrics/" && filtered:
		kind = "slash"
	case r.URL.Path == "/metrics" && r.URL.RawQuery == "":
		kind = "whole"
	}
	l.mu.Lock()
	if l.kinds == nil {
		l.kinds = map[string]int{}
	}
	l.kinds[kind]++
	l.order = append(l.order, kind)
	l.mu.Unlock()
}

func (l *requestLog) counts() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.kinds)
}

// Servers take the filtered request in every way real ones do, and every scrape reads the
// numbers: a filtering server sends small pages; one that ignores the filter sends the whole
// page (read as before); vLLM's layout is found out through the trailing slash; a server whose
// filtered answer holds nothing (SGLang's multiprocess registry) or that refuses the query is
// asked for the whole page at once, and from then on.
func TestScraperFiltersWhereTheServerCan(t *testing.T) {
	vllm := VLLMPage{Waiting: []int{4}, Running: []int{9}, KVUsage: []float64{0.5}, NumGPUBlocks: 1856}.Render()
	sglang := SGLangPage(4, 9, 0.5, 200000)
	expose := func(e servermetrics.Exposition, page []byte) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if !strings.HasPrefix(r.URL.Path, "/metrics") {
				w.WriteHeader(404)
				return
			}
			e.WriteAnswer(w, r, page)
		}
	}
	tests := []struct {
		name    string
		handler http.HandlerFunc
		small   bool           // the pages end small
		kinds   map[string]int // requests after the first ten scrapes, by kind (share of 1)
	}{
		{"prometheus_client's application filters", expose(servermetrics.ExpositionFiltered, vllm), true, map[string]int{"filtered": 1}},
		{"vLLM: /metrics ignores, /metrics/ filters", expose(servermetrics.ExpositionVLLM, vllm), true, map[string]int{"slash": 1}},
		{"make_asgi_app before 0.23 ignores the query everywhere", expose(servermetrics.ExpositionWhole, vllm), false, map[string]int{"filtered": 1}},
		{"SGLang's multiprocess registry sends an empty page", expose(servermetrics.ExpositionMultiprocess, sglang), false, map[string]int{"whole": 1}},
		{"a server that refuses the query", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.RawQuery != "" {
				http.Error(w, "unknown parameter", 400)
				return
			}
			_, _ = w.Write(vllm)
		}, false, map[string]int{"whole": 1}},
		{"an exact /metrics route that ignores the query, /metrics/ not found", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write(vllm)
		}, false, map[string]int{"filtered": 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var log requestLog
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				log.note(r)
				tc.handler(w, r)
			}))
			defer srv.Close()
			addr := strings.TrimPrefix(srv.URL, "http://")
			h := start(t, filterCfg(), addr)
			waitFor(t, "10 good scrapes", func() bool { return h.count(addr, resultOK) >= 10 })
			before := log.counts()
			waitFor(t, "30 more good scrapes", func() bool { return h.count(addr, resultOK) >= 40 })
			after := log.counts()
			for k := range after {
				after[k] -= before[k]
			}
			for k, n := range after {
				if n > 0 && tc.kinds[k] == 0 {
					t.Errorf("%d %s requests once settled (all requests: %v)", n, k, log.order)
				}
			}
			for k := range tc.kinds {
				if after[k] == 0 {
					t.Errorf("no %s request once settled: %v", k, after)
				}
			}
			for r := resultError; r < numResults; r++ {
				if n := h.count(addr, r); n > 0 {
					t.Errorf("%v %s scrapes", n, r)
				}
			}
			m := h.ep(addr).Metrics()
			if !m.HasQueue || m.Waiting != 4 || m.Running != 9 || m.KVUsage != 0.5 || m.NumGPUBlocks == 0 {
				t.Errorf("metrics %+v", m)
			}
			bytes := gather(t, h.reg)[`kvpick_model_server_metrics_page_bytes{endpoint="`+addr+`"}`]
			if small := bytes < 4096; small != tc.small {
				t.Errorf("last page %v bytes, want small %v", bytes, tc.small)
			}
		})
	}
}

// A server whose pages hold none of the families whatever is asked keeps getting the filtered
// request: nothing is learnt, and each scrape costs that request and the whole page's.
func TestServerWithoutFamiliesKeepsTheFilteredRequest(t *testing.T) {
	var log requestLog
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.note(r)
		_, _ = w.Write([]byte("# TYPE python_info gauge\npython_info 1\n"))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	h := start(t, filterCfg(), addr)
	waitFor(t, "5 scrapes", func() bool { return h.count(addr, resultMissing) >= 5 })
	h.stop()
	c := log.counts()
	if c["filtered"] < 5 || c["whole"] > c["filtered"] || c["slash"]+c["other"] > 0 {
		t.Fatalf("requests %v: want a filtered request every scrape, each followed by one for the whole page", c)
	}
}

// The log says how the server answers the filter, once for every change.
func TestFilterOutcomeIsLoggedOnce(t *testing.T) {
	vllm := VLLMPage{Waiting: []int{4}, Running: []int{9}, KVUsage: []float64{0.5}, NumGPUBlocks: 1856}.Render()
	for _, tc := range []struct {
		e    servermetrics.Exposition
		want []string
	}{
		{servermetrics.ExpositionFiltered, nil},
		{servermetrics.ExpositionVLLM, []string{"ignores the name[] filter", "sends only the families asked for"}},
		{servermetrics.ExpositionMultiprocess, []string{"asking for the whole page"}},
		{servermetrics.ExpositionWhole, []string{"ignores the name[] filter"}},
	} {
		t.Run(string(tc.e), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { tc.e.WriteAnswer(w, r, vllm) }))
			defer srv.Close()
			addr := strings.TrimPrefix(srv.URL, "http://")
			h := start(t, filterCfg(), addr)
			waitFor(t, "30 good scrapes", func() bool { return h.count(addr, resultOK) >= 30 })
			var msgs []string
			for _, l := range h.logs.FilterMessageSnippet("model server metrics: ").FilterField(zap.String("endpoint", addr)).All() {
				msgs = append(msgs, l.Message)
			}
			ok := len(msgs) == len(tc.want)
			for i := 0; ok && i < len(msgs); i++ {
				ok = strings.Contains(msgs[i], tc.want[i])
			}
			if !ok {
				t.Fatalf("log lines %q, want lines saying %q", msgs, tc.want)
			}
		})
	}
}

// The project's vLLM simulator, as it serves by default, ends up sending the scraper small
// filtered pages (through /metrics/) with its numbers.
func TestScrapesTheSimulatorFiltered(t *testing.T) {
	cfg := engine.DefaultConfig()
	cfg.NumGPUBlocks = 1234
	eng, err := engine.New(cfg, engine.RealClock{})
	if err != nil {
		t.Fatal(err)
	}
	var log requestLog
	sim := httpserver.New(eng, httpserver.Options{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { log.note(r); sim.ServeHTTP(w, r) }))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	h := start(t, filterCfg(), addr)
	waitFor(t, "slash requests", func() bool { return log.counts()["slash"] >= 5 })
	m := h.ep(addr).Metrics()
	if m == nil || !m.HasQueue || !m.HasKVUsage || m.NumGPUBlocks != 1234 {
		t.Fatalf("metrics %+v", m)
	}
	if b := gather(t, h.reg)[`kvpick_model_server_metrics_page_bytes{endpoint="`+addr+`"}`]; b == 0 || b > 4096 {
		t.Fatalf("page of %v bytes, want a small filtered one", b)
	}
}

// On the wire, the default request names the engine's families as the query parameter name[],
// which a server decodes as prometheus_client's parse_qs does (net/url here).
func TestFilteredRequestOnTheWire(t *testing.T) {
	got := make(chan []string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.URL.Query()["name[]"]:
		default:
		}
		_, _ = w.Write(VLLMPage{Waiting: []int{1}, Running: []int{1}, KVUsage: []float64{0.1}}.Render())
	}))
	defer srv.Close()
	start(t, filterCfg(), strings.TrimPrefix(srv.URL, "http://"))
	names := <-got
	want := []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
		"vllm:gpu_cache_usage_perc", "vllm:cache_config_info", "vllm:lora_requests_info", "vllm:time_to_first_token_seconds_count",
		"vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
		"vllm:gpu_prefix_cache_hits_total", "sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:max_total_num_tokens",
		"sglang:time_to_first_token_seconds_count"}
	if !slices.Equal(names, want) {
		t.Fatalf("name[] = %v, want %v", names, want)
	}
}
