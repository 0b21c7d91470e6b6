package replay

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/promtext"
)

// Options configure a benchmark: every workload × every policy.
type Options struct {
	// Workloads are generated workloads' names; Trace, if set, adds the trace file.
	Workloads []string
	Trace     string
	Policies  []string

	Seed      uint64
	Engines   int
	Requests  int     // per workload; 0: each workload's default
	Rate      float64 // req/s of simulated time; 0: each workload's default
	ErrorRate float64

	Clock     string // ClockReal or ClockVirtual
	TimeScale float64

	// PickerConfig is a picker configuration file (defaults when empty).
	PickerConfig string
	// PickerBin is a prebuilt picker binary; empty builds cmd/extproc.
	PickerBin string
	// PickerAddr targets a running picker instead of starting one per workload; it must have
	// been started with --endpoints as printed by EndpointList. PickerMetricsAddr is its
	// /metrics host:port (optional); PickerTLS: it serves TLS.
	PickerAddr, PickerMetricsAddr string
	PickerTLS                     bool

	// Progress receives the progress display (stderr); nil for none.
	Progress io.Writer
}

// Report is the whole benchmark's outcome.
type Report struct {
	Params   ReportParams   `json:"params"`
	Engine   engine.Config  `json:"engine"`
	Picker   *config.Config `json:"pickerConfig,omitempty"`
	Workload []WorkloadInfo `json:"workloads"`
	Results  []*Summary     `json:"results"`
	Notes    []string       `json:"notes,omitempty"`
	Started  time.Time      `json:"started"`
	Elapsed  float64        `json:"elapsedSeconds"`
}

// ReportParams are the run's parameters.
type ReportParams struct {
	Seed         uint64   `json:"seed"`
	Engines      int      `json:"engines"`
	Requests     int      `json:"requests"`
	Rate         float64  `json:"rate"`
	ErrorRate    float64  `json:"errorRate"`
	Clock        string   `json:"clock"`
	TimeScale    float64  `json:"timeScale"`
	Policies     []string `json:"policies"`
	Workloads    []string `json:"workloads"`
	Trace        string   `json:"trace,omitempty"`
	PickerConfig string   `json:"pickerConfigFile,omitempty"`
	PickerAddr   string   `json:"pickerAddr,omitempty"`
}

// WorkloadInfo describes a workload in the report.
type WorkloadInfo struct {
	Name     string         `json:"name"`
	About    string         `json:"about"`
	Requests int            `json:"requests"`
	Rate     float64        `json:"rate"`
	Params   map[string]any `json:"params"`
}

// EndpointList is the --endpoints value of a picker in front of n simulated engines.
func EndpointList(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = EndpointAddr(i)
	}
	return out
}

// Benchmark runs every workload with every policy and returns the report.
func Benchmark(ctx context.Context, o Options) (*Report, error) {
	if o.Engines < 1 {
		o.Engines = 8
	}
	if o.Clock == "" {
		o.Clock = ClockReal
	}
	if o.TimeScale <= 0 {
		o.TimeScale = 10
	}
	if len(o.Policies) == 0 {
		o.Policies = Policies()
	}
	for _, p := range o.Policies {
		if !slices.Contains(Policies(), p) {
			return nil, fmt.Errorf("unknown policy %q (have %s)", p, strings.Join(Policies(), ", "))
		}
	}
	if len(o.Workloads) == 0 && o.Trace == "" {
		o.Workloads = Workloads()
	}
	ecfg := EngineConfig()
	rep := &Report{
		Params: ReportParams{Seed: o.Seed, Engines: o.Engines, Requests: o.Requests, Rate: o.Rate, ErrorRate: o.ErrorRate,
			Clock: o.Clock, TimeScale: o.TimeScale, Policies: o.Policies, Workloads: o.Workloads, Trace: o.Trace,
			PickerConfig: o.PickerConfig, PickerAddr: o.PickerAddr},
		Engine:  ecfg,
		Started: time.Now(),
	}
	if o.Clock == ClockVirtual {
		rep.Params.TimeScale = 0 // lockstep: no wall-time pacing
	}
	if o.PickerAddr != "" && slices.Contains(o.Policies, KVPick) {
		rep.Notes = append(rep.Notes, "kvpick ran against a picker at "+o.PickerAddr+
			": its prefix index carries over from one workload to the next, and its configuration is not recorded")
	}

	// Check names and read the trace before anything runs; generate each workload when its
	// turn comes (the largest takes ~150 MB).
	spec := Spec{Seed: o.Seed, Engines: o.Engines, Requests: o.Requests, Rate: o.Rate, ErrorRate: o.ErrorRate, Engine: ecfg}
	for _, name := range o.Workloads {
		if _, _, err := DefaultSize(name, o.Engines); err != nil {
			return nil, err
		}
	}
	var trace *Workload
	if o.Trace != "" {
		var err error
		if trace, err = ReadTraceFile(o.Trace, spec); err != nil {
			return nil, err
		}
	}
	if o.ErrorRate < 0 || o.ErrorRate > 1 {
		return nil, fmt.Errorf("error rate %v outside [0, 1]", o.ErrorRate)
	}

	var pickerBin string
	var tmp string
	if slices.Contains(o.Policies, KVPick) {
		var err error
		tmp, err = os.MkdirTemp("", "kvpick-replay-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		if o.PickerAddr == "" {
			if rep.Picker, err = PickerConfig(o.PickerConfig, EndpointList(o.Engines), EngineConfig().NumGPUBlocks); err != nil {
				return nil, err
			}
			if pickerBin = o.PickerBin; pickerBin == "" {
				o.progressf("building the picker (%s)...\n", PickerPackage)
				if pickerBin, err = BuildPicker(ctx, tmp); err != nil {
					return nil, err
				}
			}
		}
	}

	n := len(o.Workloads)
	if trace != nil {
		n++
	}
	for i := range n {
		w := trace
		if i < len(o.Workloads) {
			o.progressf("generating %s...\n", o.Workloads[i])
			var err error
			if w, err = Generate(o.Workloads[i], spec); err != nil {
				return nil, err
			}
		}
		rep.Workload = append(rep.Workload, WorkloadInfo{Name: w.Name, About: w.About, Requests: len(w.Requests), Rate: w.Rate, Params: w.Params})
		for _, pol := range o.Policies {
			s, err := o.runOne(ctx, w, pol, ecfg, rep.Picker, pickerBin, tmp)
			if err != nil {
				return nil, fmt.Errorf("%s / %s: %w", w.Name, pol, err)
			}
			rep.Results = append(rep.Results, s)
		}
	}
	rep.Elapsed = time.Since(rep.Started).Seconds()
	return rep, nil
}

