// Command loadgen puts an ext_proc picker under load the way Envoy drives it
// (FULL_DUPLEX_STREAMED, one stream per request) and reports what it costs. Three scenarios:
//
//	loadgen throughput   back-to-back exchanges with 64 KB chat bodies: exchanges/s, per picker
//	                     core, added latency, decision time, optional CPU profile
//	loadgen streams      10,000 streams held open at once, then their responses streamed token
//	                     by token: time to open, picker RSS and goroutines at peak, picker CPU
//	                     per streamed response, in-flight accounting, return to 0
//	loadgen churn        unique prompts against a small prefix index: memory over time, bytes
//	                     per index entry, whether the live heap stays bounded
//
// By default it builds cmd/extproc, starts it on free ports with 64 fake endpoints and the
// health check off, and stops it at the end; --picker-addr targets a running picker instead.
// docs/loadgen.md explains each scenario and how to read its report.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/kvpick/kvpick/internal/loadgen"
	"github.com/kvpick/kvpick/internal/pickerproc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: loadgen <scenario> [flags]

scenarios:
  throughput   exchanges back to back: exchanges/s, per picker core, added latency, decision time
  streams      many streams held open, then streamed token by token: RSS, CPU per response, in-flight
  churn        unique prompts against a small index: memory over time, bytes per entry, bounded heap

