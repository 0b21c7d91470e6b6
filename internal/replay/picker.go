package replay

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/internal/pickerproc"
	"github.com/kvpick/kvpick/internal/promtext"
)

// PickerPackage is the import path of the picker's command.
const PickerPackage = pickerproc.Package

// BuildPicker compiles the picker binary into dir (with the go command, from the module the
// current directory is in), with extra go build flags, and returns its path.
func BuildPicker(ctx context.Context, dir string, flags ...string) (string, error) {
	bin, err := pickerproc.Build(ctx, "", dir, flags...)
	if err != nil {
		return "", fmt.Errorf("%w\n(run from inside the kvpick module, or pass --picker-bin)", err)
	}
	return bin, nil
}

// PickerDefaults returns the picker binary's built-in configuration (--print-default-config).
func PickerDefaults(ctx context.Context, bin string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, bin, "--print-default-config").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --print-default-config: %w", bin, err)
	}
	return out, nil
}

// PickerOptions are what the replay must set in the configuration of a picker it starts.
type PickerOptions struct {
	// File is the user's configuration file ("": the defaults).
	File string
	// Defaults is the picker binary's built-in configuration (its --print-default-config), on
	// which File is layered; nil: the replay's own compiled-in defaults. A binary built from
	// another commit than the replay has its own defaults, and runs with them.
	Defaults []byte
	// Endpoints are the simulated engines' addresses.
	Endpoints []string
	// Clock and TimeScale: on the real clock the picker's durations that mean simulated time
	// (the metrics refresh interval and staleness bound) are divided by TimeScale; on the
	// virtual clock the picker scrapes every VirtualRefresh of wall time (default 1 ms) and its
	// metrics never go stale, the driver pacing what they say (docs/replay.md, "Clocks").
	Clock          string
	TimeScale      float64
	VirtualRefresh time.Duration
	// CapacityBlocks, when > 0, sets the prefix scorer's lruCapacityPerEndpoint (the
	// mis-sized-capacity scenarios).
	CapacityBlocks int
	// Peers, when set, are every picker replica's metrics address (peers.addresses): the
	// replicas share their commits, polling at the configured interval in simulated time.
	Peers []string
}

// PickerSetup is the configuration a started picker runs with, and what the replay changed in
// it.
type PickerSetup struct {
	Config *config.Config `json:"config"`
	// Overrides lists every value the replay set, with the value it replaced.
	Overrides []Override `json:"overrides"`
	// Refresh is the picker's metrics refresh interval in simulated time (0: it does not
	// scrape): the virtual clock publishes the engines' metrics at this period.
	Refresh time.Duration `json:"refreshSimulated"`
}

// Override is one setting the replay changed.
type Override struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	Was   string `json:"was"`
	Why   string `json:"why"`
}

func (o Override) String() string {
	return fmt.Sprintf("%s = %s (was %s): %s", o.Key, o.Value, o.Was, o.Why)
}

// DefaultVirtualRefresh is the picker's wall-time scrape interval on the virtual clock: each
// metrics tick waits for a little more than one (the picker's minimum): between ticks its scrape
// loops sit parked (publish), so a short interval costs no CPU.
const DefaultVirtualRefresh = time.Millisecond

// virtualStaleness is the picker's staleness bound on the virtual clock: wall-time gaps never
// make metrics stale there, since the driver itself keeps them exactly one tick old at most.
const virtualStaleness = time.Hour

// PickerConfig returns the configuration a picker in front of the simulated engines runs with:
// the user's file (or the defaults), with the replay's settings (PickerOptions).
func PickerConfig(o PickerOptions) (*PickerSetup, error) {
	base := config.Default()
	if o.Defaults != nil {
		var err error
		if base, err = config.Parse(o.Defaults); err != nil {
			return nil, fmt.Errorf("the picker binary's default configuration (a binary newer than this replay? rebuild the replay): %w", err)
		}
	}
	cfg, err := config.LoadOn(o.File, base)
	if err != nil {
		return nil, err
	}
	if o.TimeScale <= 0 {
		o.TimeScale = 10
	}
	if o.VirtualRefresh <= 0 {
		o.VirtualRefresh = DefaultVirtualRefresh
	}
	st := &PickerSetup{Config: cfg}
	set := func(key, value, was, why string) {
		st.Overrides = append(st.Overrides, Override{key, value, was, why})
	}
	set("pool.endpoints", fmt.Sprintf("[%s]", strings.Join(o.Endpoints, ",")), fmt.Sprintf("%v", cfg.Pool.Endpoints),
		"the simulated engines' loopback addresses")
	cfg.Pool.Endpoints = o.Endpoints
	set("pool.healthCheck.interval", "0s", cfg.Pool.HealthCheck.Interval.D().String(), "health checks off: the simulated engines never fail")
	cfg.Pool.HealthCheck.Interval = 0

	m := &cfg.Pool.Metrics
	st.Refresh = m.RefreshInterval.D()
	if m.RefreshInterval > 0 {
		refresh, stale := m.RefreshInterval.D(), m.StalenessThreshold.D()
		var newRefresh, newStale time.Duration
		var why string
		if o.Clock == ClockVirtual {
			newRefresh, newStale = o.VirtualRefresh, virtualStaleness
			why = fmt.Sprintf("virtual clock: the engines' metrics change every %v of simulated time and the driver waits until the picker has applied them", refresh)
		} else {
			newRefresh = max(time.Millisecond, time.Duration(float64(refresh)/o.TimeScale))
			newStale = max(2*newRefresh, time.Duration(float64(stale)/o.TimeScale))
			why = fmt.Sprintf("real clock: simulated time runs %g times faster than the wall clock", o.TimeScale)
		}
		set("pool.metrics.refreshInterval", newRefresh.String(), refresh.String(), why)
		set("pool.metrics.stalenessThreshold", newStale.String(), stale.String(), why)
		m.RefreshInterval, m.StalenessThreshold = config.Duration(newRefresh), config.Duration(newStale)
	}
	if p := &cfg.Peers; len(o.Peers) > 0 {
		set("peers.addresses", fmt.Sprintf("[%s]", strings.Join(o.Peers, ",")), fmt.Sprintf("%v", p.Addresses),
			"the picker replicas' metrics addresses: they share their commits")
		p.Addresses = o.Peers
		var iv time.Duration
		var why string
		if o.Clock == ClockVirtual {
			iv, why = 100*time.Microsecond, "virtual clock: the driver waits until every replica has applied what another published (docs/replay.md, \"Router replicas\"), so the polls after an answer follow at once"
		} else {
			iv = max(time.Millisecond, time.Duration(float64(p.Interval.D())/o.TimeScale))
			why = fmt.Sprintf("real clock: simulated time runs %g times faster than the wall clock", o.TimeScale)
		}
		set("peers.interval", iv.String(), p.Interval.D().String(), why)
		p.Interval = config.Duration(iv)
	}
	if o.CapacityBlocks > 0 {
		was := "unset"
		if v, ok := pluginParam(cfg, prefixScorer, capacityKey); ok {
			was = v
		}
		found, err := cfg.SetParameter(prefixScorer, capacityKey, o.CapacityBlocks)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fmt.Errorf("the picker configuration has no %s to size", prefixScorer)
		}
		set("plugins."+prefixScorer+"."+capacityKey, fmt.Sprint(o.CapacityBlocks), was,
			"mis-sized capacity scenario: what the picker believes unless the engines report their num_gpu_blocks")
	}
	return st, cfg.Validate()
}