func (o *Options) progressf(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format, args...)
	}
}

func (o *Options) runOne(ctx context.Context, w *Workload, pol string, ecfg engine.Config, pcfg *config.Config, bin, tmp string) (s *Summary, err error) {
	rc := RunConfig{Workload: w, Policy: pol, Engines: o.Engines, Engine: ecfg, Clock: o.Clock, TimeScale: o.TimeScale}
	var before *promtext.Metrics
	if pol == KVPick {
		var p *Picker
		if o.PickerAddr != "" {
			p, err = DialPicker(ctx, o.PickerAddr, o.PickerMetricsAddr, o.PickerTLS)
		} else {
			// A fresh picker per workload: its index must not remember the previous one.
			p, err = StartPicker(ctx, bin, pcfg, tmp)
		}
		if err != nil {
			return nil, err
		}
		defer func() {
			if serr := p.Stop(); serr != nil && err == nil {
				s, err = nil, fmt.Errorf("picker: %w", serr)
			}
		}()
		rc.Picker = p
		if p.MetricsAddr != "" {
			if before, err = ScrapeMetrics(ctx, p.MetricsAddr); err != nil {
				return nil, fmt.Errorf("picker metrics: %w", err)
			}
		}
	}
	bar := newProgressBar(o.Progress, w.Name+" / "+pol, len(w.Requests))
	rc.Progress = bar.update
	res, err := Run(ctx, rc)
	bar.finish(err)
	if err != nil {
		if rc.Picker != nil && rc.Picker.Logs() != "" {
			err = fmt.Errorf("%w\npicker log:\n%s", err, rc.Picker.Logs())
		}
		return nil, err
	}
	s = Summarize(res)
	if rc.Picker != nil && rc.Picker.MetricsAddr != "" {
		after, err := ScrapeMetrics(ctx, rc.Picker.MetricsAddr)
		if err != nil {
			return nil, fmt.Errorf("picker metrics: %w", err)
		}
		addPickerMetrics(s, before, after)
	}
	return s, nil
}

// addPickerMetrics fills the picker's numbers from two scrapes of its /metrics, before and
// after the run.
func addPickerMetrics(s *Summary, before, after *promtext.Metrics) {
	const dec = "kvpick_decision_duration_seconds"
	bs := promtext.SubBuckets(after.Histogram(dec), before.Histogram(dec))
	s.Decision = Quantiles{P50: Num(promtext.BucketQuantile(0.5, bs)), P90: Num(promtext.BucketQuantile(0.9, bs)), P99: Num(promtext.BucketQuantile(0.99, bs)),
		Mean: Num(math.NaN())}
	sum1, _ := value(after, dec+"_sum")
	sum0, _ := value(before, dec+"_sum")
	n1, _ := value(after, dec+"_count")
	n0, _ := value(before, dec+"_count")
	if n1 > n0 {
		s.Decision.Mean = Num((sum1 - sum0) / (n1 - n0))
	}
	if v, ok := value(after, "process_resident_memory_bytes"); ok {
		s.PickerRSSBytes = Num(v)
	}
	h1, ok1 := value(after, "kvpick_prefix_predicted_hit_blocks_total")
	t1, ok2 := value(after, "kvpick_prefix_request_blocks_total")
	h0, _ := value(before, "kvpick_prefix_predicted_hit_blocks_total")
	t0, _ := value(before, "kvpick_prefix_request_blocks_total")
	if ok1 && ok2 && t1 > t0 {
		s.PredictedHitRatio = Num((h1 - h0) / (t1 - t0))
	}
}
