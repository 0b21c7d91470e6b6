package runner_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/router"
	"github.com/kvpick/kvpick/pkg/runner"
)

// TestOneSystemPromptInFrontOfAllTrafficSpreadsOverThePool: with the default configuration,
// when every request starts with the same long system prompt and a few requests are in flight
// at a time (below the load guard's margins), the pool shares the traffic instead of the
// endpoints that served the prompt first keeping it; a conversation's later turn still goes
// where its history is.
func TestOneSystemPromptInFrontOfAllTrafficSpreadsOverThePool(t *testing.T) {
	const endpoints, inFlight = 8, 6
	// inFlight+1 requests at a time need inFlight+1 endpoints: spread evenly, none carries
	// more than 1/(inFlight+1) of them (200/7 = 28.6 of 200).
	tests := []struct {
		name       string
		replicate  bool
		wantSpread bool
	}{
		{"hot prefixes replicated (default)", true, true},
		// The contrast: without copies the endpoints that hold the prompt keep it, one of them
		// with twice the others' share (the load guard's margins are not reached).
		{"replicateHotPrefixes off", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Pool.HealthCheck.Interval = 0
			cfg.Pool.Metrics.RefreshInterval = 0
			for i := range endpoints {
				cfg.Pool.Endpoints = append(cfg.Pool.Endpoints, fmt.Sprintf("10.0.0.%d:8000", i+1))
			}
			if _, err := cfg.SetParameter("prefix-scorer", "replicateHotPrefixes", tc.replicate); err != nil {
				t.Fatal(err)
			}
			pk, err := runner.Build(cfg, zap.NewNop())
			if err != nil {
				t.Fatal(err)
			}
			system := strings.Repeat("You are the assistant of a large online shop; follow its policies. ", 60)
			type open struct {
				req *router.Request
				ep  *router.Endpoint
			}
			var window []open
			finish := func(o open) {
				pk.Pipeline.ResponseHeaders(o.req, o.ep, "", 200)
				pk.Pipeline.FirstByte(o.req, o.ep, "")
				pk.Pipeline.Done(o.req, o.ep)
			}
			served := map[string]int{}
			const total = 400
			for i := range total {
				req := routertest.Chat(t, system+fmt.Sprintf(" Question %d about order %d.", i, i*7))
				d, err := pk.Pipeline.Schedule(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				if i >= total-200 {
					served[d.Endpoint.Addr]++
				}
				window = append(window, open{req, d.Endpoint})
				if len(window) > inFlight {
					finish(window[0])
					window = window[1:]
				}
			}
			for _, o := range window {
				finish(o)
			}
			most := 0
			for _, n := range served {
				most = max(most, n)
			}
			spread := len(served) >= inFlight+1 && most <= 30
			if spread != tc.wantSpread {
				t.Fatalf("the last 200 requests went to %d endpoints, at most %d to one (%v): spread evenly over %d = %v, want %v",
					len(served), most, served, inFlight+1, spread, tc.wantSpread)
			}

			// A conversation's own history still draws its next turn.
			first := routertest.Chat(t, system+" My order 12345 has not arrived; "+strings.Repeat("it was due last week. ", 40))
			d, err := pk.Pipeline.Schedule(context.Background(), first)
			if err != nil {
				t.Fatal(err)
			}
			finish(open{first, d.Endpoint})
			for i := range 5 {
				next := routertest.Chat(t, system+" My order 12345 has not arrived; "+strings.Repeat("it was due last week. ", 40)+fmt.Sprintf(" Follow-up %d.", i))
				d2, err := pk.Pipeline.Schedule(context.Background(), next)
				if err != nil {
					t.Fatal(err)
				}
				finish(open{next, d2.Endpoint})
				if d2.Endpoint != d.Endpoint {
					t.Fatalf("follow-up %d went to %s, not to %s where its history is", i, d2.Endpoint.Addr, d.Endpoint.Addr)
				}
			}
		})
	}
}
