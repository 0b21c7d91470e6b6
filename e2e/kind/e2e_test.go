//go:build kind

package kind

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Set by hack/e2e-kind.sh; the defaults match manifests/e2e and its port-forward.
var (
	gatewayURL = envOr("KVPICK_E2E_GATEWAY", "http://127.0.0.1:8080")
	model      = envOr("KVPICK_E2E_MODEL", "meta-llama/Llama-3.1-8B-Instruct")
	// endpoints: the model servers' ip:port, comma-separated; when set, every answer must come
	// from one of them.
	endpoints = splitList(os.Getenv("KVPICK_E2E_ENDPOINTS"))
	waitFor   = envDuration("KVPICK_E2E_WAIT", 3*time.Minute)
)

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func envDuration(key string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(key)); err == nil {
		return d
	}
	return def
}

func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// TestMain waits until the gateway routes a request end to end: Envoy Gateway programs the
// proxy and its ext_proc cluster some seconds after the resources are applied.
func TestMain(m *testing.M) {
	if err := waitUntilRouting(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func waitUntilRouting() error {
	deadline := time.Now().Add(waitFor)
	last := "no attempt"
	for time.Now().Before(deadline) {
		resp, body, err := post(context.Background(), chatBody(model, []message{{Role: "user", Content: "ping"}}, 4, false))
		switch {
		case err != nil:
			last = err.Error()
		case resp.StatusCode == http.StatusOK && resp.Header.Get("x-served-by") != "":
			return nil
		default:
			last = fmt.Sprintf("%d %s", resp.StatusCode, truncate(body))
		}
		time.Sleep(2 * time.Second)
	}
	return fmt.Errorf("the gateway at %s did not route a request within %v; last answer: %s", gatewayURL, waitFor, last)
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatResponse struct {
	Choices []struct {
		Message      message `json:"message"`
		FinishReason string  `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func chatBody(model string, msgs []message, maxTokens int, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": maxTokens, "stream": stream})
	return b
}

var client = &http.Client{Timeout: 2 * time.Minute}

func post(ctx context.Context, body []byte) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, gatewayURL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func truncate(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

// served checks the x-served-by header (the simulator's ip:port) and returns it.
func served(t *testing.T, resp *http.Response) string {
	t.Helper()
	s := resp.Header.Get("x-served-by")
	if s == "" {
		t.Fatalf("no x-served-by header: the answer did not come from a simulator (headers %v)", resp.Header)
	}
	if len(endpoints) > 0 && !slices.Contains(endpoints, s) {
		t.Fatalf("served by %s, which is not a pool member %v", s, endpoints)
	}
	return s
}

func TestChatCompletion(t *testing.T) {
	resp, body, err := post(context.Background(), chatBody(model, []message{{Role: "user", Content: "Say hello."}}, 16, false))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, truncate(body))
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("content-type %q", ct)
	}
	var r chatResponse
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("not JSON: %v: %s", err, truncate(body))
	}
	if len(r.Choices) != 1 || r.Choices[0].Message.Content == "" || r.Usage == nil || r.Usage.PromptTokens == 0 {
		t.Fatalf("not a chat completion: %s", truncate(body))
	}
	t.Logf("served by %s", served(t, resp))
}

// TestConversationsStickToOneServer runs several multi-turn conversations at once. Each turn
// resends the whole conversation, so its prompt extends the previous turn's: the picker must
// send every turn of a conversation to the server that already holds its prefix (same
// x-served-by), which the server confirms by reporting cached prompt tokens; different
// conversations must not all pile onto one server.
func TestConversationsStickToOneServer(t *testing.T) {
	const conversations, turns = 8, 4
	results := make([]conversation, conversations)
	var wg sync.WaitGroup
	for c := range conversations {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[c] = converse(c, turns)
		}()
	}
	wg.Wait()

	used := map[string]int{}
	for c, r := range results {
		if r.err != nil {
			t.Errorf("conversation %d: %v", c, r.err)
			continue
		}
		t.Logf("conversation %d: servers %v, prompt tokens %v, cached %v", c, r.servers, r.prompt, r.cached)
		for i, s := range r.servers {
			if s != r.servers[0] {
				t.Errorf("conversation %d: turn %d went to %s, turn 0 to %s", c, i, s, r.servers[0])
			}
		}
		// Each turn's prompt starts with the whole previous prompt: a server that served the
		// previous turn has at least most of it cached (a chat template's shared preamble,
		// cached everywhere, is a few dozen tokens).
		for i := 1; i < len(r.cached); i++ {
			if r.cached[i] < r.prompt[i-1]/2 {
				t.Errorf("conversation %d: turn %d had %d of its %d prompt tokens cached; the previous turn's prompt alone was %d tokens",
					c, i, r.cached[i], r.prompt[i], r.prompt[i-1])
			}
		}
		used[r.servers[0]]++
	}
	if n := len(used); n == 1 {
		t.Errorf("all %d conversations went to one server %v: affinity without spreading", conversations, used)
	}
}

// conversation is what one conversation saw: per turn, the server, the prompt's size and how
// much of it the server had cached (usage.prompt_tokens_details.cached_tokens).
type conversation struct {
	servers []string
	prompt  []int
	cached  []int
	err     error
}

func converse(id, turns int) (r conversation) {
	// A system prompt unique from its first byte: the picker places new prefixes by a hash of
	// their first block, so conversations that shared one would share a server.
	salt := make([]byte, 8)
	_, _ = rand.Read(salt)
	system := fmt.Sprintf("Conversation %d, session %s. ", id, hex.EncodeToString(salt)) +
		strings.Repeat("You are a careful assistant who answers in complete sentences and cites the turn you refer to. ", 16)
	msgs := []message{{Role: "system", Content: system}}
	for turn := range turns {
		msgs = append(msgs, message{Role: "user", Content: fmt.Sprintf("Turn %d of conversation %d: tell me more.", turn, id)})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		resp, body, err := post(ctx, chatBody(model, msgs, 24, false))
		cancel()
		if err != nil {
			r.err = err
			return r
		}
		if resp.StatusCode != http.StatusOK {
			r.err = fmt.Errorf("turn %d: status %d: %s", turn, resp.StatusCode, truncate(body))
			return r
		}
		var cr chatResponse
		if err := json.Unmarshal(body, &cr); err != nil || len(cr.Choices) == 0 || cr.Usage == nil {
			r.err = fmt.Errorf("turn %d: not a chat completion: %s", turn, truncate(body))
			return r
		}
		s := resp.Header.Get("x-served-by")
		if s == "" || len(endpoints) > 0 && !slices.Contains(endpoints, s) {
			r.err = fmt.Errorf("turn %d: x-served-by %q is not a pool member %v", turn, s, endpoints)
			return r
		}
		cached := 0
		if d := cr.Usage.PromptTokensDetails; d != nil {
			cached = d.CachedTokens
		}
		r.servers = append(r.servers, s)
		r.prompt = append(r.prompt, cr.Usage.PromptTokens)
		r.cached = append(r.cached, cached)
		msgs = append(msgs, cr.Choices[0].Message)
	}
	return r
}

// TestBadBodiesGetOpenAIErrors: requests the picker cannot route are refused with the status
// and the JSON error body an OpenAI client expects, through Envoy.
func TestBadBodiesGetOpenAIErrors(t *testing.T) {
	tests := []struct {
		name string
		body string
	}{
		{"malformed JSON", `{"model": "` + model + `", "messages": [`},
		{"no model", `{"messages": [{"role": "user", "content": "hi"}]}`},
		{"not an object", `["model"]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body, err := post(context.Background(), []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", resp.StatusCode, truncate(body))
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("content-type %q, want application/json", ct)
			}
			var e struct {
				Error *struct {
					Message string          `json:"message"`
					Type    string          `json:"type"`
					Code    json.RawMessage `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("not an OpenAI error body: %s", truncate(body))
			}
			t.Logf("%s: %s", e.Error.Type, e.Error.Message)
		})
	}
}

// TestStreaming: an SSE answer arrives event by event (the picker passes response chunks on as
// they come, Envoy does not buffer them), well formed, ending with [DONE].
func TestStreaming(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, gatewayURL+"/v1/chat/completions",
		bytes.NewReader(chatBody(model, []message{{Role: "user", Content: "Count slowly to one hundred."}}, 64, true)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, truncate(b))
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content-type %q, want text/event-stream", ct)
	}
	served(t, resp)

	var (
		firstAt, doneAt time.Time
		contentEvents   int
		text            strings.Builder
		sawUsage        bool
	)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, ":") {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if data == "[DONE]" {
			doneAt = time.Now()
			break
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event is not JSON: %q", data)
		}
		if ev.Usage != nil && string(*ev.Usage) != "null" {
			sawUsage = true
		}
		for _, c := range ev.Choices {
			if c.Delta.Content != "" {
				if contentEvents == 0 {
					firstAt = time.Now()
				}
				contentEvents++
				text.WriteString(c.Delta.Content)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	if doneAt.IsZero() {
		t.Fatal("the stream ended without data: [DONE]")
	}
	if contentEvents < 3 {
		t.Fatalf("%d content events, want several: %q", contentEvents, text.String())
	}
	if !sawUsage {
		t.Error("no usage event (the simulators send one: --always-usage)")
	}
	// The simulators take 20 ms a token (manifests/e2e): 64 tokens stream for over a second. A
	// proxy that buffered the answer would deliver every event at once.
	ttft, spread := firstAt.Sub(start), doneAt.Sub(firstAt)
	t.Logf("%d content events, first after %v, [DONE] %v later", contentEvents, ttft, spread)
	if spread < 300*time.Millisecond {
		t.Errorf("events arrived within %v of each other: the stream was buffered, not streamed", spread)
	}
}

// Set by hack/e2e-kind.sh: how to reach the cluster, for the tests that change its pods.
var (
	kubectl   = strings.Fields(envOr("KVPICK_E2E_KUBECTL", "kubectl --context kind-kvpick-e2e"))
	namespace = envOr("KVPICK_E2E_NAMESPACE", "kvpick-e2e")
)

func kube(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectl[0], append(append(slices.Clone(kubectl[1:]), "-n", namespace), args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", strings.Join(kubectl, " "), strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// poolMembers lists the simulators' ip:port as the API server sees them now: Running pods
// that are Ready and not being deleted.
func poolMembers(t *testing.T) map[string]string {
	t.Helper()
	out := kube(t, "get", "pods", "-l", "app=kvpick-model-server", "-o",
		`jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.name} {.status.podIP} {.metadata.deletionTimestamp} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
	members := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[2] == "True" { // no deletionTimestamp
			members[f[1]+":8000"] = f[0]
		}
	}
	return members
}

// TestPoolFollowsPodChanges: the picker reads its pool from the InferencePool. Replacing a
// simulator pod (new pod, new IP) must not cost a request, nor restart the picker, and every
// answer must come from a pod that is a pool member when it is sent: the deleted pod's address
// leaves the pool, the new one joins it once Ready.
func TestPoolFollowsPodChanges(t *testing.T) {
	restarts := func() string {
		return kube(t, "get", "pods", "-l", "app.kubernetes.io/name=kvpick", "-o", "jsonpath={.items[*].status.containerStatuses[*].restartCount}")
	}
	pickerPods := kube(t, "get", "pods", "-l", "app.kubernetes.io/name=kvpick", "-o", "jsonpath={.items[*].metadata.name}")
	before := restarts()
	members := poolMembers(t)
	if len(members) < 2 {
		t.Fatalf("pool members %v: want the four simulators", members)
	}
	var victim, victimAddr string
	for addr, pod := range members {
		victim, victimAddr = pod, addr
		break
	}
	kube(t, "delete", "pod", victim, "--wait=true")
	kube(t, "rollout", "status", "deployment/kvpick-sim", "--timeout=3m")

	// The picker drops the deleted pod at once; give the gateway's own endpoint view (which it
	// also needs for the ORIGINAL_DST upstream) a moment to settle, then every request must
	// succeed on a current member.
	deadline := time.Now().Add(time.Minute)
	for {
		now := poolMembers(t)
		if _, gone := now[victimAddr]; !gone && len(now) == len(members) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool members %v a minute after deleting %s", now, victim)
		}
		time.Sleep(time.Second)
	}
	now := poolMembers(t)
	for i := range 20 {
		resp, body, err := post(context.Background(), chatBody(model, []message{{Role: "user", Content: fmt.Sprintf("After the change, request %d.", i)}}, 4, false))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, truncate(body))
		}
		s := resp.Header.Get("x-served-by")
		if s == victimAddr {
			t.Fatalf("request %d served by %s, the deleted pod's address", i, s)
		}
		if _, ok := now[s]; !ok {
			t.Fatalf("request %d served by %s, not a pool member %v", i, s, now)
		}
	}
	if got := kube(t, "get", "pods", "-l", "app.kubernetes.io/name=kvpick", "-o", "jsonpath={.items[*].metadata.name}"); got != pickerPods || restarts() != before {
		t.Errorf("the picker was replaced or restarted (pods %q -> %q, restarts %q -> %q): pod changes must not restart it", pickerPods, got, before, restarts())
	}
}
