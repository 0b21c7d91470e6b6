package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/servermetrics"
	"github.com/kvpick/kvpick/internal/freeport"
	"github.com/kvpick/kvpick/internal/progress"
	"github.com/kvpick/kvpick/internal/promtext"
)

// Options configure a benchmark: every seed × workload × scenario × policy.
type Options struct {
	// Workloads are generated workloads' names; Trace, if set, adds the trace file.
	Workloads []string
	Trace     string
	Policies  []string

	// Seeds are the workloads' seeds; each seed is a full run (empty: seed 1).
	Seeds     []uint64
	Engines   int
	Requests  int     // per workload; 0: each workload's default
	Rate      float64 // req/s of simulated time; 0: each workload's default
	ErrorRate float64

	Clock     string // ClockReal or ClockVirtual
	TimeScale float64

	// Scenarios are the conditions every workload runs under (StandardScenarios, or one from
	// the flags); empty: one DefaultScenario.
	Scenarios []Scenario

	// MetricsInterval is how often (simulated time) the baselines that read model-server
	// metrics get a new snapshot (0: 50 ms).
	MetricsInterval time.Duration
	// VirtualRefresh is the picker's scrape interval in wall time on the virtual clock (0: 1 ms).
	VirtualRefresh time.Duration
	// MetricsFlavor is whose metric names the simulated servers' /metrics use (empty: vLLM's).
	MetricsFlavor servermetrics.Flavor

	// PickerConfig is a picker configuration file (defaults when empty).
	PickerConfig string
	// PickerBin is a prebuilt picker binary; empty builds cmd/extproc.
	PickerBin string
	// PickerAddr targets a running picker instead of starting one per run; it must have been
	// started with --endpoints as printed by EndpointList. PickerMetricsAddr is its
	// /metrics host:port (optional); PickerTLS: it serves TLS.
	PickerAddr, PickerMetricsAddr string
	PickerTLS                     bool
	// PickerLogDir, if set, receives each started picker's whole log, one file per run
	// (SCENARIO-WORKLOAD-seedN.log); PickerLogLevel is the picker's --log-level ("" leaves its
	// info; nothing quieter, or its "picker serving" line is not logged): "debug" logs every
	// decision with each candidate's scores, its request_id "replay-N" the N of the run's
	// RequestRecord.
	PickerLogDir, PickerLogLevel string
	// Replicas is how many active instances of each router that runs as a service of its own
	// (0 or 1: one): kvpick's pickers, each started with the same configuration and scraping
	// every engine, and the gie and sglang baselines; the requests go to them in turn
	// (docs/replay.md, "Router replicas").
	Replicas int
	// ShareCommits has kvpick's replicas share their commits (peers.addresses: each lists
	// them all); only with Replicas above 1.
	ShareCommits bool

	// Progress receives the progress display (stderr); nil for none.
	Progress io.Writer
	// Records, if set, receives every request of every run as a JSON line (RequestRecord), for
	// diagnosing a policy request by request.
	Records io.Writer
}

// RequestRecord is one request's line in Options.Records. Times are in simulated seconds.
type RequestRecord struct {
	Scenario string `json:"scenario"`
	Workload string `json:"workload"`
	Seed     uint64 `json:"seed"`
	Policy   string `json:"policy"`
	// ID is the request's index in the workload; After the request whose end it follows (the
	// previous turn or step; -1 for none); Group what it shares its prefix with (-1: nothing).
	ID     int  `json:"id"`
	After  int  `json:"after"`
	Group  int  `json:"group"`
	Stream bool `json:"stream"`
	// Arrival is from the start of the run; Engine -1 when it was not routed.
	Arrival float64 `json:"arrival"`
	Engine  int     `json:"engine"`
	Status  int     `json:"status"`
	// TTFT, AdmissionWait (arrival to the first prefill chunk) and Latency (arrival to the end)
	// are 0 for a request that did not complete.
	TTFT          float64 `json:"ttft"`
	AdmissionWait float64 `json:"admissionWait"`
	Latency       float64 `json:"latency"`
	PromptTokens  int     `json:"promptTokens"`
	CachedTokens  int     `json:"cachedTokens"`
	OutputTokens  int     `json:"outputTokens"`
	Preemptions   int     `json:"preemptions"`
}

