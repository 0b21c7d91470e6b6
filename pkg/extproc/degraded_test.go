package extproc

import (
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestResponseModesThatBreakAccountingAreReported: a proxy configured not to send the response
// body (the stream ends at the response headers, so the request stops counting in flight while
// it is generated) or the response headers (nothing is committed) makes the picker route worse
// without failing a request. Each such stream is counted by reason, with one warning per reason.
func TestResponseModesThatBreakAccountingAreReported(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"hello"}`)
	fd := protocol(fullDuplex, fullDuplex, false)
	bodyNone := protocol(fullDuplex, filterv3.ProcessingMode_NONE, false)
	tests := []struct {
		name       string
		pc         *extprocv3.ProtocolConfiguration
		response   []*extprocv3.ProcessingRequest // after the request
		cancel     bool                           // the stream is cancelled instead of half-closed
		wantReason string                         // "" for none
	}{
		{"full duplex, whole response", fd, []*extprocv3.ProcessingRequest{respHeaders("200", false), respBody([]byte("ok"), true)}, false, ""},
		{"full duplex, response without body", fd, []*extprocv3.ProcessingRequest{respHeaders("204", true)}, false, ""},
		{"response body NONE in protocol_config", bodyNone, []*extprocv3.ProcessingRequest{respHeaders("200", false)}, false, "response_body_none"},
		{"no protocol_config, stream ends after the response headers", nil, []*extprocv3.ProcessingRequest{respHeaders("200", false)}, false, "response_body_none"},
		{"response headers skipped", fd, nil, false, "response_headers_skipped"},
		{"cancelled after routing", fd, nil, true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.WarnLevel)
			reg := prometheus.NewRegistry()
			s, p := testServer(t, Options{Log: zap.New(core), Metrics: NewMetrics(reg)}, "10.0.0.1:8000")
			for range 3 {
				msgs := append([]*extprocv3.ProcessingRequest{
					reqHeaders(tc.pc, false, hdr(":method", "POST"), hdr(":path", "/v1/completions")),
					reqBody(body, true),
				}, tc.response...)
				ss := newScript(msgs...)
				if tc.cancel {
					ss.cancelAt = len(msgs)
				}
				_ = s.Process(ss)
				if routedTo(ss.out) == "" {
					t.Fatal("not routed")
				}
			}
			if n := inFlight(p); n != 0 {
				t.Fatalf("in flight %d", n)
			}
			for _, reason := range []string{"response_body_none", "response_headers_skipped"} {
				want := 0.0
				if reason == tc.wantReason {
					want = 3
				}
				if got := metricValue(t, reg, "kvpick_extproc_degraded_mode_streams_total", "reason", reason); got != want {
					t.Errorf("degraded streams{reason=%s} = %v, want %v", reason, got, want)
				}
			}
			warnings := logs.FilterField(zap.String("reason", tc.wantReason)).Len()
			if tc.wantReason == "" {
				warnings = logs.FilterMessageSnippet("accounting").Len()
			}
			if want := map[bool]int{true: 0, false: 1}[tc.wantReason == ""]; warnings != want {
				t.Errorf("%d warnings, want %d: %v", warnings, want, logs.All())
			}
		})
	}
}
