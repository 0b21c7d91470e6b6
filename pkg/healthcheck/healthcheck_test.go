package healthcheck

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/pool"
)

// settle bounds how long a test waits for probes that run every few milliseconds: a liveness
// bound for a stuck loop, not a speed requirement.
const settle = 20 * time.Second

func cfg(interval time.Duration, unhealthy, healthy int) config.HealthCheck {
	return config.HealthCheck{Path: "/health", Interval: config.Duration(interval), Timeout: config.Duration(settle),
		UnhealthyThreshold: unhealthy, HealthyThreshold: healthy}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestThresholdsDecideTheVerdict(t *testing.T) {
	c := cfg(time.Second, 2, 2)
	tests := []struct {
		name    string
		probes  string // one letter per probe: o = ok, x = failed
		healthy bool
		changes []verdict
	}{
		{"new endpoint, first probe good", "o", true, []verdict{firstHealthy}},
		{"new endpoint never answers", "xxxx", false, nil},
		{"new endpoint answers late", "xxo", true, []verdict{firstHealthy}},
		{"one failure is tolerated", "oxo", true, []verdict{firstHealthy}},
		{"two failures in a row", "oxx", false, []verdict{firstHealthy, becameUnhealthy}},
		{"recovery needs two successes", "oxxo", false, []verdict{firstHealthy, becameUnhealthy}},
		{"recovered", "oxxoo", true, []verdict{firstHealthy, becameUnhealthy, becameHealthy}},
		{"a failure resets the success streak", "oxxoxoo", true, []verdict{firstHealthy, becameUnhealthy, becameHealthy}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var h health
			var got []verdict
			for _, p := range tc.probes {
				if v := h.record(p == 'o', c); v != unchanged {
					got = append(got, v)
				}
			}
			if h.healthy != tc.healthy || len(got) != len(tc.changes) {
				t.Fatalf("healthy %v, changes %v; want %v, %v", h.healthy, got, tc.healthy, tc.changes)
			}
			for i := range got {
				if got[i] != tc.changes[i] {
					t.Fatalf("changes %v, want %v", got, tc.changes)
				}
			}
		})
	}
}

// TestNewEndpointsAreUnhealthyUntilTheirFirstGoodProbe: an endpoint that joins the pool while
// the checker runs is never visible as healthy before a probe of it succeeded.
func TestNewEndpointsAreUnhealthyUntilTheirFirstGoodProbe(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	p := pool.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	New(cfg(time.Hour, 2, 2), zap.NewNop()).Watch(ctx, p)
	addr := strings.TrimPrefix(srv.URL, "http://")
	p.Set([]string{addr})
	e := p.Lookup(addr)
	if e.Healthy() {
		t.Fatal("a new endpoint is healthy before any probe answered")
	}
	close(release)
	waitFor(t, "the first good probe", e.Healthy)
}

// TestEndpointsAlreadyInThePoolAreProbedFirst: Watch on a populated pool takes its endpoints out
// until they answer.
func TestEndpointsAlreadyInThePoolAreProbedFirst(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	p := pool.New()
	up := strings.TrimPrefix(srv.URL, "http://")
	p.Set([]string{up, "127.0.0.1:1"}) // port 1: connection refused
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	New(cfg(5*time.Millisecond, 2, 1), zap.NewNop()).Watch(ctx, p)
	if p.Lookup("127.0.0.1:1").Healthy() {
		t.Fatal("an endpoint never probed is healthy once the checker runs")
	}
	waitFor(t, "the live endpoint's first probe", p.Lookup(up).Healthy)
}

// TestDisabledChecksLeaveEndpointsHealthy: with interval 0 nothing probes, so nothing may hold
// endpoints back.
func TestDisabledChecksLeaveEndpointsHealthy(t *testing.T) {
	p := pool.New()
	c := New(cfg(0, 2, 1), zap.NewNop())
	c.Watch(context.Background(), p)
	p.Set([]string{"127.0.0.1:1"})
	if !p.Lookup("127.0.0.1:1").Healthy() || c.Loops() != 0 {
		t.Fatalf("healthy %v, %d loops; want healthy and no loop", p.Lookup("127.0.0.1:1").Healthy(), c.Loops())
	}
}

// TestEndpointsGoUnhealthyAndRecover, through real probes.
func TestEndpointsGoUnhealthyAndRecover(t *testing.T) {
	var status atomic.Int32
	status.Store(200)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			w.WriteHeader(404)
			return
		}
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	p := pool.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	New(cfg(5*time.Millisecond, 2, 2), zap.NewNop()).Watch(ctx, p)
	addr := strings.TrimPrefix(srv.URL, "http://")
	p.Set([]string{addr, "127.0.0.1:1"})
	up, down := p.Lookup(addr), p.Lookup("127.0.0.1:1")
	waitFor(t, "the live endpoint healthy", up.Healthy)
	status.Store(503)
	waitFor(t, "503s to take the endpoint out", func() bool { return !up.Healthy() })
	status.Store(200)
	waitFor(t, "recovery", up.Healthy)
	if down.Healthy() {
		t.Fatal("an endpoint that refuses connections is healthy")
	}
}

// TestProbesReuseOneConnection: the probes of an endpoint share a kept-alive connection instead
// of a handshake each.
func TestProbesReuseOneConnection(t *testing.T) {
	var conns, probes atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		probes.Add(1)
		_, _ = w.Write([]byte("ok"))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	p := pool.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	New(cfg(2*time.Millisecond, 2, 1), zap.NewNop()).Watch(ctx, p)
	p.Set([]string{strings.TrimPrefix(srv.URL, "http://")})
	waitFor(t, "20 probes", func() bool { return probes.Load() >= 20 })
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d probes opened %d connections, want 1", probes.Load(), n)
	}
}

// TestOneLoopPerEndpoint: each endpoint has one probe loop while it is in the pool; loops end
// when their endpoint leaves and when the checker stops.
func TestOneLoopPerEndpoint(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	p := pool.New()
	ctx, cancel := context.WithCancel(context.Background())
	c := New(cfg(2*time.Millisecond, 2, 1), zap.NewNop())
	c.Watch(ctx, p)
	addr := strings.TrimPrefix(srv.URL, "http://")
	p.Set([]string{addr, "127.0.0.1:1", "127.0.0.1:2"})
	if n := c.Loops(); n != 3 {
		t.Fatalf("%d loops for 3 endpoints", n)
	}
	p.Set([]string{addr, "127.0.0.1:1", "127.0.0.1:2"}) // no change: no new loop
	if n := c.Loops(); n != 3 {
		t.Fatalf("%d loops after an unchanged Set", n)
	}
	p.Set([]string{addr})
	waitFor(t, "the removed endpoints' loops to end", func() bool { return c.Loops() == 1 })
	cancel()
	waitFor(t, "every loop to end", func() bool { return c.Loops() == 0 })
}
