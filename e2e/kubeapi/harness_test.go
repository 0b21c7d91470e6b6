package kubeapi

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/internal/kubetest"
	"github.com/kvpick/kvpick/internal/promtext"
	"github.com/kvpick/kvpick/pkg/runner"
)

// settle bounds every wait: a race-built picker and an API server on a loaded 2-core machine
// are slow, and a wait that runs out fails with what it last saw instead of hanging.
const settle = time.Minute

var cluster kubetest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	cluster.Stop()
	os.Exit(code)
}

// env is a namespace of the shared cluster with the CRDs installed.
type env struct{ *kubetest.Env }

func newEnv(t *testing.T) *env { return &env{cluster.Env(t)} }

// servers are model-server stand-ins on loopback addresses: they answer the picker's health
// probes (GET /health), 200 unless told otherwise.
type servers struct {
	mu     sync.Mutex
	status map[string]*atomic.Int32 // "ip:port" -> /health status
}

// serve listens on every ip × port and returns the ports it used: the same ports on every IP,
// as pods of one pool serve on the same target ports.
func serve(t *testing.T, ips []string, nports int) (*servers, []int32) {
	t.Helper()
	s := &servers{status: map[string]*atomic.Int32{}}
	for attempt := 0; attempt < 20; attempt++ {
		var ls []net.Listener
		var ports []int32
		ok := true
		for i := 0; i < nports && ok; i++ {
			l, err := net.Listen("tcp", net.JoinHostPort(ips[0], "0"))
			if err != nil {
				t.Fatal(err)
			}
			ls = append(ls, l)
			ports = append(ports, int32(l.Addr().(*net.TCPAddr).Port))
		}
		for _, ip := range ips[1:] {
			for _, p := range ports {
				l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(int(p))))
				if err != nil {
					ok = false // taken on that address: try other ports
					break
				}
				ls = append(ls, l)
			}
		}
		if !ok {
			for _, l := range ls {
				l.Close()
			}
			continue
		}
		for _, l := range ls {
			addr := l.Addr().String()
			st := &atomic.Int32{}
			st.Store(http.StatusOK)
			s.status[addr] = st
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/health" {
					w.WriteHeader(int(st.Load()))
					return
				}
				http.NotFound(w, r)
			}), ReadHeaderTimeout: 5 * time.Second}
			go func() { _ = srv.Serve(l) }()
			t.Cleanup(func() { srv.Close() })
		}
		return s, ports
	}
	t.Fatal("no ports free on every address")
	return nil, nil
}

// setHealth sets what addr answers to health probes.
func (s *servers) setHealth(addr string, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status[addr].Store(int32(status))
}

// picker is a picker run in-process by runner.Run in Kubernetes mode.
type picker struct {
	grpc, health *grpc.ClientConn
	metrics      *promtext.Scraper
	cancel       context.CancelFunc
	done         chan error
}

type pickerOpts struct {
	pool, group        string
	leader             bool
	unhealthyThreshold int // 0: the default
}

