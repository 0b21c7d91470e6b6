package extproc

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/router"
)

// panicky is a plugin that panics at the stage named by the request's id.
type panicky struct{}

var (
	_ router.Scorer           = panicky{}
	_ router.ResponseObserver = panicky{}
	_ router.UsageObserver    = panicky{}
	_ router.DoneObserver     = panicky{}
)

func (panicky) Name() string { return "panicky" }

func (panicky) Score(_ context.Context, req *router.Request, _ []*router.Endpoint, _ []float64) {
	if req.ID == "score" {
		panic("scorer bug")
	}
}

func (panicky) ResponseHeaders(req *router.Request, _ *router.Endpoint, _ int) {
	if req.ID == "response" {
		panic("response observer bug")
	}
}

func (panicky) Usage(req *router.Request, _ *router.Endpoint, _ openai.Usage) {
	if req.ID == "usage" {
		panic("usage observer bug")
	}
}

func (panicky) Done(req *router.Request, _ *router.Endpoint) {
	if req.ID == "done" {
		panic("done observer bug")
	}
}

// TestPanickingPluginFailsOnlyItsRequest: a plugin that panics ends its own stream with an error
// (an OpenAI-style 500 when the request was not routed yet), logged with the request id and
// counted; the request leaves the in-flight count, and the next request is served.
func TestPanickingPluginFailsOnlyItsRequest(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	usage := []byte(`data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2}}` + "\n\ndata: [DONE]\n\n")
	tests := []struct {
		stage         string
		wantImmediate bool       // a 500 ImmediateResponse
		wantCode      codes.Code // Process's status
	}{
		{"score", true, codes.OK},
		{"response", false, codes.Internal},
		{"usage", false, codes.Internal},
		{"done", false, codes.OK}, // the stream was over: nothing left to fail
	}
	for _, tc := range tests {
		t.Run(tc.stage, func(t *testing.T) {
			core, logs := observer.New(zapcore.ErrorLevel)
			reg := prometheus.NewRegistry()
			m := NewMetrics(reg)
			s, p := testServerWith(t, Options{Log: zap.New(core), Metrics: m}, config.Default().Plugins,
				[]router.Plugin{panicky{}}, "10.0.0.1:8000", "10.0.0.2:8000")
			pc := protocol(fullDuplex, fullDuplex, false)
			hs := reqHeaders(pc, false, hdr(":method", "POST"), hdr(":path", "/v1/chat/completions"), hdr("x-request-id", tc.stage))
			ss := newScript(hs, reqBody(body, true), respHeaders("200", false), respBody(usage, true))
			err := s.Process(ss)
			if got := status.Code(err); got != tc.wantCode {
				t.Fatalf("Process returned %v, want code %v", err, tc.wantCode)
			}
			im := ss.out[len(ss.out)-1].GetImmediateResponse()
			if tc.wantImmediate != (im != nil) {
				t.Fatalf("immediate response %v, want one: %v", im, tc.wantImmediate)
			}
			if im != nil && im.GetStatus().GetCode() != 500 {
				t.Fatalf("immediate status %v, want 500", im.GetStatus().GetCode())
			}
			if n := inFlight(p); n != 0 {
				t.Fatalf("in flight %d after the panicking stream ended", n)
			}
			if got := metricValue(t, reg, "kvpick_extproc_panics_total"); got != 1 {
				t.Fatalf("panics counted %v, want 1", got)
			}
			entries := logs.FilterField(zap.String("request_id", tc.stage)).All()
			if len(entries) != 1 {
				t.Fatalf("%d error log lines carry the request id, want 1 (all: %v)", len(entries), logs.All())
			}
			// The picker goes on serving.
			ok := newScript(reqHeaders(pc, false, hdr(":method", "POST"), hdr(":path", "/v1/chat/completions")),
				reqBody(body, true), respHeaders("200", false), respBody([]byte("data: [DONE]\n\n"), true))
			if err := s.Process(ok); err != nil || routedTo(ok.out) == "" {
				t.Fatalf("the next request: %v, routed to %q", err, routedTo(ok.out))
			}
			if n := inFlight(p); n != 0 {
				t.Fatalf("in flight %d after the next stream ended", n)
			}
		})
	}
}
