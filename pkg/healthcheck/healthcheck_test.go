package healthcheck

import (
	"context"
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

func TestEndpointsGoUnhealthyAfterThresholdAndRecover(t *testing.T) {
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
	addr := strings.TrimPrefix(srv.URL, "http://")
	p.Set([]string{addr, "127.0.0.1:1"}) // port 1: connection refused
	c := New(config.HealthCheck{Path: "/health", Interval: config.Duration(time.Second), Timeout: config.Duration(time.Second),
		UnhealthyThreshold: 2, HealthyThreshold: 2}, p, zap.NewNop())
	up, down := p.Lookup(addr), p.Lookup("127.0.0.1:1")
	ctx := context.Background()

	c.Round(ctx)
	if !up.Healthy() || !down.Healthy() {
		t.Fatal("one failure must not mark an endpoint unhealthy (threshold 2)")
	}
	c.Round(ctx)
	if !up.Healthy() || down.Healthy() {
		t.Fatalf("after two rounds: up healthy=%v, refused healthy=%v", up.Healthy(), down.Healthy())
	}
	status.Store(503)
	c.Round(ctx)
	c.Round(ctx)
	if up.Healthy() {
		t.Fatal("two 503s must mark the endpoint unhealthy")
	}
	status.Store(200)
	c.Round(ctx)
	if up.Healthy() {
		t.Fatal("recovery needs two successes (healthyThreshold 2)")
	}
	c.Round(ctx)
	if !up.Healthy() {
		t.Fatal("two successes must mark the endpoint healthy again")
	}
	p.Set([]string{addr})
	c.Round(ctx)
	if len(c.streak) != 1 {
		t.Fatalf("checker remembers %d endpoints, want 1", len(c.streak))
	}
}
