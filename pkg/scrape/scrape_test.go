package scrape

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/plugins"
	"github.com/kvpick/kvpick/pkg/pool"
	"github.com/kvpick/kvpick/pkg/router"
)

// testCfg scrapes often, with generous timeouts: tests wait for conditions, never for time.
func testCfg() config.ModelServerMetrics {
	return config.ModelServerMetrics{
		Path: "/metrics", RefreshInterval: config.Duration(5 * time.Millisecond), Timeout: config.Duration(5 * time.Second),
		StalenessThreshold: config.Duration(time.Minute), MaxBodyBytes: 1 << 20, Engine: "auto",
	}
}

// pageServer is a metrics server whose page, status and delay the test changes.
type pageServer struct {
	*httptest.Server
	mu       sync.Mutex
	page     []byte
	status   int
	block    chan struct{} // when set, requests wait on it
	hits     atomic.Int64
	inFlight atomic.Int64
	maxIn    atomic.Int64
	onHit    func(n int64) []byte // when set, makes the page of the n-th request
}

func newPageServer(t *testing.T, page []byte) *pageServer {
	s := &pageServer{page: page, status: 200}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.hits.Add(1)
		in := s.inFlight.Add(1)
		defer s.inFlight.Add(-1)
		for {
			m := s.maxIn.Load()
			if in <= m || s.maxIn.CompareAndSwap(m, in) {
				break
			}
		}
		if r.URL.Path != "/metrics" {
			w.WriteHeader(404)
			return
		}
		s.mu.Lock()
		page, status, block, onHit := s.page, s.status, s.block, s.onHit
		s.mu.Unlock()
		if block != nil {
			select {
			case <-block:
			case <-r.Context().Done():
				return
			}
		}
		if onHit != nil {
			page = onHit(n)
		}
		w.WriteHeader(status)
		_, _ = w.Write(page)
	}))
	t.Cleanup(func() {
		s.mu.Lock()
		if s.block != nil {
			close(s.block)
			s.block = nil
		}
		s.mu.Unlock()
		s.Close()
	})
	return s
}

func (s *pageServer) addr() string { return strings.TrimPrefix(s.URL, "http://") }

func (s *pageServer) set(page []byte, status int) {
	s.mu.Lock()
	s.page, s.status = page, status
	s.mu.Unlock()
}

// harness runs a scraper over a pool until the test ends.
type harness struct {
	t    *testing.T
	pool *pool.Pool
	s    *Scraper
	reg  *prometheus.Registry
	logs *observer.ObservedLogs
	stop func()
}

func start(t *testing.T, cfg config.ModelServerMetrics, addrs ...string) *harness {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	h := &harness{t: t, pool: pool.New(), reg: prometheus.NewRegistry(), logs: logs}
	s, err := New(cfg, Options{Pool: h.pool, Log: zap.New(core), Registerer: h.reg})
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	h.pool.Listen(s)
	h.pool.Set(addrs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	h.stop = func() { cancel(); <-done }
	t.Cleanup(h.stop)
	return h
}

// waitFor polls cond until it holds; the deadline only stops a broken test from hanging.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (h *harness) ep(addr string) *router.Endpoint {
	ep := h.pool.Lookup(addr)
	if ep == nil {
		h.t.Fatalf("%s not in the pool", addr)
	}
	return ep
}

func (h *harness) count(addr string, r result) float64 {
	return gather(h.t, h.reg)[`kvpick_model_server_scrapes_total{endpoint="`+addr+`",result="`+r.String()+`"}`]
}

// gather returns every gauge and counter series of reg as name{label="value",...} → value
// (a histogram's sample count).
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+`="`+l.GetValue()+`"`)
			}
			key := mf.GetName()
			if len(ls) > 0 {
				key += "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Histogram != nil:
				out[key] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return out
}

