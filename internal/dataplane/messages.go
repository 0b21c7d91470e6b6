package dataplane

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvpick/kvpick/pkg/gateway"
)

// The messages the proxy sends, built in one place for an Exchange and for Prepare.

// requestHeaders is what the proxy sends as request headers: the pseudo headers first, then the
// client's headers.
func requestHeaders(req *HTTPRequest) []Header {
	scheme := req.Scheme
	if scheme == "" {
		scheme = "http"
	}
	hs := make([]Header, 0, len(req.Headers)+4)
	hs = append(hs, Header{":method", req.Method}, Header{":path", req.Path},
		Header{":authority", req.Authority}, Header{":scheme", scheme})
	return append(hs, req.Headers...)
}

// headersMessage is a request_headers (request) or response_headers message.
func headersMessage(request bool, hs []Header, useValue, eos bool, md *corev3.Metadata) *extprocv3.ProcessingRequest {
	hh := &extprocv3.HttpHeaders{Headers: toHeaderMap(hs, useValue), EndOfStream: eos}
	if request {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: hh}, MetadataContext: md}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: hh}, MetadataContext: md}
}

// bodyMessage is a request_body (request) or response_body message.
func bodyMessage(request bool, data []byte, eos bool, md *corev3.Metadata) *extprocv3.ProcessingRequest {
	body := &extprocv3.HttpBody{Body: data, EndOfStream: eos}
	if request {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: body}, MetadataContext: md}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: body}, MetadataContext: md}
}

// servedMetadata is the response side's metadata: the request's, plus the endpoint that served
// the request in envoy.lb (docs/protocol.md:68-69).
func servedMetadata(reqMeta *corev3.Metadata, served string) *corev3.Metadata {
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	for k, v := range reqMeta.GetFilterMetadata() {
		md.FilterMetadata[k] = v
	}
	md.FilterMetadata[gateway.LBNamespace] = &structpb.Struct{Fields: map[string]*structpb.Value{
		gateway.ServedKey: structpb.NewStringValue(served)}}
	return md
}
