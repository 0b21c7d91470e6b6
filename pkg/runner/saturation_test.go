package runner_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/internal/runnertest"
	"github.com/kvpick/kvpick/pkg/router"
	"github.com/kvpick/kvpick/pkg/runner"
)

// vllmServer serves a vLLM /metrics page whose queue and KV usage the test sets.
type vllmServer struct {
	srv     *httptest.Server
	mu      sync.Mutex
	waiting int
	usage   float64
}

func newVLLMServer(t *testing.T) *vllmServer {
	v := &vllmServer{}
	v.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		v.mu.Lock()
		wt, u := v.waiting, v.usage
		v.mu.Unlock()
		fmt.Fprintf(w, `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} %d
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} %g
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="4096"} 1.0
`, wt, u)
	}))
	t.Cleanup(v.srv.Close)
	return v
}

func (v *vllmServer) addr() string { return strings.TrimPrefix(v.srv.URL, "http://") }

func (v *vllmServer) set(waiting int, usage float64) {
	v.mu.Lock()
	v.waiting, v.usage = waiting, usage
	v.mu.Unlock()
}

// scrapedPicker builds the default configuration over servers, health checks off, and runs
// its scraper until the test ends.
func scrapedPicker(t *testing.T, servers []*vllmServer) *runner.Picker {
	t.Helper()
	cfg := config.Default()
	for _, s := range servers {
		cfg.Pool.Endpoints = append(cfg.Pool.Endpoints, s.addr())
	}
	cfg.Pool.HealthCheck.Interval = 0
	return runnertest.Scraping(t, cfg)
}

// serve routes req and plays its successful stream back to the picker: headers, first byte,
// end.
func serve(t *testing.T, pk *runner.Picker, req *router.Request) *router.Endpoint {
	t.Helper()
	d, err := pk.Pipeline.Schedule(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	pk.Pipeline.ResponseHeaders(req, d.Endpoint, "", 200)
	pk.Pipeline.FirstByte(req, d.Endpoint, "")
	pk.Pipeline.Done(req, d.Endpoint)
	return d.Endpoint
}

// waitFor polls ok every 5 ms and fails the test after 20 s.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestASaturatedServerGetsAlmostNoNewRequests: with the default configuration, an endpoint
// whose server reports 500 waiting requests and a 99% full KV cache gets at most 1 in 10 new
// requests once the picker has scraped it — even for prompts whose prefix it holds — and gets
// traffic again once it reports a short queue.
func TestASaturatedServerGetsAlmostNoNewRequests(t *testing.T) {
	servers := []*vllmServer{newVLLMServer(t), newVLLMServer(t), newVLLMServer(t), newVLLMServer(t)}
	pk := scrapedPicker(t, servers)

	// Teach the picker that the hot server holds a long system prompt.
	system := strings.Repeat("You are the assistant of a large company; follow its policies. ", 60)
	route := func(question string) string {
		return serve(t, pk, routertest.Chat(t, system+question)).Addr
	}
	// Wherever the first request lands (rendezvous) holds the prompt from then on.
	hot := pk.Pool.Lookup(route(" First question."))
	for i := range 5 {
		if got := route(fmt.Sprintf(" Warm question %d.", i)); got != hot.Addr {
			t.Fatalf("warm-up request %d went to %s, not the prompt's holder %s", i, got, hot.Addr)
		}
	}

	for _, s := range servers {
		if s.addr() == hot.Addr {
			s.set(500, 0.99)
		}
	}
	waitFor(t, "the saturated scrape", func() bool {
		m := hot.FreshMetrics(time.Now())
		return m != nil && m.Waiting == 500
	})
	got := 0
	for i := range 100 {
		if route(fmt.Sprintf(" Question %d.", i)) == hot.Addr {
			got++
		}
	}
	if got > 10 {
		t.Fatalf("the server reporting 500 waiting and 99%% KV got %d of 100 new requests, want at most 10", got)
	}

	for _, s := range servers {
		if s.addr() == hot.Addr {
			s.set(0, 0.3)
		}
	}
	waitFor(t, "the recovered scrape", func() bool {
		m := hot.FreshMetrics(time.Now())
		return m != nil && m.Waiting == 0
	})
	back := 0
	for i := range 20 {
		if route(fmt.Sprintf(" Later question %d.", i)) == hot.Addr {
			back++
		}
	}
	if back == 0 {
		t.Fatal("the recovered server holding the prompt got none of 20 requests")
	}
}