func TestScraperPublishesWhatEachEngineReports(t *testing.T) {
	tests := []struct {
		name string
		cfg  func(*config.ModelServerMetrics)
		page []byte
		want router.Metrics
	}{
		{"vLLM", nil, VLLMPage{Waiting: []int{4}, Running: []int{9}, KVUsage: []float64{0.5}, NumGPUBlocks: 1856}.Render(),
			router.Metrics{Waiting: 4, Running: 9, KVUsage: 0.5, NumGPUBlocks: 1856, BlockSize: 16, HasQueue: true, HasKVUsage: true}},
		{"vLLM before 0.10", nil, VLLMPage{Waiting: []int{1}, Running: []int{2}, KVUsage: []float64{0.25}, NumGPUBlocks: 768, OldNames: true}.Render(),
			router.Metrics{Waiting: 1, Running: 2, KVUsage: 0.25, NumGPUBlocks: 768, BlockSize: 16, HasQueue: true, HasKVUsage: true}},
		{"SGLang", nil, SGLangPage(6, 3, 0.125, 200000),
			router.Metrics{Waiting: 6, Running: 3, KVUsage: 0.125, NumGPUBlocks: 200000, BlockSize: 1, HasQueue: true, HasKVUsage: true}},
		{"custom names", func(c *config.ModelServerMetrics) { c.Engine, c.Names = customCfg.Engine, customCfg.Names },
			[]byte("myengine_queue_depth 5\nmyengine_active 1\nmyengine_kv_fraction 0.75\n"),
			router.Metrics{Waiting: 5, Running: 1, KVUsage: 0.75, HasQueue: true, HasKVUsage: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPageServer(t, tc.page)
			cfg := testCfg()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			h := start(t, cfg, srv.addr())
			ep := h.ep(srv.addr())
			waitFor(t, "a scrape", func() bool { return ep.Metrics() != nil })
			m := ep.Metrics()
			assertMetrics(t, *m, tc.want)
			if m.ScrapedAt.IsZero() || !m.StaleAt.Equal(m.ScrapedAt.Add(cfg.StalenessThreshold.D())) {
				t.Errorf("ScrapedAt %v StaleAt %v: want StaleAt = ScrapedAt + %v", m.ScrapedAt, m.StaleAt, cfg.StalenessThreshold.D())
			}
			if ep.FreshMetrics(m.ScrapedAt) != m || ep.FreshMetrics(m.StaleAt) != nil {
				t.Error("FreshMetrics must return the metrics before StaleAt and nil from StaleAt on")
			}
		})
	}
}

// A scrape that fails keeps the last good metrics (they go stale by themselves) and counts the
// failure by its kind.
func TestFailedScrapesKeepTheLastGoodMetrics(t *testing.T) {
	good := VLLMPage{Waiting: []int{2}, Running: []int{3}, KVUsage: []float64{0.5}, NumGPUBlocks: 1000}.Render()
	tests := []struct {
		name   string
		cfg    func(*config.ModelServerMetrics)
		break_ func(*pageServer)
		want   result
		log    string
	}{
		{"HTTP 500", nil, func(s *pageServer) { s.set(good, 500) }, resultBadStatus, "HTTP status 500"},
		{"page over maxBodyBytes", func(c *config.ModelServerMetrics) { c.MaxBodyBytes = int64(len(good)) + 100 },
			func(s *pageServer) { s.set(bytes.Repeat(good, 2), 200) }, resultTooLarge, "maxBodyBytes"},
		{"broken wanted line", nil, func(s *pageServer) {
			s.set([]byte("vllm:num_requests_waiting{engine=\"0\" 3\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n"), 200)
		}, resultUnparsable, "vllm:num_requests_waiting"},
		{"slow server", func(c *config.ModelServerMetrics) { c.Timeout = config.Duration(50 * time.Millisecond) },
			func(s *pageServer) { s.mu.Lock(); s.block = make(chan struct{}); s.mu.Unlock() }, resultTimeout, "timeout"},
		{"server gone", nil, func(s *pageServer) { s.CloseClientConnections(); s.Listener.Close() }, resultError, "connection refused"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPageServer(t, good)
			cfg := testCfg()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			h := start(t, cfg, srv.addr())
			ep := h.ep(srv.addr())
			waitFor(t, "a good scrape", func() bool { return ep.Metrics() != nil })
			last := ep.Metrics()
			tc.break_(srv)
			waitFor(t, tc.want.String()+" counted twice", func() bool { return h.count(srv.addr(), tc.want) >= 2 })
			// Some good scrapes may have landed before the break; none after it.
			if m := ep.Metrics(); m.Waiting != 2 || m.Running != 3 || m.NumGPUBlocks != 1000 {
				t.Fatalf("metrics after failures: %+v, want the last good ones", m)
			}
			if m := ep.Metrics(); m.ScrapedAt.Before(last.ScrapedAt) {
				t.Fatal("metrics went back in time")
			}
			// One line for the change of state, not one per failure.
			lines := h.logs.FilterMessageSnippet("metrics scrape failed").FilterField(zap.String("endpoint", srv.addr()))
			if lines.Len() != 1 {
				t.Fatalf("%d log lines for the failure, want 1", lines.Len())
			}
			if !strings.Contains(fmt.Sprint(lines.All()[0].ContextMap()), tc.log) {
				t.Errorf("log line %v does not mention %q", lines.All()[0].ContextMap(), tc.log)
			}
		})
	}
}

