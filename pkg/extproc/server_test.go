package extproc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/internal/runnertest"
	"github.com/kvpick/kvpick/pkg/runner"
)

// harness is a real picker (default pipeline) behind a real gRPC server on loopback, and an
// Envoy-like client.
type harness struct {
	t      *testing.T
	pk     *runner.Picker
	client *dataplane.Client
	conn   *grpc.ClientConn
}

var pool4 = []string{"127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003", "127.0.0.1:8004"}

func newHarness(t *testing.T, edit func(*config.Config)) *harness {
	t.Helper()
	cfg := config.Default()
	cfg.Pool.Endpoints = pool4
	if edit != nil {
		edit(cfg)
	}
	pk, addr := runnertest.Serve(t, cfg)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, pk: pk, conn: conn, client: dataplane.New(conn, dataplane.WithMessageTimeout(5*time.Second))}
	t.Cleanup(func() { conn.Close() })
	return h
}

// metric reads a gauge or counter (summed over label sets matching labels) from the registry.
func (h *harness) metric(name string, labels ...string) float64 {
	h.t.Helper()
	mfs, err := h.pk.Registry.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == kv[i] && lp.GetValue() == kv[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// inFlight sums the pool's in-flight counts.
func (h *harness) inFlight() int64 {
	var n int64
	for _, e := range h.pk.Pool.Snapshot() {
		n += e.InFlight()
	}
	return n
}

// settled waits until every stream has ended server-side: Process's cleanup runs after the
// client sees the stream end.
func (h *harness) settled() {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for h.metric("kvpick_open_streams") != 0 || h.inFlight() != 0 {
		if time.Now().After(deadline) {
			h.t.Fatalf("streams left open: %v, in flight: %d", h.metric("kvpick_open_streams"), h.inFlight())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func chatBody(conv, turns int) []byte {
	return chatBodyWithSystem(strings.Repeat("You are a meticulous assistant. ", 30), conv, turns)
}

func chatBodyWithSystem(system string, conv, turns int) []byte {
	msgs := []map[string]any{{"role": "system", "content": system}}
	for i := range turns {
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("conversation %d question %d: %s", conv, i, strings.Repeat("details please ", 20))})
		if i < turns-1 {
			msgs = append(msgs, map[string]any{"role": "assistant", "content": fmt.Sprintf("answer %d", i)})
		}
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "stream": true})
	return b
}

func post(path string, body []byte) *dataplane.HTTPRequest {
	return &dataplane.HTTPRequest{
		Method: "POST", Path: path, Authority: "gw",
		Headers: []dataplane.Header{{Key: "content-type", Value: "application/json"}, {Key: "content-length", Value: fmt.Sprint(len(body))}, {Key: "x-request-id", Value: "req-1"}},
		Body:    body,
	}
}

func sse(chunks ...string) *dataplane.HTTPResponse {
	r := &dataplane.HTTPResponse{Status: 200, Headers: []dataplane.Header{{Key: "content-type", Value: "text/event-stream"}}}
	for _, c := range chunks {
		r.Chunks = append(r.Chunks, []byte(c))
	}
	return r
}

func modes() map[string]dataplane.Mode {
	fd := dataplane.FullDuplex()
	buffered := fd
	buffered.RequestBody, buffered.ResponseBody = filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED
	partial := fd
	partial.RequestBody, partial.ResponseBody = filterv3.ProcessingMode_BUFFERED_PARTIAL, filterv3.ProcessingMode_STREAMED
	streamed := fd
	streamed.RequestBody, streamed.ResponseBody = filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_STREAMED
	streamed.SendBodyWithoutWaitingForHeaderResponse = true
	streamedWait := streamed
	streamedWait.SendBodyWithoutWaitingForHeaderResponse = false
	none := fd
	none.RequestBody, none.ResponseBody, none.RequestTrailers = filterv3.ProcessingMode_NONE, filterv3.ProcessingMode_NONE, false
	old := fd
	old.OmitProtocolConfig = true
	noTrailers := buffered
	noTrailers.RequestTrailers, noTrailers.ResponseTrailers = false, false
	return map[string]dataplane.Mode{
		"full duplex": fd, "buffered": buffered, "buffered partial": partial, "streamed without waiting": streamed,
		"streamed waiting for headers": streamedWait, "none": none, "no protocol_config": old, "buffered without trailers": noTrailers,
	}
}

func TestRoutesInEveryBodyMode(t *testing.T) {
	for name, mode := range modes() {
		for _, trailers := range []bool{false, true} {
			for _, valueField := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/trailers=%v/value-field=%v", name, trailers, valueField), func(t *testing.T) {
					h := newHarness(t, nil)
					body := chatBody(1, 3)
					req := post("/v1/chat/completions", body)
					req.HeaderValueField = valueField
					if trailers && mode.RequestTrailers {
						req.Trailers = []dataplane.Header{{Key: "x-checksum", Value: "abc"}}
					}
					resp := sse("data: {\"a\":1}\n\n", "data: {\"a\":2}\n\n", "data: [DONE]\n\n")
					if trailers && mode.ResponseTrailers {
						resp.Trailers = []dataplane.Header{{Key: "x-usage", Value: "7"}}
					}
					routed, fwd, err := h.client.Do(context.Background(), mode, req, resp)
					if err != nil {
						t.Fatal(err)
					}
					if routed.Immediate != nil {
						t.Fatalf("immediate response %d %s", routed.Immediate.Status, routed.Immediate.Body)
					}
					if !contains(pool4, routed.Destination) {
						t.Fatalf("destination %q is not in the pool", routed.Destination)
					}
					md := routed.Metadata.GetFields()["envoy.lb"].GetStructValue().GetFields()["x-gateway-destination-endpoint"].GetStringValue()
					if md != routed.Destination {
						t.Fatalf("metadata %q != header %q", md, routed.Destination)
					}
					if !routed.ClearRouteCache {
						t.Fatal("clear_route_cache not set with the routing mutation")
					}
					if mode.RequestBody != filterv3.ProcessingMode_NONE && !bytes.Equal(routed.Body, body) {
						t.Fatalf("forwarded body differs (%d vs %d bytes)", len(routed.Body), len(body))
					}
					if got := string(fwd.Body); mode.ResponseBody != filterv3.ProcessingMode_NONE && got != "data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n" {
						t.Fatalf("forwarded response %q", got)
					}
					h.settled()
					if got := h.metric("kvpick_requests_total", "outcome", "success", "status", "200"); got != 1 {
						t.Fatalf("requests_total{success,200} = %v", got)
					}
				})
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

func TestErrorsAreOpenAIStyleImmediateResponses(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(*config.Config)
		req    *dataplane.HTTPRequest
		status int
		code   string
	}{
		{"malformed JSON", nil, post("/v1/chat/completions", []byte(`{"model":"m","messages":[`)), 400, "invalid_json"},
		{"no model", nil, post("/v1/chat/completions", []byte(`{"messages":[{"role":"user","content":"hi"}]}`)), 400, "missing_model"},
		{"no body on an inference path", nil, &dataplane.HTTPRequest{Method: "GET", Path: "/v1/chat/completions"}, 400, "missing_body"},
		{"body over the limit", func(c *config.Config) { c.ExtProc.MaxBodyBytes = 1000 }, post("/v1/chat/completions", chatBody(1, 5)), 413, "request_too_large"},
		{"empty pool", func(c *config.Config) { c.Pool.Endpoints = nil }, post("/v1/chat/completions", chatBody(1, 1)), 503, "no_endpoint"},
		{"subset hint outside the pool", nil, func() *dataplane.HTTPRequest {
			r := post("/v1/chat/completions", chatBody(1, 1))
			r.SubsetHint = []string{"10.9.9.9:80"}
			return r
		}(), 503, "no_endpoint"},
		{"empty subset hint", nil, func() *dataplane.HTTPRequest {
			r := post("/v1/chat/completions", chatBody(1, 1))
			r.SubsetHint = []string{}
			return r
		}(), 503, "no_endpoint"},
	}
	for _, tc := range tests {
		for name, mode := range map[string]dataplane.Mode{"full duplex": dataplane.FullDuplex(), "buffered": modes()["buffered"]} {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				h := newHarness(t, tc.edit)
				routed, _, err := h.client.Do(context.Background(), mode, tc.req, sse("x"))
				if err != nil {
					t.Fatal(err)
				}
				im := routed.Immediate
				if im == nil {
					t.Fatalf("routed to %s, want an immediate %d", routed.Destination, tc.status)
				}
				if im.Status != tc.status {
					t.Fatalf("status %d, want %d (%s)", im.Status, tc.status, im.Body)
				}
				if ct, _ := dataplane.Lookup(im.Headers, "content-type"); ct != "application/json" {
					t.Fatalf("content-type %q", ct)
				}
				var e openAIError
				if err := json.Unmarshal(im.Body, &e); err != nil {
					t.Fatalf("body is not JSON: %s", im.Body)
				}
				if e.Error.Code != tc.code || e.Error.Message == "" || e.Error.Type == "" {
					t.Fatalf("error body %s, want code %s", im.Body, tc.code)
				}
				h.settled()
				if got := h.metric("kvpick_requests_total", "outcome", "rejected", "status", fmt.Sprint(tc.status)); got != 1 {
					t.Fatalf("requests_total{rejected,%d} = %v", tc.status, got)
				}
			})
		}
	}
}