// writeRecords writes one run's requests to o.Records.
func (o *Options) writeRecords(sc Scenario, seed uint64, w *Workload, pol string, res *RunResult) error {
	enc := json.NewEncoder(o.Records)
	for i, r := range res.Records {
		rec := RequestRecord{Scenario: sc.Name, Workload: w.Name, Seed: seed, Policy: pol, ID: i, After: -1, Group: -1,
			Stream: r.Stream, Arrival: r.Arrival.Sub(res.Start).Seconds(), Engine: r.Engine, Status: r.Status}
		if i < len(w.Requests) {
			rec.After, rec.Group = w.Requests[i].After, w.Requests[i].Group
		}
		if r.OK() {
			rec.TTFT = r.Result.FirstToken.Sub(r.Arrival).Seconds()
			rec.AdmissionWait = r.Result.Admitted.Sub(r.Arrival).Seconds()
			rec.Latency = r.Result.End.Sub(r.Arrival).Seconds()
			rec.PromptTokens, rec.CachedTokens = r.Result.PromptTokens, r.Result.CachedTokens
			rec.OutputTokens, rec.Preemptions = r.Result.CompletionTokens, r.Result.Preemptions
		}
		if err := enc.Encode(&rec); err != nil {
			return fmt.Errorf("request records: %w", err)
		}
	}
	return nil
}

// Scenario is a condition a workload runs under: how the servers answer and how big their
// caches are, and how the picker is configured.
type Scenario struct {
	Name  string `json:"name"`
	About string `json:"about"`
	// Timing is TimingVLLM or TimingFirstToken.
	Timing string `json:"responseTiming"`
	// Streaming is the generated workloads' mix of streamed requests (a trace keeps its own).
	Streaming StreamMix `json:"streaming"`
	// OmitCachedTokens: the servers run without --enable-prompt-tokens-details.
	OmitCachedTokens bool `json:"omitCachedTokens"`
	// KVBlocks spreads num_gpu_blocks over the engines (ParseKVBlocks); "" keeps the engine
	// model's.
	KVBlocks string `json:"kvBlocks,omitempty"`
	// LoadFollowsCaches scales every generated workload's requests and rate by the engines'
	// mean num_gpu_blocks over the engine model's: KV memory bounds the batch, so engines with
	// a third of the memory serve about a third of the load (and the distinct prefixes keep
	// their share of the pool's cache).
	LoadFollowsCaches bool `json:"loadFollowsCaches,omitempty"`
	// LoadScale, when > 0, scales every generated workload's requests and rate (on top of
	// LoadFollowsCaches): a busier or quieter pool than the workload's default.
	LoadScale float64 `json:"loadScale,omitempty"`
	// CapacityFactor, when > 0, sets the picker's lruCapacityPerEndpoint to this multiple of
	// the engines' mean num_gpu_blocks.
	CapacityFactor float64 `json:"capacityFactor,omitempty"`
	// OmitCacheConfig: the servers do not report their KV cache's size on /metrics, so the
	// picker sizes its index from its configuration (and corrects it from what responses show).
	OmitCacheConfig bool `json:"omitCacheConfig,omitempty"`
	// Policies, if set, restricts the policies run in this scenario; BaselinesFrom names the
	// scenario whose baselines the ratios then use (same workload and seed).
	Policies      []string `json:"policies,omitempty"`
	BaselinesFrom string   `json:"baselinesFrom,omitempty"`
}

// DefaultScenario is vLLM's response timing, the default stream mix and the engine model's
// caches.
func DefaultScenario() Scenario {
	return Scenario{Name: "default", About: "vLLM's response timing, 80% streamed (half with usage), 4,096-block caches",
		Timing: TimingVLLM, Streaming: DefaultStreaming}
}

// SmallCaches is the KV-cache spread of the small, unequal caches scenario: 768 to 1,856
// blocks of 16 tokens, as in the vLLM-faithful replay of issue 8.
const SmallCaches = "768-1856"

// BusyLoad is the small-caches-busy scenario's load: 0.55 of every workload's default requests
// and rate on the small caches, 1.72x small-caches' 0.32. There queues form and caches fill
// (least-loaded's shared-prefix TTFT p90 ~2 s, precise's ~0.3 s), the range issue 8's external
// replay reported (1.1 s and 0.3 s), while the default load on these caches measures overload
// (every policy's p50 ~20 s; docs/replay.md, "Scenarios").
const BusyLoad = 0.55

