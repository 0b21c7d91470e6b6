package extproc

import (
	"sync/atomic"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/router"
)

// usageRecorder counts usage reports.
type usageRecorder struct{ n atomic.Int32 }

var _ router.UsageObserver = (*usageRecorder)(nil)

func (*usageRecorder) Name() string { return "usage-recorder" }

func (u *usageRecorder) Usage(*router.Request, *router.Endpoint, openai.Usage) { u.n.Add(1) }

// TestUsageIsDeliveredWhenTheResponseEnds: the usage report reaches the plugins as soon as the
// response's last message has been passed on, not when the proxy closes the stream: the
// stream's end then only takes the request out of the accounting, with nothing slow before it.
func TestUsageIsDeliveredWhenTheResponseEnds(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"hello"}`)
	usage := []byte(`{"id":"x","usage":{"prompt_tokens":10,"completion_tokens":2}}`)
	tests := []struct {
		name     string
		respMode filterv3.ProcessingMode_BodySendMode
		trailers bool
	}{
		{"full duplex, end_of_stream", fullDuplex, false},
		{"full duplex, trailers", fullDuplex, true},
		{"buffered", filterv3.ProcessingMode_BUFFERED, false},
		{"streamed", streamedM, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &usageRecorder{}
			s, p := testServerWith(t, Options{}, config.Default().Plugins, []router.Plugin{rec}, "10.0.0.1:8000")
			pc := protocol(fullDuplex, tc.respMode, false)
			hs := reqHeaders(pc, false, hdr(":method", "POST"), hdr(":path", "/v1/completions"))
			msgs := []*extprocv3.ProcessingRequest{hs, reqBody(body, true), respHeaders("200", false), respBody(usage, !tc.trailers)}
			if tc.trailers {
				msgs = append(msgs, respTrailers())
			}
			ss := newScript(msgs...)
			var atClose int32 = -1
			ss.onRecv = func(delivered int) {
				if delivered == len(msgs) {
					atClose = rec.n.Load()
				}
			}
			if err := s.Process(ss); err != nil {
				t.Fatal(err)
			}
			if atClose != 1 {
				t.Fatalf("%d usage reports when the proxy closed the stream, want 1", atClose)
			}
			if got := rec.n.Load(); got != 1 {
				t.Fatalf("%d usage reports in all, want 1", got)
			}
			if n := inFlight(p); n != 0 {
				t.Fatalf("in flight %d", n)
			}
		})
	}
}
