package replay

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/dataplane"
	"github.com/kvpick/kvpick/pkg/promtext"
)

// PickerPackage is the import path of the picker's command.
const PickerPackage = "github.com/kvpick/kvpick/cmd/extproc"

// BuildPicker compiles the picker binary into dir (with the go command, from the module the
// current directory is in), with extra go build flags, and returns its path.
func BuildPicker(ctx context.Context, dir string, flags ...string) (string, error) {
	out := filepath.Join(dir, "extproc")
	args := append(append([]string{"build", "-o", out}, flags...), PickerPackage)
	cmd := exec.CommandContext(ctx, "go", args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s (run from inside the kvpick module, or pass --picker-bin): %v\n%s",
			PickerPackage, err, b)
	}
	return out, nil
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
			for i, p := range cfg.Plugins {
				if p.Name != prefixScorer {
					continue
				}
				params := map[string]any{}
				if len(p.Parameters) > 0 {
					if err := json.Unmarshal(p.Parameters, &params); err != nil {
						return nil, err
					}
				}
				params[capacityKey] = engineBlocks * 85 / 100
				if cfg.Plugins[i].Parameters, err = json.Marshal(params); err != nil {
					return nil, err
				}
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
	cmd  *exec.Cmd
	logs *tail
	wait chan struct{} // closed when the process exited
	werr error
}

// StartPicker runs the picker binary on free loopback ports with cfg and waits until its
// readiness health check says SERVING.
func StartPicker(ctx context.Context, bin string, cfg *config.Config, dir string) (*Picker, error) {
	b, err := json.MarshalIndent(cfg, "", "  ") // JSON is YAML
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(dir, "picker-*.yaml")
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0",
		"--secure-serving=false", "--log-level=info", "--config-file", f.Name())
	cmd.Stdout = io.Discard
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Picker{cmd: cmd, logs: &tail{max: 40}, wait: make(chan struct{})}
	addrs := make(chan [3]string, 1)
	go p.readLogs(stderr, addrs)
	go func() {
		p.werr = cmd.Wait()
		close(p.wait)
	}()
	var a [3]string
	select {
	case a = <-addrs:
	case <-p.wait:
		return nil, fmt.Errorf("picker exited at start (%v):\n%s", p.werr, p.logs)
	case <-time.After(30 * time.Second):
		p.kill()
		return nil, fmt.Errorf("picker did not start within 30 s:\n%s", p.logs)
	case <-ctx.Done():
		p.kill()
		return nil, ctx.Err()
	}
	p.Addr, p.MetricsAddr = a[0], a[2]
	if err := waitReady(ctx, a[1], p.wait); err != nil {
		p.kill()
		return nil, fmt.Errorf("%v\n%s", err, p.logs)
	}
	if err := p.dial(false); err != nil {
		p.kill()
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

// readLogs keeps the last lines of the picker's log and finds the line that gives its addresses.
func (p *Picker) readLogs(r io.Reader, addrs chan<- [3]string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	found := false
	for sc.Scan() {
		line := sc.Text()
		p.logs.add(line)
		if found || !strings.Contains(line, "picker serving") {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		var a [3]string
		ok := true
		for i, k := range []string{"ext_proc", "health", "metrics"} {
			s, _ := m[k].(string)
			_, port, err := net.SplitHostPort(s)
			if err != nil {
				ok = false
				break
			}
			a[i] = net.JoinHostPort("127.0.0.1", port)
		}
		if ok {
			found = true
			addrs <- a
		}
	}
	_, _ = io.Copy(io.Discard, r)
}

func waitReady(ctx context.Context, healthAddr string, exited <-chan struct{}) error {
	conn, err := grpc.NewClient(healthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("picker not ready within 30 s (last: %v %v)", resp.GetStatus(), err)
		}
		select {
		case <-exited:
			return errors.New("picker exited before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *Picker) kill() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		<-p.wait
	}
}

// Stop closes the connection and, for a picker StartPicker started, stops it with SIGTERM (it
// drains its streams, all closed by then) and waits for it to exit.
func (p *Picker) Stop() error {
	if p.conn != nil {
		p.conn.Close()
	}
	if p.cmd == nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.wait:
	case <-time.After(30 * time.Second):
		p.kill()
		return fmt.Errorf("picker did not exit within 30 s of SIGTERM")
	}
	var ee *exec.ExitError
	if p.werr != nil && !errors.As(p.werr, &ee) {
		return p.werr
	}
	if ee != nil && !ee.Success() {
		return fmt.Errorf("picker exited with %v:\n%s", p.werr, p.logs)
	}
	return nil
}

// Logs returns the last lines the picker logged.
func (p *Picker) Logs() string {
	if p.logs == nil {
		return ""
	}
	return p.logs.String()
}

// tail keeps the last max lines.
type tail struct {
	mu    sync.Mutex
	max   int
	lines []string
}

func (t *tail) add(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, s)
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}

// ---- /metrics ------------------------------------------------------------------------------

// ScrapeMetrics fetches and parses http://addr/metrics.
func ScrapeMetrics(ctx context.Context, addr string) (*promtext.Metrics, error) {
	return promtext.NewScraper("http://" + addr + "/metrics").Scrape(ctx)
}

// value reads a metric summed over its series; ok is false when the page does not have it.
func value(m *promtext.Metrics, name string) (v float64, ok bool) { return m.Sum(name), m.Has(name) }
