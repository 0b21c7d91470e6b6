package demo

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvpick/kvpick/internal/devgateway"
	"github.com/kvpick/kvpick/internal/engine"
)

// fastSim keeps the tests short: the same cache, prefill that still matters, quick decode.
func fastSim() *engine.Config {
	c := SimConfig()
	c.DecodePerToken = time.Millisecond
	return &c
}

func TestStackServesRequestsAndStopsCleanly(t *testing.T) {
	for _, policy := range []devgateway.Policy{devgateway.PolicyPicker, devgateway.PolicyRoundRobin} {
		t.Run(string(policy), func(t *testing.T) {
			s, err := Start(context.Background(), StackOptions{Policy: policy, Sims: 2, Sim: fastSim()})
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			defer func() {
				if !closed {
					s.Close()
				}
			}()
			if policy == devgateway.PolicyPicker && (s.PickerAddr == "" || s.PickerMetricsAddr == "") {
				t.Errorf("picker addresses not reported: %q %q", s.PickerAddr, s.PickerMetricsAddr)
			}
			for _, stream := range []bool{false, true} {
				a, err := ask(context.Background(), &http.Client{}, s.GatewayURL, []message{{Role: "user", Content: "Hello from the demo test"}}, stream, 8)
				if err != nil {
					t.Fatalf("stream=%v: %v", stream, err)
				}
				if a.servedBy != s.Sims[0].Addr && a.servedBy != s.Sims[1].Addr {
					t.Errorf("served by %q, not a demo simulator", a.servedBy)
				}
				if a.text == "" || a.promptTokens == 0 {
					t.Errorf("stream=%v: empty answer %+v", stream, a)
				}
			}
			if !strings.Contains(s.CurlExample(), s.GatewayURL+"/v1/chat/completions") {
				t.Errorf("curl example does not target the gateway:\n%s", s.CurlExample())
			}
			done := make(chan struct{})
			go func() { s.Close(); close(done) }()
			select {
			case <-done:
				closed = true
			case <-time.After(60 * time.Second):
				t.Fatal("Close did not return")
			}
			if err := s.Err(); err != nil {
				t.Errorf("a component failed: %v", err)
			}
		})
	}
}

// TestPickerBeatsRoundRobinOnTheDemoWorkload runs the demo's comparison at a reduced size:
// the simulators must report a higher prefix-cache hit rate behind the picker.
func TestPickerBeatsRoundRobinOnTheDemoWorkload(t *testing.T) {
	w := Workload{Chats: 8, Turns: 4, SystemPrompts: 2, Agents: 2, Steps: 4, Unique: 6, Concurrency: 4, MaxTokens: 8, Seed: 1}
	var progress bytes.Buffer
	p, rr, err := Compare(context.Background(), CompareOptions{Workload: w, Sims: 4, Sim: fastSim(), Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	Report(&out, p, rr)
	t.Logf("\n%s", out.String())
	for _, r := range []Result{p, rr} {
		if r.Errors != 0 || r.Requests != w.Requests() {
			t.Errorf("%s: %d errors in %d requests (want 0 in %d): %s", r.Policy, r.Errors, r.Requests, w.Requests(), r.FirstError)
		}
		sum := 0
		for _, n := range r.PerEndpoint {
			sum += n
		}
		if sum != r.Requests-r.Errors {
			t.Errorf("%s: per-endpoint counts %v do not add up to %d answers", r.Policy, r.PerEndpoint, r.Requests-r.Errors)
		}
	}
	if p.HitRate <= rr.HitRate || p.Computed >= rr.Computed {
		t.Errorf("picker hit rate %.3f (computed %d tokens) does not beat round-robin's %.3f (%d)", p.HitRate, p.Computed, rr.HitRate, rr.Computed)
	}
	if p.CachedRatio <= rr.CachedRatio {
		t.Errorf("responses' cached_tokens ratio: picker %.3f, round-robin %.3f", p.CachedRatio, rr.CachedRatio)
	}
	for _, want := range []string{"kvpick picker", "round-robin", "prefix cache hit rate", "requests per server"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// Progress to something that is not a terminal (a buffer, as a pipe or a CI log): one
	// plain line per run at least, never a carriage return.
	if strings.ContainsRune(progress.String(), '\r') {
		t.Errorf("carriage returns in progress written to a non-terminal: %q", progress.String())
	}
	for _, policy := range []string{"picker", "round-robin"} {
		found := false
		for _, line := range strings.Split(progress.String(), "\n") {
			if strings.HasPrefix(line, policy) && strings.Contains(line, "100%") &&
				strings.Contains(line, fmt.Sprintf("%d/%d requests", w.Requests(), w.Requests())) {
				found = true
			}
		}
		if !found {
			t.Errorf("no final progress line for %s: %q", policy, progress.String())
		}
	}
}
