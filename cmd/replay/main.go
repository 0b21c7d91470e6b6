// Command replay is the replay benchmark: it replays generated workloads (or a recorded trace)
// against simulated vLLM engines, routed by in-process baseline policies and by the real picker
// binary over ext_proc, and reports cache-hit ratio, TTFT, throughput, load balance and the
// picker's own cost. See docs/replay.md.
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

	"github.com/kvpick/kvpick/internal/replay"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "replay:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	workloads := fs.String("workloads", strings.Join(replay.Workloads(), ","), "comma-separated workloads: "+strings.Join(replay.Workloads(), ", "))
	trace := fs.String("trace", "", "JSONL trace to replay (docs/replay.md); alone it replaces the generated workloads")
	policies := fs.String("policies", strings.Join(replay.Policies(), ","), "comma-separated routing policies: "+strings.Join(replay.Policies(), ", "))
	seed := fs.Uint64("seed", 1, "seed of the generated workloads")
	engines := fs.Int("engines", 8, "simulated engines (model servers)")
	requests := fs.Int("requests", 0, "requests per workload (0: each workload's default, scaled with --engines)")
	rate := fs.Float64("rate", 0, "arrival rate, requests per simulated second (0: each workload's default, scaled with --engines); for a trace, rescales its timestamps to this mean rate")
	errorRate := fs.Float64("error-rate", 0, "fraction of requests the model server fails with 500 before any output")
	clock := fs.String("clock", replay.ClockReal, "real: simulated time = wall time × --time-scale, concurrent; virtual: lockstep discrete-event simulation, deterministic and fast")
	timeScale := fs.Float64("time-scale", 10, "with --clock real, how many times faster than real time the simulation runs")
	pickerConfig := fs.String("picker-config", "", "picker configuration file (YAML) for the kvpick policy; health checks are turned off and the pool set to the simulated engines")
	pickerBin := fs.String("picker-bin", "", "prebuilt picker binary (default: go build "+replay.PickerPackage+")")
	pickerAddr := fs.String("picker-addr", "", "ext_proc address of an already running picker (plaintext unless --picker-tls); start it with --endpoints as --print-endpoints shows")
	pickerMetrics := fs.String("picker-metrics-addr", "", "with --picker-addr: the picker's metrics host:port, for its decision latency and memory")
	pickerTLS := fs.Bool("picker-tls", false, "with --picker-addr: the picker serves TLS (certificate not verified)")
	printEndpoints := fs.Bool("print-endpoints", false, "print the --endpoints value of a picker in front of --engines engines and exit")
	jsonOut := fs.String("json", "", "write every number and the run's parameters to this JSON file")
	svgDir := fs.String("svg", "", "write charts (hit-ratio.svg, ttft.svg) into this directory")
	quiet := fs.Bool("quiet", false, "no progress display on stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *engines < 1 {
		return fmt.Errorf("--engines %d: want at least 1", *engines)
	}
	if *printEndpoints {
		fmt.Fprintln(stdout, strings.Join(replay.EndpointList(*engines), ","))
		return nil
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o := replay.Options{
		Trace: *trace, Seed: *seed, Engines: *engines, Requests: *requests, Rate: *rate, ErrorRate: *errorRate,
		Clock: *clock, TimeScale: *timeScale,
		PickerConfig: *pickerConfig, PickerBin: *pickerBin, PickerAddr: *pickerAddr, PickerMetricsAddr: *pickerMetrics, PickerTLS: *pickerTLS,
	}
	if *trace == "" || set["workloads"] {
		o.Workloads = splitList(*workloads)
	}
	o.Policies = splitList(*policies)
	switch {
	case *clock != replay.ClockReal && *clock != replay.ClockVirtual:
		return fmt.Errorf("--clock %q: want real or virtual", *clock)
	case *timeScale <= 0:
		return fmt.Errorf("--time-scale %v: want > 0", *timeScale)
	case *errorRate < 0 || *errorRate > 1:
		return fmt.Errorf("--error-rate %v: want 0..1", *errorRate)
	case *requests < 0 || *rate < 0:
		return errors.New("--requests and --rate must not be negative")
	case len(o.Policies) == 0:
		return errors.New("--policies: none given")
	case len(o.Workloads) == 0 && *trace == "":
		return errors.New("--workloads: none given")
	}
	if !*quiet {
		o.Progress = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := replay.Benchmark(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\n%d engines, seed %d, %s clock", o.Engines, o.Seed, o.Clock)
	if o.Clock == replay.ClockReal {
		fmt.Fprintf(stdout, " ×%g", o.TimeScale)
	}
	fmt.Fprintf(stdout, ", %.0fs wall\n", rep.Elapsed)
	for _, w := range rep.Workload {
		fmt.Fprintf(stdout, "  %-14s %5d requests at %5.1f req/s: %s\n", w.Name, w.Requests, w.Rate, w.About)
	}
	fmt.Fprintln(stdout)
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	replay.WriteLegend(stdout)
	for _, n := range rep.Notes {
		fmt.Fprintln(stdout, "note:", n)
	}
	if *jsonOut != "" {
		if err := rep.WriteJSON(*jsonOut); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "wrote", *jsonOut)
	}
	if *svgDir != "" {
		files, err := rep.WriteSVG(*svgDir)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, "wrote", strings.Join(files, ", "))
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