'loadgen <scenario> -h' lists the scenario's flags. docs/loadgen.md explains the reports.
`

// Exit codes: 1 the run could not be made, 2 it ran but a check failed (errors, leaks).
const (
	exitError  = 1
	exitFailed = 2
)

type common struct {
	pickerAddr, metricsAddr, pickerBin, pickerConfig, pickerLog, jsonOut string
	clientProfile                                                        string
	pickerPID, endpoints                                                 int
	quiet                                                                bool
	seed                                                                 uint64
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.pickerAddr, "picker-addr", "", "ext_proc address (host:port, plaintext) of a running picker; empty: build cmd/extproc and start it")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "", "with --picker-addr: the picker's metrics address (host:port) for /metrics and /debug/pprof")
	fs.IntVar(&c.pickerPID, "picker-pid", 0, "with --picker-addr: the picker's process id when local, for CPU from /proc")
	fs.StringVar(&c.pickerBin, "picker-bin", "", "extproc binary to start instead of building ./cmd/extproc")
	fs.StringVar(&c.pickerConfig, "picker-config", "", "picker configuration file to start it with (default: built-in defaults, health check off)")
	fs.StringVar(&c.pickerLog, "picker-log", "", "copy the started picker's log to this file")
	fs.IntVar(&c.endpoints, "endpoints", 64, "fake endpoints in the started picker's pool")
	fs.StringVar(&c.jsonOut, "json", "", "write the report as JSON to this file")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress bar")
	fs.Uint64Var(&c.seed, "seed", 1, "random seed (bodies, request order)")
	fs.StringVar(&c.clientProfile, "client-cpuprofile", "", "write a CPU profile of the load generator itself (to check that it is not the bottleneck)")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return exitError
		}
		return 0
	}
	scenario, args := args[0], args[1:]
	fs := flag.NewFlagSet("loadgen "+scenario, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	var runScenario func(context.Context, *loadgen.Target, io.Writer) (report, error)
	var validate func() error // the flags, before a picker is built and started
	var lruCapacity int
	switch scenario {
	case "throughput":
		o := loadgen.DefaultThroughputOptions()
		fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "workers, each running exchanges back to back")
		fs.IntVar(&o.Conns, "conns", o.Conns, "gRPC connections (as Envoy opens one per worker thread)")
		fs.DurationVar(&o.Duration, "duration", o.Duration, "measured window")
		fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "load before the window, not measured (warms the prefix index)")
		fs.IntVar(&o.BodyBytes, "body-bytes", o.BodyBytes, "request body size")
		fs.IntVar(&o.ChunkBytes, "chunk-bytes", o.ChunkBytes, "request body chunk size")
		fs.IntVar(&o.Conversations, "conversations", o.Conversations, "distinct conversations in the body pool")
		fs.IntVar(&o.SystemPrompts, "system-prompts", o.SystemPrompts, "system prompts shared by the conversations")
		fs.IntVar(&o.Variants, "variants", o.Variants, "final questions per conversation")
		fs.BoolVar(&o.RepeatBodies, "repeat-bodies", false, "send the pool's bodies unchanged (default: a fresh nonce in each final question, so its last blocks are new)")
		fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of the picker, taken during the window, to this file")
		validate = func() error {
			return positive(map[string]int{"--concurrency": o.Concurrency, "--conns": o.Conns, "--body-bytes": o.BodyBytes, "--chunk-bytes": o.ChunkBytes})
		}
		runScenario = func(ctx context.Context, t *loadgen.Target, prog io.Writer) (report, error) {
			o.Seed, o.Progress = c.seed, prog
			r, err := loadgen.RunThroughput(ctx, t, o)
			if err != nil {
				return nil, err
			}
			return throughputReport{r}, nil
		}
	case "streams":
		o := loadgen.DefaultStreamsOptions()
		fs.IntVar(&o.Streams, "streams", o.Streams, "streams held open at once")
		fs.IntVar(&o.Conns, "conns", 0, "gRPC connections (0: one per 2,500 streams)")
		fs.IntVar(&o.OpenConcurrency, "open-concurrency", o.OpenConcurrency, "streams being opened at the same moment")
		fs.DurationVar(&o.Hold, "hold", o.Hold, "how long all streams stay open and idle together")
		fs.IntVar(&o.BodyBytes, "body-bytes", o.BodyBytes, "request body size")
		fs.IntVar(&o.TokensMin, "tokens-min", o.TokensMin, "fewest tokens in a streamed response (one SSE chunk each)")
		fs.IntVar(&o.TokensMax, "tokens-max", o.TokensMax, "most tokens in a streamed response (0: one-chunk responses)")
		fs.DurationVar(&o.TokenGap, "token-gap", o.TokenGap, "time between two tokens of a response")
		fs.DurationVar(&o.OpenTimeout, "open-timeout", o.OpenTimeout, "give up when opening takes longer")
		fs.DurationVar(&o.StreamTimeout, "stream-timeout", o.StreamTimeout, "give up when streaming the responses takes longer")
		fs.DurationVar(&o.SettleTimeout, "settle-timeout", o.SettleTimeout, "how long the in-flight and stream gauges get to return to 0")
		fs.StringVar(&o.HeapProfile, "heapprofile", "", "write the picker's heap profile, taken with every stream open, to this file")
		validate = func() error {
			if o.TokensMin < 0 || o.TokensMax < o.TokensMin {
				return fmt.Errorf("--tokens-min %d, --tokens-max %d: want 0 ≤ min ≤ max", o.TokensMin, o.TokensMax)
			}
			return positive(map[string]int{"--streams": o.Streams, "--body-bytes": o.BodyBytes})
		}
		runScenario = func(ctx context.Context, t *loadgen.Target, prog io.Writer) (report, error) {
			o.Seed, o.Progress = c.seed, prog
			r, err := loadgen.RunStreams(ctx, t, o)
			if err != nil {
				return nil, err
			}
			return streamsReport{r}, nil
		}
	case "churn":
		o := loadgen.DefaultChurnOptions()
		var csvOut string
		var bound int
		fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "workers, each running exchanges back to back")
		fs.IntVar(&o.Conns, "conns", o.Conns, "gRPC connections")
		fs.DurationVar(&o.Duration, "duration", o.Duration, "length of the run")
		fs.Int64Var(&o.Exchanges, "exchanges", 0, "end the run after this many exchanges instead of --duration")
		fs.DurationVar(&o.Interval, "interval", o.Interval, "sampling period")
		fs.IntVar(&o.MinBytes, "min-bytes", o.MinBytes, "smallest prompt")
		fs.IntVar(&o.MaxBytes, "max-bytes", o.MaxBytes, "largest prompt")
		fs.IntVar(&o.ChunkBytes, "chunk-bytes", o.ChunkBytes, "request body chunk size")
		fs.IntVar(&lruCapacity, "lru-capacity", 2000, "lruCapacityPerEndpoint of the started picker (blocks per endpoint)")
		fs.IntVar(&bound, "bound", 0, "the index's capacity in entries, when the picker is not started here (0: lru-capacity × endpoints for a started picker)")
		fs.Float64Var(&o.LeakThreshold, "leak-threshold", o.LeakThreshold, "fail when the live heap grows, after the index is full, by more than this fraction of what keeping every inserted entry would cost")
		fs.StringVar(&csvOut, "csv", "", "write the samples as CSV to this file")
		fs.StringVar(&o.HeapProfile, "heapprofile", "", "write the picker's heap profile, taken at the end after a forced GC, to this file")
		validate = func() error {
			return positive(map[string]int{"--concurrency": o.Concurrency, "--conns": o.Conns, "--min-bytes": o.MinBytes, "--max-bytes": o.MaxBytes, "--chunk-bytes": o.ChunkBytes})
		}
		runScenario = func(ctx context.Context, t *loadgen.Target, prog io.Writer) (report, error) {
			o.Seed, o.Progress = c.seed, prog
			o.Bound = bound
			if o.Bound == 0 && c.pickerAddr == "" && c.pickerConfig == "" {
				o.Bound = lruCapacity * c.endpoints
			}
			r, err := loadgen.RunChurn(ctx, t, o)
			if err != nil {
				return nil, err
			}
			if csvOut != "" {
				f, err := os.Create(csvOut)
				if err != nil {
					return nil, err
				}
				werr := r.WriteCSV(f)
				if cerr := f.Close(); werr == nil {
					werr = cerr
				}
				if werr != nil {
					return nil, werr
				}
			}
			return churnReport{r}, nil
		}
	default:
		fmt.Fprintf(stderr, "loadgen: unknown scenario %q\n\n%s", scenario, usage)
		return exitError
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitError
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "loadgen: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return exitError
	}
	if err := validate(); err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return exitError
	}
	var prog io.Writer = stderr
	if c.quiet {
		prog = nil
	}

	target, stopPicker, err := c.target(ctx, lruCapacity, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return exitError
	}
	if c.clientProfile != "" {
		f, err := os.Create(c.clientProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(stderr, "loadgen: --client-cpuprofile:", err)
			return exitError
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	rep, err := runScenario(ctx, target, prog)
	var pickerNote string
	if stopPicker != nil {
		pickerNote = stopPicker(err != nil)
	}
	if err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		if pickerNote != "" {
			fmt.Fprintln(stderr, pickerNote)
		}
		return exitError
	}
	rep.WriteText(stdout)
	if pickerNote != "" {
		fmt.Fprintln(stdout, pickerNote)
	}
	if c.jsonOut != "" {
		b, err := json.MarshalIndent(rep.result(), "", "  ")
		if err == nil {
			err = os.WriteFile(c.jsonOut, append(b, '\n'), 0o644)
		}
		if err != nil {
			fmt.Fprintln(stderr, "loadgen: --json:", err)
			return exitError
		}
	}
	if fails := rep.failures(); len(fails) > 0 {
		for _, f := range fails {
			fmt.Fprintln(stdout, "FAIL:", f)
		}
		return exitFailed
	}
	fmt.Fprintln(stdout, "PASS")
	return 0
}

func positive(vals map[string]int) error {
	for k, v := range vals {
		if v <= 0 {
			return fmt.Errorf("%s %d: want a positive number", k, v)
		}
	}
	return nil
}

// target returns the picker to load: the one at --picker-addr, or one built and started here
// (stop stops it and returns a line about its log, more of it when failed).
func (c *common) target(ctx context.Context, lruCapacity int, stderr io.Writer) (*loadgen.Target, func(failed bool) string, error) {
	if c.pickerAddr != "" {
		t := &loadgen.Target{GRPCAddr: c.pickerAddr, PID: c.pickerPID}
		if c.metricsAddr != "" {
			t.MetricsURL = "http://" + c.metricsAddr + "/metrics"
			t.PprofURL = "http://" + c.metricsAddr + "/debug/pprof"
		}
		return t, nil, nil
	}
	if c.endpoints <= 0 {
		return nil, nil, fmt.Errorf("--endpoints %d: want a positive number", c.endpoints)
	}
	dir, err := os.MkdirTemp("", "loadgen-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	bin := c.pickerBin
	if bin == "" {
		root, err := pickerproc.ModuleRoot()
		if err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("%w: use --picker-bin or --picker-addr", err)
		}
		fmt.Fprintln(stderr, "loadgen: building ./cmd/extproc ...")
		if bin, err = pickerproc.Build(ctx, root, dir); err != nil {
			cleanup()
			return nil, nil, err
		}
	}
	var cfg []byte
	if c.pickerConfig != "" {
		cfg, err = os.ReadFile(c.pickerConfig)
	} else {
		cfg, err = loadgen.PickerConfig(lruCapacity)
	}
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	p, err := loadgen.StartPicker(ctx, loadgen.PickerOptions{Bin: bin, Config: cfg, Endpoints: loadgen.FakeEndpoints(c.endpoints), Dir: dir, LogFile: c.pickerLog})
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	fmt.Fprintf(stderr, "loadgen: picker pid %d serving ext_proc on %s, metrics %s, %d fake endpoints\n", p.PID, p.GRPCAddr, p.MetricsURL, c.endpoints)
	t := p.Target
	return &t, func(failed bool) string {
		defer cleanup()
		exitedEarly := false
		select {
		case <-p.Proc.Exited():
			exitedEarly = true
		default:
		}
		stopErr := p.Proc.Stop()
		levels := p.Proc.LogCounts()
		note := fmt.Sprintf("picker log: %d info, %d warn, %d error lines", levels["info"], levels["warn"], levels["error"])
		if exitedEarly {
			note = "picker EXITED during the run; " + note
		}
		switch {
		case stopErr != nil:
			note += "; " + stopErr.Error() // ends with the last log lines
		case failed || exitedEarly || levels["error"] > 0 || levels["warn"] > 0:
			note += "\nlast picker log lines:\n  " + strings.ReplaceAll(p.Proc.Logs(), "\n", "\n  ")
		}
		return note
	}, nil
}

// report is a scenario's result.
type report interface {
	WriteText(io.Writer)
	result() any
	failures() []string
}

type throughputReport struct{ r *loadgen.ThroughputResult }

func (t throughputReport) WriteText(w io.Writer) { t.r.WriteText(w) }
func (t throughputReport) result() any           { return t.r }
func (t throughputReport) failures() []string {
	var f []string
	if t.r.Errors > 0 {
		f = append(f, fmt.Sprintf("%d exchanges failed", t.r.Errors))
	}
	if t.r.Exchanges == 0 {
		f = append(f, "no exchange completed in the window")
	}
	return f
}

type streamsReport struct{ r *loadgen.StreamsResult }

func (s streamsReport) WriteText(w io.Writer) { s.r.WriteText(w) }
func (s streamsReport) result() any           { return s.r }
func (s streamsReport) failures() []string {
	var f []string
	r := s.r
	if r.Errors > 0 {
		f = append(f, fmt.Sprintf("%d streams failed (%d opening, %d streaming)", r.Errors, r.OpenErrors, r.FinishErrors))
	}
	if r.Responses != r.Opened {
		f = append(f, fmt.Sprintf("%d responses streamed whole of %d streams opened", r.Responses, r.Opened))
	}
	if math.IsNaN(float64(r.AllOpen.Inflight)) {
		f = append(f, "no metrics: in-flight accounting not checked (give --metrics-addr)")
		return f
	}
	if !r.InflightMatches {
		f = append(f, fmt.Sprintf("in-flight sum with all streams open = %.0f, want %d", float64(r.AllOpen.Inflight), r.Options.Streams))
	}
	if !r.ReturnedToZero {
		f = append(f, fmt.Sprintf("after the run: in flight %.0f, open streams %.0f, want 0", float64(r.After.Inflight), float64(r.After.OpenStreams)))
	}
	if !r.GoroutinesReturned {
		f = append(f, fmt.Sprintf("goroutines after the run %.0f, baseline %.0f", float64(r.After.Goroutines), float64(r.Baseline.Goroutines)))
	}
	return f
}

type churnReport struct{ r *loadgen.ChurnResult }

func (c churnReport) WriteText(w io.Writer) { c.r.WriteText(w) }
func (c churnReport) result() any           { return c.r }
func (c churnReport) failures() []string {
	var f []string
	if c.r.Errors > 0 {
		f = append(f, fmt.Sprintf("%d exchanges failed", c.r.Errors))
	}
	r := c.r
	switch {
	case math.IsNaN(float64(r.LeakRatio)):
		f = append(f, "memory not checked: no live heap figures once the index was full (give --metrics-addr; run longer)")
	case !r.Bounded:
		f = append(f, fmt.Sprintf("live heap grew %.1f MiB after the index was full: %.0f%% of what keeping the %.0f inserted blocks would cost (threshold %.0f%%)",
			float64(r.HeapGrowthBytes)/(1<<20), 100*float64(r.LeakRatio), float64(r.BlocksInserted), 100*r.Options.LeakThreshold))
	}
	if r.Options.Bound > 0 && math.IsNaN(float64(r.BoundReachedS)) {
		f = append(f, fmt.Sprintf("the index never reached its bound of %d entries", r.Options.Bound))
	}
	if r.Options.Bound > 0 && float64(r.MaxEntries) > float64(r.Options.Bound) {
		f = append(f, fmt.Sprintf("the index held %.0f entries, over its bound of %d", float64(r.MaxEntries), r.Options.Bound))
	}
	return f
}
