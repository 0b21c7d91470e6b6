// Command replay is the replay benchmark: it replays generated workloads (or a recorded trace)
// against simulated vLLM engines, routed by in-process baseline policies and by the real picker
// binary over ext_proc, and reports cache-hit ratio, TTFT, throughput, load balance and the
// picker's own cost. See docs/replay.md.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvpick/kvpick/internal/engine/servermetrics"
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

// scenarioFlags are the flags that describe one scenario; --suite replaces them.
var scenarioFlags = []string{"response-timing", "stream-fraction", "include-usage-fraction", "cached-tokens", "kv-blocks",
	"load-follows-caches", "load-scale", "picker-capacity-factor", "omit-cache-config"}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	workloads := fs.String("workloads", strings.Join(replay.Workloads(), ","), "comma-separated workloads: "+strings.Join(replay.Workloads(), ", "))
	trace := fs.String("trace", "", "JSONL trace to replay (docs/replay.md); alone it replaces the generated workloads")
	policies := fs.String("policies", strings.Join(replay.PolicyNames(), ","), "comma-separated routing policies: "+strings.Join(replay.PolicyNames(), ", "))
	seed := fs.Uint64("seed", 1, "seed of the generated workloads (one run; see --seeds)")
	seeds := fs.String("seeds", "", `seeds, each a full run: "1-6" (tuning), "101-112" (held-out reporting), or "1,4,9"; overrides --seed`)
	suite := fs.String("suite", "", `"standard": every workload under the standard scenarios (default, mixed, small-caches, capacity-x10, capacity-x0.1, small-caches-busy); "heavy": the small caches at 0.7 and 0.85 of the default load (small-caches-heavy, small-caches-overload); replaces the scenario flags`)
	engines := fs.Int("engines", 8, "simulated engines (model servers)")
	requests := fs.Int("requests", 0, "requests per workload (0: each workload's default, scaled with --engines)")
	rate := fs.Float64("rate", 0, "arrival rate, requests per simulated second (0: each workload's default, scaled with --engines); for a trace, rescales its timestamps to this mean rate")
	errorRate := fs.Float64("error-rate", 0, "fraction of requests the model server fails with 500 before any output")
	clock := fs.String("clock", replay.ClockReal, "real: simulated time = wall time × --time-scale, concurrent; virtual: lockstep discrete-event simulation, deterministic and fast")
	timeScale := fs.Float64("time-scale", 10, "with --clock real, how many times faster than real time the simulation runs")
	timing := fs.String("response-timing", replay.TimingVLLM, `when the picker sees the response: "vllm" (a stream's headers at arrival, its first event at the first token; a non-streamed answer whole at the end) or "first-token" (the former replay: headers at the first token)`)
	streamFrac := fs.Float64("stream-fraction", replay.DefaultStreaming.Fraction, "share of generated requests with \"stream\": true (0.5 for a mixed run)")
	usageFrac := fs.Float64("include-usage-fraction", replay.DefaultStreaming.UsageFraction, "share of streamed requests that set stream_options.include_usage")
	cachedTokens := fs.Bool("cached-tokens", true, "the servers report usage.prompt_tokens_details.cached_tokens (vLLM --enable-prompt-tokens-details; off by default in vLLM)")
	kvBlocks := fs.String("kv-blocks", "", `num_gpu_blocks per engine: "N", "LO-HI" (spread evenly over the engines, e.g. 768-1856) or one value per engine "a,b,..." (default: the engine model's 4096)`)
	loadScale := fs.Float64("load-scale", 0, "scale each generated workload's requests and rate by this factor (after --load-follows-caches; 0: no scaling)")
	loadFollows := fs.Bool("load-follows-caches", false, "scale each generated workload's requests and rate by the engines' mean num_gpu_blocks / 4096 (with --kv-blocks: smaller caches serve less)")
	omitCacheConfig := fs.Bool("omit-cache-config", false, "the servers do not report their KV cache's size on /metrics (no vllm:cache_config_info): the picker sizes its index from its configuration")
	capFactor := fs.Float64("picker-capacity-factor", 0, "set the picker's lruCapacityPerEndpoint to this multiple of the engines' mean num_gpu_blocks (0: its configured value)")
	metricsInterval := fs.Duration("metrics-interval", replay.DefaultMetricsInterval, "simulated time between the metrics snapshots the gie baseline reads")
	flavor := fs.String("metrics-flavor", string(servermetrics.VLLM), "the simulated servers' /metrics names: vllm, vllm-old (before 0.10) or sglang")
	virtualRefresh := fs.Duration("virtual-refresh", replay.DefaultVirtualRefresh, "with --clock virtual, the picker's scrape interval in wall time")
	pickerConfig := fs.String("picker-config", "", "picker configuration file (YAML) for the kvpick policy; the replay sets the pool, turns health checks off and scales the metrics durations (printed in the report)")
	pickerBin := fs.String("picker-bin", "", "prebuilt picker binary (default: go build "+replay.PickerPackage+")")
	pickerAddr := fs.String("picker-addr", "", "ext_proc address of an already running picker (plaintext unless --picker-tls); start it with --endpoints as --print-endpoints shows")
	pickerMetrics := fs.String("picker-metrics-addr", "", "with --picker-addr: the picker's metrics host:port, for its decision latency and memory")
	pickerTLS := fs.Bool("picker-tls", false, "with --picker-addr: the picker serves TLS (certificate not verified)")
	printEndpoints := fs.Bool("print-endpoints", false, "print the --endpoints value of a picker in front of --engines engines and exit")
	pickerLog := fs.String("picker-log", "", "write each run's picker log into this directory (created), one file per run: SCENARIO-WORKLOAD-seedN.log")
	shareCommits := fs.Bool("share-commits", false, "with --replicas: kvpick's replicas share their commits (each lists all of them in peers.addresses)")
	replicas := fs.Int("replicas", 1, "active instances of kvpick (pickers started with the same configuration, each scraping every engine), gie and sglang: the requests go to them in turn, as a proxy's round-robin over a router's replicas")
	pickerLogLevel := fs.String("picker-log-level", "", `the started pickers' --log-level: debug (every decision with each candidate's scores; request_id "replay-N" is --records' id N) or info (the default; the replay reads the picker's info-level "picker serving" line, so nothing quieter)`)
	jsonOut := fs.String("json", "", "write every number and the run's parameters to this JSON file")
	recordsOut := fs.String("records", "", "write every request of every run to this file, one JSON line each (engine, TTFT, cached tokens, admission wait, the turn it follows: docs/replay.md)")
	svgDir := fs.String("svg", "", "write charts (hit-ratio.svg, ttft.svg per scenario) into this directory")
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
		Trace: *trace, Engines: *engines, Requests: *requests, Rate: *rate, ErrorRate: *errorRate,
		Clock: *clock, TimeScale: *timeScale, MetricsInterval: *metricsInterval, VirtualRefresh: *virtualRefresh,
		MetricsFlavor: servermetrics.Flavor(*flavor),
		PickerConfig:  *pickerConfig, PickerBin: *pickerBin, PickerAddr: *pickerAddr, PickerMetricsAddr: *pickerMetrics, PickerTLS: *pickerTLS,
	}
	if *trace == "" || set["workloads"] {
		o.Workloads = splitList(*workloads)
	}
	o.Policies = splitList(*policies)
	o.Seeds = []uint64{*seed}
	if *seeds != "" {
		var err error
		if o.Seeds, err = parseSeeds(*seeds); err != nil {
			return fmt.Errorf("--seeds: %w", err)
		}
	}
	switch *suite {
	case "":
		sc := replay.DefaultScenario()
		sc.Timing = *timing
		sc.Streaming = replay.StreamMix{Fraction: *streamFrac, UsageFraction: *usageFrac}
		sc.OmitCachedTokens = !*cachedTokens
		sc.KVBlocks = *kvBlocks
		sc.LoadFollowsCaches = *loadFollows
		sc.LoadScale = *loadScale
		sc.CapacityFactor = *capFactor
		sc.OmitCacheConfig = *omitCacheConfig
		for _, f := range scenarioFlags {
			if set[f] {
				sc.Name, sc.About = "custom", "as the flags say"
				break
			}
		}
		o.Scenarios = []replay.Scenario{sc}
	case "standard", "heavy":
		for _, f := range scenarioFlags {
			if set[f] {
				return fmt.Errorf("--%s: the %s suite sets its own scenarios; drop --suite to run one scenario", f, *suite)
			}
		}
		if *suite == "heavy" {
			o.Scenarios = replay.HeavyScenarios()
		} else {
			o.Scenarios = replay.StandardScenarios()
		}
	default:
		return fmt.Errorf("--suite %q: want standard, heavy (or nothing)", *suite)
	}
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
	case *timing != replay.TimingVLLM && *timing != replay.TimingFirstToken:
		return fmt.Errorf("--response-timing %q: want %s", *timing, strings.Join(replay.ResponseTimings(), " or "))
	case !(*streamFrac >= 0 && *streamFrac <= 1) || !(*usageFrac >= 0 && *usageFrac <= 1):
		return errors.New("--stream-fraction and --include-usage-fraction: want 0..1")
	case *capFactor < 0:
		return fmt.Errorf("--picker-capacity-factor %v: want >= 0", *capFactor)
	case *loadScale < 0 || math.IsNaN(*loadScale) || math.IsInf(*loadScale, 0):
		return fmt.Errorf("--load-scale %v: want >= 0", *loadScale)
	case *metricsInterval <= 0 || *virtualRefresh <= 0:
		return errors.New("--metrics-interval and --virtual-refresh: want > 0")
	}
	if _, err := replay.ParseKVBlocks(*kvBlocks, *engines); err != nil {
		return fmt.Errorf("--kv-blocks: %w", err)
	}
	switch *pickerLogLevel {
	case "", "debug", "info":
	default:
		return fmt.Errorf("--picker-log-level %q: want debug or info (the replay needs the picker's info-level \"picker serving\" line)", *pickerLogLevel)
	}
	if (*pickerLog != "" || *pickerLogLevel != "") && *pickerAddr != "" {
		return errors.New("--picker-log and --picker-log-level: the replay does not start a picker with --picker-addr")
	}
	if *pickerLog != "" {
		if err := os.MkdirAll(*pickerLog, 0o755); err != nil {
			return fmt.Errorf("--picker-log: %w", err)
		}
	}
	o.PickerLogDir, o.PickerLogLevel = *pickerLog, *pickerLogLevel
	o.Replicas, o.ShareCommits = *replicas, *shareCommits
	if !*quiet {
		o.Progress = stderr
	}
	var records *bufio.Writer
	if *recordsOut != "" {
		f, err := os.Create(*recordsOut)
		if err != nil {
			return fmt.Errorf("--records: %w", err)
		}
		defer f.Close()
		records = bufio.NewWriterSize(f, 1<<16)
		o.Records = records
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := replay.Benchmark(ctx, o)
	if records != nil {
		if ferr := records.Flush(); ferr != nil && err == nil {
			err = fmt.Errorf("--records: %w", ferr)
		}
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	rep.WriteHeader(stdout)
	fmt.Fprintln(stdout)
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if err := rep.WriteSummary(stdout); err != nil {
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

// parseSeeds reads "1-6", "101-112", "1,4,9" or a mix ("1-3,7").
func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	seen := map[uint64]bool{}
	for _, part := range splitList(s) {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(strings.TrimSpace(lo), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: not a seed", part)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(strings.TrimSpace(hi), 10, 64); err != nil || b < a {
				return nil, fmt.Errorf("%q: want LO-HI with LO <= HI", part)
			}
			if b-a >= 10000 {
				return nil, fmt.Errorf("%q: more than 10000 seeds", part)
			}
		}
		for v := a; v <= b; v++ {
			if !seen[v] {
				seen[v] = true
				out = append(out, v)
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no seeds")
	}
	return out, nil
}
