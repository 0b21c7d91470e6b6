package httpserver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"

	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/servermetrics"
)

const model = "test-model"

func newServer(t *testing.T, mutate func(*engine.Config), opts Options) (*httptest.Server, *engine.Engine) {
	t.Helper()
	cfg := engine.DefaultConfig()
	cfg.Model = model
	cfg.PrefillPerToken = time.Microsecond
	cfg.DecodePerToken = 200 * time.Microsecond
	if mutate != nil {
		mutate(&cfg)
	}
	eng, err := engine.New(cfg, engine.RealClock{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(eng, opts))
	t.Cleanup(srv.Close)
	return srv, eng
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func decode[T any](t *testing.T, r io.Reader) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decoding %T: %v", v, err)
	}
	return v
}

type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func cachedOf(t *testing.T, u usageJSON) int {
	t.Helper()
	if u.PromptTokensDetails == nil {
		t.Fatalf("usage %+v has no prompt_tokens_details", u)
	}
	return u.PromptTokensDetails.CachedTokens
}

type chatResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Logprobs     any    `json:"logprobs"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage usageJSON `json:"usage"`
}

type completionResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int    `json:"index"`
		Text         string `json:"text"`
		Logprobs     any    `json:"logprobs"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage usageJSON `json:"usage"`
}

type errorResponse struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

var longText = strings.Repeat("Prefix caching lets a server skip the prefill of a prompt it has seen before. ", 20)

func chatBody(extra string) string {
	c, _ := json.Marshal(longText)
	return `{"model":"` + model + `","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":` + string(c) + `}]` + extra + `}`
}

func TestChatJSON(t *testing.T) {
	srv, _ := newServer(t, nil, Options{})
	resp := post(t, srv.URL+"/v1/chat/completions", chatBody(`,"max_tokens":12`))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got, want := resp.Header.Get("x-served-by"), strings.TrimPrefix(srv.URL, "http://"); got != want {
		t.Errorf("x-served-by %q, want %q", got, want)
	}
	r := decode[chatResponse](t, resp.Body)
	if r.Object != "chat.completion" || r.Model != model || !strings.HasPrefix(r.ID, "chatcmpl-") || len(r.Choices) != 1 {
		t.Fatalf("response %+v", r)
	}
	c := r.Choices[0]
	if c.Message.Role != "assistant" || c.FinishReason != "length" {
		t.Errorf("choice %+v", c)
	}
	if n := len(engine.Tokenize(c.Message.Content)); n != 12 || r.Usage.CompletionTokens != 12 {
		t.Errorf("content has %d tokens, usage says %d, want 12", n, r.Usage.CompletionTokens)
	}
	u := r.Usage
	if u.PromptTokens < 200 || u.TotalTokens != u.PromptTokens+u.CompletionTokens || cachedOf(t, u) != 0 {
		t.Errorf("usage %+v", u)
	}

	// The same prompt again hits the prefix cache.
	resp = post(t, srv.URL+"/v1/chat/completions", chatBody(`,"max_tokens":12`))
	r2 := decode[chatResponse](t, resp.Body)
	if got := cachedOf(t, r2.Usage); got < u.PromptTokens-16 || got%16 != 0 {
		t.Errorf("repeat cached %d of %d prompt tokens", got, u.PromptTokens)
	}
}

func TestCompletionJSON(t *testing.T) {
	srv, _ := newServer(t, nil, Options{ServedBy: "10.0.0.7:8000"})
	resp := post(t, srv.URL+"/v1/completions", `{"model":"`+model+`","prompt":"Once upon a time"}`)
	if resp.StatusCode != 200 || resp.Header.Get("x-served-by") != "10.0.0.7:8000" {
		t.Fatalf("status %d, x-served-by %q", resp.StatusCode, resp.Header.Get("x-served-by"))
	}
	r := decode[completionResponse](t, resp.Body)
	if r.Object != "text_completion" || len(r.Choices) != 1 || r.Choices[0].FinishReason != "stop" {
		t.Fatalf("response %+v", r)
	}
	if n := r.Usage.CompletionTokens; n < 16 || n > 64 || len(engine.Tokenize(r.Choices[0].Text)) != n {
		t.Errorf("%d completion tokens for text %q", n, r.Choices[0].Text)
	}
	if r.Usage.PromptTokens != len(engine.CompletionPrompt("Once upon a time")) {
		t.Errorf("prompt tokens %d", r.Usage.PromptTokens)
	}
}

type sseChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		Logprobs     any     `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
}

// readSSE parses a stream: every event must be "data: {json}" or the final
// "data: [DONE]".
func readSSE(t *testing.T, r io.Reader) []sseChunk {
	t.Helper()
	var out []sseChunk
	sc := bufio.NewScanner(r)
	sawDone := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if sawDone {
			t.Fatalf("data after [DONE]: %q", line)
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if data == "[DONE]" {
			sawDone = true
			continue
		}
		out = append(out, decode[sseChunk](t, strings.NewReader(data)))
	}
	if !sawDone {
		t.Fatal("stream did not end with [DONE]")
	}
	return out
}

func TestStreams(t *testing.T) {
	tests := []struct {
		name        string
		chat        bool
		always      bool
		extra       string
		wantUsage   bool
		wantTokens  int
		chunkTokens int
	}{
		{"chat, usage forced", true, true, `,"max_tokens":10`, true, 10, 4},
		{"chat, usage asked", true, false, `,"max_tokens":9,"stream_options":{"include_usage":true}`, true, 9, 3},
		{"chat, no usage", true, false, `,"max_tokens":8`, false, 8, 4},
		{"completion, usage forced", false, true, `,"max_tokens":7`, true, 7, 2},
		{"completion, one token", false, false, `,"max_tokens":1`, false, 1, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := newServer(t, nil, Options{AlwaysUsage: tt.always, ChunkTokens: tt.chunkTokens})
			path, body := "/v1/completions", `{"model":"`+model+`","prompt":"Hello there","stream":true`+tt.extra+`}`
			if tt.chat {
				path, body = "/v1/chat/completions", chatBody(`,"stream":true`+tt.extra)
			}
			resp := post(t, srv.URL+path, body)
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			chunks := readSSE(t, resp.Body)
			wantObject := "text_completion"
			if tt.chat {
				wantObject = "chat.completion.chunk"
			}
			var text strings.Builder
			var finish string
			var usage *usageJSON
			for i, c := range chunks {
				if c.Object != wantObject || c.Model != model || c.ID != chunks[0].ID || c.ID == "" {
					t.Errorf("chunk %d header %+v", i, c)
				}
				if c.Usage != nil {
					if i != len(chunks)-1 || len(c.Choices) != 0 {
						t.Errorf("usage chunk %d of %d with %d choices", i, len(chunks), len(c.Choices))
					}
					usage = c.Usage
					continue
				}
				if len(c.Choices) != 1 {
					t.Fatalf("chunk %d has %d choices", i, len(c.Choices))
				}
				ch := c.Choices[0]
				if finish != "" {
					t.Errorf("chunk %d after the finish reason", i)
				}
				if ch.FinishReason != nil {
					finish = *ch.FinishReason
				}
				if tt.chat {
					if ch.Delta == nil || ch.Delta.Content == nil {
						t.Fatalf("chat chunk %d without delta content", i)
					}
					if (i == 0) != (ch.Delta.Role == "assistant") {
						t.Errorf("chunk %d role %q", i, ch.Delta.Role)
					}
					text.WriteString(*ch.Delta.Content)
				} else {
					if ch.Text == nil {
						t.Fatalf("completion chunk %d without text", i)
					}
					text.WriteString(*ch.Text)
				}
			}
			if finish != "length" {
				t.Errorf("finish reason %q", finish)
			}
			if n := len(engine.Tokenize(text.String())); n != tt.wantTokens {
				t.Errorf("streamed %d tokens (%q), want %d", n, text.String(), tt.wantTokens)
			}
			if (usage != nil) != tt.wantUsage {
				t.Fatalf("usage present = %v, want %v", usage != nil, tt.wantUsage)
			}
			if usage != nil && (usage.CompletionTokens != tt.wantTokens || usage.TotalTokens != usage.PromptTokens+usage.CompletionTokens) {
				t.Errorf("usage %+v", usage)
			}
			content := 0
			for _, c := range chunks {
				if len(c.Choices) == 1 && (c.Choices[0].Text != nil || c.Choices[0].Delta.Role == "") {
					content++
				}
			}
			if want := (tt.wantTokens + tt.chunkTokens - 1) / tt.chunkTokens; content != want {
				t.Errorf("%d content chunks, want %d", content, want)
			}
		})
	}
}

func TestStreamCachedTokensGrow(t *testing.T) {
	srv, _ := newServer(t, nil, Options{AlwaysUsage: true})
	var cached []int
	for range 2 {
		resp := post(t, srv.URL+"/v1/chat/completions", chatBody(`,"stream":true,"max_tokens":4`))
		chunks := readSSE(t, resp.Body)
		last := chunks[len(chunks)-1]
		if last.Usage == nil {
			t.Fatal("no usage chunk")
		}
		cached = append(cached, cachedOf(t, *last.Usage))
	}
	if cached[0] != 0 || cached[1] < 200 {
		t.Errorf("cached tokens %v, want 0 then most of the prompt", cached)
	}
}

func TestErrors(t *testing.T) {
	srv, _ := newServer(t, nil, Options{})
	tests := []struct {
		method, path, body string
		status             int
	}{
		{"POST", "/v1/chat/completions", `{"model":`, 400},
		{"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, 400},
		{"POST", "/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"x"}]}`, 404},
		{"POST", "/v1/chat/completions", `{"model":"` + model + `","messages":[]}`, 400},
		{"POST", "/v1/completions", `{"model":"` + model + `","prompt":[1,2],"max_tokens":1000000}`, 400},
		{"POST", "/v1/embeddings", `{}`, 404},
		{"GET", "/nope", ``, 404},
		{"GET", "/v1/completions", ``, 405},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		e := decode[errorResponse](t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || e.Error.Code != tt.status || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s %s %s: status %d, error %+v; want %d", tt.method, tt.path, tt.body, resp.StatusCode, e, tt.status)
		}
	}
}

