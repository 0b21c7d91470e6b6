// Command demo runs kvpick end to end on one machine, in one process: four simulated vLLM
// servers, the picker and the development gateway, on loopback.
//
//	go run ./cmd/demo          # start everything, print a curl example, wait for Ctrl-C
//	go run ./cmd/demo --load   # (or: go run ./cmd/demo load) run a short mixed workload
//	                           # through the picker, then through round-robin on fresh
//	                           # simulators, and print both side by side
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvpick/kvpick/internal/demo"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	load := fs.Bool("load", false, "run the workload comparison (picker vs round-robin) and exit")
	listen := fs.String("listen", "127.0.0.1:8080", "the gateway's listen address (interactive mode)")
	sims := fs.Int("sims", 4, "simulated model servers")
	concurrency := fs.Int("concurrency", 0, "sessions at a time in --load (0: the workload's default)")
	logLevel := fs.String("log-level", "warn", "log level of the components (to stderr)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch rest := fs.Args(); {
	case len(rest) == 1 && rest[0] == "load":
		*load = true
	case len(rest) > 0:
		return fmt.Errorf("unexpected arguments: %s (the only command is \"load\")", strings.Join(rest, " "))
	}
	var level zapcore.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", *logLevel)
	}
	zc := zap.NewDevelopmentConfig()
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.OutputPaths, zc.ErrorOutputPaths = []string{"stderr"}, []string{"stderr"}
	log, err := zc.Build()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *load {
		w := demo.DefaultWorkload()
		if *concurrency > 0 {
			w.Concurrency = *concurrency
		}
		fmt.Fprintf(stdout, "Workload: %s.\nRunning it through the picker, then through round-robin on fresh simulators...\n", w)
		p, rr, err := demo.Compare(ctx, demo.CompareOptions{Workload: w, Sims: *sims, Log: log, Progress: stderr})
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout)
		demo.Report(stdout, p, rr)
		return nil
	}

	s, err := demo.Start(ctx, demo.StackOptions{Sims: *sims, GatewayAddr: *listen, Log: log})
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%w\nthe gateway's address %s is in use (another demo still running?): give another with --listen, e.g. --listen 127.0.0.1:8081, or --listen 127.0.0.1:0 for any free port", err, *listen)
	}
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Fprintf(stdout, "kvpick demo: %d simulated model servers, the picker and the gateway are running.\n\n", len(s.Sims))
	for i, sim := range s.Sims {
		fmt.Fprintf(stdout, "  simulator %d   http://%s   (/metrics, /v1/models)\n", i, sim.Addr)
	}
	fmt.Fprintf(stdout, "  picker        %s (ext_proc, TLS)   metrics http://%s/metrics\n", s.PickerAddr, s.PickerMetricsAddr)
	fmt.Fprintf(stdout, "  gateway       %s\n\n", s.GatewayURL)
	fmt.Fprintf(stdout, "Send OpenAI requests to the gateway; x-served-by says which server answered:\n\n%s\n\n", s.CurlExample())
	fmt.Fprintln(stdout, "Ctrl-C stops everything.")
	<-ctx.Done()
	fmt.Fprintln(stdout, "\nstopping...")
	return s.Err()
}
