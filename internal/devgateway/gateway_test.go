package devgateway_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/devgateway"
)

var modes = []string{devgateway.ModeFullDuplex, devgateway.ModeBuffered, devgateway.ModeStreamed}

func TestRequestGoesToThePickedEndpointWithThePickersHeaders(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ms := []*model{startModel(t, nil), startModel(t, nil), startModel(t, nil)}
			byAddr := map[string]*model{}
			var addrs []string
			for _, m := range ms {
				byAddr[m.addr] = m
				addrs = append(addrs, m.addr)
			}
			p := startPicker(t, addrs, nil)
			gw := pickerGateway(t, p, mode)

			body := chatBody("m", "tell me about the prefix cache", false)
			r := post(t, gw.url, "/v1/chat/completions", body)
			if r.status != http.StatusOK {
				t.Fatalf("status %d, body %s", r.status, r.body)
			}
			served := r.header.Get("x-served-by")
			m, ok := byAddr[served]
			if !ok {
				t.Fatalf("x-served-by %q is not a pool endpoint", served)
			}
			got := m.seen()
			if len(got) != 1 {
				t.Fatalf("the served endpoint saw %d requests, want 1", len(got))
			}
			if !bytes.Equal(got[0].body, body) {
				t.Errorf("upstream body %q, want the client's %q", got[0].body, body)
			}
			if d := got[0].header.Get("x-gateway-destination-endpoint"); d != served {
				t.Errorf("upstream x-gateway-destination-endpoint %q, want the endpoint it reached (%s)", d, served)
			}
			if got[0].header.Get("x-request-id") == "" {
				t.Error("no x-request-id upstream (Envoy always sets one)")
			}
			// The response path reported a served 2xx: the picker counts a success.
			eventually(t, "the picker records the success", func() bool {
				return p.metric(t, "kvpick_requests_total", "outcome", "success") == 1 && p.inFlight() == 0
			})

			// A request without a body (GET /v1/models) is routed at the header stage.
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, gw.url+"/v1/models", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || byAddr[resp.Header.Get("x-served-by")] == nil {
				t.Fatalf("GET /v1/models: status %d served by %q", resp.StatusCode, resp.Header.Get("x-served-by"))
			}
		})
	}
}

func TestOneMegabyteBodyArrivesIntact(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			m := startModel(t, nil)
			p := startPicker(t, []string{m.addr}, nil)
			gw := pickerGateway(t, p, mode)
			body := chatBody("m", strings.Repeat("0123456789abcdef", 1<<16), false) // 1 MiB of prompt
			r := post(t, gw.url, "/v1/chat/completions", body)
			if r.status != http.StatusOK {
				t.Fatalf("status %d, body %.300s", r.status, r.body)
			}
			got := m.seen()
			if len(got) != 1 || sha256.Sum256(got[0].body) != sha256.Sum256(body) {
				t.Fatalf("the model server did not get the client's body intact (%d requests)", len(got))
			}
			if cl := got[0].header.Get("content-length"); cl != "" && cl != fmt.Sprint(len(body)) {
				t.Errorf("content-length %s upstream, body is %d bytes", cl, len(body))
			}
		})
	}
}

// The stand-in model server sends one SSE event, then waits until the client has read it
// before sending the next: if anything on the path held chunks back, the client would never
// see the first event and the test would fail at its timeout.
func TestSSEReachesTheClientEventByEvent(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			const events = 4
			next := make(chan struct{})
			m := startModel(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("content-type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				for i := 0; i < events; i++ {
					fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
					w.(http.Flusher).Flush()
					select {
					case <-next:
					case <-r.Context().Done():
						return
					}
				}
				io.WriteString(w, "data: [DONE]\n\n")
			})
			p := startPicker(t, []string{m.addr}, nil)
			gw := pickerGateway(t, p, mode)

			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.url+"/v1/chat/completions",
				bytes.NewReader(chatBody("m", "stream please", true)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("content-type"); ct != "text/event-stream" {
				t.Errorf("content-type %q", ct)
			}
			br := bufio.NewReader(resp.Body)
			for i := 0; i < events; i++ {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("event %d: %v (the gateway held the stream back?)", i, err)
				}
				if want := fmt.Sprintf("data: {\"n\":%d}\n", i); line != want {
					t.Fatalf("event %d: got %q, want %q", i, line, want)
				}
				if blank, _ := br.ReadString('\n'); blank != "\n" {
					t.Fatalf("event %d not terminated by a blank line: %q", i, blank)
				}
				next <- struct{}{} // only now may the server send the next event
			}
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "data: [DONE]\n\n" {
				t.Fatalf("stream end %q, %v", rest, err)
			}
		})
	}
}

