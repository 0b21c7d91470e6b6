package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvpick/kvpick/pkg/gateway"
)

// exchangeLog interleaves what the fake picker received with the driver's engine events, in
// the order they happened: on the virtual clock every ext_proc step is a synchronous round
// trip, so the order is the protocol's, not a race.
type exchangeLog struct {
	mu     sync.Mutex
	events []logged
}

type logged struct {
	req  int
	kind string // picker:<message> or engine:<event>
	data string
	eos  bool
}

func (l *exchangeLog) add(e logged) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// of returns request id's events.
func (l *exchangeLog) of(id int) []logged {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logged
	for _, e := range l.events {
		if e.req == id {
			out = append(out, e)
		}
	}
	return out
}

// fakePicker is an ext_proc server in FULL_DUPLEX_STREAMED mode that routes every request to
// dest, re-emits bodies unchanged, and logs every message it receives.
type fakePicker struct {
	extprocv3.UnimplementedExternalProcessorServer
	dest string
	log  *exchangeLog
}

func (p *fakePicker) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	id := -1
	var body []byte
	send := srv.Send
	for {
		msg, err := srv.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch v := msg.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			for _, h := range v.RequestHeaders.GetHeaders().GetHeaders() {
				if h.GetKey() == gateway.RequestIDHeader {
					fmt.Sscanf(string(h.GetRawValue()), "replay-%d", &id)
				}
			}
			p.log.add(logged{req: id, kind: "picker:request_headers"})
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, v.RequestBody.GetBody()...)
			if !v.RequestBody.GetEndOfStream() {
				continue
			}
			p.log.add(logged{req: id, kind: "picker:request_body", eos: true})
			set := []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: gateway.DestinationHeader, RawValue: []byte(p.dest)}},
				{Header: &corev3.HeaderValue{Key: "content-length", RawValue: []byte(fmt.Sprint(len(body)))}},
			}
			md := &structpb.Struct{Fields: map[string]*structpb.Value{
				gateway.LBNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
					gateway.DestinationHeader: structpb.NewStringValue(p.dest)}})}}
			if err := send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
				RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
					HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}, ClearRouteCache: true}}},
				DynamicMetadata: md}); err != nil {
				return err
			}
			if err := send(bodyAnswer(true, body, true)); err != nil {
				return err
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			status := ""
			for _, h := range v.ResponseHeaders.GetHeaders().GetHeaders() {
				if h.GetKey() == ":status" {
					status = string(h.GetRawValue())
				}
			}
			p.log.add(logged{req: id, kind: "picker:response_headers", data: status})
			if err := send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{}}}); err != nil {
				return err
			}
		case *extprocv3.ProcessingRequest_ResponseBody:
			b := v.ResponseBody
			p.log.add(logged{req: id, kind: "picker:response_body", data: string(b.GetBody()), eos: b.GetEndOfStream()})
			if err := send(bodyAnswer(false, b.GetBody(), b.GetEndOfStream())); err != nil {
				return err
			}
		}
	}
}

func bodyAnswer(request bool, data []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: data, EndOfStream: eos}}}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// startFakePicker serves a fakePicker on loopback and connects to it.
func startFakePicker(t *testing.T, dest string, log *exchangeLog) *Picker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, &fakePicker{dest: dest, log: log})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	p, err := DialPicker(context.Background(), ln.Addr().String(), "", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	return p
}

// timingWorkload: three requests a second apart, each alone on the pool: streamed with usage,
// streamed without, not streamed.
func timingWorkload(t *testing.T) *Workload {
	t.Helper()
	g := &gen{spec: Spec{Seed: 1, Engine: EngineConfig()}, errs: newRand(1, "timing/errors"), w: &Workload{Name: "timing"}}
	for i, opts := range []string{`"stream":true,"stream_options":{"include_usage":true}`, `"stream":true`, `"stream":false`} {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":20,%s,"messages":[{"role":"user","content":"request %d: %s"}]}`,
			Model, opts, i, text(newRand(uint64(i), "timing"), 300))
		if err := g.addRequest(Request{Path: "/v1/chat/completions", Body: []byte(body), At: time.Duration(i) * time.Second,
			After: -1, Group: -1}); err != nil {
			t.Fatal(err)
		}
	}
	return g.w
}

// runTimed replays the timing workload on one engine through the fake picker and returns the
// interleaved log.
func runTimed(t *testing.T, rc RunConfig) *exchangeLog {
	t.Helper()
	log := &exchangeLog{}
	eps, err := ListenEndpointsWait(1, testBase(), false, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eps.Close() })
	rc.Workload, rc.Policy, rc.Engines, rc.Clock = timingWorkload(t), KVPick, 1, ClockVirtual
	rc.Picker, rc.Endpoints, rc.ScrapeOff = startFakePicker(t, eps.Addrs()[0], log), eps, true
	rc.Trace = func(e Event) {
		switch e.Kind {
		case "submit", "first-token", "done":
			log.add(logged{req: e.Request, kind: "engine:" + e.Kind})
		}
	}
	res, err := Run(context.Background(), rc)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res.Records {
		if !r.OK() {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	return log
}

func kinds(evs []logged) string {
	var k []string
	for _, e := range evs {
		k = append(k, strings.TrimPrefix(strings.TrimPrefix(e.kind, "picker:"), "engine:"))
	}
	return strings.Join(k, " ")
}

// sseEvents returns the JSON objects of an SSE body's data events (without [DONE]).
func sseEvents(t *testing.T, body string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, ev := range strings.Split(body, "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("SSE event %q: %v", data, err)
		}
		out = append(out, m)
	}
	return out
}

