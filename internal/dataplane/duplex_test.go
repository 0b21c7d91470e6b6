package dataplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvpick/kvpick/pkg/gateway"
)

const served = "10.0.0.1:8000"

var sseChunks = [][]byte{[]byte("data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"), []byte("data: [DONE]\n\n")}

// runDuplex plays one request and an SSE response on a Duplex, as a load generator does, and
// returns the routing answer and the first error.
func runDuplex(c *Client, req *HTTPRequest, chunks [][]byte) (Routing, error) {
	d, err := c.OpenDuplex(context.Background())
	if err != nil {
		return Routing{}, err
	}
	r, err := d.Route(Prepare(req, 16<<10))
	if err != nil || r.Immediate != nil {
		d.Cancel()
		return r, err
	}
	im, err := d.ResponseHeaders(PrepareResponseHeaders(200, []Header{{"content-type", "text/event-stream"}}, served, false))
	if err != nil {
		d.Cancel()
		return r, err
	}
	if im != nil {
		d.Cancel()
		return r, &ImmediateError{Immediate: im}
	}
	for i, ch := range chunks {
		if err := d.ResponseChunk(PrepareResponseChunk(ch, served, i == len(chunks)-1)); err != nil {
			d.Cancel()
			return r, err
		}
	}
	if sent, back, ended := d.ResponseBody(); sent != back || !ended {
		return r, fmt.Errorf("response: sent %d, re-emitted %d, end %v", sent, back, ended)
	}
	return r, d.Close()
}

// outcome classifies an error the way a test of a server cares about: the rule broken, the
// gRPC status, the immediate response, or the server leaving.
func outcome(err error) string {
	var pe *ProtocolError
	var se *StreamError
	var ie *ImmediateError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &pe):
		return "rule " + string(pe.Rule)
	case errors.As(err, &se):
		return fmt.Sprintf("status %s (%d)", se.Status.Code(), se.HTTPStatus)
	case errors.As(err, &ie):
		return fmt.Sprintf("immediate %d", ie.Immediate.Status)
	case errors.Is(err, ErrServerGone):
		return "server gone"
	}
	return "other: " + err.Error()
}

// TestDuplexAgreesWithExchange runs the same faulty servers through an Exchange and through a
// Duplex: on every fault the fast path claims to see, both must reach the same verdict.
func TestDuplexAgreesWithExchange(t *testing.T) {
	big := bytes.Repeat([]byte("b"), 100_000)
	for _, tc := range []struct {
		fault string
		body  []byte
		want  string
	}{
		{"", chatBody, "ok"},
		{"", big, "ok"},
		{fChunkTooBig, big, "rule " + string(RuleDuplexChunkSize)},
		{fValueOnly, chatBody, "rule " + string(RuleHeaderValueOnly)},
		{fBothValues, chatBody, "rule " + string(RuleHeaderBothValues)},
		{fBodyBeforeHeaders, chatBody, "rule " + string(RuleOrder)},
		{fEmptyBodyAnswer, chatBody, "rule " + string(RuleDuplexEmptyBodyAnswer)},
		{fDuplexBodyMutation, chatBody, "rule " + string(RuleDuplexStreamed)},
		{fWrongCL, chatBody, "rule " + string(RuleContentLength)},
		{fNoCL, chatBody, "rule " + string(RuleContentLength)},
		{fMissingEOS, chatBody, "rule " + string(RuleDuplexEndOfStream)},
		{fErrorStatus, chatBody, "status Internal (500)"},
		{fImmediate503, chatBody, "immediate 503"},
		{fResponseImmediate, chatBody, "immediate 500"},
		{fRespEmptyBody, chatBody, "rule " + string(RuleDuplexEmptyBodyAnswer)},
		{fCloseOK, chatBody, "server gone"},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.fault, len(tc.body)), func(t *testing.T) {
			c := newEnv(t, newRouter(tc.fault))
			x, err := c.Open(context.Background(), FullDuplex())
			if err != nil {
				t.Fatal(err)
			}
			exchange := ""
			routed, err := x.Request(postReq(tc.body))
			switch {
			case err != nil:
				x.Cancel()
			case routed.Immediate != nil:
				err = &ImmediateError{Immediate: routed.Immediate}
				x.Cancel()
			case routed.ServerGone:
				exchange = "server gone"
				x.Cancel()
			default:
				var fwd *Forwarded
				fwd, err = x.Response(&HTTPResponse{Status: 200, Headers: []Header{{"content-type", "text/event-stream"}},
					ServedEndpoint: served, Chunks: sseChunks})
				if err == nil && fwd.Immediate != nil {
					err = &ImmediateError{Immediate: fwd.Immediate}
				}
				if err == nil {
					err = x.Close()
				} else {
					x.Cancel()
				}
			}
			if exchange == "" {
				exchange = outcome(err)
			}
			r, derr := runDuplex(c, postReq(tc.body), sseChunks)
			duplex := outcome(derr)
			if r.Immediate != nil {
				duplex = fmt.Sprintf("immediate %d", r.Immediate.Status)
			}
			if exchange != tc.want || duplex != tc.want {
				t.Fatalf("Exchange: %s (%v); Duplex: %s (%v); want %s", exchange, err, duplex, derr, tc.want)
			}
			if tc.want == "ok" && (r.Destination != routed.Destination || !r.ClearRouteCache || r.Body != len(tc.body)) {
				t.Errorf("Duplex routing %+v; the Exchange's destination %q", r, routed.Destination)
			}
		})
	}
}

