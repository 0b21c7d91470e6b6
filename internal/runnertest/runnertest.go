// Package runnertest serves a real picker in-process on a loopback port, for tests of the
// packages that talk to one (the ext_proc server, the dev gateway, the load generator), or
// builds one whose scraper runs, for tests of what it makes of model servers' metrics.
package runnertest

import (
	"context"
	"net"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/runner"
)

// Serve builds a picker from cfg and serves its ext_proc service in plaintext on 127.0.0.1 until
// the test ends. It returns the picker and the ext_proc address.
func Serve(t testing.TB, cfg *config.Config) (*runner.Picker, string) {
	t.Helper()
	pk, err := runner.Build(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(runner.ServerOptions(cfg)...)
	extprocv3.RegisterExternalProcessorServer(gs, pk.Server)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return pk, lis.Addr().String()
}

// Scraping builds a picker from cfg and runs its scraper until the test ends.
func Scraping(t testing.TB, cfg *config.Config) *runner.Picker {
	t.Helper()
	pk, err := runner.Build(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { pk.Scraper.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return pk
}
