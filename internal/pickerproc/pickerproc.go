// Package pickerproc runs the picker binary (cmd/extproc) as a child process for tools that
// measure it from outside, the load generator (internal/loadgen) and the replay benchmark
// (internal/replay): it builds the binary, starts it plaintext on free loopback ports, learns the
// ports from its "picker serving" log line, waits until it is ready, keeps the end of its log
// for error messages and stops it the way Kubernetes would (SIGTERM, then a kill).
package pickerproc

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
)

// Package is the import path of the picker's command.
const Package = "github.com/kvpick/kvpick/cmd/extproc"

const (
	module = "github.com/kvpick/kvpick"
	// startTimeout bounds each step of the start (the serving line, then readiness): a cold
	// picker built with -race on a busy machine takes seconds, a broken one never gets there.
	startTimeout = 30 * time.Second
	// stopTimeout is the drain a SIGTERM gets before the kill, as a pod's grace period.
	stopTimeout      = 30 * time.Second
	defaultTailLines = 40
)

// Options say how to start the picker.
type Options struct {
	Bin       string   // the extproc binary
	Config    []byte   // YAML or JSON, written to a temporary file in Dir; nil runs the built-in defaults
	Dir       string   // where the configuration file goes ("" is the system's temporary directory)
	Args      []string // extra flags, after the ones Start sets (a repeated flag's last value wins)
	LogFile   string   // when set, every log line of the picker is copied there
	TailLines int      // how many of the last log lines to keep for Logs and errors; 0 is 40
}

// Process is a started picker.
type Process struct {
	// GRPCAddr, HealthAddr and MetricsAddr are the bound loopback host:ports of the ext_proc,
	// gRPC health and /metrics (and /debug/pprof) servers; MetricsAddr is "" when the serving
	// line does not give it.
	GRPCAddr, HealthAddr, MetricsAddr string
	PID                               int

	cmd     *exec.Cmd
	exited  chan struct{} // closed once the process was waited for and its log read to the end
	waitErr error         // cmd.Wait's result, set before exited is closed

	mu      sync.Mutex
	tail    []string
	maxTail int
	byLevel map[string]int
}