func TestResponsesReachThePickerAsVLLMSendsThem(t *testing.T) {
	log := runTimed(t, RunConfig{})
	// A stream's headers go out when the request is queued, before its prefill; its first
	// events at the first token; the rest, with usage only when asked for, at the end.
	streamed := "request_headers request_body submit response_headers first-token response_body done response_body"
	for id, usage := range []bool{true, false} {
		evs := log.of(id)
		if got := kinds(evs); got != streamed {
			t.Fatalf("streamed request %d: %s\nwant %s", id, got, streamed)
		}
		first, last := evs[5], evs[7]
		if evs[3].data != "200" || first.eos || !last.eos {
			t.Fatalf("streamed request %d: status %s, first chunk eos %v, last eos %v", id, evs[3].data, first.eos, last.eos)
		}
		fe := sseEvents(t, first.data)
		if len(fe) != 2 || fmt.Sprint(fe[0]["choices"]) != "[map[delta:map[content: role:assistant] finish_reason:<nil> index:0 logprobs:<nil>]]" {
			t.Fatalf("first events of request %d: %v", id, fe)
		}
		le := sseEvents(t, last.data)
		hasUsage := false
		for _, e := range le {
			if u, ok := e["usage"].(map[string]any); ok {
				hasUsage = true
				if _, ok := u["prompt_tokens_details"].(map[string]any)["cached_tokens"]; !ok {
					t.Fatalf("request %d: usage without cached_tokens: %v", id, u)
				}
			}
		}
		if hasUsage != usage || !strings.HasSuffix(last.data, "data: [DONE]\n\n") {
			t.Fatalf("request %d (include_usage %v): last chunk %q", id, usage, last.data)
		}
	}
	// A non-streamed answer: headers and the whole body at the end.
	evs := log.of(2)
	if got, want := kinds(evs), "request_headers request_body submit first-token done response_headers response_body"; got != want {
		t.Fatalf("non-streamed: %s\nwant %s", got, want)
	}
	var whole struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct{ Role, Content string }
		} `json:"choices"`
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			CompletionTokens    int `json:"completion_tokens"`
			PromptTokensDetails *struct {
				CachedTokens *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(evs[6].data), &whole); err != nil || !evs[6].eos {
		t.Fatalf("non-streamed body %q (eos %v): %v", evs[6].data, evs[6].eos, err)
	}
	if whole.Object != "chat.completion" || whole.Choices[0].Message.Role != "assistant" || whole.Usage.CompletionTokens != 20 ||
		whole.Usage.PromptTokens == 0 || whole.Usage.PromptTokensDetails == nil || whole.Usage.PromptTokensDetails.CachedTokens == nil {
		t.Fatalf("non-streamed body: %+v", whole)
	}
}

func TestCachedTokensOnlyWhenTheServersReportThem(t *testing.T) {
	log := runTimed(t, RunConfig{OmitCachedTokens: true})
	// vLLM writes a non-streamed answer's hidden details as null and leaves them out of a
	// stream's usage event (its chunks are serialized without unset fields).
	for _, c := range []struct {
		name           string
		id, at         int
		details, usage string
	}{
		{"stream", 0, 7, "", `"usage":{"prompt_tokens":`},
		{"non-streamed", 2, 6, `"prompt_tokens_details":null`, `"usage":{"prompt_tokens":`},
	} {
		body := log.of(c.id)[c.at].data
		hasDetails := strings.Contains(body, "prompt_tokens_details")
		if !strings.Contains(body, c.usage) || strings.Contains(body, "cached_tokens") ||
			(c.details == "" && hasDetails) || (c.details != "" && !strings.Contains(body, c.details)) {
			t.Fatalf("%s request %d: usage without cached_tokens, details %q expected: %s", c.name, c.id, c.details, body)
		}
	}
}

func TestFirstTokenTimingIsTheFormerBehaviour(t *testing.T) {
	log := runTimed(t, RunConfig{Timing: TimingFirstToken})
	for id, want := range []string{
		"request_headers request_body submit first-token response_headers response_body done response_body",
		"request_headers request_body submit first-token response_headers response_body done response_body",
		"request_headers request_body submit first-token response_headers done response_body",
	} {
		if got := kinds(log.of(id)); got != want {
			t.Fatalf("request %d: %s\nwant %s", id, got, want)
		}
	}
}