// TestPreparedMessagesAreTheExchanges checks that the fast path sends, byte for byte, the
// messages an Exchange sends for the same request and response.
func TestPreparedMessagesAreTheExchanges(t *testing.T) {
	for _, req := range []*HTTPRequest{
		postReq(chatBody),
		postReq(bytes.Repeat([]byte("x"), 40_000)), // three chunks
		{Method: "GET", Path: "/v1/models", Authority: "gw"},
		func() *HTTPRequest {
			r := postReq(chatBody)
			r.SubsetHint, r.Scheme, r.HeaderValueField = []string{"10.0.0.1:8000", "10.0.0.2:8000"}, "https", true
			return r
		}(),
	} {
		r := newRouter("")
		c := newEnv(t, r)
		if _, _, err := c.Do(context.Background(), FullDuplex(), req, &HTTPResponse{Status: 200,
			Headers: []Header{{"content-type", "text/event-stream"}}, ServedEndpoint: served, Chunks: sseChunks}); err != nil {
			t.Fatal(err)
		}
		if _, err := runDuplex(c, req, sseChunks); err != nil {
			t.Fatal(err)
		}
		want, got := r.rec.stream(0), r.rec.stream(1)
		if req.HeaderValueField {
			// An Exchange writes the response's headers in value too; Prepare's response
			// messages always use raw_value. Compare the request side.
			want, got = want[:len(want)-1-len(sseChunks)], got[:len(got)-1-len(sseChunks)]
		}
		if req.SubsetHint != nil {
			// An Exchange forwards the request's metadata on the response side too; Prepare's
			// response messages carry the served endpoint only.
			for _, m := range want {
				if m.GetResponseHeaders() != nil || m.GetResponseBody() != nil {
					delete(m.GetMetadataContext().GetFilterMetadata(), gateway.SubsetNamespace)
				}
			}
		}
		if len(want) != len(got) {
			t.Fatalf("%s %s: the Exchange sent %s, the Duplex %s", req.Method, req.Path, kinds(want), kinds(got))
		}
		for i := range want {
			if !proto.Equal(want[i], got[i]) {
				t.Errorf("%s %s: message %d differs:\nExchange %v\nDuplex   %v", req.Method, req.Path, i, want[i], got[i])
			}
		}
	}
}

