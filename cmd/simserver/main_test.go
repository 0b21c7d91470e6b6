package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// start runs the binary's run loop on a free port with args and returns its
// address; the server stops when the test ends.
func start(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, append([]string{"--addr", "127.0.0.1:0", "--model", "m", "--log-level", "warn"}, args...),
			io.Discard, func(a string) { addrc <- a })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(30 * time.Second): // a hang, not a speed limit
			t.Error("no shutdown")
		}
	})
	select {
	case a := <-addrc:
		return a
	case err := <-errc:
		t.Fatal(err)
	}
	return ""
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestRunServesAndShutsDown starts the binary's run loop on a free port,
// serves a request, and checks a cancelled context (SIGINT/SIGTERM in
// main) ends it cleanly.
func TestRunServesAndShutsDown(t *testing.T) {
	addr := start(t, "--decode-ms-per-token", "0.1")
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || body.Usage.CompletionTokens != 3 || resp.Header.Get("x-served-by") != addr {
		t.Fatalf("status %d, err %v, body %+v, served by %q", resp.StatusCode, err, body, resp.Header.Get("x-served-by"))
	}
}

// TestFlags: the flags reach the engine, the answers and /metrics.
func TestFlags(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		metrics     []string // substrings of /metrics
		noMetrics   []string
		wantDetails bool
	}{
		{"defaults: vLLM's, no cached_tokens", nil,
			[]string{"vllm:kv_cache_usage_perc{", `num_gpu_blocks="8000"`}, []string{"vllm:gpu_cache_usage_perc"}, false},
		{"cached_tokens reported, older names, a cache size",
			[]string{"--enable-prompt-tokens-details", "--metrics-flavor", "vllm-old", "--num-gpu-blocks", "777", "--max-num-batched-tokens", "512"},
			[]string{"vllm:gpu_cache_usage_perc{", `num_gpu_blocks="777"`}, []string{"vllm:kv_cache_usage_perc"}, true},
		{"SGLang's names", []string{"--enable-prompt-tokens-details", "--metrics-flavor", "sglang", "--block-size", "32", "--num-gpu-blocks", "100"},
			[]string{"sglang:num_queue_reqs{", `sglang:max_total_num_tokens{model_name="m"} 3200.0`}, []string{"vllm:"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := start(t, append([]string{"--decode-ms-per-token", "0.1"}, tt.args...)...)
			resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`))
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got := bytes.Contains(raw, []byte(`"cached_tokens"`)); got != tt.wantDetails {
				t.Errorf("cached_tokens reported %v, want %v: %s", got, tt.wantDetails, raw)
			}
			m := get(t, "http://"+addr+"/metrics")
			for _, s := range tt.metrics {
				if !strings.Contains(m, s) {
					t.Errorf("/metrics lacks %q", s)
				}
			}
			for _, s := range tt.noMetrics {
				if strings.Contains(m, s) {
					t.Errorf("/metrics has %q", s)
				}
			}
		})
	}
}

func TestHelpDescribesTheModel(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, &out, nil); err == nil {
		t.Fatal("--help did not stop")
	}
	for _, flag := range []string{"max-num-batched-tokens", "step-overhead-ms", "enable-prompt-tokens-details", "metrics-flavor", "late-error-rate"} {
		if !strings.Contains(out.String(), "-"+flag) {
			t.Errorf("--help does not mention --%s", flag)
		}
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--num-gpu-blocks", "0"},
		{"--error-rate", "2"},
		{"--log-level", "loud"},
		{"--metrics-flavor", "tgi"},
		{"--max-num-batched-tokens", "8"}, // below max-num-seqs
		{"extra"},
	} {
		if err := run(context.Background(), args, io.Discard, nil); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
