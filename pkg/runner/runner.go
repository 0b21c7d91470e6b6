// Package runner runs the picker process: it builds the pipeline from the configuration,
// serves ext_proc (and gRPC health on the same port, for Envoy's cluster health check), gRPC
// health on its own port (for Kubernetes probes), Prometheus metrics and pprof, and shuts all
// of it down gracefully.
package runner

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/certs"
	"github.com/kvpick/kvpick/pkg/extproc"
	"github.com/kvpick/kvpick/pkg/healthcheck"
	"github.com/kvpick/kvpick/pkg/peers"
	"github.com/kvpick/kvpick/pkg/plugins"
	"github.com/kvpick/kvpick/pkg/pool"
	"github.com/kvpick/kvpick/pkg/prefix"
	"github.com/kvpick/kvpick/pkg/router"
	"github.com/kvpick/kvpick/pkg/scrape"
)

// Health service names.
const (
	ServiceLiveness  = "liveness"
	ServiceReadiness = "readiness"
	ServiceExtProc   = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// Options are the process's settings.
type Options struct {
	GRPCAddr, HealthAddr, MetricsAddr string // listen addresses, "host:port"
	Config                            *config.Config
	SecureServing                     bool
	CertPath                          string // directory with tls.crt and tls.key; "" = self-signed
	Log                               *zap.Logger
	// Ready, when set, receives the bound addresses once every listener is up.
	Ready func(grpc, health, metrics net.Addr)
	// Kubernetes, when set, fills the pool from an InferencePool (kube.go) instead of the
	// configuration's static endpoints, which must then be empty.
	Kubernetes *Kubernetes
	// EnablePprof serves /debug/pprof/ on MetricsAddr. Off by default: profiles expose the
	// process's internals (its command line, what its heap holds).
	EnablePprof bool
}

// Picker is a built, not yet serving, picker.
type Picker struct {
	Pool     *pool.Pool
	Pipeline *router.Pipeline
	Server   *extproc.Server
	Registry *prometheus.Registry
	// Scraper reads every endpoint's model-server metrics (pool.metrics); Run starts it.
	Scraper *scrape.Scraper
	// PeerLog and Peers share the prefix index's commits with the other active replicas
	// (config peers); nil when no peers are configured. Run serves the log and starts Peers.
	PeerLog *peers.Log
	Peers   *peers.Poller
	// PeerSink is what Peers applies the other replicas' entries to (the prefix plugin, which
	// tells the prefill scorer of their picks); nil without peers.
	PeerSink peers.Sink
}

// Build assembles the pool, the plugins, the pipeline and the ext_proc server from cfg, and
// populates the pool with cfg's static endpoints. Errors name the offending field.
func Build(cfg *config.Config, log *zap.Logger) (*Picker, error) {
	pk, addrs, err := build(cfg, log)
	if err != nil {
		return nil, err
	}
	pk.Pool.Set(addrs)
	return pk, nil
}

// build is Build without populating the pool: Run hands the static endpoints, or those
// discovery finds, to the pool through its readiness gate.
func build(cfg *config.Config, log *zap.Logger) (*Picker, []string, error) {
	addrs, err := pool.ParseAddrs("pool.endpoints", cfg.Pool.Endpoints)
	if err != nil {
		return nil, nil, err
	}
	reg := prometheus.NewRegistry()
	built, err := plugins.Build(cfg.Plugins, plugins.Deps{Registerer: reg, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	p := pool.New()
	for _, pl := range built.Plugins {
		if l, ok := pl.(router.PoolListener); ok {
			p.Listen(l)
		}
	}
	pipe, err := router.New(router.Config{Pool: p, Plugins: built.Plugins, Weights: built.Weights, Fallbacks: cfg.ExtProc.Fallbacks})
	if err != nil {
		return nil, nil, fmt.Errorf("plugins: %w", err)
	}
	// Listening before the pool is populated, the scraper gets a loop for every endpoint.
	sc, err := scrape.New(cfg.Pool.Metrics, scrape.Options{Pool: p, Log: log, Registerer: reg, Observer: pipe})
	if err != nil {
		return nil, nil, err
	}
	p.Listen(sc)
	srv, err := extproc.New(pipe, extproc.Options{
		MaxBodyBytes:    cfg.ExtProc.MaxBodyBytes,
		ChunkBytes:      cfg.ExtProc.ChunkBytes,
		AssumedBodyMode: cfg.ExtProc.AssumedBodyMode,
		Log:             log,
		Metrics:         extproc.NewMetrics(reg),
		ExplainHeader:   cfg.ExtProc.ExplainHeader,
		MatchBlocks: func(req *router.Request, ep *router.Endpoint) (int, int) {
			m := prefix.MatchesOf(req)
			return m.Blocks(ep), m.Total
		},
	})
	if err != nil {
		return nil, nil, err
	}
	reg.MustRegister(pool.NewCollector(p), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pk := &Picker{Pool: p, Pipeline: pipe, Server: srv, Registry: reg, Scraper: sc}
	if err := pk.linkPeers(cfg.Peers, built.Plugins, reg, log); err != nil {
		return nil, nil, err
	}
	return pk, addrs, nil
}

// linkPeers has the prefix index share its commits with the configured peers (pkg/peers).
func (pk *Picker) linkPeers(c config.Peers, plugs []router.Plugin, reg prometheus.Registerer, log *zap.Logger) error {
	if len(c.Addresses) == 0 {
		return nil
	}
	var idx *prefix.Plugin
	for _, pl := range plugs {
		if p, ok := pl.(*prefix.Plugin); ok {
			idx = p
		}
	}
	if idx == nil {
		return fmt.Errorf("peers: the plugins have no %s whose index to share", prefix.Name)
	}
	pk.PeerLog = peers.NewLog(c.LogBlocks)
	poller, err := peers.NewPoller(peers.Options{Peers: c.Addresses, Interval: c.Interval.D(), Wait: c.Wait.D(), Timeout: c.Timeout.D(),
		ResolveInterval: c.ResolveInterval.D(), Log: pk.PeerLog, Sink: idx, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	pk.Peers, pk.PeerSink = poller, idx
	for _, pl := range plugs {
		if o, ok := pl.(prefix.PeerObserver); ok {
			idx.ObservePeers(o)
		}
	}
	idx.PublishTo(pk.PeerLog)
	return nil
}

// ServerOptions are the ext_proc gRPC server's options for cfg: the receive limit raised to the
// body limit (in BUFFERED mode the whole body arrives in one message), and Envoy's keepalive
// pings on idle HTTP/2 connections accepted.
func ServerOptions(cfg *config.Config) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(cfg.ExtProc.MaxBodyBytes) + 1<<20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
}

// Run serves until ctx is cancelled, then drains: health turns NOT_SERVING, open streams get
// up to drainTimeout to finish.
func Run(ctx context.Context, o Options) error {
	log := o.Log
	if o.Kubernetes != nil && len(o.Config.Pool.Endpoints) > 0 {
		return ErrStaticAndKubernetes
	}
	pk, static, err := build(o.Config, log)
	if err != nil {
		return err
	}

	opts := ServerOptions(o.Config)
	if o.SecureServing {
		var cert tls.Certificate
		if o.CertPath != "" {
			cert, err = certs.Load(o.CertPath)
		} else {
			cert, err = certs.SelfSigned()
		}
		if err != nil {
			return err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	}

	hs := health.NewServer()
	hs.SetServingStatus(ServiceLiveness, healthpb.HealthCheckResponse_SERVING)
	gate := newReadiness(hs, pk.Pool, o.Kubernetes != nil && o.Kubernetes.LeaderElection, log)
	var kube *kubeSource
	if o.Kubernetes != nil {
		if kube, err = newKubeSource(o.Kubernetes, o.Config.Kubernetes.LeaderElection, gate, pk.Registry, log); err != nil {
			return err
		}
		defer kube.stop()
	}

	gs := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(gs, pk.Server)
	healthpb.RegisterHealthServer(gs, hs)
	hsrv := grpc.NewServer()
	healthpb.RegisterHealthServer(hsrv, hs)

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(pk.Registry, promhttp.HandlerOpts{Registry: pk.Registry}))
	if pk.PeerLog != nil {
		mux.Handle(peers.Path, pk.PeerLog.Handler())
	}
	if o.EnablePprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if pk.PeerLog != nil {
		msrv.RegisterOnShutdown(pk.PeerLog.StopWaiting) // open long polls end with the server
	}

	gl, err := net.Listen("tcp", o.GRPCAddr)
	if err != nil {
		return fmt.Errorf("--grpc-port: %w", err)
	}
	hl, err := net.Listen("tcp", o.HealthAddr)
	if err != nil {
		gl.Close()
		return fmt.Errorf("--grpc-health-port: %w", err)
	}
	ml, err := net.Listen("tcp", o.MetricsAddr)
	if err != nil {
		gl.Close()
		hl.Close()
		return fmt.Errorf("--metrics-bind-address: %w", err)
	}

	errc := make(chan error, 3)
	go func() { errc <- gs.Serve(gl) }()
	go func() { errc <- hsrv.Serve(hl) }()
	go func() {
		if err := msrv.Serve(ml); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
			return
		}
		errc <- nil
	}()
	hctx, stopChecks := context.WithCancel(ctx)
	defer stopChecks()
	// Before the pool is populated, so that every endpoint is unhealthy until its first good
	// probe (when health checks are on).
	checker := healthcheck.New(o.Config.Pool.HealthCheck, log)
	if checker.Enabled() {
		gate.requireHealthy()
		checker.OnChange(gate.healthChanged)
	}
	checker.Watch(hctx, pk.Pool)
	if kube != nil {
		kube.start()
	} else {
		gate.Set(static)
	}
	go pk.Scraper.Run(hctx)
	if pk.Peers != nil {
		go pk.Peers.Run(hctx)
	}
	log.Info("picker serving",
		zap.Stringer("ext_proc", gl.Addr()), zap.Stringer("health", hl.Addr()), zap.Stringer("metrics", ml.Addr()),
		zap.Bool("tls", o.SecureServing), zap.Int("endpoints", len(pk.Pool.Snapshot())))
	if kube == nil && len(pk.Pool.Snapshot()) == 0 {
		log.Warn("the pool has no endpoints: every request will be answered 503 (set --endpoints or pool.endpoints)")
	}
	if o.Ready != nil {
		o.Ready(gl.Addr(), hl.Addr(), ml.Addr())
	}

	select {
	case <-ctx.Done():
	case err := <-errc:
		if err != nil {
			gs.Stop()
			hsrv.Stop()
			msrv.Close()
			return fmt.Errorf("server stopped: %w", err)
		}
	}
	// Readiness first, so the proxy stops opening streams here; a leader hands the Lease over
	// at once. New streams are still served for the delay, then open ones drain.
	sd := o.Config.Shutdown
	gate.shutdown()
	if kube != nil {
		kube.resign()
	}
	log.Info("shutting down: readiness NOT_SERVING, still serving while the proxy notices",
		zap.Duration("shutdown_delay", sd.Delay.D()), zap.Duration("drain_timeout", sd.DrainTimeout.D()))
	select {
	case <-time.After(sd.Delay.D()):
	case err := <-errc:
		log.Warn("a server stopped during the shutdown delay", zap.Error(err))
	}
	log.Info("shutting down: draining open streams")
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(sd.DrainTimeout.D()):
		log.Warn("drain timeout: closing the remaining streams")
		gs.Stop()
	}
	hs.Shutdown()
	hsrv.Stop()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = msrv.Shutdown(sctx)
	return nil
}
