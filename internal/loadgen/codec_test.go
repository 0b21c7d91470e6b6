package loadgen

import (
	"bytes"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

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
	if err := (leanCodec{}).Unmarshal(data, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestLeanCodecDecodesAnswers(t *testing.T) {
	routed := &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "content-length", RawValue: []byte("123")}},
				{Header: &corev3.HeaderValue{Key: DestinationHeader, RawValue: []byte("10.0.0.1:8000,10.0.0.2:8000")},
					AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
			}},
			ClearRouteCache: true,
		}}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"envoy.lb": structpb.NewStringValue("x")}},
	}
	for _, split := range []bool{false, true} {
		a := decodeVia(t, routed, split)
		if a.kind != fRequestHeaders || a.dest != "10.0.0.1:8000" || !a.clearRouteCache || a.streamed {
			t.Errorf("routing answer (split %v) decoded as %+v", split, a)
		}
	}

	// value instead of raw_value does not count: Envoy reads raw_value.
	valueOnly := proto.Clone(routed).(*extprocv3.ProcessingResponse)
	h := valueOnly.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()[1].GetHeader()
	h.Value, h.RawValue = string(h.RawValue), nil
	if a := decodeVia(t, valueOnly, false); a.dest != "" {
		t.Errorf("destination in value only decoded as %q", a.dest)
	}

	body := bytes.Repeat([]byte("x"), 62000)
	for _, c := range []struct {
		m    *extprocv3.ProcessingResponse
		kind string
		len  int
		eos  bool
	}{
		{streamedBody(true, body, false), "request_body", 62000, false},
		{streamedBody(true, nil, true), "request_body", 0, true},
		{streamedBody(false, body[:500], true), "response_body", 500, true},
	} {
		a := decodeVia(t, c.m, true)
		if a.kindName() != c.kind || !a.streamed || a.bodyLen != c.len || a.eos != c.eos {
			t.Errorf("%s: decoded as %+v", c.kind, a)
		}
	}
	// A body answer without a streamed mutation is not a re-emitted body.
	if a := decodeVia(t, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}}, false); a.streamed || a.kind != fRequestBody {
		t.Errorf("empty body answer decoded as %+v", a)
	}

	imm := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests}, Body: []byte(`{"error":{"message":"saturated"}}`), Details: "kvpick_x"}}}
	a := decodeVia(t, imm, false)
	if a.kind != fImmediate || a.status != 429 || !strings.Contains(a.detail, "saturated") {
		t.Errorf("immediate response decoded as %+v", a)
	}
	if e := unexpected("route", &a); e.Key() != "route: immediate response 429" {
		t.Errorf("error key %q", e.Key())
	}
	tr := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	if a := decodeVia(t, tr, false); a.kindName() != "request_trailers" || unexpected("body", &a).Key() != "body: unexpected request_trailers" {
		t.Errorf("trailers answer decoded as %+v", a)
	}

	if err := (leanCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x05, 0x01})}, &answer{}); err == nil {
		t.Error("truncated message: want an error")
	}
}

func TestLeanCodecMarshal(t *testing.T) {
	req := NewRequest([]byte(`{"model":"m"}`), 4, "id")
	for i, e := range req.enc {
		out, err := (leanCodec{}).Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var back extprocv3.ProcessingRequest
		if err := (leanCodec{}).Unmarshal(out, &back); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&back, req.msgs[i]) {
			t.Fatalf("message %d does not round-trip", i)
		}
	}
	// Other messages take the ordinary path.
	out, err := (leanCodec{}).Marshal(req.msgs[0])
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(req.msgs[0])
	if !bytes.Equal(out.Materialize(), want) {
		t.Fatal("proto fallback differs")
	}
	out.Free()
	if _, err := (leanCodec{}).Marshal(42); err == nil {
		t.Error("want an error for a non-message")
	}
}