func TestShedsWith429WhenEveryEndpointIsSaturated(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Pool.Endpoints = pool4[:1]
		c.Plugins[2].Parameters = json.RawMessage(`{"maxInFlightPerEndpoint":1}`)
	})
	if h.pk.Pipeline == nil || config.Default().Plugins[2].Name != "saturation-filter" {
		t.Fatal("default plugin order changed; fix this test")
	}
	x, err := h.client.Open(context.Background(), dataplane.FullDuplex())
	if err != nil {
		t.Fatal(err)
	}
	defer x.Cancel()
	if r, err := x.Request(post("/v1/chat/completions", chatBody(1, 1))); err != nil || r.Immediate != nil {
		t.Fatalf("first request: %v %+v", err, r)
	}
	routed, _, err := h.client.Do(context.Background(), dataplane.FullDuplex(), post("/v1/chat/completions", chatBody(2, 1)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if routed.Immediate == nil || routed.Immediate.Status != 429 {
		t.Fatalf("second request while the only endpoint is saturated: %+v", routed)
	}
}

func TestLargeBodyIsReemittedWhole(t *testing.T) {
	h := newHarness(t, nil)
	big := chatBody(1, 1)
	filler := strings.Repeat("lorem ipsum dolor sit amet ", 40000) // ~1 MB
	big = bytes.Replace(big, []byte("details please"), []byte(filler), 1)
	for name, mode := range map[string]dataplane.Mode{"full duplex": dataplane.FullDuplex(), "buffered": modes()["buffered"], "streamed": modes()["streamed without waiting"]} {
		t.Run(name, func(t *testing.T) {
			routed, _, err := h.client.Do(context.Background(), mode, post("/v1/chat/completions", big), sse("ok"))
			if err != nil {
				t.Fatal(err)
			}
			if routed.Immediate != nil || !bytes.Equal(routed.Body, big) {
				t.Fatalf("1 MB body not forwarded intact (%d of %d bytes)", len(routed.Body), len(big))
			}
		})
	}
}

func TestConversationsStickToTheirEndpointAcrossTurns(t *testing.T) {
	h := newHarness(t, nil)
	home := map[int]string{}
	for turn := 1; turn <= 4; turn++ {
		for conv := range 12 {
			// Each conversation has its own system prompt: new prompts with no match anywhere
			// spread by rendezvous hash, later turns follow their first.
			body := chatBodyWithSystem(fmt.Sprintf("System prompt of conversation %d. %s", conv, strings.Repeat("Be brief. ", 40)), conv, turn)
			routed, _, err := h.client.Do(context.Background(), dataplane.FullDuplex(), post("/v1/chat/completions", body), sse("data: [DONE]\n\n"))
			if err != nil {
				t.Fatal(err)
			}
			if turn == 1 {
				home[conv] = routed.Destination
			} else if routed.Destination != home[conv] {
				t.Fatalf("conversation %d turn %d went to %s, earlier turns to %s", conv, turn, routed.Destination, home[conv])
			}
		}
	}
	spread := map[string]bool{}
	for _, d := range home {
		spread[d] = true
	}
	if len(spread) < 3 {
		t.Fatalf("12 new conversations landed on only %d endpoints: %v", len(spread), home)
	}
}

func TestFailedResponsesCreateNoAffinity(t *testing.T) {
	h := newHarness(t, nil)
	for _, status := range []int{500, 503, 429} {
		resp := &dataplane.HTTPResponse{Status: status, Body: []byte(`{"error":{}}`)}
		if _, _, err := h.client.Do(context.Background(), dataplane.FullDuplex(), post("/v1/chat/completions", chatBody(status, 2)), resp); err != nil {
			t.Fatal(err)
		}
	}
	h.settled()
	if n := h.metric("kvpick_prefix_index_entries"); n != 0 {
		t.Fatalf("failed responses left %v index entries", n)
	}
	if n := h.metric("kvpick_prefix_pending_records"); n != 0 {
		t.Fatalf("failed responses left %v pending records", n)
	}
	if got := h.metric("kvpick_requests_total", "outcome", "upstream_error"); got != 3 {
		t.Fatalf("requests_total{upstream_error} = %v", got)
	}
	// A success commits.
	if _, _, err := h.client.Do(context.Background(), dataplane.FullDuplex(), post("/v1/chat/completions", chatBody(1, 2)), sse("ok")); err != nil {
		t.Fatal(err)
	}
	h.settled()
	if n := h.metric("kvpick_prefix_index_entries"); n == 0 {
		t.Fatal("a 200 response committed nothing")
	}
}

func TestCommitGoesToTheEndpointTheProxyReportsServed(t *testing.T) {
	h := newHarness(t, nil)
	body := chatBody(5, 2)
	routed, _, err := h.client.Do(context.Background(), dataplane.FullDuplex(), post("/v1/chat/completions", body), nil)
	if err != nil {
		t.Fatal(err)
	}
	other := pool4[0]
	if other == routed.Destination {
		other = pool4[1]
	}
	x, err := h.client.Open(context.Background(), dataplane.FullDuplex())
	if err != nil {
		t.Fatal(err)
	}
	r, err := x.Request(post("/v1/chat/completions", body))
	if err != nil || r.Immediate != nil {
		t.Fatal(err)
	}
	// The proxy failed over to another endpoint, which served the request.
	if _, _, err := x.ResponseHeaders(200, nil, other, true); err != nil {
		t.Fatal(err)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	next, _, err := h.client.Do(context.Background(), dataplane.FullDuplex(), post("/v1/chat/completions", chatBody(5, 3)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if next.Destination != other {
		t.Fatalf("next turn went to %s, want the served endpoint %s", next.Destination, other)
	}
}

func TestCancelledStreamsLeaveNothingBehind(t *testing.T) {
	h := newHarness(t, nil)
	// Connect first: the connection's own goroutines are not a leak.
	if _, _, err := h.client.Do(context.Background(), dataplane.FullDuplex(), post("/v1/chat/completions", chatBody(0, 1)), sse("ok")); err != nil {
		t.Fatal(err)
	}
	h.settled()
	base := runtime.NumGoroutine()
	stages := []string{"after headers", "mid body", "after routing", "after response headers", "mid response body"}
	for _, stage := range stages {
		for name, mode := range map[string]dataplane.Mode{"full duplex": dataplane.FullDuplex(), "buffered": modes()["buffered"]} {
			t.Run(stage+"/"+name, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				body := chatBody(9, 2)
				req := post("/v1/chat/completions", body)
				switch stage {
				case "after headers", "mid body":
					if mode.RequestBody == filterv3.ProcessingMode_BUFFERED && stage == "mid body" {
						t.Skip("BUFFERED sends the body in one message: there is no mid-body")
					}
					// Raw messages: the body never ends, so the picker has not answered (routed
					// or rejected) when the proxy cancels. (The fuzzer and
					// TestCancelBeforeTheBodyEnds cancel at exact points.)
					raw, err := extprocv3.NewExternalProcessorClient(h.conn).Process(ctx)
					if err != nil {
						t.Fatal(err)
					}
					err = raw.Send(&extprocv3.ProcessingRequest{
						ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode.RequestBody, ResponseBodyMode: mode.ResponseBody},
						Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{
							Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(req.Path)}},
						}}},
					})
					if err != nil {
						t.Fatal(err)
					}
					if mode.RequestBody == filterv3.ProcessingMode_BUFFERED {
						// The headers' answer: the picker holds the request, waiting for its body.
						if r, err := raw.Recv(); err != nil || r.GetRequestHeaders() == nil {
							t.Fatalf("headers answer %v, %v", r, err)
						}
					}
					if stage == "mid body" {
						err := raw.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
							RequestBody: &extprocv3.HttpBody{Body: body[:len(body)/2]},
						}})
						if err != nil {
							t.Fatal(err)
						}
					}
					cancel()
				default:
					x, err := h.client.Open(ctx, mode)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := x.Request(req); err != nil {
						t.Fatal(err)
					}
					if stage != "after routing" {
						if _, _, err := x.ResponseHeaders(200, []dataplane.Header{{Key: "content-type", Value: "text/event-stream"}}, "", false); err != nil {
							t.Fatal(err)
						}
						if stage == "mid response body" {
							if err := x.ResponseBody([]byte("data: 1\n\n"), false); err != nil {
								t.Fatal(err)
							}
						}
					}
					x.Cancel()
				}
				h.settled()
				if n := h.metric("kvpick_prefix_pending_records"); n != 0 {
					t.Fatalf("%v pending records left", n)
				}
			})
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base+2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base+2 {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines grew from %d to %d:\n%s", base, n, buf[:runtime.Stack(buf, true)])
	}
}

