package loadgen

import (
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/runnertest"
	"github.com/kvpick/kvpick/pkg/runner"
)

// inProcess is a real picker (runner.Build) behind a gRPC server on loopback, with its metrics
// and pprof on an httptest server, as the scenarios see a picker process.
type inProcess struct {
	pk     *runner.Picker
	target *Target
}

func startInProcess(t *testing.T, endpoints, lruCapacity int) *inProcess {
	t.Helper()
	// The configuration the command starts its picker with.
	y, err := PickerConfig(lruCapacity)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(y)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pool.Endpoints = FakeEndpoints(endpoints)
	pk, addr := runnertest.Serve(t, cfg)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(pk.Registry, promhttp.HandlerOpts{}))
	mux.Handle("/debug/pprof/heap", pprof.Handler("heap"))
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return &inProcess{pk: pk, target: &Target{
		GRPCAddr:   addr,
		MetricsURL: hs.URL + "/metrics",
		PprofURL:   hs.URL + "/debug/pprof",
		Endpoints:  cfg.Pool.Endpoints,
	}}
}

// inFlight sums the pool's in-flight counts.
func (p *inProcess) inFlight() int64 {
	var n int64
	for _, e := range p.pk.Pool.Snapshot() {
		n += e.InFlight()
	}
	return n
}

// settled waits for every stream's server side to end (the deadline bounds a leak's wait; it
// is not a speed requirement).
func (p *inProcess) settled(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for p.inFlight() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("in flight after the run: %d", p.inFlight())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