// HeavyLoad and OverLoad are the loads of the heavy suite on the small caches: at 0.7 of the
// default most engines lack KV room for a long prompt at a time (kvpick's multi-turn p90 was
// 1.2x gie's there), at 0.85 every policy's queues grow for the whole run (docs/benchmarks.md,
// "Heavier loads").
const (
	HeavyLoad = 0.7
	OverLoad  = 0.85
)

// HeavyScenarios are the conditions of the heavy suite: the small caches beyond the standard
// scenarios' loads, where the picker's trade-offs are tested under memory pressure.
func HeavyScenarios() []Scenario {
	heavy := DefaultScenario()
	heavy.Name, heavy.About = "small-caches-heavy", "the small caches at 0.7 of the default load: most engines short of KV room for a long prompt"
	heavy.KVBlocks, heavy.LoadScale = SmallCaches, HeavyLoad
	over := heavy
	over.Name, over.About = "small-caches-overload", "the small caches at 0.85 of the default load: queues grow for the whole run under every policy"
	over.LoadScale = OverLoad
	return []Scenario{heavy, over}
}

// StandardScenarios are the conditions of the standard report (docs/replay.md, "Scenarios").
func StandardScenarios() []Scenario {
	d := DefaultScenario()
	mixed := d
	mixed.Name, mixed.About = "mixed", "half the requests not streamed (their headers come at the end), half the streams with usage"
	mixed.Streaming = StreamMix{Fraction: 0.5, UsageFraction: 0.5}
	// The in-process policies never see a response: under any stream mix they route exactly as
	// in default, so only the picker runs again.
	mixed.Policies, mixed.BaselinesFrom = []string{KVPick}, d.Name
	small := d
	small.Name, small.About = "small-caches", "KV caches of 768-1,856 blocks spread over the engines; requests and rate x0.32 (their mean / 4,096)"
	small.KVBlocks, small.LoadFollowsCaches = SmallCaches, true
	over := small
	over.Name, over.About = "capacity-x10", "small caches that the servers do not report (no cache_config_info); the picker configured with 10x their mean num_gpu_blocks"
	over.CapacityFactor, over.Policies, over.BaselinesFrom = 10, []string{KVPick}, small.Name
	over.OmitCacheConfig = true
	under := over
	under.Name, under.About = "capacity-x0.1", "small caches that the servers do not report; the picker configured with a tenth of their mean num_gpu_blocks"
	under.CapacityFactor = 0.1
	busy := d
	busy.Name, busy.About = "small-caches-busy", "the small caches at 0.55 of the default load (1.72x small-caches'): queues and full caches"
	busy.KVBlocks, busy.LoadScale = SmallCaches, BusyLoad
	return []Scenario{d, mixed, small, over, under, busy}
}

// Report is the whole benchmark's outcome.
type Report struct {
	Params ReportParams  `json:"params"`
	Engine engine.Config `json:"engine"`
	// Pickers are the configurations of the pickers the replay started, per scenario, with the
	// settings it overrode.
	Pickers    map[string]*PickerSetup `json:"pickers,omitempty"`
	Scenarios  []Scenario              `json:"scenarios"`
	Workload   []WorkloadInfo          `json:"workloads"`
	Results    []*Summary              `json:"results"`
	Aggregates []*Aggregate            `json:"aggregates"`
	Notes      []string                `json:"notes,omitempty"`
	Started    time.Time               `json:"started"`
	Elapsed    float64                 `json:"elapsedSeconds"`
}

// ReportParams are the run's parameters.
type ReportParams struct {
	Seeds           []uint64 `json:"seeds"`
	Engines         int      `json:"engines"`
	Requests        int      `json:"requests"`
	Rate            float64  `json:"rate"`
	ErrorRate       float64  `json:"errorRate"`
	Clock           string   `json:"clock"`
	TimeScale       float64  `json:"timeScale"`
	MetricsInterval string   `json:"metricsInterval"`
	MetricsFlavor   string   `json:"metricsFlavor"`
	VirtualRefresh  string   `json:"virtualRefresh,omitempty"`
	Policies        []string `json:"policies"`
	Workloads       []string `json:"workloads"`
	Trace           string   `json:"trace,omitempty"`
	PickerConfig    string   `json:"pickerConfigFile,omitempty"`
	PickerAddr      string   `json:"pickerAddr,omitempty"`
	Replicas        int      `json:"replicas,omitempty"`
}

