package loadgen

import (
	"bufio"
	"bytes"
	"context"
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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"sigs.k8s.io/yaml"

	"github.com/kvpick/kvpick/config"
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
// the active health check off (the endpoints are fake) and, when lruCapacity > 0, the prefix
// index's capacity per endpoint set to it.
func PickerConfig(lruCapacity int) ([]byte, error) {
	cfg := config.Default()
	cfg.Pool.HealthCheck.Interval = 0
	if lruCapacity > 0 {
		found := false
		for i, p := range cfg.Plugins {
			if p.Name != "prefix-scorer" {
				continue
			}
			params := map[string]any{}
			if len(p.Parameters) > 0 {
				if err := json.Unmarshal(p.Parameters, &params); err != nil {
					return nil, err
				}
			}
			params["lruCapacityPerEndpoint"] = lruCapacity
			b, err := json.Marshal(params)
			if err != nil {
				return nil, err
			}
			cfg.Plugins[i].Parameters = b
			found = true
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

// ModuleRoot finds the kvpick module's root directory from the working directory up.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/kvpick/kvpick\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("not inside the kvpick module (no go.mod for github.com/kvpick/kvpick above the working directory): use --picker-bin or --picker-addr")
		}
		dir = parent
	}
}

// BuildPicker compiles cmd/extproc of the module at root into dir and returns the binary's path.
func BuildPicker(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "extproc")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/extproc")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/extproc: %v\n%s", err, out)
	}
	return bin, nil
}

// PickerProcess is a picker binary started by the load generator.
type PickerProcess struct {
	Target
	HealthAddr string
	cmd        *exec.Cmd
	exited     chan struct{}
	waitErr    error

	mu      sync.Mutex
	tail    []string // the last log lines
	byLevel map[string]int
}

// PickerOptions say how to start a picker.
type PickerOptions struct {
	Bin       string   // the extproc binary
	Config    []byte   // YAML configuration, written next to the binary
	Endpoints []string // --endpoints
	Dir       string   // where to write the configuration
	LogFile   string   // when set, every log line of the picker is copied there
	ExtraArgs []string
}

// StartPicker starts the picker on free ports (plaintext), reads the bound addresses from its
// "picker serving" log line and waits until its readiness health service is SERVING.
func StartPicker(ctx context.Context, o PickerOptions) (*PickerProcess, error) {
	cfgPath := filepath.Join(o.Dir, "picker.yaml")
	if err := os.WriteFile(cfgPath, o.Config, 0o644); err != nil {
		return nil, err
	}
	args := []string{"--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0", "--secure-serving=false",
		"--config-file=" + cfgPath, "--log-level=info"}
	if len(o.Endpoints) > 0 {
		args = append(args, "--endpoints="+strings.Join(o.Endpoints, ","))
	}
	args = append(args, o.ExtraArgs...)
	cmd := exec.Command(o.Bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &PickerProcess{cmd: cmd, exited: make(chan struct{}), byLevel: map[string]int{}}
	p.PID = cmd.Process.Pid
	p.Endpoints = o.Endpoints
	var logw io.WriteCloser
	if o.LogFile != "" {
		if logw, err = os.Create(o.LogFile); err != nil {
			_ = cmd.Process.Kill()
			return nil, err
		}
	}
	serving := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if logw != nil {
				fmt.Fprintln(logw, line)
			}
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil {
				lvl, _ := rec["level"].(string)
				p.mu.Lock()
				p.byLevel[lvl]++
				p.mu.Unlock()
				if rec["msg"] == "picker serving" {
					select {
					case serving <- rec:
					default:
					}
				}
			}
			p.mu.Lock()
			p.tail = append(p.tail, line)
			if len(p.tail) > 50 {
				p.tail = p.tail[len(p.tail)-50:]
			}
			p.mu.Unlock()
		}
		if logw != nil {
			logw.Close()
		}
	}()
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()

	fail := func(err error) (*PickerProcess, error) {
		p.Stop()
		return nil, fmt.Errorf("%w\npicker log:\n%s", err, strings.Join(p.LogTail(), "\n"))
	}
	var rec map[string]any
	select {
	case rec = <-serving:
	case <-p.exited:
		return fail(fmt.Errorf("picker exited at start: %v", p.waitErr))
	case <-time.After(30 * time.Second):
		return fail(errors.New("picker did not log \"picker serving\" within 30 s"))
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	local := func(key string) string {
		s, _ := rec[key].(string)
		_, port, err := net.SplitHostPort(s)
		if err != nil {
			return ""
		}
		return net.JoinHostPort("127.0.0.1", port)
	}
	p.GRPCAddr, p.HealthAddr = local("ext_proc"), local("health")
	if m := local("metrics"); m != "" {
		p.MetricsURL = "http://" + m + "/metrics"
		p.PprofURL = "http://" + m + "/debug/pprof"
	}
	if p.GRPCAddr == "" || p.HealthAddr == "" {
		return fail(fmt.Errorf("cannot read the picker's addresses from its log line %v", rec))
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := WaitReady(rctx, p.HealthAddr, "readiness"); err != nil {
		return fail(err)
	}
	return p, nil
}

// WaitReady polls the gRPC health service at addr until service is SERVING.
func WaitReady(ctx context.Context, addr, service string) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: service})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("status %v", resp.GetStatus())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("health %q at %s not SERVING: %v", service, addr, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// LogTail returns the picker's last log lines.
func (p *PickerProcess) LogTail() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.tail...)
}

// LogLevels counts the picker's log lines by level.
func (p *PickerProcess) LogLevels() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.byLevel))
	for k, v := range p.byLevel {
		out[k] = v
	}
	return out
}

// Exited reports whether the picker process has ended.
func (p *PickerProcess) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM, waits up to 30 s for the drain, then kills the picker.
func (p *PickerProcess) Stop() error {
	if p.Exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return errors.New("picker did not stop within 30 s of SIGTERM; killed")
	}
}