// A page that lacks families is published with the Has flags false, counted as missing_metrics
// and logged once.
func TestMissingFamiliesArePublishedAsUnknown(t *testing.T) {
	srv := newPageServer(t, VLLMPage{Waiting: []int{2}, Running: []int{3}, KVUsage: []float64{0.5}, NumGPUBlocks: 1000}.Render())
	h := start(t, testCfg(), srv.addr())
	ep := h.ep(srv.addr())
	waitFor(t, "a good scrape", func() bool { m := ep.Metrics(); return m != nil && m.HasQueue })
	srv.set(VLLMPage{KVUsage: []float64{0.5}, NumGPUBlocks: 1000, Omit: []string{"vllm:num_requests_waiting", "vllm:num_requests_running"}}.Render(), 200)
	waitFor(t, "the queue to disappear", func() bool { return !ep.Metrics().HasQueue })
	if m := ep.Metrics(); !m.HasKVUsage || m.KVUsage != 0.5 || m.NumGPUBlocks != 1000 || m.Waiting != 0 || m.Running != 0 {
		t.Fatalf("metrics %+v: want no queue, the rest read", m)
	}
	waitFor(t, "missing_metrics counted", func() bool { return h.count(srv.addr(), resultMissing) >= 2 })
	if n := h.logs.FilterMessageSnippet("incomplete").Len(); n != 1 {
		t.Fatalf("%d log lines, want 1", n)
	}
}

// Metrics older than the staleness threshold are not trusted: FreshMetrics turns nil while
// Metrics keeps the last scrape (capacity stays useful).
func TestMetricsGoStaleWhenScrapesFail(t *testing.T) {
	srv := newPageServer(t, VLLMPage{Waiting: []int{2}, Running: []int{3}, KVUsage: []float64{0.5}, NumGPUBlocks: 1000}.Render())
	cfg := testCfg()
	cfg.StalenessThreshold = config.Duration(100 * time.Millisecond)
	h := start(t, cfg, srv.addr())
	ep := h.ep(srv.addr())
	waitFor(t, "fresh metrics", func() bool { return ep.FreshMetrics(time.Now()) != nil })
	srv.set(nil, 503)
	waitFor(t, "the metrics to go stale", func() bool { return ep.FreshMetrics(time.Now()) == nil })
	if m := ep.Metrics(); m == nil || m.NumGPUBlocks != 1000 {
		t.Fatalf("Metrics() = %+v: the last scrape must stay readable", m)
	}
	srv.set(VLLMPage{Waiting: []int{7}, Running: []int{3}, KVUsage: []float64{0.5}, NumGPUBlocks: 1000}.Render(), 200)
	waitFor(t, "fresh metrics again", func() bool { m := ep.FreshMetrics(time.Now()); return m != nil && m.Waiting == 7 })
	waitFor(t, "the recovery logged", func() bool { return h.logs.FilterMessageSnippet("scraped again").Len() == 1 })
}

// A server that never answers holds its own loop only: the other endpoint keeps being scraped,
// and the slow one never has two scrapes in flight.
func TestSlowEndpointDelaysNoOther(t *testing.T) {
	page := VLLMPage{Waiting: []int{1}, Running: []int{1}, KVUsage: []float64{0.1}}.Render()
	slow, fast := newPageServer(t, page), newPageServer(t, page)
	slow.block = make(chan struct{})
	cfg := testCfg()
	cfg.Timeout = config.Duration(time.Hour) // the slow scrape never ends during the test
	h := start(t, cfg, slow.addr(), fast.addr())
	waitFor(t, "the slow server's first request", func() bool { return slow.hits.Load() >= 1 })
	before := fast.hits.Load()
	waitFor(t, "50 more scrapes of the fast server", func() bool { return fast.hits.Load() >= before+50 })
	if n := slow.hits.Load(); n != 1 {
		t.Fatalf("slow server got %d requests while its first was pending, want 1", n)
	}
	if n := slow.maxIn.Load(); n != 1 {
		t.Fatalf("slow server had %d scrapes in flight at once", n)
	}
	if h.ep(fast.addr()).Metrics() == nil || h.ep(slow.addr()).Metrics() != nil {
		t.Fatal("the fast endpoint must have metrics, the slow one none")
	}
}