func TestPickerRejectionsReachTheClientUnchanged(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		status int
	}{
		{"malformed JSON", `{"model":"m","messages":[`, http.StatusBadRequest},
		{"missing model", `{"messages":[{"role":"user","content":"hi"}]}`, http.StatusBadRequest},
		{"no body", ``, http.StatusBadRequest},
	} {
		for _, mode := range modes {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				m := startModel(t, nil)
				p := startPicker(t, []string{m.addr}, nil)
				gw := pickerGateway(t, p, mode)
				r := post(t, gw.url, "/v1/chat/completions", []byte(tc.body))
				if r.status != tc.status {
					t.Fatalf("status %d, want %d (body %s)", r.status, tc.status, r.body)
				}
				if ct := r.header.Get("content-type"); ct != "application/json" {
					t.Errorf("content-type %q", ct)
				}
				openAIError(t, r.body)
				if n := len(m.seen()); n != 0 {
					t.Errorf("the model server saw %d requests; an immediate response goes nowhere", n)
				}
			})
		}
	}
}

func TestChunkedRequestBodyIsForwardedIntact(t *testing.T) {
	m := startModel(t, nil)
	p := startPicker(t, []string{m.addr}, nil)
	gw := pickerGateway(t, p, devgateway.ModeFullDuplex)
	body := chatBody("m", strings.Repeat("chunked ", 10000), false)
	pr, pw := io.Pipe()
	go func() {
		for off := 0; off < len(body); off += 7000 { // several writes: a chunked upload
			pw.Write(body[off:min(off+7000, len(body))])
		}
		pw.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.url+"/v1/chat/completions", pr)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := m.seen(); len(got) != 1 || !bytes.Equal(got[0].body, body) {
		t.Fatal("the model server did not get the chunked body intact")
	}
}

func TestBodyOverTheGatewayLimitIs413(t *testing.T) {
	m := startModel(t, nil)
	gw := startGateway(t, devgateway.Options{Policy: devgateway.PolicyRoundRobin, Endpoints: []string{m.addr}, MaxBodyBytes: 1024})
	r := post(t, gw.url, "/v1/chat/completions", chatBody("m", strings.Repeat("x", 2048), false))
	if r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d", r.status)
	}
	openAIError(t, r.body)
	if len(m.seen()) != 0 {
		t.Error("the oversized request reached the model server")
	}
}

func TestConnectionFailureMovesOnToTheNextFallback(t *testing.T) {
	live := startModel(t, nil)
	dead := closedAddr(t)
	p := startPicker(t, []string{dead, live.addr}, func(c *config.Config) { c.ExtProc.Fallbacks = 1 })
	gw := pickerGateway(t, p, devgateway.ModeFullDuplex)
	// Distinct prompts spread the picks over both endpoints (nothing to match, equal load): with
	// 24 of them the dead endpoint is picked first many times.
	for i := 0; i < 24; i++ {
		r := post(t, gw.url, "/v1/chat/completions", chatBody("m", fmt.Sprintf("question %d: %s", i, strings.Repeat("x", 300)), false))
		if r.status != http.StatusOK || r.header.Get("x-served-by") != live.addr {
			t.Fatalf("request %d: status %d served by %q, want 200 from %s", i, r.status, r.header.Get("x-served-by"), live.addr)
		}
	}
	if n := gw.logs.FilterMessage("served by a fallback").Len(); n == 0 {
		t.Fatal("no request was picked for the dead endpoint first: the fallback path was not exercised")
	}
	eventually(t, "every stream ends", func() bool { return p.inFlight() == 0 })
}

