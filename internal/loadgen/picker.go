package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/pickerproc"
)

// Target is the picker under load.
type Target struct {
	GRPCAddr   string   // ext_proc, plaintext
	MetricsURL string   // http://host:port/metrics; "" when unreachable (metric reports are skipped)
	PprofURL   string   // http://host:port/debug/pprof; "" when unreachable
	PID        int      // the picker's process id when local (CPU and RSS from /proc); 0 otherwise
	Endpoints  []string // the picker's pool, to check destinations; nil skips the check
}

// FakeEndpoints returns n distinct addresses in 10.0.0.0/8 for a static pool whose servers do
// not exist (the picker must run with its health check off).
func FakeEndpoints(n int) []string {
	out := make([]string, n)
	for i := range n {
		out[i] = fmt.Sprintf("10.%d.%d.%d:8000", 1+i/(250*250), (i/250)%250, 1+i%250)
	}
	return out
}

// PickerConfig returns a picker configuration file for load tests: the built-in defaults with
// the active health check and the scrape of the model servers' metrics off (the endpoints are
// fake: probing them would cost the picker CPU the load test measures) and, when
// lruCapacity > 0, the prefix index's capacity per endpoint set to it.
func PickerConfig(lruCapacity int) ([]byte, error) {
	cfg := config.Default()
	cfg.Pool.HealthCheck.Interval = 0
	cfg.Pool.Metrics.RefreshInterval = 0
	if lruCapacity > 0 {
		found, err := cfg.SetParameter("prefix-scorer", "lruCapacityPerEndpoint", lruCapacity)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fmt.Errorf("the default configuration has no prefix-scorer")
		}
	}
	j, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(j)
}

// PickerProcess is a picker binary started by the load generator: the Target it serves and
// the process (its log, its exit, Stop).
type PickerProcess struct {
	Target
	Proc *pickerproc.Process
}

// PickerOptions say how to start a picker.
type PickerOptions struct {
	Bin       string   // the extproc binary
	Config    []byte   // YAML configuration
	Endpoints []string // --endpoints
	Dir       string   // where to write the configuration
	LogFile   string   // when set, every log line of the picker is copied there
	ExtraArgs []string
}

// StartPicker starts the picker on free ports (plaintext) with the static pool o.Endpoints and
// waits until it is ready (pickerproc.Start).
func StartPicker(ctx context.Context, o PickerOptions) (*PickerProcess, error) {
	var args []string
	if len(o.Endpoints) > 0 {
		args = append(args, "--endpoints="+strings.Join(o.Endpoints, ","))
	}
	proc, err := pickerproc.Start(ctx, pickerproc.Options{Bin: o.Bin, Config: o.Config, Dir: o.Dir,
		Args: append(args, o.ExtraArgs...), LogFile: o.LogFile, TailLines: 50})
	if err != nil {
		return nil, err
	}
	p := &PickerProcess{Proc: proc, Target: Target{GRPCAddr: proc.GRPCAddr, PID: proc.PID, Endpoints: o.Endpoints}}
	if proc.MetricsAddr != "" {
		p.MetricsURL = "http://" + proc.MetricsAddr + "/metrics"
		p.PprofURL = "http://" + proc.MetricsAddr + "/debug/pprof"
	}
	return p, nil
}