func TestInFlightIsCountedUntilTheStreamEnds(t *testing.T) {
	h := newHarness(t, nil)
	x, err := h.client.Open(context.Background(), dataplane.FullDuplex())
	if err != nil {
		t.Fatal(err)
	}
	r, err := x.Request(post("/v1/chat/completions", chatBody(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	ep := h.pk.Pool.Lookup(r.Destination)
	if ep.InFlight() != 1 {
		t.Fatalf("in flight after routing = %d", ep.InFlight())
	}
	if _, _, err := x.ResponseHeaders(200, nil, "", false); err != nil {
		t.Fatal(err)
	}
	if ep.InFlight() != 1 {
		t.Fatalf("in flight while the response streams = %d", ep.InFlight())
	}
	if err := x.ResponseBody([]byte("done"), true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := x.NextResponseBody(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	h.settled()
}

func TestSubsetHintRestrictsTheChoice(t *testing.T) {
	h := newHarness(t, nil)
	for _, asString := range []bool{false, true} {
		for i := range 20 {
			req := post("/v1/chat/completions", chatBody(i, 1))
			req.SubsetHint = []string{pool4[2], pool4[3]}
			req.SubsetHintAsString = asString
			routed, _, err := h.client.Do(context.Background(), dataplane.FullDuplex(), req, nil)
			if err != nil {
				t.Fatal(err)
			}
			if routed.Destination != pool4[2] && routed.Destination != pool4[3] {
				t.Fatalf("routed to %s outside the hint", routed.Destination)
			}
		}
	}
}

func TestOtherPathsAreRoutedAtHeadersAndStreamed(t *testing.T) {
	h := newHarness(t, nil)
	body := bytes.Repeat([]byte("binary upload "), 20000)
	for name, mode := range modes() {
		t.Run(name, func(t *testing.T) {
			req := post("/v1/files", body)
			routed, fwd, err := h.client.Do(context.Background(), mode, req, &dataplane.HTTPResponse{Status: 200, Body: []byte(`{"id":"file-1"}`)})
			if err != nil {
				t.Fatal(err)
			}
			if !contains(pool4, routed.Destination) {
				t.Fatalf("destination %q", routed.Destination)
			}
			if mode.RequestBody != filterv3.ProcessingMode_NONE && !bytes.Equal(routed.Body, body) {
				t.Fatal("body changed")
			}
			if mode.ResponseBody != filterv3.ProcessingMode_NONE && string(fwd.Body) != `{"id":"file-1"}` {
				t.Fatalf("response %q", fwd.Body)
			}
		})
	}
	// GET without body.
	routed, _, err := h.client.Do(context.Background(), dataplane.FullDuplex(), &dataplane.HTTPRequest{Method: "GET", Path: "/v1/models"}, nil)
	if err != nil || !contains(pool4, routed.Destination) {
		t.Fatalf("GET /v1/models: %v %+v", err, routed)
	}
}

func TestRequestIDIsGeneratedWhenAbsent(t *testing.T) {
	h := newHarness(t, nil)
	req := post("/v1/chat/completions", chatBody(1, 1))
	req.Headers = req.Headers[:2] // no x-request-id
	routed, _, err := h.client.Do(context.Background(), dataplane.FullDuplex(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := dataplane.Lookup(routed.Headers, "x-request-id"); !ok || len(id) != 32 {
		t.Fatalf("x-request-id %q", id)
	}
	req2 := post("/v1/chat/completions", chatBody(1, 1))
	routed, _, err = h.client.Do(context.Background(), dataplane.FullDuplex(), req2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := dataplane.Lookup(routed.Headers, "x-request-id"); id != "req-1" {
		t.Fatalf("the client's x-request-id was replaced by %q", id)
	}
}

func TestResponseContentLengthIsKept(t *testing.T) {
	h := newHarness(t, nil)
	resp := &dataplane.HTTPResponse{Status: 200, Headers: []dataplane.Header{{Key: "content-length", Value: "11"}}, Body: []byte(`{"ok":true}`)}
	_, fwd, err := h.client.Do(context.Background(), dataplane.FullDuplex(), post("/v1/chat/completions", chatBody(1, 1)), resp)
	if err != nil {
		t.Fatal(err)
	}
	if cl, _ := dataplane.Lookup(fwd.Headers, "content-length"); cl != "11" {
		t.Fatalf("content-length %q", cl)
	}
	if _, ok := dataplane.Lookup(fwd.Headers, "transfer-encoding"); ok {
		t.Fatal("transfer-encoding set")
	}
}

func TestObservabilityModeIsNotAnswered(t *testing.T) {
	h := newHarness(t, nil)
	stream, err := extprocv3.NewExternalProcessorClient(h.conn).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	err = stream.Send(&extprocv3.ProcessingRequest{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}})
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := stream.Recv(); err == nil {
		t.Fatalf("answered in observability mode: %v", msg)
	}
	h.settled()
}

// TestUsageReportsReachThePlugins: the usage object at the end of a successful response, however
// the proxy sends the body and wherever the chunks split it, is read once and counted; a failed
// response's is not.
func TestUsageReportsReachThePlugins(t *testing.T) {
	usage := `data: {"choices":[],"usage":{"prompt_tokens":1500,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":1200}}}` + "\n\ndata: [DONE]\n\n"
	long := strings.Repeat(`data: {"choices":[{"delta":{"content":"tok"}}]}`+"\n\n", 40) // > UsageTailBytes
	for name, mode := range modes() {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, nil)
			// Split inside the usage object's key, after a long stream.
			resp := sse(long, usage[:40], usage[40:])
			if _, _, err := h.client.Do(context.Background(), mode, post("/v1/chat/completions", chatBody(1, 1)), resp); err != nil {
				t.Fatal(err)
			}
			failed := sse(usage)
			failed.Status = 500
			if _, _, err := h.client.Do(context.Background(), mode, post("/v1/chat/completions", chatBody(2, 1)), failed); err != nil {
				t.Fatal(err)
			}
			h.settled()
			want, wantCached := 1500.0, 1200.0
			if mode.ResponseBody == filterv3.ProcessingMode_NONE {
				want, wantCached = 0, 0 // the picker never sees the body
			}
			if got := h.metric("kvpick_prefix_server_prompt_tokens_total"); got != want {
				t.Errorf("server prompt tokens %v, want %v", got, want)
			}
			if got := h.metric("kvpick_prefix_server_cached_tokens_total"); got != wantCached {
				t.Errorf("server cached tokens %v, want %v", got, wantCached)
			}
		})
	}
}

// TestAssumedBodyModeNoneRoutesAtHeaders: a proxy that sends no protocol_config and no body,
// with extProc.assumedBodyMode NONE, gets its answer at the request headers; the picker must
// not wait for a body that will never come.
func TestAssumedBodyModeNoneRoutesAtHeaders(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.ExtProc.AssumedBodyMode = "NONE" })
	mode := modes()["none"]
	mode.OmitProtocolConfig = true
	routed, _, err := h.client.Do(context.Background(), mode, post("/v1/chat/completions", chatBody(1, 1)), sse("ok"))
	if err != nil {
		t.Fatal(err)
	}
	if routed.Immediate != nil || !contains(pool4, routed.Destination) {
		t.Fatalf("not routed at headers: %+v", routed)
	}
	h.settled()
}

// TestExplainHeaderThroughTheRunner: extProc.explainHeader wires the explanation, with the
// prefix scorer's match, end to end.
func TestExplainHeaderThroughTheRunner(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.ExtProc.ExplainHeader = true })
	req := post("/v1/chat/completions", chatBody(1, 2))
	req.Headers = append(req.Headers, dataplane.Header{Key: "x-kvpick-explain", Value: "1"})
	routed, fwd, err := h.client.Do(context.Background(), dataplane.FullDuplex(), req, sse("data: [DONE]\n\n"))
	if err != nil {
		t.Fatal(err)
	}
	got, ok := dataplane.Lookup(fwd.Headers, "x-kvpick-explain")
	if !ok || !strings.HasPrefix(got, "endpoint="+routed.Destination+";") || !strings.Contains(got, "match=0/") {
		t.Fatalf("x-kvpick-explain %q (present %v)", got, ok)
	}
}