func TestResetBeforeHeadersMovesOnToTheNextFallback(t *testing.T) {
	live := startModel(t, nil)
	resetter := startModel(t, func(w http.ResponseWriter, r *http.Request) {
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close() // the server dies with the request in hand
		}
	})
	p := startPicker(t, []string{resetter.addr, live.addr}, func(c *config.Config) { c.ExtProc.Fallbacks = 1 })
	gw := pickerGateway(t, p, devgateway.ModeFullDuplex)
	for i := 0; i < 24; i++ {
		r := post(t, gw.url, "/v1/chat/completions", chatBody("m", fmt.Sprintf("question %d: %s", i, strings.Repeat("y", 300)), false))
		if r.status != http.StatusOK || r.header.Get("x-served-by") != live.addr {
			t.Fatalf("request %d: status %d served by %q, want 200 from %s", i, r.status, r.header.Get("x-served-by"), live.addr)
		}
	}
	if len(resetter.seen()) == 0 {
		t.Fatal("the resetting endpoint was never tried: the retry path was not exercised")
	}
}

func TestEveryDestinationFailingIs503ThroughTheResponsePath(t *testing.T) {
	p := startPicker(t, []string{closedAddr(t), closedAddr(t)}, func(c *config.Config) { c.ExtProc.Fallbacks = 1 })
	gw := pickerGateway(t, p, devgateway.ModeFullDuplex)
	r := post(t, gw.url, "/v1/chat/completions", chatBody("m", "anyone there?", false))
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503 (body %s)", r.status, r.body)
	}
	if ct := r.header.Get("content-type"); ct != "application/json" {
		t.Errorf("content-type %q", ct)
	}
	openAIError(t, r.body)
	// The local reply went through ext_proc: the picker saw :status 503 with no served endpoint.
	eventually(t, "the picker records the 503", func() bool {
		return p.metric(t, "kvpick_requests_total", "outcome", "upstream_error", "status", "503") == 1 && p.inFlight() == 0
	})
}

func TestUnreachablePickerFailsFastWithStatusOnError(t *testing.T) {
	m := startModel(t, nil)
	conn, err := devgateway.DialPicker(closedAddr(t), false)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	gw := startGateway(t, devgateway.Options{Picker: conn})
	r := post(t, gw.url, "/v1/chat/completions", chatBody("m", "hello", false))
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503 (body %s)", r.status, r.body)
	}
	typ, code, _ := openAIError(t, r.body)
	if code != "ext_proc_error" || typ == "" {
		t.Errorf("error type %q code %q", typ, code)
	}
	if n := len(m.seen()); n != 0 {
		t.Errorf("the model server saw %d requests", n)
	}
}

// A client that goes away cancels the ext_proc stream and the upstream request, whether it
// leaves while the model server has not answered yet or in the middle of a stream.
func TestClientCancelReleasesEverything(t *testing.T) {
	for _, tc := range []struct {
		name      string
		midStream bool
	}{{"before the response", false}, {"mid-stream", true}} {
		t.Run(tc.name, func(t *testing.T) {
			upstreamGone := make(chan struct{})
			arrived := make(chan struct{}, 1)
			m := startModel(t, func(w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				if tc.midStream {
					w.Header().Set("content-type", "text/event-stream")
					io.WriteString(w, "data: {\"n\":0}\n\n")
					w.(http.Flusher).Flush()
				}
				<-r.Context().Done() // a stream that never ends, or a server that never answers
				close(upstreamGone)
			})
			p := startPicker(t, []string{m.addr}, nil)
			gw := pickerGateway(t, p, devgateway.ModeFullDuplex)

			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.url+"/v1/chat/completions",
				bytes.NewReader(chatBody("m", "a long story", true)))
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					_, err = bufio.NewReader(resp.Body).ReadString('\n')
					if err == nil {
						<-ctx.Done()
					}
					resp.Body.Close()
				}
				errc <- err
			}()
			<-arrived
			if p.inFlight() != 1 {
				t.Errorf("picker in flight %d while the request runs, want 1", p.inFlight())
			}
			cancel()
			<-errc
			select {
			case <-upstreamGone:
			case <-time.After(testTimeout):
				t.Fatal("the upstream request was not cancelled")
			}
			eventually(t, "the picker's stream ends", func() bool { return p.inFlight() == 0 })
			eventually(t, "no gateway goroutine is left", func() bool { return len(gatewayGoroutines()) == 0 })
		})
	}
}

