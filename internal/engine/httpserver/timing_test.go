package httpserver

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
)

// The tests here run the server's engine on a VirtualClock that only the
// test advances, one engine event at a time, so what the client sees can be
// placed exactly on the engine's timeline: nothing the server writes can
// depend on an engine step the test has not run.

var epoch = time.Unix(1_700_000_000, 0)

// hangGuard bounds waits for something that must happen; reaching it is a
// hang, not slowness.
const hangGuard = 20 * time.Second

type virtualServer struct {
	srv *httptest.Server
	eng *engine.Engine
	clk *engine.VirtualClock
}

func newVirtualServer(t *testing.T, mutate func(*engine.Config), opts Options) *virtualServer {
	t.Helper()
	cfg := engine.DefaultConfig()
	cfg.Model = model
	if mutate != nil {
		mutate(&cfg)
	}
	clk := engine.NewVirtualClock(epoch)
	eng, err := engine.New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(eng, opts))
	t.Cleanup(srv.Close)
	return &virtualServer{srv: srv, eng: eng, clk: clk}
}

// event is one SSE data line and the virtual time the client read it at.
type event struct {
	data string
	at   time.Time
}

// client reads a response's SSE events as they come.
type sseClient struct {
	mu     sync.Mutex
	events []event
	err    error
	eof    bool
	wake   chan struct{}
}

func readEvents(body io.Reader, clk *engine.VirtualClock) *sseClient {
	c := &sseClient{wake: make(chan struct{}, 1)}
	go func() {
		sc := bufio.NewScanner(body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if line == "" {
				continue
			}
			c.mu.Lock()
			c.events = append(c.events, event{line, clk.Now()})
			c.mu.Unlock()
			c.notify()
		}
		c.mu.Lock()
		c.err, c.eof = sc.Err(), true
		c.mu.Unlock()
		c.notify()
	}()
	return c
}

func (c *sseClient) notify() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// waitFor waits until cond holds on the events read so far.
func (c *sseClient) waitFor(t *testing.T, what string, cond func(evs []event, eof bool) bool) []event {
	t.Helper()
	deadline := time.After(hangGuard)
	for {
		c.mu.Lock()
		evs, eof := append([]event(nil), c.events...), c.eof
		c.mu.Unlock()
		if cond(evs, eof) {
			return evs
		}
		select {
		case <-c.wake:
		case <-deadline:
			t.Fatalf("hung waiting for %s; events so far: %v", what, evs)
		}
	}
}

func (c *sseClient) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.events)
}

// streamLockstep runs the engine one event at a time while a stream is read.
// After every event it waits until the client has read every data event
// the engine's progress calls for (role + one per token, with ChunkTokens
// 1), so each event is stamped with the virtual time of the step that
// produced its token. It returns the events, [DONE] included.
func streamLockstep(t *testing.T, vs *virtualServer, c *sseClient, chat bool) []event {
	t.Helper()
	for {
		st := vs.eng.Stats()
		want := int(st.GenerationTokens)
		if want > 0 && chat {
			want++ // the role event
		}
		if st.Running+st.Waiting == 0 && want > 0 {
			return c.waitFor(t, "the end of the stream", func(_ []event, eof bool) bool { return eof })
		}
		c.waitFor(t, "the events of the tokens produced", func(evs []event, _ bool) bool { return len(evs) >= want })
		if !vs.clk.Step() {
			t.Fatal("the engine ran out of events before the request finished")
		}
	}
}

