package extproc

import (
	"context"
	"errors"
	"io"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/plugins"
	"github.com/kvpick/kvpick/pkg/pool"
	"github.com/kvpick/kvpick/pkg/router"
)

// scriptStream is an in-memory ext_proc stream: Recv hands out a fixed list of messages, then
// end (io.EOF for a half-close, or a cancellation). Send records the answers, or fails from the
// failSend-th answer on (the proxy went away). Process runs synchronously on it: no goroutines.
type scriptStream struct {
	grpc.ServerStream // nil: only the methods below are used
	ctx               context.Context
	cancel            context.CancelFunc
	in                []*extprocv3.ProcessingRequest
	// cancelAt, when >= 0, cancels the stream instead of delivering in[cancelAt].
	cancelAt int
	failSend int // -1: never
	// onRecv, when set, runs at each Recv with the number of messages delivered so far.
	onRecv func(delivered int)
	next   int
	out    []*extprocv3.ProcessingResponse
}

func newScript(msgs ...*extprocv3.ProcessingRequest) *scriptStream {
	ctx, cancel := context.WithCancel(context.Background())
	return &scriptStream{ctx: ctx, cancel: cancel, in: msgs, cancelAt: -1, failSend: -1}
}

func (s *scriptStream) Context() context.Context { return s.ctx }

func (s *scriptStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if s.onRecv != nil {
		s.onRecv(s.next)
	}
	if s.next == s.cancelAt {
		s.cancel()
	}
	if s.ctx.Err() != nil {
		return nil, status.Error(codes.Canceled, "context canceled")
	}
	if s.next >= len(s.in) {
		return nil, io.EOF
	}
	m := s.in[s.next]
	s.next++
	return m, nil
}

func (s *scriptStream) Send(m *extprocv3.ProcessingResponse) error {
	if s.ctx.Err() != nil {
		return status.Error(codes.Canceled, "context canceled")
	}
	if s.failSend >= 0 && len(s.out) >= s.failSend {
		return errors.New("transport is closing")
	}
	s.out = append(s.out, m)
	return nil
}

// testServer is a Server over the default pipeline (config/default.yaml's plugins) and a static
// pool of eps.
func testServer(t testing.TB, opt Options, eps ...string) (*Server, *pool.Pool) {
	t.Helper()
	return testServerWith(t, opt, config.Default().Plugins, nil, eps...)
}

// testServerWith is testServer with the given plugin specs, plus extra plugin instances
// inserted before the picker.
func testServerWith(t testing.TB, opt Options, specs []config.Plugin, extra []router.Plugin, eps ...string) (*Server, *pool.Pool) {
	t.Helper()
	return buildTestServer(t, opt, specs, extra, nil, eps...)
}

// buildTestServer is testServerWith whose plugins register their metrics with reg (nil: none).
func buildTestServer(t testing.TB, opt Options, specs []config.Plugin, extra []router.Plugin, reg prometheus.Registerer, eps ...string) (*Server, *pool.Pool) {
	t.Helper()
	built, err := plugins.Build(specs, plugins.Deps{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	all := append(extra[:len(extra):len(extra)], built.Plugins...)
	p := pool.New()
	for _, pl := range all {
		if l, ok := pl.(router.PoolListener); ok {
			p.Listen(l)
		}
	}
	pipe, err := router.New(router.Config{Pool: p, Plugins: all, Weights: built.Weights})
	if err != nil {
		t.Fatal(err)
	}
	if opt.MaxBodyBytes == 0 {
		opt.MaxBodyBytes = 32 << 20
	}
	if opt.ChunkBytes == 0 {
		opt.ChunkBytes = 62000
	}
	s, err := New(pipe, opt)
	if err != nil {
		t.Fatal(err)
	}
	p.Set(eps)
	return s, p
}

// inFlight sums the pool's in-flight counts.
func inFlight(p *pool.Pool) int64 {
	var n int64
	for _, e := range p.Snapshot() {
		n += e.InFlight()
	}
	return n
}

// metricValue sums a counter's or gauge's series whose labels include labels (name, value, ...).
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
				}
				if !found {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// Message builders, as a proxy would send them.

func hdr(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

func reqHeaders(pc *extprocv3.ProtocolConfiguration, eos bool, hs ...*corev3.HeaderValue) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{ProtocolConfig: pc, Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: eos},
	}}
}

func chatHeaders(pc *extprocv3.ProtocolConfiguration, contentLength string) *extprocv3.ProcessingRequest {
	hs := []*corev3.HeaderValue{hdr(":method", "POST"), hdr(":path", "/v1/chat/completions"), hdr("x-request-id", "r1")}
	if contentLength != "" {
		hs = append(hs, hdr("content-length", contentLength))
	}
	return reqHeaders(pc, false, hs...)
}

func reqBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos},
	}}
}

func reqTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{},
	}}
}

func respHeaders(code string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{hdr(":status", code)}}, EndOfStream: eos},
	}}
}

func respBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos},
	}}
}

func respTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
		ResponseTrailers: &extprocv3.HttpTrailers{},
	}}
}

func protocol(req, resp filterv3.ProcessingMode_BodySendMode, noWait bool) *extprocv3.ProtocolConfiguration {
	return &extprocv3.ProtocolConfiguration{RequestBodyMode: req, ResponseBodyMode: resp, SendBodyWithoutWaitingForHeaderResponse: noWait}
}

// routedTo is the destination header of the first answer that carries one, or "".
func routedTo(out []*extprocv3.ProcessingResponse) string {
	for _, r := range out {
		var cr *extprocv3.CommonResponse
		switch x := r.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			cr = x.RequestHeaders.GetResponse()
		case *extprocv3.ProcessingResponse_RequestBody:
			cr = x.RequestBody.GetResponse()
		}
		for _, h := range cr.GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == DestinationHeader {
				return string(h.GetHeader().GetRawValue())
			}
		}
	}
	return ""
}