// bodyOf decodes a Prepared's body messages, checking end_of_stream is on the last only.
func bodyOf(t *testing.T, p *Prepared) []byte {
	t.Helper()
	var body []byte
	for i, e := range p.enc[1:] {
		var m extprocv3.ProcessingRequest
		if err := proto.Unmarshal(e.b, &m); err != nil {
			t.Fatal(err)
		}
		body = append(body, m.GetRequestBody().GetBody()...)
		if !proto.Equal(&m, p.msgs[1+i]) {
			t.Fatalf("chunk %d: the encoding is not the message", i)
		}
		if m.GetRequestBody().GetEndOfStream() != (i == len(p.enc)-2) {
			t.Fatalf("end_of_stream on chunk %d of %d", i, len(p.enc)-1)
		}
		if e.BodyLen() != len(m.GetRequestBody().GetBody()) {
			t.Fatalf("chunk %d: BodyLen %d, body %d bytes", i, e.BodyLen(), len(m.GetRequestBody().GetBody()))
		}
	}
	if !bytes.Equal(body, p.Body()) {
		t.Fatal("Body differs from the encoded body")
	}
	return body
}

func contentLengthOf(t *testing.T, p *Prepared) string {
	t.Helper()
	var m extprocv3.ProcessingRequest
	if err := proto.Unmarshal(p.enc[0].b, &m); err != nil {
		t.Fatal(err)
	}
	v, _ := Lookup(fromHeaderMap(m.GetRequestHeaders().GetHeaders()), contentLength)
	return v
}

func fromHeaderMap(hm *corev3.HeaderMap) []Header {
	var out []Header
	for _, h := range hm.GetHeaders() {
		out = append(out, Header{h.GetKey(), string(h.GetRawValue())})
	}
	return out
}

func TestPreparedSetBody(t *testing.T) {
	p := Prepare(postReq(make([]byte, 40000)), 16384)
	if len(p.enc) != 4 || p.BodyLen() != 40000 || contentLengthOf(t, p) != "40000" {
		t.Fatalf("%d messages, %d bytes, content-length %s", len(p.enc), p.BodyLen(), contentLengthOf(t, p))
	}
	small := []byte(`{"model":"m"}`)
	p.SetBody(small)
	if len(p.enc) != 2 || !bytes.Equal(bodyOf(t, p), small) || contentLengthOf(t, p) != "13" {
		t.Fatalf("after SetBody: %d messages, content-length %s", len(p.enc), contentLengthOf(t, p))
	}
	p.SetBody([]byte{})
	if len(p.enc) != 2 || len(bodyOf(t, p)) != 0 {
		t.Fatal("an empty body is one empty end-of-stream chunk")
	}
}

func TestPreparedStamp(t *testing.T) {
	body := []byte(strings.Repeat("abcdefghij", 100))
	for _, chunk := range []int{1000, 95, 100, 7} {
		p := Prepare(postReq(body), chunk)
		var into Prepared
		for _, at := range []int{0, 90, 95, 984} {
			stamp := []byte("0123456789abcdef")
			s := p.Stamp(&into, at, stamp)
			want := append([]byte(nil), body...)
			copy(want[at:], stamp)
			if got := bodyOf(t, s); !bytes.Equal(got, want) {
				t.Fatalf("chunk %d at %d: stamped body differs", chunk, at)
			}
			if s.BodyLen() != len(body) || len(s.enc) != len(p.enc) {
				t.Fatalf("stamped: %d bytes, %d messages", s.BodyLen(), len(s.enc))
			}
		}
		if !bytes.Equal(bodyOf(t, p), body) {
			t.Fatal("Stamp changed the original")
		}
		// Past the end: the request as it is.
		if s := p.Stamp(&into, len(body)-3, []byte("12345")); !bytes.Equal(bodyOf(t, s), body) {
			t.Fatal("a stamp past the end changed the body")
		}
	}
}

