package extproc

import (
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvpick/kvpick/pkg/gateway"
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/pool"
)

// Names from the endpoint-picker protocol (defined once, in pkg/gateway).
const (
	DestinationHeader   = gateway.DestinationHeader
	LBNamespace         = gateway.LBNamespace
	ServedKey           = gateway.ServedKey
	SubsetNamespace     = gateway.SubsetNamespace
	SubsetKey           = gateway.SubsetKey
	RequestIDHeader     = gateway.RequestIDHeader
	contentLengthHeader = "content-length"
)

// headerValue reads a header value from raw_value, or from value for clients that use it.
func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// setHeader replaces a header. Only raw_value is set: Envoy reads raw_value and would set a
// header given in value alone to "", and rejects a HeaderValue with both.
func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// routeMetadata is the dynamic metadata that mirrors the destination header for the proxy's
// load balancer: {"envoy.lb": {"x-gateway-destination-endpoint": dest}}.
func routeMetadata(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		LBNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			DestinationHeader: structpb.NewStringValue(dest),
		}}),
	}}
}

// subsetHint reads the proxy's subset hint: a list of "ip:port" strings, or one comma-separated
// string. ok is false when there is no hint at all; a hint that is present but empty is
// (nil, true): nothing is eligible.
func subsetHint(md *corev3.Metadata) (addrs []string, ok bool) {
	ns := md.GetFilterMetadata()[SubsetNamespace]
	if ns == nil {
		return nil, false
	}
	v, present := ns.GetFields()[SubsetKey]
	if !present {
		return nil, false
	}
	add := func(s string) {
		for _, part := range strings.Split(s, ",") {
			if a, err := pool.CanonicalAddr(strings.TrimSpace(part)); err == nil {
				addrs = append(addrs, a)
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		add(k.StringValue)
	case *structpb.Value_ListValue:
		for _, item := range k.ListValue.GetValues() {
			add(item.GetStringValue())
		}
	}
	return addrs, true
}

// servedEndpoint reads the endpoint the proxy reports as having served the request.
func servedEndpoint(md *corev3.Metadata) string {
	v := md.GetFilterMetadata()[LBNamespace].GetFields()[ServedKey].GetStringValue()
	if v == "" {
		return ""
	}
	// Some data planes report the list they were given; the first entry is the one used.
	v, _, _ = strings.Cut(v, ",")
	if a, err := pool.CanonicalAddr(strings.TrimSpace(v)); err == nil {
		return a
	}
	return v
}

// immediate builds an ImmediateResponse that ends the request with an OpenAI-style JSON error.
func immediate(status int, typ, code, param, msg, requestID string) *extprocv3.ProcessingResponse {
	body := openai.ErrorJSON(typ, code, param, msg)
	hdrs := []*corev3.HeaderValueOption{
		setHeader("content-type", "application/json"),
		setHeader(contentLengthHeader, strconv.Itoa(len(body))),
	}
	if requestID != "" {
		hdrs = append(hdrs, setHeader(RequestIDHeader, requestID))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: hdrs},
			Body:    body,
			Details: "kvpick_" + code,
		},
	}}
}

func headersResponse(common *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: common},
	}}
}

func responseHeadersResponse(common *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: common},
	}}
}

func requestBodyResponse(common *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: common},
	}}
}

func responseBodyResponse(common *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{Response: common},
	}}
}

// streamed wraps a chunk as the streamed body mutation that FULL_DUPLEX_STREAMED requires.
func streamed(chunk []byte, eos bool) *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: eos},
		},
	}}
}

func requestTrailersResponse() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{},
	}}
}

func responseTrailersResponse() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
		ResponseTrailers: &extprocv3.TrailersResponse{},
	}}
}