func TestStreamHeadersAtArrivalEventsAtTokens(t *testing.T) {
	for _, chat := range []bool{true, false} {
		name := map[bool]string{true: "chat", false: "completion"}[chat]
		t.Run(name, func(t *testing.T) {
			vs := newVirtualServer(t, nil, Options{})
			path, body := "/v1/completions", `{"model":"`+model+`","prompt":"`+strings.Repeat("tell me a story ", 200)+`","stream":true,"max_tokens":6}`
			if chat {
				path, body = "/v1/chat/completions", chatBody(`,"stream":true,"max_tokens":6`)
			}
			resp := post(t, vs.srv.URL+path, body)
			// Do returned: the status line and headers are here, and the
			// clock has not run a single engine event.
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			if l := vs.eng.Load(); l.Waiting != 1 || l.Running != 0 || !vs.clk.Now().Equal(epoch) {
				t.Fatalf("headers came with the request %+v at %v, want waiting, unscheduled, at arrival", l, vs.clk.Now().Sub(epoch))
			}
			c := readEvents(resp.Body, vs.clk)
			// No event can come before the first token: give the server a
			// moment to (wrongly) write one.
			time.Sleep(50 * time.Millisecond)
			if n := c.count(); n != 0 {
				t.Fatalf("%d events before any engine step", n)
			}
			evs := streamLockstep(t, vs, c, chat)
			if last := evs[len(evs)-1]; last.data != "data: [DONE]" {
				t.Fatalf("last event %q", last.data)
			}
			st := vs.eng.Stats()
			if st.Outcomes[engine.OutcomeLength] != 1 {
				t.Fatalf("outcomes %v", st.Outcomes)
			}
			// Token times: the first at the step ending the prefill, then one per step.
			firstAt := epoch.Add(time.Duration(st.TTFT.Sum * float64(time.Second)))
			content := evs[:len(evs)-1]
			if chat {
				if !strings.Contains(content[0].data, `"role":"assistant"`) {
					t.Errorf("first event %q carries no assistant role", content[0].data)
				}
				if !content[0].at.Equal(content[1].at) {
					t.Errorf("role at %v, first token at %v", content[0].at, content[1].at)
				}
				content = content[1:]
			}
			if len(content) != 6 {
				t.Fatalf("%d token events, want 6: %v", len(content), content)
			}
			if d := content[0].at.Sub(firstAt); d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("first token event at %v, the engine's first token at %v", content[0].at.Sub(epoch), firstAt.Sub(epoch))
			}
			for i := 1; i < len(content); i++ {
				if !content[i].at.After(content[i-1].at) {
					t.Errorf("token %d event at %v, not after token %d's (%v): events must follow the steps",
						i, content[i].at.Sub(epoch), i-1, content[i-1].at.Sub(epoch))
				}
			}
			if !strings.Contains(content[5].data, `"finish_reason":"length"`) {
				t.Errorf("last token event %q has no finish reason", content[5].data)
			}
		})
	}
}

func TestNonStreamedWholeAtTheEnd(t *testing.T) {
	vs := newVirtualServer(t, nil, Options{})
	type result struct {
		resp *http.Response
		at   time.Time
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.Post(vs.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(`,"max_tokens":5`)))
		done <- result{resp, vs.clk.Now(), err}
	}()
	// Wait for the request to reach the engine, then run it event by event:
	// nothing may reach the client until the last token.
	deadline := time.Now().Add(hangGuard)
	for vs.eng.Load().Waiting == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the request never reached the engine")
		}
		time.Sleep(time.Millisecond)
	}
	for vs.eng.Stats().Outcomes[engine.OutcomeLength] == 0 {
		select {
		case r := <-done:
			t.Fatalf("answer (%v) before the request finished", r.err)
		default:
		}
		if !vs.clk.Step() {
			t.Fatal("no engine event left")
		}
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(hangGuard):
		t.Fatal("no answer after the request finished")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.resp.Body.Close()
	st := vs.eng.Stats()
	end := epoch.Add(time.Duration(st.E2E.Sum * float64(time.Second)))
	if r.resp.StatusCode != 200 || !r.at.Equal(end) {
		t.Errorf("status %d at %v, want 200 at the end of generation %v", r.resp.StatusCode, r.at.Sub(epoch), end.Sub(epoch))
	}
	body := decode[chatResponse](t, r.resp.Body)
	if body.Usage.CompletionTokens != 5 || len(engine.Tokenize(body.Choices[0].Message.Content)) != 5 {
		t.Errorf("body %+v", body)
	}
}