// WorkloadInfo describes a generated workload in the report.
type WorkloadInfo struct {
	Name     string         `json:"name"`
	Seed     uint64         `json:"seed"`
	About    string         `json:"about"`
	Requests int            `json:"requests"`
	Rate     float64        `json:"rate"`
	Params   map[string]any `json:"params"`
}

// EndpointList is the --endpoints value of a picker in front of n simulated engines when the
// replay targets a picker it did not start (--picker-addr).
func EndpointList(n int) []string { return DefaultEndpointBase.List(n) }

func (o *Options) defaults() error {
	if o.Engines < 1 {
		o.Engines = 8
	}
	if o.Clock == "" {
		o.Clock = ClockReal
	}
	if o.TimeScale <= 0 {
		o.TimeScale = 10
	}
	if o.MetricsInterval <= 0 {
		o.MetricsInterval = DefaultMetricsInterval
	}
	if o.MetricsFlavor == "" {
		o.MetricsFlavor = servermetrics.VLLM
	}
	if _, err := servermetrics.ParseFlavor(string(o.MetricsFlavor)); err != nil {
		return err
	}
	if o.VirtualRefresh <= 0 {
		o.VirtualRefresh = DefaultVirtualRefresh
	}
	if len(o.Seeds) == 0 {
		o.Seeds = []uint64{1}
	}
	if len(o.Policies) == 0 {
		o.Policies = PolicyNames()
	}
	for _, p := range o.Policies {
		if !slices.Contains(PolicyNames(), p) {
			return fmt.Errorf("unknown policy %q (have %s)", p, strings.Join(PolicyNames(), ", "))
		}
	}
	if len(o.Workloads) == 0 && o.Trace == "" {
		o.Workloads = Workloads()
	}
	if len(o.Scenarios) == 0 {
		o.Scenarios = []Scenario{DefaultScenario()}
	}
	names := map[string]bool{}
	for _, sc := range o.Scenarios {
		if names[sc.Name] {
			return fmt.Errorf("scenario %q twice", sc.Name)
		}
		names[sc.Name] = true
		if !slices.Contains(ResponseTimings(), sc.Timing) {
			return fmt.Errorf("scenario %s: response timing %q (want %s)", sc.Name, sc.Timing, strings.Join(ResponseTimings(), " or "))
		}
		if err := sc.Streaming.validate(); err != nil {
			return fmt.Errorf("scenario %s: %w", sc.Name, err)
		}
		if _, err := ParseKVBlocks(sc.KVBlocks, o.Engines); err != nil {
			return fmt.Errorf("scenario %s: %w", sc.Name, err)
		}
		if sc.BaselinesFrom != "" && !names[sc.BaselinesFrom] {
			return fmt.Errorf("scenario %s: baselines from %q, which does not run before it", sc.Name, sc.BaselinesFrom)
		}
	}
	if o.ErrorRate < 0 || o.ErrorRate > 1 {
		return fmt.Errorf("error rate %v outside [0, 1]", o.ErrorRate)
	}
	if o.Replicas < 0 || o.Replicas > 16 {
		return fmt.Errorf("replicas %d outside [1, 16]", o.Replicas)
	}
	if o.ShareCommits && o.Replicas < 2 {
		return errors.New("sharing commits needs at least two replicas")
	}
	if o.Replicas > 1 && o.PickerAddr != "" {
		return errors.New("picker replicas are started by the replay: not with a picker address")
	}
	for _, name := range o.Workloads {
		if _, _, err := DefaultSize(name, o.Engines); err != nil {
			return err
		}
	}
	return nil
}

// policies returns the policies a scenario runs, in report order.
func (o *Options) policies(sc Scenario) []string {
	if len(sc.Policies) == 0 {
		return o.Policies
	}
	var out []string
	for _, p := range o.Policies {
		if slices.Contains(sc.Policies, p) {
			out = append(out, p)
		}
	}
	return out
}