func TestInjectedErrors(t *testing.T) {
	srv, eng := newServer(t, func(c *engine.Config) { c.ErrorRate = 1 }, Options{})
	for _, stream := range []string{"false", "true"} {
		resp := post(t, srv.URL+"/v1/chat/completions", chatBody(`,"stream":`+stream))
		e := decode[errorResponse](t, resp.Body)
		if resp.StatusCode != 500 || e.Error.Code != 500 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Errorf("stream=%s: status %d error %+v", stream, resp.StatusCode, e)
		}
	}
	if got := eng.Stats().Outcomes[engine.OutcomeError]; got != 2 {
		t.Errorf("error outcomes %d", got)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestOverloaded(t *testing.T) {
	srv, eng := newServer(t, func(c *engine.Config) {
		c.HangRate, c.MaxNumSeqs, c.MaxWaiting = 1, 1, 1
	}, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	send := func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/chat/completions", strings.NewReader(chatBody("")))
		go func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	// One at a time: two sent together can both reach the one-slot
	// waiting queue before the scheduler runs the first, and the second
	// would be refused before the state under test exists.
	send()
	waitFor(t, "one running", func() bool { s := eng.Stats(); return s.Running == 1 && s.Waiting == 0 })
	send()
	waitFor(t, "one running, one waiting", func() bool { s := eng.Stats(); return s.Running == 1 && s.Waiting == 1 })
	resp := post(t, srv.URL+"/v1/chat/completions", chatBody(""))
	if e := decode[errorResponse](t, resp.Body); resp.StatusCode != 503 || e.Error.Code != 503 {
		t.Errorf("status %d, error %+v", resp.StatusCode, e)
	}
	cancel()
	waitFor(t, "hung requests to be freed", func() bool { s := eng.Stats(); return s.Running == 0 && s.Waiting == 0 })
}

func TestCancelFreesSlot(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*engine.Config)
		stream bool
	}{
		{"hung, plain", func(c *engine.Config) { c.HangRate = 1 }, false},
		{"hung, stream", func(c *engine.Config) { c.HangRate = 1 }, true},
		{"long decode, stream", func(c *engine.Config) { c.DecodePerToken = 50 * time.Millisecond }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, eng := newServer(t, tt.mutate, Options{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/chat/completions",
				strings.NewReader(chatBody(fmt.Sprintf(`,"stream":%v,"max_tokens":1000`, tt.stream))))
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					if tt.stream {
						// Read the first event, then hang up.
						_, err = bufio.NewReader(resp.Body).ReadString('\n')
					}
					resp.Body.Close()
				}
				errc <- err
			}()
			if tt.stream && !strings.HasPrefix(tt.name, "hung") {
				// The client got its first event (so the request ran) and
				// hung up.
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			} else {
				waitFor(t, "the request to run", func() bool { return eng.Stats().Running == 1 })
				cancel()
			}
			waitFor(t, "the slot to be freed", func() bool {
				s := eng.Stats()
				return s.Running == 0 && s.KVUsage == 0 && s.Outcomes[engine.OutcomeAbort] == 1
			})
		})
	}
}

func TestModelsAndHealth(t *testing.T) {
	srv, _ := newServer(t, nil, Options{})
	resp, err := http.Get(srv.URL + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", err, resp)
	}
	resp.Body.Close()
	resp, err = http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || m.Object != "list" || len(m.Data) != 1 || m.Data[0].ID != model {
		t.Errorf("models: %v %+v", err, m)
	}
}