// Scrapes time out and start again one at a time: the scraper never has two connections to one
// server open (the server may take a moment to notice that a timed-out request was abandoned,
// so the test counts on the scraper's side).
func TestTimedOutScrapesDoNotPileUp(t *testing.T) {
	page := VLLMPage{Waiting: []int{1}, Running: []int{1}, KVUsage: []float64{0.1}}.Render()
	slow := newPageServer(t, page)
	slow.block = make(chan struct{})
	cfg := testCfg()
	cfg.Timeout = config.Duration(20 * time.Millisecond)
	p := pool.New()
	reg := prometheus.NewRegistry()
	s, err := New(cfg, Options{Pool: p, Log: zap.NewNop(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	var open, maxOpen atomic.Int64
	s.wrapConn = func(c net.Conn) net.Conn {
		n := open.Add(1)
		for m := maxOpen.Load(); n > m && !maxOpen.CompareAndSwap(m, n); m = maxOpen.Load() {
		}
		return &closeCounter{Conn: c, open: &open}
	}
	p.Listen(s)
	p.Set([]string{slow.addr()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	h := &harness{t: t, s: s, reg: reg}
	waitFor(t, "5 timeouts", func() bool { return h.count(slow.addr(), resultTimeout) >= 5 })
	if n := maxOpen.Load(); n != 1 {
		t.Fatalf("%d connections open at once, want 1", n)
	}
}

// closeCounter counts a connection's close.
type closeCounter struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *closeCounter) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// Endpoints that join get a loop, endpoints that leave lose it, and nothing is left running
// once the scraper stops.
func TestLoopsFollowThePoolAndStop(t *testing.T) {
	base := runtime.NumGoroutine()
	page := VLLMPage{Waiting: []int{1}, Running: []int{1}, KVUsage: []float64{0.1}}.Render()
	a, b, c := newPageServer(t, page), newPageServer(t, page), newPageServer(t, page)
	serverGoroutines := runtime.NumGoroutine() - base
	h := start(t, testCfg(), a.addr())
	waitFor(t, "a scraped", func() bool { return a.hits.Load() > 0 })

	h.pool.Set([]string{a.addr(), b.addr(), c.addr()})
	waitFor(t, "b and c scraped", func() bool { return b.hits.Load() > 0 && c.hits.Load() > 0 })
	epB := h.ep(b.addr())

	h.pool.Set([]string{a.addr(), c.addr()})
	h.s.mu.Lock()
	_, still := h.s.loops[epB]
	n := len(h.s.loops)
	h.s.mu.Unlock()
	if still || n != 2 {
		t.Fatalf("after removing b: b still scraped %v, %d loops", still, n)
	}
	// At most the scrape in flight at the removal reaches b; c goes on.
	bAtRemoval, cAtRemoval := b.hits.Load(), c.hits.Load()
	waitFor(t, "20 more scrapes of c", func() bool { return c.hits.Load() >= cAtRemoval+20 })
	if got := b.hits.Load(); got > bAtRemoval+1 {
		t.Fatalf("b got %d scrapes after it left the pool", got-bAtRemoval)
	}
	// A returning address is a new endpoint with a new loop.
	h.pool.Set([]string{a.addr(), b.addr(), c.addr()})
	bBack := b.hits.Load()
	waitFor(t, "b scraped again", func() bool { return b.hits.Load() > bBack })

	h.stop()
	waitFor(t, "goroutines back to the baseline", func() bool { return runtime.NumGoroutine() <= base+serverGoroutines })
}

// PicksAtScrape is the endpoint's pick count when the request left: picks made while the server
// answers are beyond it.
func TestPicksAtScrapeIsTakenBeforeTheRequest(t *testing.T) {
	b, err := plugins.Build([]config.Plugin{{Name: "max-score-picker"}}, plugins.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	p := pool.New()
	pipe, err := router.New(router.Config{Pool: p, Plugins: b.Plugins})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[int64]int64{} // request number → picks when it arrived
	var ep atomic.Pointer[router.Endpoint]
	srv := newPageServer(t, nil)
	srv.onHit = func(n int64) []byte {
		e := ep.Load()
		mu.Lock()
		seen[n] = e.Picks()
		mu.Unlock()
		// A request is routed while the server prepares its page: the page cannot include it.
		req := routertest.Chat(t, "hello")
		d, err := pipe.Schedule(context.Background(), req)
		if err != nil {
			t.Error(err)
		} else {
			pipe.Done(req, d.Endpoint)
		}
		return []byte(fmt.Sprintf("vllm:num_requests_waiting %d\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n", n))
	}
	s, err := New(testCfg(), Options{Pool: p, Log: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	p.Listen(s)
	p.Set([]string{srv.addr()})
	ep.Store(p.Lookup(srv.addr()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "5 scrapes", func() bool { m := ep.Load().Metrics(); return m != nil && m.Waiting >= 5 })
	m := ep.Load().Metrics()
	mu.Lock()
	want := seen[int64(m.Waiting)]
	mu.Unlock()
	if m.PicksAtScrape != want {
		t.Fatalf("PicksAtScrape %d, want %d (the picks when scrape %d was sent)", m.PicksAtScrape, want, m.Waiting)
	}
	if got := ep.Load().Picks(); got <= m.PicksAtScrape {
		t.Fatalf("picks %d: the pick made during the scrape must be beyond PicksAtScrape %d", got, m.PicksAtScrape)
	}
}

// The observer learns every published scrape, after the endpoint has it.
func TestObserverSeesEveryPublishedScrape(t *testing.T) {
	srv := newPageServer(t, VLLMPage{Waiting: []int{1}, Running: []int{1}, KVUsage: []float64{0.1}}.Render())
	p := pool.New()
	obs := &recordingObserver{}
	s, err := New(testCfg(), Options{Pool: p, Log: zap.NewNop(), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	p.Listen(s)
	p.Set([]string{srv.addr()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "3 updates", func() bool { return obs.n.Load() >= 3 })
	if obs.mismatch.Load() {
		t.Fatal("the observer got metrics the endpoint did not hold")
	}
}

type recordingObserver struct {
	n        atomic.Int64
	mismatch atomic.Bool
}

func (o *recordingObserver) MetricsUpdated(ep *router.Endpoint, m *router.Metrics) {
	if ep.Metrics() != m {
		o.mismatch.Store(true)
	}
	o.n.Add(1)
}

// The per-endpoint gauges report the last good scrape; an endpoint that leaves the pool leaves
// the metrics.
func TestCollectorExportsPerEndpointState(t *testing.T) {
	srv := newPageServer(t, VLLMPage{Waiting: []int{4}, Running: []int{9}, KVUsage: []float64{0.5}, NumGPUBlocks: 1856}.Render())
	h := start(t, testCfg(), srv.addr())
	waitFor(t, "a scrape", func() bool { return h.ep(srv.addr()).Metrics() != nil })
	got := gather(t, h.reg)
	ep := `{endpoint="` + srv.addr() + `"}`
	for name, want := range map[string]float64{
		"kvpick_model_server_requests_waiting": 4, "kvpick_model_server_requests_running": 9,
		"kvpick_model_server_kv_cache_usage_ratio": 0.5, "kvpick_model_server_num_gpu_blocks": 1856,
		"kvpick_model_server_block_size_tokens": 16,
	} {
		if v, ok := got[name+ep]; !ok || v != want {
			t.Errorf("%s = %v (exported %v), want %v", name+ep, v, ok, want)
		}
	}
	if age, ok := got["kvpick_model_server_metrics_age_seconds"+ep]; !ok || age < 0 || age > 60 {
		t.Errorf("age %v (exported %v)", age, ok)
	}
	if n := got[`kvpick_model_server_scrapes_total{endpoint="`+srv.addr()+`",result="ok"}`]; n < 1 {
		t.Errorf("ok scrapes %v", n)
	}
	if got["kvpick_model_server_scrape_duration_seconds"] < 1 {
		t.Error("no scrape duration observed")
	}
	h.pool.Set(nil)
	for k := range gather(t, h.reg) {
		if strings.Contains(k, srv.addr()) {
			t.Errorf("%s still exported after the endpoint left", k)
		}
	}
}

func TestDisabledScraperDoesNothing(t *testing.T) {
	srv := newPageServer(t, nil)
	cfg := testCfg()
	cfg.RefreshInterval = 0
	p := pool.New()
	s, err := New(cfg, Options{Pool: p})
	if err != nil {
		t.Fatal(err)
	}
	p.Listen(s)
	p.Set([]string{srv.addr()})
	s.Run(context.Background()) // returns at once
	if srv.hits.Load() != 0 || len(s.loops) != 0 {
		t.Fatal("a disabled scraper must not scrape")
	}
}

// The connection copes with the ways servers end or shape their answers: every scrape succeeds.
func TestConnectionHandling(t *testing.T) {
	page := VLLMPage{Waiting: []int{1}, Running: []int{2}, KVUsage: []float64{0.5}}.Render()
	tests := []struct {
		name    string
		handler http.HandlerFunc
		server  func(*httptest.Server)
	}{
		{"Connection: close after every answer", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			_, _ = w.Write(page)
		}, nil},
		{"server drops idle connections between scrapes", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write(page)
		}, func(s *httptest.Server) { s.Config.IdleTimeout = time.Millisecond }},
		{"chunked answer in pieces", func(w http.ResponseWriter, r *http.Request) {
			for p := page; len(p) > 0; {
				n := min(len(p), 1000)
				_, _ = w.Write(p[:n])
				w.(http.Flusher).Flush()
				p = p[n:]
			}
		}, nil},
		{"request line and headers as sent", func(w http.ResponseWriter, r *http.Request) {
			if r.Method != "GET" || r.URL.RequestURI() != "/metrics?name[]=x" || r.Host != r.Context().Value(http.LocalAddrContextKey).(net.Addr).String() ||
				r.Header.Get("Accept") != "text/plain;version=0.0.4" || r.Header.Get("Accept-Encoding") != "" {
				w.WriteHeader(400)
				return
			}
			_, _ = w.Write(page)
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewUnstartedServer(tc.handler)
			if tc.server != nil {
				tc.server(srv)
			}
			srv.Start()
			defer srv.Close()
			addr := strings.TrimPrefix(srv.URL, "http://")
			cfg := testCfg()
			if strings.HasPrefix(tc.name, "request line") {
				cfg.Path = "/metrics?name[]=x"
			}
			h := start(t, cfg, addr)
			waitFor(t, "20 good scrapes", func() bool { return h.count(addr, resultOK) >= 20 })
			for r := resultError; r < numResults; r++ {
				if n := h.count(addr, r); n > 0 {
					t.Errorf("%v %s scrapes", n, r)
				}
			}
		})
	}
}

// A scrape blocked on a server that does not answer ends when the picker stops or the
// endpoint leaves, not at its timeout: on a plain TCP connection (the request written by hand,
// the answer awaited on the poller) and on a wrapped one (net.Conn's Write and Read).
func TestStopAbortsAScrapeInFlight(t *testing.T) {
	for _, wrapped := range []bool{false, true} {
		t.Run(fmt.Sprint("wrapped ", wrapped), func(t *testing.T) {
			srv := newPageServer(t, VLLMPage{Waiting: []int{1}, Running: []int{1}, KVUsage: []float64{0.1}}.Render())
			srv.mu.Lock()
			srv.block = make(chan struct{})
			srv.mu.Unlock()
			cfg := testCfg()
			cfg.Timeout = config.Duration(time.Hour)
			cfg.StalenessThreshold = config.Duration(2 * time.Hour)
			core, _ := observer.New(zap.InfoLevel)
			p := pool.New()
			s, err := New(cfg, Options{Pool: p, Log: zap.New(core)})
			if err != nil {
				t.Fatal(err)
			}
			if wrapped {
				s.wrapConn = func(c net.Conn) net.Conn { return struct{ net.Conn }{c} }
			}
			p.Listen(s)
			p.Set([]string{srv.addr(), "127.0.0.1:1"})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { s.Run(ctx); close(done) }()
			waitFor(t, "a request in flight", func() bool { return srv.inFlight.Load() == 1 })
			// The endpoint leaves: its loop's scrape is aborted, the connection closed.
			p.Set([]string{"127.0.0.1:1"})
			waitFor(t, "the server to see the request end", func() bool { return srv.inFlight.Load() == 0 })
			// Back, then the picker stops with a scrape in flight.
			p.Set([]string{srv.addr(), "127.0.0.1:1"})
			waitFor(t, "a request in flight again", func() bool { return srv.inFlight.Load() == 1 })
			cancel()
			waitFor(t, "Run to return", func() bool {
				select {
				case <-done:
					return true
				default:
					return false
				}
			})
		})
	}
}