// Benchmark runs every seed, workload, scenario and policy and returns the report.
func Benchmark(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	ecfg := EngineConfig()
	rep := &Report{
		Params: ReportParams{Seeds: o.Seeds, Engines: o.Engines, Requests: o.Requests, Rate: o.Rate, ErrorRate: o.ErrorRate,
			Clock: o.Clock, TimeScale: o.TimeScale, MetricsInterval: o.MetricsInterval.String(), Policies: o.Policies,
			MetricsFlavor: string(o.MetricsFlavor),
			Workloads:     o.Workloads, Trace: o.Trace, PickerConfig: o.PickerConfig, PickerAddr: o.PickerAddr},
		Engine:    ecfg,
		Scenarios: o.Scenarios,
		Pickers:   map[string]*PickerSetup{},
		Started:   time.Now(),
	}
	if o.Clock == ClockVirtual {
		rep.Params.TimeScale = 0 // lockstep: no wall-time pacing
		rep.Params.VirtualRefresh = o.VirtualRefresh.String()
	}
	wantsPicker := false
	for _, sc := range o.Scenarios {
		wantsPicker = wantsPicker || slices.Contains(o.policies(sc), KVPick)
	}
	if o.Replicas > 1 {
		rep.Params.Replicas = o.Replicas
		rep.Notes = append(rep.Notes, fmt.Sprintf("kvpick, gie and sglang ran as %d active replicas each, the requests spread over them in turn; "+
			"kvpick's decision and memory figures are its replicas' together (memory: the largest)", o.Replicas))
		if o.ShareCommits {
			rep.Notes = append(rep.Notes, "kvpick's replicas shared their commits (peers.addresses); gie's and sglang's did not")
		}
	}
	if o.PickerAddr != "" && wantsPicker {
		rep.Notes = append(rep.Notes, "kvpick ran against a picker at "+o.PickerAddr+
			": its prefix index carries over from one run to the next, and its configuration is not recorded")
	}

	var trace *Workload
	if o.Trace != "" {
		var err error
		spec := Spec{Seed: o.Seeds[0], Engines: o.Engines, Requests: o.Requests, Rate: o.Rate, ErrorRate: o.ErrorRate, Engine: ecfg}
		if trace, err = ReadTraceFile(o.Trace, spec); err != nil {
			return nil, err
		}
	}

	var pickerBin, tmp string
	var pickerDefaults []byte // the binary's own config/default.yaml
	if wantsPicker {
		var err error
		if tmp, err = os.MkdirTemp("", "kvpick-replay-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		if o.PickerAddr == "" {
			// Check the configuration before anything runs.
			if _, err := PickerConfig(PickerOptions{File: o.PickerConfig, Endpoints: EndpointList(o.Engines)}); err != nil {
				return nil, err
			}
			if pickerBin = o.PickerBin; pickerBin == "" {
				o.progressf("building the picker (%s)...\n", PickerPackage)
				if pickerBin, err = BuildPicker(ctx, tmp); err != nil {
					return nil, err
				}
			}
			if pickerDefaults, err = PickerDefaults(ctx, pickerBin); err != nil {
				return nil, err
			}
		}
	}

	names := append([]string(nil), o.Workloads...)
	if trace != nil {
		names = append(names, trace.Name)
	}
	for _, seed := range o.Seeds {
		for _, name := range names {
			gens := map[workloadSize]*Workload{}
			for _, sc := range o.Scenarios {
				w := trace
				if trace == nil || name != trace.Name {
					k, err := o.size(name, sc, ecfg)
					if err != nil {
						return nil, err
					}
					k.mix = sc.Streaming
					if w = gens[k]; w == nil {
						o.progressf("generating %s (seed %d)...\n", name, seed)
						mix := sc.Streaming
						if w, err = Generate(name, Spec{Seed: seed, Engines: o.Engines, Requests: k.requests, Rate: k.rate,
							ErrorRate: o.ErrorRate, Engine: ecfg, Streaming: &mix}); err != nil {
							return nil, err
						}
						// One generation per stream mix and size (three in the standard
						// scenarios; the largest workload takes ~150 MB).
						gens[k] = w
						rep.Workload = append(rep.Workload, WorkloadInfo{Name: w.Name, Seed: seed, About: w.About,
							Requests: len(w.Requests), Rate: w.Rate, Params: w.Params})
					}
				}
				for _, pol := range o.policies(sc) {
					s, err := o.runOne(ctx, rep, sc, seed, w, pol, ecfg, pickerBin, pickerDefaults, tmp)
					if err != nil {
						return nil, fmt.Errorf("%s / %s / seed %d / %s: %w", sc.Name, w.Name, seed, pol, err)
					}
					rep.Results = append(rep.Results, s)
				}
			}
		}
	}
	rep.Aggregates = Aggregates(rep.Results, o.Scenarios)
	for _, s := range rep.Results {
		if s.Scrape != nil && s.Scrape.Note != "" {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s / %s / seed %d: %s", s.Scenario, s.Workload, s.Seed, s.Scrape.Note))
		}
		if ps := s.PeerSync; ps != nil && (ps.Timeouts > 0 || ps.Unpaced) {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s / %s / seed %d: the picker replicas' sharing was not paced to the virtual clock "+
				"(%d waits timed out; unpaced: %v — a picker built before stop 32), so the run may not repeat", s.Scenario, s.Workload, s.Seed, ps.Timeouts, ps.Unpaced))
		}
		if s.Endpoint != "" && s.Endpoint != DefaultEndpointBase.Addr(0) {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s / %s / seed %d: the engines listened from %s (another process held %s): "+
				"the picker breaks ties by hashing addresses, so this run may differ from an undisturbed one", s.Scenario, s.Workload,
				s.Seed, s.Endpoint, DefaultEndpointBase.Addr(0)))
		}
	}
	rep.Elapsed = time.Since(rep.Started).Seconds()
	return rep, nil
}

