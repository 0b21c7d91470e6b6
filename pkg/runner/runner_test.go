package runner

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/dataplane"
)

func startPicker(t *testing.T, secure bool) (grpcAddr, healthAddr, metricsAddr string, stop func() error) {
	t.Helper()
	return startPickerWith(t, secure, nil)
}

// startPickerWith is startPicker with edit applied to Run's options.
func startPickerWith(t *testing.T, secure bool, edit func(*Options)) (grpcAddr, healthAddr, metricsAddr string, stop func() error) {
	t.Helper()
	cfg := config.Default()
	cfg.Pool.Endpoints = []string{"127.0.0.1:8001"}
	cfg.Pool.HealthCheck.Interval = 0 // no server behind the endpoint
	ready := make(chan [3]string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	o := Options{
		GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		Config: cfg, SecureServing: secure, Log: zap.NewNop(),
		Ready: func(g, h, m net.Addr) { ready <- [3]string{g.String(), h.String(), m.String()} },
	}
	if edit != nil {
		edit(&o)
	}
	go func() { done <- Run(ctx, o) }()
	select {
	case a := <-ready:
		return a[0], a[1], a[2], func() error {
			cancel()
			select {
			case err := <-done:
				return err
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return after cancel")
				return nil
			}
		}
	case err := <-done:
		cancel()
		t.Fatalf("Run failed: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("picker not ready")
	}
	return
}

func checkHealth(t *testing.T, conn *grpc.ClientConn, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health %q: %v", service, err)
	}
	if resp.GetStatus() != want {
		t.Fatalf("health %q = %v, want %v", service, resp.GetStatus(), want)
	}
}

func TestRunServesExtProcHealthAndMetrics(t *testing.T) {
	for _, secure := range []bool{true, false} {
		name := "plaintext"
		if secure {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			g, h, m, stop := startPicker(t, secure)
			creds := insecure.NewCredentials()
			if secure {
				creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})
			}
			gconn, err := grpc.NewClient(g, grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			defer gconn.Close()
			hconn, err := grpc.NewClient(h, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer hconn.Close()
			for _, svc := range []string{"", ServiceLiveness, ServiceReadiness, ServiceExtProc} {
				checkHealth(t, hconn, svc, healthpb.HealthCheckResponse_SERVING)
			}
			// Envoy health-checks the ext_proc cluster on the ext_proc port itself.
			checkHealth(t, gconn, ServiceExtProc, healthpb.HealthCheckResponse_SERVING)

			routed, _, err := dataplane.New(gconn).Do(context.Background(), dataplane.FullDuplex(), &dataplane.HTTPRequest{
				Method: "POST", Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"hello there"}`),
			}, &dataplane.HTTPResponse{Status: 200, Body: []byte("{}")})
			if err != nil || routed.Destination != "127.0.0.1:8001" {
				t.Fatalf("routing over %s: %v %+v", name, err, routed)
			}

			for path, want := range map[string]string{
				"/metrics": "kvpick_requests_total",
			} {
				resp, err := http.Get("http://" + m + path)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
					t.Fatalf("GET %s: %d, body lacks %q", path, resp.StatusCode, want)
				}
			}
			if err := stop(); err != nil {
				t.Fatalf("Run returned %v after cancel", err)
			}
		})
	}
}

func TestBuildRejectsBadPool(t *testing.T) {
	cfg := config.Default()
	cfg.Pool.Endpoints = []string{"10.0.0.1"}
	if _, err := Build(cfg, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "pool.endpoints[0]") {
		t.Fatalf("err = %v", err)
	}
}

// TestPprofIsServedOnlyWhenEnabled: /debug/pprof/ exposes the process's internals (command line,
// heap contents in profiles): off unless asked for, on the metrics address.
func TestPprofIsServedOnlyWhenEnabled(t *testing.T) {
	for _, enabled := range []bool{false, true} {
		t.Run(fmt.Sprintf("enabled=%v", enabled), func(t *testing.T) {
			_, _, m, stop := startPickerWith(t, false, func(o *Options) {
				o.EnablePprof = enabled
				o.Config.Shutdown.Delay = 0
			})
			defer func() { _ = stop() }()
			resp, err := http.Get("http://" + m + "/debug/pprof/")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			served := resp.StatusCode == 200 && strings.Contains(string(b), "goroutine")
			if served != enabled {
				t.Fatalf("GET /debug/pprof/: %d (served %v), want served %v", resp.StatusCode, served, enabled)
			}
		})
	}
}

// TestPeersNeedThePrefixIndex: with peers configured the picker shares its prefix index's
// commits (a log and a poller); without them it builds neither; peers with no prefix-scorer
// among the plugins are refused.
func TestPeersNeedThePrefixIndex(t *testing.T) {
	cfg := config.Default()
	pk, err := Build(cfg, zap.NewNop())
	if err != nil || pk.PeerLog != nil || pk.Peers != nil {
		t.Fatalf("no peers: err %v, log %v, poller %v", err, pk.PeerLog, pk.Peers)
	}
	cfg.Peers.Addresses = []string{"kvpick-peers:9090"}
	if pk, err = Build(cfg, zap.NewNop()); err != nil || pk.PeerLog == nil || pk.Peers == nil {
		t.Fatalf("peers: err %v", err)
	}
	// The default plugins: a peer's pick there is counted and charged to the endpoint's
	// prefill queue (the prefill scorer observes the index's peer picks) until it ends.
	pk.Pool.Set([]string{"10.0.0.1:8000", "10.0.0.2:8000"})
	ep := pk.Pool.Lookup("10.0.0.2:8000")
	if !pk.PeerSink.ApplyPeerPick(3, 1, ep.Addr, []uint64{11, 12, 13}) || ep.Picks() != 1 || ep.QueuedPrefill() <= 3 {
		t.Fatalf("a peer's pick of 3 uncached blocks: %d picks, %d blocks queued", ep.Picks(), ep.QueuedPrefill())
	}
	pk.PeerSink.ApplyPeerCommit(3, 1, ep.Addr, []uint64{11, 12, 13})
	if ep.QueuedPrefill() != 0 {
		t.Fatalf("%d blocks queued after the peer's commit", ep.QueuedPrefill())
	}
	cfg.Plugins = []config.Plugin{{Name: "inflight-scorer"}, {Name: "max-score-picker"}}
	if _, err := Build(cfg, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "prefix-scorer") {
		t.Fatalf("peers without the prefix index: err %v", err)
	}
}
