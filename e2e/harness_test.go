//go:build linux

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Bounds, not expectations: a 2-core CI machine running the race detector is slow, and a wait
// that runs out fails the test with the processes' logs instead of hanging it.
const (
	startTimeout   = 60 * time.Second // a process answering its health check
	requestTimeout = 45 * time.Second // one request through the gateway
	settleTimeout  = 30 * time.Second // the system noticing something (a dead endpoint, a restart)
)

// bins are the commands under test, built once by TestMain.
var bins struct{ picker, sim, gateway string }

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // every test skips itself
	}
	dir, err := os.MkdirTemp("", "kvpick-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	code := 1
	if err := build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building the commands:", err)
	} else {
		code = m.Run()
	}
	killAll() // backstop: every test kills its own processes in t.Cleanup
	os.RemoveAll(dir)
	os.Exit(code)
}

// build compiles the three commands into dir. KVPICK_E2E_RACE=1 builds them with the race
// detector (slower to build and to run; the suite's own -race covers only the test process).
func build(dir string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return err
	}
	args := []string{"build", "-o", dir + string(os.PathSeparator)}
	if os.Getenv("KVPICK_E2E_RACE") == "1" {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/extproc", "./cmd/simserver", "./cmd/devgateway")
	cmd := exec.Command(goBin, args...)
	cmd.Dir = ".." // the module root: this package is e2e/
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	bins.picker = filepath.Join(dir, "extproc")
	bins.sim = filepath.Join(dir, "simserver")
	bins.gateway = filepath.Join(dir, "devgateway")
	return nil
}

func needE2E(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end suite: skipped with -short")
	}
}

// ---- processes -------------------------------------------------------------------------------

// proc is one child process in its own process group, its output in a log file.
type proc struct {
	name    string
	bin     string
	args    []string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
}

var (
	liveMu sync.Mutex
	live   = map[*proc]bool{}
)

func killAll() {
	liveMu.Lock()
	defer liveMu.Unlock()
	for p := range live {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// startProc starts bin; the test's cleanup kills its process group (after printing the log's
// tail if the test failed).
func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, bin: bin, args: args, logPath: filepath.Join(t.TempDir(), name+".log")}
	p.launch(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- %s (%s %s), last lines of its log:\n%s", p.name, filepath.Base(p.bin), strings.Join(p.args, " "), p.tail(30))
		}
		p.kill()
	})
	return p
}

func (p *proc) launch(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Own process group: kill takes any grandchild too. Pdeathsig: the child dies with the
	// test binary even if it is killed (go test -timeout) before any cleanup runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s: %v", p.name, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	liveMu.Lock()
	live[p] = true
	liveMu.Unlock()
	done := p.done
	go func() {
		_ = cmd.Wait()
		f.Close()
		liveMu.Lock()
		delete(live, p)
		liveMu.Unlock()
		close(done)
	}()
}