// TestUsageReporting: the usage chunk only when asked (or forced), and
// cached_tokens only when the server reports prompt tokens details.
func TestUsageReporting(t *testing.T) {
	tests := []struct {
		name         string
		opts         Options
		extra        string
		stream       bool
		wantUsage    bool
		wantDetails  bool
		wantNullKey  bool // "prompt_tokens_details":null in the body
		wantNoDetail bool // no prompt_tokens_details key at all
	}{
		{"stream, not asked", Options{}, "", true, false, false, false, false},
		{"stream, include_usage false", Options{}, `,"stream_options":{"include_usage":false}`, true, false, false, false, false},
		{"stream, include_usage", Options{}, `,"stream_options":{"include_usage":true}`, true, true, true, false, false},
		{"stream, forced", Options{AlwaysUsage: true}, "", true, true, true, false, false},
		{"stream, include_usage, details hidden", Options{HidePromptTokensDetails: true}, `,"stream_options":{"include_usage":true}`, true, true, false, false, true},
		{"JSON", Options{}, "", false, true, true, false, false},
		{"JSON, details hidden", Options{HidePromptTokensDetails: true}, "", false, true, false, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := newServer(t, nil, tt.opts)
			body := chatBody(`,"max_tokens":3` + tt.extra)
			if tt.stream {
				body = chatBody(`,"max_tokens":3,"stream":true` + tt.extra)
			}
			resp := post(t, srv.URL+"/v1/chat/completions", body)
			raw, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("status %d, %v", resp.StatusCode, err)
			}
			var u *usageJSON
			if tt.stream {
				chunks := readSSE(t, strings.NewReader(string(raw)))
				u = chunks[len(chunks)-1].Usage
			} else {
				r := decode[chatResponse](t, strings.NewReader(string(raw)))
				u = &r.Usage
			}
			if (u != nil) != tt.wantUsage {
				t.Fatalf("usage %+v, want present %v:\n%s", u, tt.wantUsage, raw)
			}
			if u != nil && (u.PromptTokensDetails != nil) != tt.wantDetails {
				t.Errorf("prompt_tokens_details %+v, want present %v", u.PromptTokensDetails, tt.wantDetails)
			}
			if got := strings.Contains(string(raw), `"prompt_tokens_details":null`); got != tt.wantNullKey {
				t.Errorf("null prompt_tokens_details %v, want %v:\n%s", got, tt.wantNullKey, raw)
			}
			if tt.wantNoDetail && strings.Contains(string(raw), "prompt_tokens_details") {
				t.Errorf("prompt_tokens_details in\n%s", raw)
			}
		})
	}
}

func TestErrorAfterTheStreamStarted(t *testing.T) {
	srv, eng := newServer(t, func(c *engine.Config) { c.LateErrorRate = 1 }, Options{})
	resp := post(t, srv.URL+"/v1/chat/completions", chatBody(`,"stream":true,"max_tokens":8`))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	var datas []string
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			d, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				t.Fatalf("not an SSE data line: %q", line)
			}
			datas = append(datas, d)
		}
	}
	// Role, 4 tokens (it fails after half of 8), the error, [DONE].
	if len(datas) != 7 || datas[6] != "[DONE]" || strings.Contains(datas[4], "finish_reason\":\"") {
		t.Fatalf("events %q", datas)
	}
	var e errorResponse
	if err := json.Unmarshal([]byte(datas[5]), &e); err != nil || e.Error.Code != 500 || e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("error event %q: %v %+v", datas[5], err, e)
	}
	for _, d := range datas[1:5] {
		if !strings.Contains(d, `"content":`) {
			t.Errorf("token event %q", d)
		}
	}
	// Not streamed: a 500 JSON error at the end.
	resp = post(t, srv.URL+"/v1/chat/completions", chatBody(`,"max_tokens":8`))
	if e := decode[errorResponse](t, resp.Body); resp.StatusCode != 500 || e.Error.Code != 500 {
		t.Errorf("status %d error %+v", resp.StatusCode, e)
	}
	if got := eng.Stats().Outcomes[engine.OutcomeError]; got != 2 {
		t.Errorf("error outcomes %d", got)
	}
}

// TestClientGoneCancelsInEngine: a client that hangs up while its request
// waits frees it in the engine (virtual clock: the engine never ran).
func TestClientGoneCancelsInEngine(t *testing.T) {
	vs := newVirtualServer(t, nil, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", vs.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody(`,"stream":true`)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if vs.eng.Load().Waiting != 1 {
		t.Fatal("not waiting")
	}
	cancel()
	deadline := time.Now().Add(hangGuard)
	for vs.eng.Stats().Outcomes[engine.OutcomeAbort] != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the request was not cancelled in the engine")
		}
		time.Sleep(time.Millisecond)
	}
	if l := vs.eng.Load(); l.Waiting != 0 || l.Running != 0 {
		t.Errorf("load %+v", l)
	}
}
