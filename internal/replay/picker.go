package replay

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"sigs.k8s.io/yaml"

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

// PickerConfig returns the configuration a picker in front of the simulated engines runs with:
// the user's file (or the defaults when file is ""), with the pool set to endpoints and active
// health checks off (the simulated engines serve no HTTP). The prefix index is sized the way
// config/default.yaml tells an operator to size it, 85% of the servers' num_gpu_blocks
// (engineBlocks), unless the file sets lruCapacityPerEndpoint itself.
func PickerConfig(file string, endpoints []string, engineBlocks int) (*config.Config, error) {
	cfg, err := config.Load(file)
	if err != nil {
		return nil, err
	}
	cfg.Pool.Endpoints = endpoints
	cfg.Pool.HealthCheck.Interval = 0
	if engineBlocks > 0 {
		userSet, err := setsCapacity(file)
		if err != nil {
			return nil, err
		}
		if !userSet {
			if _, err := cfg.SetParameter(prefixScorer, capacityKey, engineBlocks*85/100); err != nil {
				return nil, err
			}
		}
	}
	return cfg, cfg.Validate()
}

const (
	prefixScorer = "prefix-scorer"
	capacityKey  = "lruCapacityPerEndpoint"
)

// setsCapacity reports whether the config file gives the prefix scorer a capacity of its own.
func setsCapacity(file string) (bool, error) {
	if file == "" {
		return false, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return false, err
	}
	var doc struct {
		Plugins []struct {
			Name       string         `json:"name"`
			Parameters map[string]any `json:"parameters"`
		} `json:"plugins"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return false, fmt.Errorf("%s: %w", file, err)
	}
	for _, p := range doc.Plugins {
		if _, ok := p.Parameters[capacityKey]; ok && p.Name == prefixScorer {
			return true, nil
		}
	}
	return false, nil
}

// Picker is a connection to a running picker, started by StartPicker or found at an address by
// DialPicker.
type Picker struct {
	// Addr is the ext_proc address; MetricsAddr the /metrics host:port ("" when unknown).
	Addr, MetricsAddr string
	Client            *dataplane.Client

	conn *grpc.ClientConn
	proc *pickerproc.Process // nil for DialPicker's
}

// StartPicker runs the picker binary on free loopback ports with cfg and waits until its
// readiness health check says SERVING.
func StartPicker(ctx context.Context, bin string, cfg *config.Config, dir string) (*Picker, error) {
	b, err := json.MarshalIndent(cfg, "", "  ") // JSON is YAML
	if err != nil {
		return nil, err
	}
	proc, err := pickerproc.Start(ctx, pickerproc.Options{Bin: bin, Config: b, Dir: dir})
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
	if p.conn != nil {
		p.conn.Close()
	}
	if p.proc == nil {
		return nil
	}
	return p.proc.Stop()
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