// workloadSize is what a generated workload depends on besides its name and seed.
type workloadSize struct {
	mix      StreamMix
	requests int     // 0: the workload's default
	rate     float64 // 0: the workload's default
}

// size returns a generated workload's requests and rate in a scenario: the flags' (or the
// workload's defaults), scaled with the caches when the scenario says so.
func (o *Options) size(name string, sc Scenario, ecfg engine.Config) (k workloadSize, err error) {
	k.requests, k.rate = o.Requests, o.Rate
	if !sc.LoadFollowsCaches && sc.LoadScale <= 0 {
		return k, nil
	}
	n, r, err := DefaultSize(name, o.Engines)
	if err != nil {
		return k, err
	}
	if k.requests == 0 {
		k.requests = n
	}
	if k.rate == 0 {
		k.rate = r
	}
	scale := 1.0
	if sc.LoadFollowsCaches {
		blocks, err := ParseKVBlocks(sc.KVBlocks, o.Engines)
		if err != nil {
			return k, err
		}
		scale = meanBlocks(blocks, ecfg) / float64(ecfg.NumGPUBlocks)
	}
	if sc.LoadScale > 0 {
		scale *= sc.LoadScale
	}
	k.requests = max(1, int(math.Round(float64(k.requests)*scale)))
	k.rate *= scale
	return k, nil
}

func (o *Options) progressf(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format, args...)
	}
}

// ParseKVBlocks turns a KV-cache spec into num_gpu_blocks per engine: "" (nil: the engine
// model's), "N" (every engine), "LO-HI" (evenly spaced from LO to HI, in a fixed shuffled order
// so that engine 0 is not the smallest) or a comma-separated list of one value per engine.
func ParseKVBlocks(spec string, n int) ([]int, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, nil
	}
	num := func(s string) (int, error) {
		var v int
		if _, err := fmt.Sscanf(strings.TrimSpace(s), "%d", &v); err != nil || v < 1 || fmt.Sprint(v) != strings.TrimSpace(s) {
			return 0, fmt.Errorf("KV blocks %q: %q is not a positive integer", spec, s)
		}
		return v, nil
	}
	out := make([]int, n)
	switch {
	case strings.Contains(spec, ","):
		parts := strings.Split(spec, ",")
		if len(parts) != n {
			return nil, fmt.Errorf("KV blocks %q: %d values for %d engines", spec, len(parts), n)
		}
		for i, p := range parts {
			v, err := num(p)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
	case strings.Contains(spec, "-"):
		a, b, _ := strings.Cut(spec, "-")
		lo, err := num(a)
		if err != nil {
			return nil, err
		}
		hi, err := num(b)
		if err != nil {
			return nil, err
		}
		if hi < lo {
			return nil, fmt.Errorf("KV blocks %q: %d > %d", spec, lo, hi)
		}
		perm := newRand(0, "kv-blocks").Perm(n)
		for i := range n {
			v := lo
			if n > 1 {
				v = lo + int(math.Round(float64(hi-lo)*float64(i)/float64(n-1)))
			}
			out[perm[i]] = v
		}
	default:
		v, err := num(spec)
		if err != nil {
			return nil, err
		}
		for i := range out {
			out[i] = v
		}
	}
	return out, nil
}

