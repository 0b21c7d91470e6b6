package runner

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/dataplane"
)

// running is a picker served by Run in the test.
type running struct {
	grpc, health *grpc.ClientConn
	cancel       context.CancelFunc
	done         chan error
}

func run(t *testing.T, cfg *config.Config) *running {
	t.Helper()
	ready := make(chan [2]string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- Run(ctx, Options{
			GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
			Config: cfg, Log: zap.NewNop(),
			Ready: func(g, h, _ net.Addr) { ready <- [2]string{g.String(), h.String()} },
		})
	}()
	var addrs [2]string
	select {
	case addrs = <-ready:
	case err := <-r.done:
		cancel()
		t.Fatalf("Run: %v", err)
	}
	var err error
	if r.grpc, err = grpc.NewClient(addrs[0], grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	if r.health, err = grpc.NewClient(addrs[1], grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		r.grpc.Close()
		r.health.Close()
	})
	return r
}

func status(t *testing.T, conn *grpc.ClientConn, svc string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
	if err != nil {
		t.Fatalf("health %q: %v", svc, err)
	}
	return resp.GetStatus()
}

// waitStatus polls until every service reports want; the deadline only bounds a broken run.
func waitStatus(t *testing.T, conn *grpc.ClientConn, want healthpb.HealthCheckResponse_ServingStatus, svcs ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok := true
		for _, svc := range svcs {
			if status(t, conn, svc) != want {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("services %q never reported %v", svcs, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func staticConfig(endpoints ...string) *config.Config {
	cfg := config.Default()
	cfg.Pool.Endpoints = endpoints
	cfg.Pool.HealthCheck.Interval = 0 // nothing listens behind the endpoints
	cfg.Shutdown.Delay = 0
	return cfg
}

func TestReadinessFollowsAnEmptyStaticPool(t *testing.T) {
	tests := []struct {
		name      string
		endpoints []string
		want      healthpb.HealthCheckResponse_ServingStatus
	}{
		{"empty pool is not ready", nil, healthpb.HealthCheckResponse_NOT_SERVING},
		{"non-empty pool is ready", []string{"127.0.0.1:8001"}, healthpb.HealthCheckResponse_SERVING},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, staticConfig(tc.endpoints...))
			for _, svc := range readinessServices {
				if got := status(t, r.health, svc); got != tc.want {
					t.Errorf("health port, service %q = %v, want %v", svc, got, tc.want)
				}
			}
			if got := status(t, r.grpc, ServiceExtProc); got != tc.want {
				t.Errorf("ext_proc port, service %q = %v, want %v", ServiceExtProc, got, tc.want)
			}
			if got := status(t, r.health, ServiceLiveness); got != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("liveness = %v, want SERVING whatever the pool", got)
			}
		})
	}
}

func TestReadinessServesTheReferenceChartsProbeName(t *testing.T) {
	r := run(t, staticConfig("127.0.0.1:8001"))
	if got := status(t, r.health, "inference-extension"); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("inference-extension = %v", got)
	}
}

// On shutdown, readiness goes first while liveness stays, a stream opened before the signal
// finishes normally, and Run returns only after it.
func TestShutdownTurnsNotReadyThenDrainsOpenStreams(t *testing.T) {
	cfg := staticConfig("127.0.0.1:8001")
	cfg.Shutdown.Delay = config.Duration(200 * time.Millisecond)
	r := run(t, cfg)
	waitStatus(t, r.health, healthpb.HealthCheckResponse_SERVING, ServiceReadiness)

	x, err := dataplane.New(r.grpc, dataplane.WithMessageTimeout(time.Minute)).Open(context.Background(), dataplane.FullDuplex())
	if err != nil {
		t.Fatal(err)
	}
	routed, err := x.Request(&dataplane.HTTPRequest{Method: "POST", Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"a long generation"}`)})
	if err != nil || routed.Destination != "127.0.0.1:8001" {
		t.Fatalf("routing: %v %+v", err, routed)
	}

	r.cancel()
	waitStatus(t, r.health, healthpb.HealthCheckResponse_NOT_SERVING, readinessServices...)
	if got := status(t, r.health, ServiceLiveness); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness = %v while draining, want SERVING", got)
	}
	select {
	case err := <-r.done:
		t.Fatalf("Run returned (%v) while a stream was open", err)
	default:
	}
	if _, err := x.Response(&dataplane.HTTPResponse{Status: 200, Body: []byte(`{"choices":[]}`)}); err != nil {
		t.Fatalf("the open stream was cut: %v", err)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return once the last stream ended")
	}
}

func TestStaticPoolAndKubernetesAreExclusive(t *testing.T) {
	err := Run(context.Background(), Options{
		Config: staticConfig("127.0.0.1:8001"), Log: zap.NewNop(),
		Kubernetes: &Kubernetes{PoolName: "p"},
	})
	if !errors.Is(err, ErrStaticAndKubernetes) {
		t.Fatalf("err = %v", err)
	}
}

// TestReadinessWaitsForAHealthyEndpoint: with health checks on, endpoints join unhealthy until
// their first good probe; until one has passed, every request would be answered 503, so the
// picker is not ready. It turns ready at the first good probe and not ready again when every
// endpoint fails its checks.
func TestReadinessWaitsForAHealthyEndpoint(t *testing.T) {
	var healthy atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	cfg := staticConfig(strings.TrimPrefix(srv.URL, "http://"))
	cfg.Pool.HealthCheck.Interval = config.Duration(20 * time.Millisecond)
	cfg.Pool.HealthCheck.Timeout = config.Duration(10 * time.Millisecond)
	cfg.Pool.Metrics.RefreshInterval = 0
	r := run(t, cfg)
	time.Sleep(100 * time.Millisecond) // several failed probes
	if got := status(t, r.health, ServiceReadiness); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("readiness %v while the only endpoint fails its probes", got)
	}
	healthy.Store(true)
	waitStatus(t, r.health, healthpb.HealthCheckResponse_SERVING, readinessServices...)
	healthy.Store(false)
	waitStatus(t, r.health, healthpb.HealthCheckResponse_NOT_SERVING, readinessServices...)
}
