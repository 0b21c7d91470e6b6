// Package demo runs the whole kvpick path in one process for the one-command demo
// (cmd/demo): simulated model servers (internal/engine), the picker (pkg/runner) and the
// development gateway (internal/devgateway), all on loopback; and a short mixed workload that
// compares the picker with round-robin on fresh simulators.
package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/devgateway"
	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/httpserver"
	"github.com/kvpick/kvpick/pkg/runner"
)

// StackOptions configure a Stack.
type StackOptions struct {
	// Policy is the gateway's: devgateway.PolicyPicker runs the picker; round-robin and random
	// run no picker.
	Policy devgateway.Policy
	// Sims is the number of simulated model servers (default 4).
	Sims int
	// Sim configures every simulator (default SimConfig()).
	Sim *engine.Config
	// GatewayAddr is the gateway's listen address (default 127.0.0.1:0, a free port).
	GatewayAddr string
	// Log receives the components' logs (default: none).
	Log *zap.Logger
}

// SimConfig is the simulators' configuration for the demo: vLLM's timing shape, sped up so
// that a few hundred requests take seconds on a laptop, and a KV cache small enough that
// duplicating every conversation on every server (what round-robin does) costs evictions.
func SimConfig() engine.Config {
	c := engine.DefaultConfig()
	c.NumGPUBlocks = 2000 // 32K tokens per server
	c.PrefillPerToken = 100 * time.Microsecond
	c.DecodePerToken = 4 * time.Millisecond
	return c
}

// Stack is a running set of simulators, picker and gateway.
type Stack struct {
	// GatewayURL is where clients send requests ("http://127.0.0.1:port").
	GatewayURL string
	// PickerAddr, PickerMetricsAddr: the picker's ext_proc and /metrics addresses ("" without
	// a picker).
	PickerAddr, PickerMetricsAddr string
	// Sims are the simulators, in the order of the pool.
	Sims []*Sim

	cancel  context.CancelFunc
	servers []*http.Server
	gw      *devgateway.Gateway
	wg      sync.WaitGroup
	errMu   sync.Mutex
	err     error
}

// Sim is one simulated model server.
type Sim struct {
	Addr   string
	Engine *engine.Engine
}

// Start starts a stack; Close stops it. The picker (if any) is ready when Start returns.
func Start(ctx context.Context, o StackOptions) (_ *Stack, err error) {
	if o.Policy == "" {
		o.Policy = devgateway.PolicyPicker
	}
	if o.Sims <= 0 {
		o.Sims = 4
	}
	simCfg := SimConfig()
	if o.Sim != nil {
		simCfg = *o.Sim
	}
	if o.GatewayAddr == "" {
		o.GatewayAddr = "127.0.0.1:0"
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	// The gateway's address first: it is the one a user chooses, and may find taken.
	gln, err := net.Listen("tcp", o.GatewayAddr)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &Stack{cancel: cancel}
	defer func() {
		if err != nil {
			gln.Close()
			s.Close()
		}
	}()

	// Simulators on 127.0.0.1 with their own ports: other loopback addresses are not
	// configured on every OS (macOS has 127.0.0.1 only).
	var addrs []string
	for i := 0; i < o.Sims; i++ {
		eng, err := engine.New(simCfg, engine.RealClock{})
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		h := httpserver.New(eng, httpserver.Options{AlwaysUsage: true, Logger: o.Log.Named(fmt.Sprintf("sim%d", i))})
		s.serve(&http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, ln)
		s.Sims = append(s.Sims, &Sim{Addr: ln.Addr().String(), Engine: eng})
		addrs = append(addrs, ln.Addr().String())
	}

	gopt := devgateway.Options{Policy: o.Policy, RetryOnReset: true, Log: o.Log.Named("gateway")}
	if o.Policy == devgateway.PolicyPicker {
		cfg := config.Default()
		cfg.Pool.Endpoints = addrs
		cfg.ExtProc.Fallbacks = 2 // the gateway takes a list: survive a dead server
		type addrs3 struct{ grpc, metrics net.Addr }
		ready := make(chan addrs3, 1)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			err := runner.Run(rctx, runner.Options{
				GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
				Config: cfg, SecureServing: true, Log: o.Log.Named("picker"),
				Ready: func(g, _, m net.Addr) { ready <- addrs3{g, m} },
			})
			if err != nil {
				s.fail(fmt.Errorf("picker: %w", err))
				cancel()
			}
		}()
		select {
		case a := <-ready:
			s.PickerAddr, s.PickerMetricsAddr = a.grpc.String(), a.metrics.String()
		case <-rctx.Done():
			return nil, s.failure(errors.New("the picker did not start"))
		}
		conn, err := devgateway.DialPicker(s.PickerAddr, true)
		if err != nil {
			return nil, err
		}
		context.AfterFunc(rctx, func() { conn.Close() })
		gopt.Picker = conn
	} else {
		gopt.Endpoints = addrs
	}
	g, err := devgateway.New(gopt)
	if err != nil {
		return nil, err
	}
	s.gw = g
	s.serve(&http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}, gln)
	s.GatewayURL = "http://" + gln.Addr().String()
	return s, nil
}

func (s *Stack) serve(srv *http.Server, ln net.Listener) {
	s.servers = append(s.servers, srv)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.fail(err)
		}
	}()
}

func (s *Stack) fail(err error) {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

func (s *Stack) failure(fallback error) error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	if s.err != nil {
		return s.err
	}
	return fallback
}

// Err reports a component that stopped on its own (nil while all run).
func (s *Stack) Err() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err
}

// Close stops everything: the gateway first (its clients), then the simulators (their
// requests), then the picker (its streams have ended by then).
func (s *Stack) Close() {
	for i := len(s.servers) - 1; i >= 0; i-- {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if s.servers[i].Shutdown(ctx) != nil {
			_ = s.servers[i].Close()
		}
		cancel()
	}
	if s.gw != nil {
		s.gw.Close()
	}
	s.cancel()
	s.wg.Wait()
}

// SimStats are the simulators' counters, summed: what their /metrics report
// (vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total, vllm:prompt_tokens_total and
// vllm:time_to_first_token_seconds).
type SimStats struct {
	CacheQueries, CacheHits, PromptTokens uint64 // tokens
	TTFTCount                             uint64
	TTFTSum                               float64 // seconds
}

// Stats sums the simulators' counters.
func (s *Stack) Stats() SimStats {
	var t SimStats
	for _, sim := range s.Sims {
		st := sim.Engine.Stats()
		t.CacheQueries += st.PrefixCacheQueries
		t.CacheHits += st.PrefixCacheHits
		t.PromptTokens += st.PromptTokens
		t.TTFTCount += st.TTFT.Count
		t.TTFTSum += st.TTFT.Sum
	}
	return t
}

// CurlExample is a request to paste into a shell.
func (s *Stack) CurlExample() string {
	return strings.Join([]string{
		"curl -s " + s.GatewayURL + "/v1/chat/completions -H 'content-type: application/json' \\",
		`  -d '{"model":"` + engine.DefaultConfig().Model + `","messages":[{"role":"user","content":"Hello!"}],"max_tokens":32}'`,
	}, "\n")
}