func (o *Options) runOne(ctx context.Context, rep *Report, sc Scenario, seed uint64, w *Workload, pol string,
	ecfg engine.Config, bin string, binDefaults []byte, tmp string) (s *Summary, err error) {
	blocks, err := ParseKVBlocks(sc.KVBlocks, o.Engines)
	if err != nil {
		return nil, err
	}
	rc := RunConfig{Workload: w, Policy: pol, Engines: o.Engines, Engine: ecfg, KVBlocks: blocks, Clock: o.Clock,
		TimeScale: o.TimeScale, Timing: sc.Timing, OmitCachedTokens: sc.OmitCachedTokens, OmitCacheConfig: sc.OmitCacheConfig,
		MetricsInterval: o.MetricsInterval,
		MetricsFlavor:   o.MetricsFlavor, Seed: seed, Replicas: o.Replicas}
	var before []*promtext.Metrics
	// Every picker is stopped when the run ends, then the engines' endpoints closed; a failed
	// exit fails the run.
	var started []*Picker
	defer func() {
		for _, p := range started {
			if serr := p.Stop(); serr != nil && err == nil {
				s, err = nil, fmt.Errorf("picker: %w", serr)
			}
		}
		if rc.Endpoints != nil {
			rc.Endpoints.Close()
		}
	}()
	if pol == KVPick {
		eps, err := ListenEndpoints(o.Engines, DefaultEndpointBase, o.PickerAddr != "")
		if err != nil {
			return nil, err
		}
		rc.Endpoints = eps
		var p *Picker
		if o.PickerAddr != "" {
			p, err = DialPicker(ctx, o.PickerAddr, o.PickerMetricsAddr, o.PickerTLS)
		} else {
			capacity := 0
			if sc.CapacityFactor > 0 {
				capacity = int(math.Round(sc.CapacityFactor * meanBlocks(blocks, ecfg)))
			}
			n := max(1, o.Replicas)
			var ports []int
			var peerAddrs []string
			if o.ShareCommits {
				if ports, err = freeport.Loopback(n); err != nil {
					return nil, err
				}
				for _, p := range ports {
					peerAddrs = append(peerAddrs, fmt.Sprintf("127.0.0.1:%d", p))
				}
				if o.Clock == ClockVirtual {
					// Paced: each replica polls the others through the sync's proxies.
					ps, err := NewPeerSync(peerAddrs, 0)
					if err != nil {
						return nil, err
					}
					defer ps.Close()
					rc.PeerSync, peerAddrs = ps, ps.Addrs()
				}
			}
			setup, err := PickerConfig(PickerOptions{File: o.PickerConfig, Defaults: binDefaults, Endpoints: eps.Addrs(),
				Clock: o.Clock, TimeScale: o.TimeScale, VirtualRefresh: o.VirtualRefresh, CapacityBlocks: capacity, Peers: peerAddrs})
			if err != nil {
				return nil, err
			}
			if rep.Pickers[sc.Name] == nil {
				rep.Pickers[sc.Name] = setup
			}
			if setup.Refresh > 0 {
				rc.MetricsInterval = setup.Refresh
			} else {
				rc.ScrapeOff = true
			}
			// Fresh pickers per run: an index must not remember the previous run.
			for k := range n {
				var run PickerRun
				if ports != nil {
					run.Args = []string{fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", ports[k])}
				}
				if o.PickerLogDir != "" {
					suffix := ""
					if k > 0 {
						suffix = fmt.Sprintf("-replica%d", k)
					}
					run.LogFile = filepath.Join(o.PickerLogDir, fmt.Sprintf("%s-%s-seed%d%s.log", sc.Name, w.Name, seed, suffix))
				}
				run.LogLevel = o.PickerLogLevel
				r, err := StartPicker(ctx, bin, setup.Config, tmp, run)
				if err != nil {
					return nil, err
				}
				started = append(started, r)
				if k == 0 {
					p = r
				} else {
					rc.PickerReplicas = append(rc.PickerReplicas, r)
				}
			}
		}
		if err != nil {
			return nil, err
		}
		if o.PickerAddr != "" {
			started = append(started, p)
		}
		rc.Picker = p
		if before, err = scrapePickers(ctx, rc); err != nil {
			return nil, err
		}
	}
	label := fmt.Sprintf("%s/%s/%d/%s", sc.Name, w.Name, seed, pol)
	bar := progress.Count(o.Progress, label, "requests", len(w.Requests))
	rc.Progress = bar.Update
	res, err := Run(ctx, rc)
	if err != nil {
		bar.Stop("FAILED")
	} else {
		bar.Stop("done")
	}
	if err != nil {
		if rc.Picker != nil && rc.Picker.Logs() != "" {
			err = fmt.Errorf("%w\npicker log:\n%s", err, rc.Picker.Logs())
		}
		return nil, err
	}
	s = Summarize(res)
	s.Scenario, s.Seed = sc.Name, seed
	if o.Records != nil {
		if err := o.writeRecords(sc, seed, w, pol, res); err != nil {
			return nil, err
		}
	}
	if rc.Endpoints != nil {
		s.Endpoint = rc.Endpoints.Addrs()[0]
	}
	if before != nil {
		after, err := scrapePickers(ctx, rc)
		if err != nil {
			return nil, err
		}
		addPickerMetrics(s, before, after)
	}
	return s, nil
}

// scrapePickers scrapes every picker of a run: one page per replica (nil: the picker's
// metrics address is unknown).
func scrapePickers(ctx context.Context, rc RunConfig) ([]*promtext.Metrics, error) {
	if rc.Picker == nil || rc.Picker.MetricsAddr == "" {
		return nil, nil
	}
	var pages []*promtext.Metrics
	for _, p := range append([]*Picker{rc.Picker}, rc.PickerReplicas...) {
		m, err := ScrapeMetrics(ctx, p.MetricsAddr)
		if err != nil {
			return nil, fmt.Errorf("picker metrics: %w", err)
		}
		pages = append(pages, m)
	}
	return pages, nil
}

func meanBlocks(blocks []int, ecfg engine.Config) float64 {
	if len(blocks) == 0 {
		return float64(ecfg.NumGPUBlocks)
	}
	sum := 0
	for _, b := range blocks {
		sum += b
	}
	return float64(sum) / float64(len(blocks))
}

// addPickerMetrics fills the picker's numbers from two scrapes of its /metrics, before and
// after the run, one page per replica: decisions and predicted hits of all replicas together,
// the largest replica's memory.
func addPickerMetrics(s *Summary, before, after []*promtext.Metrics) {
	const dec = "kvpick_decision_duration_seconds"
	var bs []promtext.Bucket
	delta := func(name string) (d float64, ok bool) {
		for k := range after {
			v1, ok1 := value(after[k], name)
			v0, _ := value(before[k], name)
			d, ok = d+v1-v0, ok || ok1
		}
		return d, ok
	}
	for k := range after {
		d := promtext.SubBuckets(after[k].Histogram(dec), before[k].Histogram(dec))
		if bs == nil {
			bs = d
			continue
		}
		for i := range min(len(bs), len(d)) {
			bs[i].Count += d[i].Count
		}
	}
	s.Decision = Quantiles{P50: Num(promtext.BucketQuantile(0.5, bs)), P90: Num(promtext.BucketQuantile(0.9, bs)), P99: Num(promtext.BucketQuantile(0.99, bs)),
		Mean: Num(math.NaN())}
	sum, _ := delta(dec + "_sum")
	if n, _ := delta(dec + "_count"); n > 0 {
		s.Decision.Mean = Num(sum / n)
	}
	for _, m := range after {
		if v, ok := value(m, "process_resident_memory_bytes"); ok && (math.IsNaN(float64(s.PickerRSSBytes)) || v > float64(s.PickerRSSBytes)) {
			s.PickerRSSBytes = Num(v)
		}
	}
	h, ok1 := delta("kvpick_prefix_predicted_hit_blocks_total")
	t, ok2 := delta("kvpick_prefix_request_blocks_total")
	if ok1 && ok2 && t > 0 {
		s.PredictedHitRatio = Num(h / t)
	}
}