func TestBaselinePoliciesBypassThePicker(t *testing.T) {
	ms := []*model{startModel(t, nil), startModel(t, nil), startModel(t, nil)}
	addrs := []string{ms[0].addr, ms[1].addr, ms[2].addr}
	t.Run("round-robin takes endpoints in turn", func(t *testing.T) {
		gw := startGateway(t, devgateway.Options{Policy: devgateway.PolicyRoundRobin, Endpoints: addrs})
		for i := 0; i < 6; i++ {
			r := post(t, gw.url, "/v1/chat/completions", chatBody("m", "same prompt", false))
			if want := addrs[i%3]; r.status != http.StatusOK || r.header.Get("x-served-by") != want {
				t.Fatalf("request %d: status %d served by %q, want %s", i, r.status, r.header.Get("x-served-by"), want)
			}
		}
	})
	t.Run("random stays in the pool", func(t *testing.T) {
		gw := startGateway(t, devgateway.Options{Policy: devgateway.PolicyRandom, Endpoints: addrs})
		for i := 0; i < 6; i++ {
			r := post(t, gw.url, "/v1/chat/completions", chatBody("m", "same prompt", false))
			if s := r.header.Get("x-served-by"); r.status != http.StatusOK || (s != addrs[0] && s != addrs[1] && s != addrs[2]) {
				t.Fatalf("request %d: status %d served by %q", i, r.status, s)
			}
		}
	})
	t.Run("round-robin answers 503 when nothing is reachable", func(t *testing.T) {
		gw := startGateway(t, devgateway.Options{Policy: devgateway.PolicyRoundRobin, Endpoints: []string{closedAddr(t)}})
		r := post(t, gw.url, "/v1/chat/completions", chatBody("m", "x", false))
		if r.status != http.StatusServiceUnavailable {
			t.Fatalf("status %d", r.status)
		}
		openAIError(t, r.body)
	})
}

func TestHealthIsAnsweredByTheGateway(t *testing.T) {
	gw := startGateway(t, devgateway.Options{Policy: devgateway.PolicyRoundRobin, Endpoints: []string{closedAddr(t)}})
	resp, err := http.Get(gw.url + devgateway.HealthPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// The response path reports the endpoint that actually served the request (the fallback),
// so the picker's prefix affinity follows it: a follow-up of a conversation that failed over
// goes straight to the server that holds its cache.
func TestServedFallbackIsReportedSoAffinityFollowsIt(t *testing.T) {
	live := startModel(t, nil)
	p := startPicker(t, []string{closedAddr(t), live.addr}, func(c *config.Config) { c.ExtProc.Fallbacks = 1 })
	gw := pickerGateway(t, p, devgateway.ModeFullDuplex)
	fallbacks := func() int { return gw.logs.FilterMessage("served by a fallback").Len() }
	failedOver := 0
	for i := 0; i < 16; i++ {
		prompt := fmt.Sprintf("conversation %d: %s", i, strings.Repeat("z", 600))
		before := fallbacks()
		if r := post(t, gw.url, "/v1/chat/completions", chatBody("m", prompt, false)); r.status != http.StatusOK {
			t.Fatalf("status %d", r.status)
		}
		if fallbacks() == before {
			continue
		}
		failedOver++
		before = fallbacks()
		if r := post(t, gw.url, "/v1/chat/completions", chatBody("m", prompt+" and a follow-up", false)); r.status != http.StatusOK {
			t.Fatalf("status %d", r.status)
		}
		if fallbacks() != before {
			t.Errorf("conversation %d: the follow-up was picked for the dead endpoint again; its cache is on %s", i, live.addr)
		}
	}
	if failedOver == 0 {
		t.Fatal("no request was picked for the dead endpoint first: the fallback path was not exercised")
	}
}
