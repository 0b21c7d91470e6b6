// Command extproc is the kvpick endpoint picker: an Envoy ext_proc server that routes
// OpenAI-style requests to the model server most likely to hold the prompt's prefix in its KV
// cache, without building hot spots.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
	"k8s.io/klog/v2"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/compatflags"
	"github.com/kvpick/kvpick/pkg/inferencepool"
	"github.com/kvpick/kvpick/pkg/runner"
)

// grpc-go marshals each outgoing message into a pooled buffer whose size classes jump from
// 32 KiB to 1 MiB, zeroing the whole 1 MiB for every re-emitted 62,000-byte body chunk (17% of
// the picker's CPU under load, docs/loadgen.md). Add 64 and 128 KiB classes. This must run
// before any gRPC server exists.
func init() {
	p, err := mem.NewBinaryTieredBufferPool(8, 12, 14, 15, 16, 17, 20)
	if err != nil {
		panic(err)
	}
	experimental.SetDefaultBufferPool(p)
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "extproc:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("extproc", flag.ContinueOnError)
	// Conventional endpoint-picker ports: gateways, charts and scripts rely on them.
	grpcPort := fs.Int("grpc-port", 9002, "ext_proc gRPC port (also serves gRPC health for the proxy's cluster health check)")
	healthPort := fs.Int("grpc-health-port", 9003, "gRPC health port (services \"\", liveness, readiness, envoy.service.ext_proc.v3.ExternalProcessor)")
	metricsBind := fs.String("metrics-bind-address", defaultMetricsAddr, "host:port for the HTTP server of /metrics (and /debug/pprof/ with --enable-pprof): \":9090\" on every interface, \"127.0.0.1:9090\" on loopback only; wins over --metrics-port")
	metricsPort := fs.Int("metrics-port", 9090, "port for /metrics on every interface, used when --metrics-bind-address is not given (kept for compatibility)")
	enablePprof := fs.Bool("enable-pprof", false, "serve /debug/pprof/ on the metrics address (profiles expose the process's internals: keep that address private)")
	configFile := fs.String("config-file", "", "YAML configuration file; empty uses the built-in defaults (config/default.yaml)")
	endpoints := fs.String("endpoints", "", "static pool as ip:port,ip:port (overrides pool.endpoints in the config file)")
	peerAddrs := fs.String("peers", "", "active-active replicas: the replicas' metrics addresses as host:port,host:port (a name may resolve to several, e.g. a headless Service; this replica's own is recognised and skipped); each shares the prompts its servers took with the others (overrides peers.addresses)")
	secure := fs.Bool("secure-serving", true, "serve ext_proc over TLS (self-signed unless --cert-path is set); false for plaintext")
	certPath := fs.String("cert-path", "", "directory holding tls.crt and tls.key for --secure-serving")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	printConfig := fs.Bool("print-default-config", false, "print the built-in default configuration and exit")
	// Model-server metrics, under the reference endpoint picker's flag names.
	scrapeDefaults := config.Default().Pool.Metrics
	refreshMetrics := fs.Duration("refresh-metrics-interval", scrapeDefaults.RefreshInterval.D(), "time between two scrapes of each endpoint's /metrics (overrides pool.metrics.refreshInterval; 0 disables scraping)")
	metricsStaleness := fs.Duration("metrics-staleness-threshold", scrapeDefaults.StalenessThreshold.D(), "how long a scrape of an endpoint's metrics is trusted (overrides pool.metrics.stalenessThreshold)")
	// Kubernetes mode: follow an InferencePool instead of a static pool (pkg/discovery).
	poolName := fs.String("pool-name", "", "InferencePool to serve; its Ready pods x target ports become the pool (exclusive with --endpoints and pool.endpoints)")
	poolNamespace := fs.String("pool-namespace", "", "the InferencePool's namespace (default: the pod's own, from POD_NAMESPACE, NAMESPACE or the service account)")
	poolGroup := fs.String("pool-group", inferencepool.GroupV1, "the InferencePool's API group: "+strings.Join(inferencepool.Groups, " (v1) or ")+" (v1alpha2)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: KUBECONFIG, ~/.kube/config, or the in-cluster service account)")
	haLeader := fs.Bool("ha-enable-leader-election", false, "active-passive HA: only the replica holding the Lease (kubernetes.leaderElection) reports ready")
	defaults := config.Default().Shutdown
	drainTimeout := fs.Duration("drain-timeout", defaults.DrainTimeout.D(), "on SIGTERM, how long open streams get to end (overrides shutdown.drainTimeout)")
	shutdownDelay := fs.Duration("shutdown-delay", defaults.Delay.D(), "on SIGTERM, how long new streams are still taken after readiness turns NOT_SERVING (overrides shutdown.delay)")
	// The reference picker's flags, last: a flag defined above is never shadowed.
	compat := compatflags.Register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // the usage is printed; asking for it is no error
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	compatLog, err := compat.Check()
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *printConfig {
		_, err := os.Stdout.Write(config.DefaultYAML())
		return err
	}
	for name, p := range map[string]int{"--grpc-port": *grpcPort, "--grpc-health-port": *healthPort, "--metrics-port": *metricsPort} {
		if p < 0 || p > 65535 {
			return fmt.Errorf("%s %d: want 0..65535 (0 picks a free port)", name, p)
		}
	}
	var level zapcore.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", *logLevel)
	}
	if !set["log-level"] && compatLog.Level != nil {
		level = *compatLog.Level
	}
	metricsAddr, err := metricsAddress(set, *metricsBind, *metricsPort)
	if err != nil {
		return err
	}
	if *certPath != "" && !*secure {
		return fmt.Errorf("--cert-path is set but --secure-serving=false")
	}
	cfg, err := config.Load(*configFile)
	if err != nil {
		return err
	}
	if *endpoints != "" {
		cfg.Pool.Endpoints = strings.Split(*endpoints, ",")
	}
	if *peerAddrs != "" {
		cfg.Peers.Addresses = strings.Split(*peerAddrs, ",")
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("--peers: %w", err)
		}
	}
	scrapeFlags := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "refresh-metrics-interval":
			cfg.Pool.Metrics.RefreshInterval, scrapeFlags = config.Duration(*refreshMetrics), true
		case "metrics-staleness-threshold":
			cfg.Pool.Metrics.StalenessThreshold, scrapeFlags = config.Duration(*metricsStaleness), true
		}
	})
	if err := cfg.Validate(); scrapeFlags && err != nil {
		return fmt.Errorf("--refresh-metrics-interval or --metrics-staleness-threshold: %w", err)
	}
	if set["drain-timeout"] {
		cfg.Shutdown.DrainTimeout = config.Duration(*drainTimeout)
	}
	if set["shutdown-delay"] {
		cfg.Shutdown.Delay = config.Duration(*shutdownDelay)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("--drain-timeout or --shutdown-delay: %w", err)
	}
	var kube *runner.Kubernetes
	switch {
	case *poolName != "" && len(cfg.Pool.Endpoints) > 0:
		return runner.ErrStaticAndKubernetes
	case *poolName != "":
		kube = &runner.Kubernetes{Kubeconfig: *kubeconfig, PoolName: *poolName, PoolNamespace: *poolNamespace, PoolGroup: *poolGroup, LeaderElection: *haLeader}
	case *haLeader || set["pool-namespace"] || set["kubeconfig"]:
		return fmt.Errorf("--ha-enable-leader-election, --pool-namespace and --kubeconfig need --pool-name")
	}

	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.Sampling = nil // every routing error matters; volume is bounded by requests
	zc.Encoding = compatLog.Encoding
	log, err := zc.Build()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	if kube != nil {
		// client-go logs through klog (watch errors, a forbidden list): into the same JSON log.
		klog.SetLogger(zapr.NewLogger(log.Named("client-go")))
	}
	if ignored := compat.IgnoredSet(); len(ignored) > 0 {
		log.Info("accepted and ignored: flags of the reference endpoint picker that this picker does not use (docs/deploy.md)", zap.Strings("flags", ignored))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runner.Run(ctx, runner.Options{
		GRPCAddr:      listenAddr(*grpcPort),
		HealthAddr:    listenAddr(*healthPort),
		MetricsAddr:   metricsAddr,
		EnablePprof:   *enablePprof,
		Config:        cfg,
		SecureServing: *secure,
		CertPath:      *certPath,
		Log:           log,
		Kubernetes:    kube,
	})
}

func listenAddr(port int) string { return net.JoinHostPort("", strconv.Itoa(port)) }

// defaultMetricsAddr is the conventional endpoint-picker metrics port on every interface.
const defaultMetricsAddr = ":9090"

// metricsAddress is where /metrics listens: --metrics-bind-address when given, else
// --metrics-port (or its chart alias metricsPort) on every interface, else the default. set
// holds the names of the flags given.
func metricsAddress(set map[string]bool, bind string, port int) (string, error) {
	if !set["metrics-bind-address"] {
		if set["metrics-port"] || set["metricsPort"] {
			return listenAddr(port), nil
		}
		return defaultMetricsAddr, nil
	}
	_, p, err := net.SplitHostPort(bind)
	if err != nil {
		return "", fmt.Errorf("--metrics-bind-address %q: want host:port, such as :9090 or 127.0.0.1:9090", bind)
	}
	if n, err := strconv.Atoi(p); err != nil || n < 0 || n > 65535 {
		return "", fmt.Errorf("--metrics-bind-address %q: port %q is not in 0..65535 (0 picks a free port)", bind, p)
	}
	return bind, nil
}
