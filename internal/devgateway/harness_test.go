package devgateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/devgateway"
	"github.com/kvpick/kvpick/internal/runnertest"
	"github.com/kvpick/kvpick/pkg/runner"
)

// testTimeout bounds every client call: a gateway that hangs fails the test instead of
// hanging it. Generous, because CI machines are small and loaded; no test asserts a duration.
const testTimeout = 30 * time.Second

// picker is a real picker (default pipeline, plaintext gRPC) in process. Built with
// runner.Build, so no active health check runs: the tests decide which endpoints fail.
type picker struct {
	pk   *runner.Picker
	addr string
}

func startPicker(t *testing.T, endpoints []string, edit func(*config.Config)) *picker {
	t.Helper()
	cfg := config.Default()
	cfg.Pool.Endpoints = endpoints
	if edit != nil {
		edit(cfg)
	}
	pk, addr := runnertest.Serve(t, cfg)
	return &picker{pk: pk, addr: addr}
}

// metric sums a counter or gauge over the label sets that match labels (name, value, ...).
func (p *picker) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := p.pk.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func matches(m *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			found = found || (lp.GetName() == kv[i] && lp.GetValue() == kv[i+1])
		}
		if !found {
			return false
		}
	}
	return true
}

// inFlight is the pool's total in-flight count: it returns to 0 once every stream ended.
func (p *picker) inFlight() int64 {
	var n int64
	for _, e := range p.pk.Pool.Snapshot() {
		n += e.InFlight()
	}
	return n
}

// gateway is a devgateway behind an httptest server. logs records what it logged.
type gateway struct {
	url  string
	logs *observer.ObservedLogs
}

func startGateway(t *testing.T, o devgateway.Options) *gateway {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	o.Log = zap.New(core)
	if o.Policy == "" || o.Policy == devgateway.PolicyPicker {
		if o.Picker == nil {
			t.Fatal("startGateway: no picker connection")
		}
	}
	g, err := devgateway.New(o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	t.Cleanup(func() {
		srv.Close()
		g.Close()
	})
	return &gateway{url: srv.URL, logs: logs}
}

// pickerGateway starts a gateway in front of p in mode.
func pickerGateway(t *testing.T, p *picker, mode string) *gateway {
	t.Helper()
	conn, err := devgateway.DialPicker(p.addr, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	m, err := devgateway.ParseMode(mode)
	if err != nil {
		t.Fatal(err)
	}
	return startGateway(t, devgateway.Options{Picker: conn, Mode: m, RetryOnReset: true})
}

// model is a stand-in model server: it records what it received and answers with handle
// (default: a small chat completion). x-served-by names it, as the simulator does.
type model struct {
	addr string
	srv  *httptest.Server

	mu       sync.Mutex
	requests []seen
}

type seen struct {
	method, path string
	header       http.Header
	body         []byte
}

func startModel(t *testing.T, handle http.HandlerFunc) *model {
	t.Helper()
	m := &model{}
	if handle == nil {
		handle = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("content-type", "application/json")
			_, _ = io.WriteString(w, `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`)
		}
	}
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		m.mu.Lock()
		m.requests = append(m.requests, seen{method: r.Method, path: r.URL.RequestURI(), header: r.Header.Clone(), body: body})
		m.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		w.Header().Set("x-served-by", m.addr)
		handle(w, r)
	}))
	m.addr = m.srv.Listener.Addr().String()
	t.Cleanup(m.srv.Close)
	return m
}

func (m *model) seen() []seen {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]seen(nil), m.requests...)
}

// closedAddr is a loopback address nothing listens on: connecting to it fails at once.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func chatBody(model, prompt string, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{
		"model":    model,
		"stream":   stream,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	return b
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

// post sends one request through the gateway and reads the whole answer.
func post(t *testing.T, url, path string, body []byte) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the body: %v", path, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// openAIError decodes an OpenAI-style error body, failing the test if it is not one.
func openAIError(t *testing.T, b []byte) (typ, code, msg string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("want an OpenAI-style JSON error, got %q (%v)", b, err)
	}
	return e.Error.Type, fmt.Sprint(e.Error.Code), e.Error.Message
}

// eventually polls cond until it holds or testTimeout passes (a bound, not an assertion on time).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not true after %v: %s", testTimeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gatewayGoroutines lists the goroutines running gateway or ext_proc-client code.
func gatewayGoroutines() []string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "kvpick/internal/devgateway.") || strings.Contains(g, "kvpick/internal/dataplane.") {
			out = append(out, g)
		}
	}
	return out
}