// TestMetricsEndpoint: /metrics serves the configured flavor in the
// Prometheus text format, with the engine's numbers.
func TestMetricsEndpoint(t *testing.T) {
	tests := []struct {
		flavor            servermetrics.Flavor
		running, blocks   string
		wantBlocksSampled float64
	}{
		{servermetrics.VLLM, "vllm:num_requests_running", "vllm:cache_config_info", 1},
		{servermetrics.VLLMOld, "vllm:num_requests_running", "vllm:cache_config_info", 1},
		{servermetrics.SGLang, "sglang:num_running_reqs", "sglang:max_total_num_tokens", 1234 * 16},
	}
	for _, tt := range tests {
		t.Run(string(tt.flavor), func(t *testing.T) {
			srv, _ := newServer(t, func(c *engine.Config) { c.NumGPUBlocks = 1234 }, Options{Metrics: servermetrics.Options{Flavor: tt.flavor}})
			for range 2 {
				post(t, srv.URL+"/v1/chat/completions", chatBody(`,"max_tokens":3`))
			}
			resp, err := http.Get(srv.URL + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			parser := expfmt.NewTextParser(pmodel.LegacyValidation)
			fams, err := parser.TextToMetricFamilies(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if f := fams[tt.running]; f == nil || f.GetMetric()[0].GetGauge().GetValue() != 0 {
				t.Errorf("%s: %v", tt.running, f)
			}
			f := fams[tt.blocks]
			if f == nil || f.GetMetric()[0].GetGauge().GetValue() != tt.wantBlocksSampled {
				t.Fatalf("%s: %v", tt.blocks, f)
			}
			if tt.flavor != servermetrics.SGLang {
				found := false
				for _, l := range f.GetMetric()[0].GetLabel() {
					found = found || (l.GetName() == "num_gpu_blocks" && l.GetValue() == "1234")
				}
				if !found {
					t.Errorf("cache_config_info labels %v", f.GetMetric()[0].GetLabel())
				}
			}
		})
	}
}

// The query name[]=... is answered as the flavor's servers do by default: vLLM sends the
// whole page on /metrics (prometheus-fastapi-instrumentator's route) and only the named
// series on /metrics/ (prometheus_client's application mounted behind it); SGLang's
// multiprocess registry sends an empty page; Options.Metrics.Exposition overrides it.
func TestMetricsNameFilter(t *testing.T) {
	const query = "?name%5B%5D=vllm%3Anum_requests_waiting&name%5B%5D=sglang%3Anum_queue_reqs"
	tests := []struct {
		name string
		opts servermetrics.Options
		path string
		want []string // families; nil: the whole page
	}{
		{"vLLM /metrics", servermetrics.Options{}, "/metrics", nil},
		{"vLLM /metrics/", servermetrics.Options{}, "/metrics/", []string{"vllm:num_requests_waiting"}},
		{"vLLM below /metrics/", servermetrics.Options{}, "/metrics/x", []string{"vllm:num_requests_waiting"}},
		{"vLLM with a plain prometheus_client app", servermetrics.Options{Exposition: servermetrics.ExpositionFiltered}, "/metrics", []string{"vllm:num_requests_waiting"}},
		{"SGLang /metrics", servermetrics.Options{Flavor: servermetrics.SGLang}, "/metrics", []string{}},
		{"SGLang /metrics/", servermetrics.Options{Flavor: servermetrics.SGLang}, "/metrics/", []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := newServer(t, nil, Options{Metrics: tt.opts})
			get := func(target string) (int, []byte) {
				resp, err := http.Get(srv.URL + target)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				return resp.StatusCode, b
			}
			code, whole := get("/metrics")
			if code != 200 || len(whole) < 10_000 {
				t.Fatalf("whole page: status %d, %d bytes", code, len(whole))
			}
			code, got := get(tt.path + query)
			if code != 200 {
				t.Fatalf("status %d", code)
			}
			var fams []string
			for _, l := range strings.Split(string(got), "\n") {
				if f, ok := strings.CutPrefix(l, "# TYPE "); ok {
					fams = append(fams, strings.Fields(f)[0])
				}
			}
			switch {
			case tt.want == nil && len(got) < 10_000:
				t.Fatalf("got %d bytes (%v), want the whole page", len(got), fams)
			case tt.want != nil && strings.Join(fams, ",") != strings.Join(tt.want, ","):
				t.Fatalf("families %v, want %v", fams, tt.want)
			}
		})
	}
}