// kill SIGKILLs the process group and waits for the process to be reaped.
func (p *proc) kill() {
	if p.cmd == nil || p.exited() {
		return // never signal a reaped pid: its group id may belong to someone else by now
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logEntries returns the JSON (zap) log lines whose "msg" is msg.
func (p *proc) logEntries(msg string) []map[string]any {
	f, err := os.Open(p.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e map[string]any
		if json.Unmarshal(sc.Bytes(), &e) == nil && e["msg"] == msg {
			out = append(out, e)
		}
	}
	return out
}

// waitUntil polls cond until it holds; it fails the test if p exits or the bound passes.
func waitUntil(t *testing.T, p *proc, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if p != nil && p.exited() {
			t.Fatalf("%s exited while waiting for %s", p.name, what)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %v", what, bound)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// ---- addresses ---------------------------------------------------------------------------------

var nextIP atomic.Uint32

// simIP hands out 127.0.0.2, 127.0.0.3, ...: each simulator of a test on its own address,
// the way pods have their own IPs.
func simIP() string { return fmt.Sprintf("127.0.0.%d", 2+nextIP.Add(1)%250) }

// freePort returns a port free on ip (":0" style when ip is ""). Another process may take it
// before the child binds it; on loopback with ephemeral ports that is rare enough.
func freePort(t *testing.T, ip string) int {
	t.Helper()
	return freePorts(t, ip, 1)[0]
}

// freePorts returns n distinct ports free on ip. The listeners stay open until all n are
// chosen: one closed before the next is asked for can come back at once (the picker was once
// given one port for both its gRPC and metrics servers, and could not start).
func freePorts(t *testing.T, ip string, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// httpOK reports whether GET url answers 200.
func httpOK(url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// ---- the three commands ------------------------------------------------------------------------

// sim is one simulated model server.
type sim struct {
	*proc
	addr string
}

// simModel is the simulator's default served model.
const simModel = "meta-llama/Llama-3.1-8B-Instruct"

func startSim(t *testing.T, name string, extra ...string) *sim {
	t.Helper()
	ip := simIP()
	addr := net.JoinHostPort(ip, strconv.Itoa(freePort(t, ip)))
	// The servers report usage and cached tokens, as a deployment whose picker learns from
	// them runs vLLM (--enable-force-include-usage, --enable-prompt-tokens-details).
	args := append([]string{"--addr", addr, "--log-level", "warn", "--always-usage", "--enable-prompt-tokens-details"}, extra...)
	s := &sim{proc: startProc(t, name, bins.sim, args...), addr: addr}
	waitUntil(t, s.proc, startTimeout, name+" /health", func() bool { return httpOK("http://" + addr + "/health") })
	return s
}

// metric sums the simulator's Prometheus samples of name (any labels).
func (s *sim) metric(t *testing.T, name string) float64 {
	t.Helper()
	v, err := scrape("http://"+s.addr+"/metrics", name)
	if err != nil {
		t.Fatalf("%s: %v", s.name, err)
	}
	return v
}

func scrape(url, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || len(line) == len(name) || (line[len(name)] != ' ' && line[len(name)] != '{') {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %v", url, line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

// picker is the picker process; it can be killed and started again on the same ports.
type picker struct {
	*proc
	grpcPort, healthPort, metricsPort int
}

// pickerConfig is the config file of the suite's pickers: two retry fallbacks (the gateway
// takes a list) and a brisk health check so that a dead endpoint is noticed within a second
// or two.
const pickerConfig = `
pool:
  healthCheck:
    interval: 500ms
    timeout: 400ms
    unhealthyThreshold: 2
extProc:
  fallbacks: 2
`

func startPicker(t *testing.T, endpoints []string, configYAML string) *picker {
	t.Helper()
	cfgPath := filepath.Join(t.TempDir(), "picker.yaml")
	if err := os.WriteFile(cfgPath, []byte(configYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, "", 3)
	p := &picker{grpcPort: ports[0], healthPort: ports[1], metricsPort: ports[2]}
	p.proc = startProc(t, "picker", bins.picker,
		"--grpc-port", strconv.Itoa(p.grpcPort), "--grpc-health-port", strconv.Itoa(p.healthPort),
		"--metrics-port", strconv.Itoa(p.metricsPort), "--config-file", cfgPath,
		"--endpoints", strings.Join(endpoints, ","), "--log-level", "info")
	p.waitReady(t)
	return p
}

// waitReady waits for gRPC health "readiness" SERVING on the health port.
func (p *picker) waitReady(t *testing.T) {
	t.Helper()
	conn, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(p.healthPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	waitUntil(t, p.proc, startTimeout, "picker readiness", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
}

// restart starts the picker again with the same arguments (and ports), appending to its log.
func (p *picker) restart(t *testing.T) {
	t.Helper()
	p.kill()
	p.launch(t)
	p.waitReady(t)
}

func (p *picker) metric(t *testing.T, name string) float64 {
	t.Helper()
	v, err := scrape("http://127.0.0.1:"+strconv.Itoa(p.metricsPort)+"/metrics", name)
	if err != nil {
		t.Fatalf("picker: %v", err)
	}
	return v
}

// gateway is the devgateway process.
type gateway struct {
	*proc
	url string
}

func startGateway(t *testing.T, pk *picker, extra ...string) *gateway {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t, "127.0.0.1"))
	args := append([]string{"--listen", addr, "--picker", "127.0.0.1:" + strconv.Itoa(pk.grpcPort), "--log-level", "info"}, extra...)
	g := &gateway{proc: startProc(t, "devgateway", bins.gateway, args...), url: "http://" + addr}
	waitUntil(t, g.proc, startTimeout, "devgateway /health", func() bool { return httpOK(g.url + "/health") })
	return g
}

// cluster is n simulators, a picker over them and a gateway in front.
type cluster struct {
	sims   []*sim
	picker *picker
	gw     *gateway
	client *client
}

type clusterOptions struct {
	sims       int
	simArgs    func(i int) []string // extra simulator flags, by index
	pickerYAML string               // default pickerConfig
}

func startCluster(t *testing.T, o clusterOptions) *cluster {
	t.Helper()
	if o.pickerYAML == "" {
		o.pickerYAML = pickerConfig
	}
	c := &cluster{}
	var addrs []string
	for i := 0; i < o.sims; i++ {
		var extra []string
		if o.simArgs != nil {
			extra = o.simArgs(i)
		}
		s := startSim(t, fmt.Sprintf("sim%d", i), extra...)
		c.sims = append(c.sims, s)
		addrs = append(addrs, s.addr)
	}
	c.picker = startPicker(t, addrs, o.pickerYAML)
	c.gw = startGateway(t, c.picker)
	c.client = newClient(c.gw.url)
	return c
}

// simByAddr returns the simulator at addr, or nil.
func (c *cluster) simByAddr(addr string) *sim {
	for _, s := range c.sims {
		if s.addr == addr {
			return s
		}
	}
	return nil
}