const (
	prefixScorer = "prefix-scorer"
	capacityKey  = "lruCapacityPerEndpoint"
)

// pluginParam returns a plugin parameter as JSON text.
func pluginParam(cfg *config.Config, plugin, key string) (string, bool) {
	for _, p := range cfg.Plugins {
		if p.Name != plugin || len(p.Parameters) == 0 {
			continue
		}
		var params map[string]json.RawMessage
		if json.Unmarshal(p.Parameters, &params) != nil {
			return "", false
		}
		if v, ok := params[key]; ok {
			return string(v), true
		}
	}
	return "", false
}

// Picker is a connection to a running picker, started by StartPicker or found at an address by
// DialPicker.
type Picker struct {
	// Addr is the ext_proc address; MetricsAddr the /metrics host:port ("" when unknown).
	Addr, MetricsAddr string
	Client            *dataplane.Client

	conn *grpc.ClientConn
	proc *pickerproc.Process // nil for DialPicker's

	stopOnce sync.Once
	stopErr  error
}

// PickerRun is how one run's picker logs: to LogFile when set (its whole log), at LogLevel
// when set (its --log-level; the default is info). The zero PickerRun keeps only the log's tail.
type PickerRun struct {
	LogFile, LogLevel string
	// Args are further flags (after the ones the replay sets).
	Args []string
}

// StartPicker runs the picker binary on free loopback ports with cfg, logging as run says, and
// waits until its readiness health check says SERVING.
func StartPicker(ctx context.Context, bin string, cfg *config.Config, dir string, run PickerRun) (*Picker, error) {
	b, err := json.MarshalIndent(cfg, "", "  ") // JSON is YAML
	if err != nil {
		return nil, err
	}
	var args []string
	if run.LogLevel != "" {
		args = append(args, "--log-level="+run.LogLevel)
	}
	args = append(args, run.Args...)
	proc, err := pickerproc.Start(ctx, pickerproc.Options{Bin: bin, Config: b, Dir: dir, Args: args, LogFile: run.LogFile})
	if err != nil {
		return nil, err
	}
	p := &Picker{Addr: proc.GRPCAddr, MetricsAddr: proc.MetricsAddr, proc: proc}
	if err := p.dial(false); err != nil {
		proc.Kill()
		return nil, err
	}
	return p, nil
}

// DialPicker connects to a picker that is already running at addr (ext_proc); metricsAddr, if
// not empty, is its metrics host:port.
func DialPicker(ctx context.Context, addr, metricsAddr string, useTLS bool) (*Picker, error) {
	p := &Picker{Addr: addr, MetricsAddr: metricsAddr}
	if err := p.dial(useTLS); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Picker) dial(useTLS bool) error {
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the picker's self-signed certificate
	}
	conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	p.conn = conn
	p.Client = dataplane.New(conn, dataplane.WithMessageTimeout(30*time.Second))
	return nil
}

// Stop closes the connection and, for a picker StartPicker started, stops it with SIGTERM (it
// drains its streams, all closed by then) and waits for it to exit; a failed exit is an error.
func (p *Picker) Stop() error {
	p.stopOnce.Do(func() {
		if p.conn != nil {
			p.conn.Close()
		}
		if p.proc != nil {
			p.stopErr = p.proc.Stop()
		}
	})
	return p.stopErr
}

// Logs returns the last lines the picker logged ("" for a picker DialPicker found).
func (p *Picker) Logs() string {
	if p.proc == nil {
		return ""
	}
	return p.proc.Logs()
}

// ---- /metrics ------------------------------------------------------------------------------

// ScrapeMetrics fetches and parses http://addr/metrics.
func ScrapeMetrics(ctx context.Context, addr string) (*promtext.Metrics, error) {
	return promtext.NewScraper("http://" + addr + "/metrics").Scrape(ctx)
}

// value reads a metric summed over its series; ok is false when the page does not have it.
func value(m *promtext.Metrics, name string) (v float64, ok bool) { return m.Sum(name), m.Has(name) }