// Start starts the picker on free ports (plaintext, log level info) and returns once its
// readiness health service is SERVING. It fails, with the picker's last log lines in the error,
// when the picker exits first, does not get there within 30 s, or ctx is done; the process is
// killed then.
func Start(ctx context.Context, o Options) (*Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// --enable-pprof: the load generator profiles the picker and forces its GCs through
	// /debug/pprof.
	args := []string{"--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0", "--secure-serving=false", "--log-level=info", "--enable-pprof"}
	cfgFile := ""
	if o.Config != nil {
		var err error
		if cfgFile, err = writeTemp(o.Dir, o.Config); err != nil {
			return nil, err
		}
		args = append(args, "--config-file="+cfgFile)
	}
	removeCfg := func() {
		if cfgFile != "" {
			_ = os.Remove(cfgFile)
		}
	}
	cmd := exec.Command(o.Bin, append(args, o.Args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		removeCfg()
		return nil, err
	}
	var logw io.WriteCloser // an interface: a nil *os.File in it would not be nil
	if o.LogFile != "" {
		f, err := os.Create(o.LogFile)
		if err != nil {
			removeCfg()
			return nil, err
		}
		logw = f
	}
	if err := cmd.Start(); err != nil {
		removeCfg()
		if logw != nil {
			logw.Close()
		}
		return nil, err
	}
	p := &Process{PID: cmd.Process.Pid, cmd: cmd, exited: make(chan struct{}), maxTail: o.TailLines,
		byLevel: map[string]int{}}
	if p.maxTail <= 0 {
		p.maxTail = defaultTailLines
	}
	serving := make(chan map[string]any, 1)
	go func() {
		// Wait only after the log was read to its end: Wait closes the pipe, and the last lines
		// are the ones that say why a picker exited.
		p.readLogs(stderr, logw, serving)
		if logw != nil {
			logw.Close()
		}
		p.waitErr = cmd.Wait()
		removeCfg() // read at start only; nothing of the run should stay behind in Dir
		close(p.exited)
	}()

	sctx, cancel := context.WithTimeoutCause(ctx, startTimeout, errors.New(`picker did not log "picker serving" within 30 s`))
	defer cancel()
	var rec map[string]any
	select {
	case rec = <-serving:
	case <-p.exited:
		return nil, p.fail(fmt.Errorf("picker exited at start (%v)", p.waitErr))
	case <-sctx.Done():
		return nil, p.fail(context.Cause(sctx))
	}
	p.GRPCAddr, p.HealthAddr, p.MetricsAddr = loopback(rec["ext_proc"]), loopback(rec["health"]), loopback(rec["metrics"])
	if p.GRPCAddr == "" || p.HealthAddr == "" {
		return nil, p.fail(fmt.Errorf("cannot read the picker's addresses from its serving line %v", rec))
	}
	if err := p.waitReady(ctx); err != nil {
		return nil, p.fail(err)
	}
	return p, nil
}

// writeTemp writes b to a new file in dir: pickers started side by side must not share one.
func writeTemp(dir string, b []byte) (string, error) {
	f, err := os.CreateTemp(dir, "picker-*.yaml")
	if err != nil {
		return "", err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// loopback turns a bound address from the log ("[::]:41234") into one to dial on this machine.
func loopback(v any) string {
	s, _ := v.(string)
	_, port, err := net.SplitHostPort(s)
	if err != nil || port == "" {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", port)
}

// readLogs reads the picker's zap JSON log to its end: it keeps the tail, counts lines by
// level, copies them to w when set and hands the first "picker serving" record to Start.
func (p *Process) readLogs(r io.Reader, w io.Writer, serving chan<- map[string]any) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		line := sc.Text()
		if w != nil {
			_, _ = io.WriteString(w, line+"\n")
		}
		var head struct{ Level, Msg string }
		isJSON := json.Unmarshal([]byte(line), &head) == nil
		p.mu.Lock()
		if isJSON {
			p.byLevel[head.Level]++
		}
		p.tail = append(p.tail, line)
		if len(p.tail) > p.maxTail {
			p.tail = p.tail[len(p.tail)-p.maxTail:]
		}
		p.mu.Unlock()
		if isJSON && head.Msg == "picker serving" && !sent {
			var rec map[string]any
			_ = json.Unmarshal([]byte(line), &rec)
			serving <- rec // buffered for this one record
			sent = true
		}
	}
	// A line over 1 MiB stops the scanner; keep draining so the picker never blocks on stderr.
	_, _ = io.Copy(io.Discard, r)
}

// waitReady polls the "readiness" health service until it is SERVING: the picker serves
// before its pool is synced, and requests before that are answered 503.
func (p *Process) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeoutCause(ctx, startTimeout, errors.New("picker not ready within 30 s"))
	defer cancel()
	conn, err := grpc.NewClient(p.HealthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		ccancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		last := err
		if err == nil {
			last = fmt.Errorf("status %v", resp.GetStatus())
		}
		select {
		case <-p.exited:
			return fmt.Errorf("picker exited before it was ready (%v)", p.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("%w (health %s, last answer: %v)", context.Cause(ctx), p.HealthAddr, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// fail kills the picker that did not start and adds its log to err.
func (p *Process) fail(err error) error {
	p.Kill()
	return fmt.Errorf("%w\npicker log:\n%s", err, p.Logs())
}

// Exited is closed when the process has ended (and its log was read to the end).
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Kill kills the process and waits for it to end.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Stop sends SIGTERM, so that the picker drains its streams, and waits up to 30 s for it to
// exit before it kills it. It returns an error, ending with the picker's last log lines, when
// the picker had to be killed or exited with a failure (also before Stop: a crash, or a race
// the race detector found).
func (p *Process) Stop() error {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(stopTimeout)
		defer t.Stop()
		select {
		case <-p.exited:
		case <-t.C:
			p.Kill()
			return fmt.Errorf("picker did not exit within 30 s of SIGTERM; killed\npicker log:\n%s", p.Logs())
		}
	}
	if p.waitErr != nil {
		return fmt.Errorf("picker exited with %w\npicker log:\n%s", p.waitErr, p.Logs())
	}
	return nil
}

// Logs returns the last lines the picker logged (Options.TailLines of them), one a line.
func (p *Process) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

// LogCounts counts the picker's JSON log lines by their zap "level" ("info", "warn", ...).
func (p *Process) LogCounts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.byLevel))
	for k, v := range p.byLevel {
		out[k] = v
	}
	return out
}

// ModuleRoot finds the kvpick module's root directory from the working directory up.
func ModuleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && declares(b, module) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("not inside the kvpick module (no go.mod for %s in or above %s)", module, wd)
		}
		dir = parent
	}
}

// declares reports whether go.mod content b is module path's.
func declares(b []byte, path string) bool {
	for line := range bytes.Lines(b) {
		if f := strings.Fields(string(line)); len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == path {
			return true
		}
	}
	return false
}

// Build compiles the picker into dir with go build and extra flags (-race, say) and returns the
// binary's path. The go command runs in root, the kvpick module or one that requires it ("" is
// the working directory), so the picker is built from that module's sources.
func Build(ctx context.Context, root, dir string, flags ...string) (string, error) {
	bin := filepath.Join(dir, "extproc")
	args := append(append([]string{"build", "-o", bin}, flags...), Package)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", Package, err, out)
	}
	return bin, nil
}
