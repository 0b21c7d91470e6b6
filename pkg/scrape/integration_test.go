package scrape_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/runnertest"
	"github.com/kvpick/kvpick/pkg/scrape"
)

// modelServer serves a vLLM or SGLang metrics page with the numbers the test sets.
type modelServer struct {
	srv    *httptest.Server
	sglang bool
	blocks int

	mu               sync.Mutex
	waiting, running int
	usage            float64
	hits             atomic.Int64
	// dead: the server drops every connection without answering, as a crashed process's
	// socket does, while the test keeps its port (a port let go could be bound by another
	// test's metrics server under make test's parallel load, and answer for it).
	dead atomic.Bool
}

func newModelServer(t *testing.T, sglang bool, blocks int) *modelServer {
	m := &modelServer{sglang: sglang, blocks: blocks}
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.dead.Load() {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		m.hits.Add(1)
		m.mu.Lock()
		wt, run, u := m.waiting, m.running, m.usage
		m.mu.Unlock()
		if m.sglang {
			_, _ = w.Write(scrape.SGLangPage(wt, run, u, m.blocks))
			return
		}
		_, _ = w.Write(scrape.VLLMPage{Waiting: []int{wt}, Running: []int{run}, KVUsage: []float64{u}, NumGPUBlocks: m.blocks}.Render())
	}))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *modelServer) addr() string { return strings.TrimPrefix(m.srv.URL, "http://") }

func (m *modelServer) set(waiting, running int, usage float64) {
	m.mu.Lock()
	m.waiting, m.running, m.usage = waiting, running, usage
	m.mu.Unlock()
}

// The picker built by runner.Build (runnertest.Scraping) scrapes real HTTP metric servers on loopback and its
// endpoints follow their numbers as they change; a server that dies goes stale without
// disturbing the others; an endpoint that leaves the pool is no longer scraped.
func TestPickerEndpointsFollowTheirServers(t *testing.T) {
	servers := []*modelServer{newModelServer(t, false, 768), newModelServer(t, false, 1856), newModelServer(t, true, 29000)}
	cfg := config.Default()
	for _, s := range servers {
		cfg.Pool.Endpoints = append(cfg.Pool.Endpoints, s.addr())
	}
	cfg.Pool.Metrics.RefreshInterval = config.Duration(10 * time.Millisecond)
	cfg.Pool.Metrics.StalenessThreshold = config.Duration(300 * time.Millisecond)
	cfg.Pool.Metrics.Timeout = config.Duration(time.Second)
	pk := runnertest.Scraping(t, cfg)

	type want struct {
		waiting, running int
		usage            float64
	}
	follow := func(phase string, servers []*modelServer, wants []want) {
		t.Helper()
		for i, s := range servers {
			s.set(wants[i].waiting, wants[i].running, wants[i].usage)
		}
		deadline := time.Now().Add(20 * time.Second)
		for i, s := range servers {
			ep := pk.Pool.Lookup(s.addr())
			for {
				m := ep.FreshMetrics(time.Now())
				if m != nil && m.HasQueue && m.HasKVUsage && m.Waiting == wants[i].waiting && m.Running == wants[i].running && m.KVUsage == wants[i].usage {
					if m.CapacityTokens() != map[bool]int64{false: int64(s.blocks) * 16, true: int64(s.blocks)}[s.sglang] {
						t.Fatalf("%s: %s capacity %d tokens", phase, s.addr(), m.CapacityTokens())
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: endpoint %s shows %+v, want %+v", phase, s.addr(), m, wants[i])
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	follow("start", servers, []want{{0, 0, 0}, {0, 0, 0}, {0, 0, 0}})
	follow("load arrives", servers, []want{{12, 256, 0.98}, {0, 40, 0.5}, {3, 17, 0.25}})
	follow("load moves", servers, []want{{0, 30, 0.25}, {9, 256, 0.875}, {0, 0, 0.0625}})

	// The registry shows what the endpoints hold.
	mfs, err := pk.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	waiting := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "kvpick_model_server_requests_waiting" {
			for _, m := range mf.GetMetric() {
				waiting[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	if waiting[servers[0].addr()] != 0 || waiting[servers[1].addr()] != 9 || waiting[servers[2].addr()] != 0 || len(waiting) != 3 {
		t.Fatalf("kvpick_model_server_requests_waiting %v", waiting)
	}

	// The SGLang server dies: its metrics go stale, its capacity stays known, the others go on.
	dead := servers[2]
	deadEP := pk.Pool.Lookup(dead.addr())
	// It once stayed fresh for 20 s under make test's load when the test closed the server's
	// listener and connections instead: a connection opened in between, or the freed port
	// bound by another test's server, went on answering.
	dead.dead.Store(true)
	dead.srv.CloseClientConnections()
	for deadline := time.Now().Add(20 * time.Second); deadEP.FreshMetrics(time.Now()) != nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a dead server's metrics never went stale")
		}
	}
	if m := deadEP.Metrics(); m == nil || m.NumGPUBlocks != 29000 {
		t.Fatalf("the dead server's last metrics %+v", m)
	}
	follow("one server dead", servers[:2], []want{{5, 5, 0.5}, {6, 6, 0.625}})

	// An endpoint that leaves the pool is no longer scraped.
	gone := servers[0]
	pk.Pool.Set([]string{servers[1].addr()})
	atRemoval := gone.hits.Load()
	follow("after a removal", servers[1:2], []want{{1, 2, 0.125}})
	follow("after a removal, again", servers[1:2], []want{{2, 3, 0.25}})
	if n := gone.hits.Load() - atRemoval; n > 1 {
		t.Fatalf("a removed endpoint was scraped %d more times", n)
	}

}