func startPicker(t *testing.T, e *env, o pickerOpts) *picker {
	t.Helper()
	cfg := config.Default()
	cfg.Pool.HealthCheck.Interval = config.Duration(100 * time.Millisecond)
	cfg.Pool.HealthCheck.Timeout = config.Duration(100 * time.Millisecond)
	cfg.Pool.Metrics.RefreshInterval = 0 // the stand-ins serve no model-server metrics
	if o.unhealthyThreshold > 0 {
		cfg.Pool.HealthCheck.UnhealthyThreshold = o.unhealthyThreshold
	}
	cfg.Shutdown.Delay = 0
	cfg.Kubernetes.LeaderElection.LeaseDuration = config.Duration(4 * time.Second)
	cfg.Kubernetes.LeaderElection.RenewDeadline = config.Duration(3 * time.Second)
	cfg.Kubernetes.LeaderElection.RetryPeriod = config.Duration(200 * time.Millisecond)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &picker{cancel: cancel, done: make(chan error, 1)}
	ready := make(chan [3]string, 1)
	go func() {
		p.done <- runner.Run(ctx, runner.Options{
			GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
			Config: cfg, Log: kubetest.Logger(t),
			Ready: func(g, h, m net.Addr) { ready <- [3]string{g.String(), h.String(), m.String()} },
			Kubernetes: &runner.Kubernetes{
				Kubeconfig: e.Cluster.KubeconfigPath(), PoolName: o.pool, PoolNamespace: e.NS, PoolGroup: o.group,
				LeaderElection: o.leader,
			},
		})
	}()
	var a [3]string
	select {
	case a = <-ready:
	case err := <-p.done:
		cancel()
		t.Fatalf("runner.Run: %v", err)
	}
	var err error
	if p.grpc, err = grpc.NewClient(a[0], grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	if p.health, err = grpc.NewClient(a[1], grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	p.metrics = promtext.NewScraper("http://" + a[2] + "/metrics")
	t.Cleanup(func() {
		p.stop(t)
		p.grpc.Close()
		p.health.Close()
	})
	return p
}

// stop cancels the picker and waits for Run to return.
func (p *picker) stop(t *testing.T) {
	t.Helper()
	p.cancel()
	select {
	case err, ok := <-p.done:
		if ok && err != nil {
			t.Errorf("runner.Run: %v", err)
		}
		if ok {
			close(p.done)
		}
	case <-time.After(settle):
		t.Error("runner.Run did not return after cancel")
	}
}

func (p *picker) ready(t *testing.T) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := healthpb.NewHealthClient(p.health).Check(context.Background(), &healthpb.HealthCheckRequest{Service: runner.ServiceReadiness})
	if err != nil {
		t.Fatalf("readiness: %v", err)
	}
	return resp.GetStatus()
}

func (p *picker) metric(t *testing.T, name string) float64 {
	t.Helper()
	m, err := p.metrics.Scrape(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m.Value(name)
}

// route sends one request through the ext_proc API as a proxy would and returns the endpoint
// the picker chose, or "503" when it answered with that status.
func (p *picker) route(t *testing.T, prompt string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), settle)
	defer cancel()
	body := fmt.Appendf(nil, `{"model":"m","prompt":%q,"max_tokens":4}`, prompt)
	// The proxy's message timeout raised from 5 s: a race-built picker on a loaded 2-core
	// machine can take longer to answer, and this test is about where requests go.
	routed, _, err := dataplane.New(p.grpc, dataplane.WithMessageTimeout(settle)).Do(ctx, dataplane.FullDuplex(),
		&dataplane.HTTPRequest{Method: "POST", Path: "/v1/completions", Body: body},
		&dataplane.HTTPResponse{Status: 200, Body: []byte(`{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":40,"completion_tokens":4}}`)})
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	if routed.Immediate != nil {
		return strconv.Itoa(routed.Immediate.Status)
	}
	return routed.Destination
}

// eventually polls f until it returns "", failing the test with f's last answer after settle.
func eventually(t *testing.T, what string, f func() string) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// destinations routes n requests with distinct prompts and returns the endpoints they went to.
func (p *picker) destinations(t *testing.T, n int, tag string) []string {
	t.Helper()
	seen := map[string]bool{}
	for i := range n {
		seen[p.route(t, fmt.Sprintf("%s request %d: a prompt long enough to span several blocks of the prefix index, so that each one is its own prefix", tag, i))] = true
	}
	var out []string
	for d := range seen {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// waitRoutes waits until n requests go exactly to want (sorted).
func (p *picker) waitRoutes(t *testing.T, what string, n int, want ...string) {
	t.Helper()
	slices.Sort(want)
	round := 0
	eventually(t, what, func() string {
		round++
		got := p.destinations(t, n, fmt.Sprintf("%s/%d", what, round))
		if slices.Equal(got, want) {
			return ""
		}
		return fmt.Sprintf("routed to %v, want %v", got, want)
	})
}

func addr(ip string, port int32) string { return net.JoinHostPort(ip, strconv.Itoa(int(port))) }

func dial(t *testing.T, target string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