func decodeVia(t *testing.T, m *extprocv3.ProcessingResponse, split bool) answer {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	data := mem.BufferSlice{mem.SliceBuffer(b)}
	if split && len(b) > 3 {
		data = mem.BufferSlice{mem.SliceBuffer(b[:3]), mem.SliceBuffer(b[3:])}
	}
	var a answer
	if err := (fastCodec{}).Unmarshal(data, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestFastCodecDecodesAnswers(t *testing.T) {
	routed := &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: contentLength, RawValue: []byte("123")}},
				{Header: &corev3.HeaderValue{Key: gateway.DestinationHeader, RawValue: []byte("10.0.0.1:8000,10.0.0.2:8000")},
					AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
			}},
			ClearRouteCache: true,
		}}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"envoy.lb": structpb.NewStringValue("x")}},
	}
	for _, split := range []bool{false, true} {
		a := decodeVia(t, routed, split)
		if a.kind != fRequestHeaders || a.dest != "10.0.0.1:8000,10.0.0.2:8000" || a.destCount != 1 || a.destInValue ||
			a.contentLength != "123" || !a.clearRouteCache || !a.headerMutation || a.bodyMutation {
			t.Errorf("routing answer (split %v) decoded as %+v", split, a)
		}
	}
	body := bytes.Repeat([]byte("x"), 62000)
	streamed := func(request bool, b []byte, eos bool) *extprocv3.ProcessingResponse {
		br := &extprocv3.BodyResponse{Response: streamedCR(b, eos)}
		if request {
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
		}
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
	}
	for _, c := range []struct {
		m    *extprocv3.ProcessingResponse
		kind string
		len  int
		eos  bool
	}{
		{streamed(true, body, false), "request_body", 62000, false},
		{streamed(true, nil, true), "request_body", 0, true},
		{streamed(false, body[:500], true), "response_body", 500, true},
	} {
		a := decodeVia(t, c.m, true)
		if a.kindName() != c.kind || !a.streamed || a.bodyLen != c.len || a.eos != c.eos || a.checkStreamed("x") != nil {
			t.Errorf("%s: decoded as %+v", c.kind, a)
		}
	}
	imm := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests}, Body: []byte(`{"error":{"message":"saturated"}}`)}}}
	if a := decodeVia(t, imm, false); a.kind != fImmediate || a.immediate().Status != 429 || !strings.Contains(string(a.immediate().Body), "saturated") {
		t.Errorf("immediate response decoded as %+v", a)
	}
	tr := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	if a := decodeVia(t, tr, false); a.kindName() != "request_trailers" {
		t.Errorf("trailers answer decoded as %+v", a)
	}
	if err := (fastCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x05, 0x01})}, &answer{}); err == nil {
		t.Error("truncated message: want an error")
	}
}

func TestFastCodecMarshal(t *testing.T) {
	p := Prepare(postReq(chatBody), 4)
	for i, e := range p.enc {
		out, err := (fastCodec{}).Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var back extprocv3.ProcessingRequest
		if err := (fastCodec{}).Unmarshal(out, &back); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&back, p.msgs[i]) {
			t.Fatalf("message %d does not round-trip", i)
		}
	}
	// Other messages take the ordinary path.
	out, err := (fastCodec{}).Marshal(p.msgs[0])
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(p.msgs[0])
	if !bytes.Equal(out.Materialize(), want) {
		t.Fatal("proto fallback differs")
	}
	out.Free()
	if _, err := (fastCodec{}).Marshal(42); err == nil {
		t.Error("want an error for a non-message")
	}
}

func TestDirtyPool(t *testing.T) {
	var p dirtyPool
	for _, size := range []int{0, 1, 256, 257, 4096, 62000, 65536, 65537, 1 << 20, 1<<20 + 1} {
		b := p.Get(size)
		if len(*b) != size {
			t.Fatalf("Get(%d): len %d", size, len(*b))
		}
		if size > 0 && size <= 1<<20 && (cap(*b) < size || cap(*b) > max(2*size, 256)) {
			t.Fatalf("Get(%d): cap %d", size, cap(*b))
		}
		p.Put(b)
		again := p.Get(size)
		if len(*again) != size || cap(*again) < size {
			t.Fatalf("Get(%d) after Put: len %d cap %d", size, len(*again), cap(*again))
		}
	}
	// A buffer whose capacity is not a tier size goes to the tier it fills.
	odd := make([]byte, 10, 5000)
	p.Put(&odd)
	if b := p.Get(4096); cap(*b) < 4096 {
		t.Fatalf("cap %d", cap(*b))
	}
}
