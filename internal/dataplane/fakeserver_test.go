package dataplane

import (
	"encoding/json"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kvpick/kvpick/pkg/gateway"
)

// recorder keeps every ProcessingRequest the fake server received, per stream.
type recorder struct {
	mu      sync.Mutex
	streams [][]*extprocv3.ProcessingRequest
}

func (r *recorder) open() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.streams = append(r.streams, nil)
	return len(r.streams) - 1
}

func (r *recorder) add(i int, req *extprocv3.ProcessingRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.streams[i] = append(r.streams[i], req)
}

func (r *recorder) stream(i int) []*extprocv3.ProcessingRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*extprocv3.ProcessingRequest(nil), r.streams[i]...)
}

// Faults a router can inject.
const (
	fChunkTooBig        = "chunk-too-big"
	fValueOnly          = "value-only"
	fBothValues         = "both-values"
	fBodyBeforeHeaders  = "body-before-headers"
	fEmptyBodyAnswer    = "empty-body-answer"
	fWrongCL            = "wrong-content-length"
	fNoCL               = "no-content-length"
	fMissingEOS         = "missing-eos"
	fEOSWithTrailers    = "eos-with-trailers"
	fWaitBodyBuffered   = "wait-body-buffered"
	fTransferEncoding   = "transfer-encoding"
	fMetaMismatch       = "meta-mismatch"
	fBodyAnswerToHdrs   = "body-answer-to-headers"
	fTwoAnswers         = "two-answers"
	fStreamedInBuffered = "streamed-in-buffered"
	fErrorStatus        = "error-status"
	fCloseOK            = "close-ok"
	fImmediate503       = "immediate-503"
	fStaleCL            = "stale-content-length"
	fAppendDestination  = "append-destination"
	fNoClose            = "no-close"
	fModeOverride       = "mode-override"
	fResponseImmediate  = "response-immediate"
	fDuplexBodyMutation = "duplex-body-mutation"
	fTrailersNoBody     = "trailers-before-body"
	fWaitEOSStreamed    = "wait-eos-streamed"
	fRespEmptyBody      = "response-empty-body-answer"
	fRespTwoAnswers     = "response-two-answers"
)

// router is a fake endpoint picker. It reads protocol_config and behaves correctly in every
// mode (like a real picker), unless fault says otherwise.
type router struct {
	extprocv3.UnimplementedExternalProcessorServer
	dest    string
	rechunk int
	fault   string
	rec     *recorder
	// gate, if set, is waited on before each message is read (a slow server).
	gate chan struct{}
}

func newRouter(fault string) *router {
	return &router{dest: "10.0.0.1:8000", rechunk: MaxDuplexChunk, fault: fault, rec: &recorder{}}
}

func hv(key, val string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte(val)}}
}

func lbMetadata(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		gateway.LBNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			gateway.DestinationHeader: structpb.NewStringValue(dest)}})}}
}

// routing is the picker's answer: destination header (+ content-length), clear_route_cache.
func (r *router) routing(bodyLen int, withCL bool) *extprocv3.CommonResponse {
	dst := hv(gateway.DestinationHeader, r.dest)
	switch r.fault {
	case fValueOnly:
		dst.Header = &corev3.HeaderValue{Key: gateway.DestinationHeader, Value: r.dest}
	case fBothValues:
		dst.Header.Value = r.dest
	case fAppendDestination:
		dst.Append = wrapperspb.Bool(true)
	}
	set := []*corev3.HeaderValueOption{dst}
	if withCL {
		switch r.fault {
		case fWrongCL:
			set = append(set, hv(contentLength, strconv.Itoa(bodyLen+1)))
		case fNoCL:
		default:
			set = append(set, hv(contentLength, strconv.Itoa(bodyLen)))
		}
	}
	if r.fault == fTransferEncoding {
		set = append(set, hv("transfer-encoding", "chunked"))
	}
	return &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}, ClearRouteCache: true}
}

func (r *router) metadata() *structpb.Struct {
	if r.fault == fMetaMismatch {
		return lbMetadata("10.9.9.9:8000")
	}
	return lbMetadata(r.dest)
}

func reqHeadersAnswer(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

func reqBodyAnswer(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: cr}}}
}

func streamedCR(b []byte, eos bool) *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
		StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b, EndOfStream: eos}}}}
}

func trailerMutation() *extprocv3.HeaderMutation {
	return &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{hv("x-trailer-seen", "yes")}}
}

type streamState struct {
	pc         *extprocv3.ProtocolConfiguration
	held       bool // request headers answer held
	body       []byte
	chunks     int
	respChunks int
}

func (r *router) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	idx := r.rec.open()
	st := &streamState{}
	first := true
	send := stream.Send
	for {
		if r.gate != nil {
			select {
			case <-r.gate:
			case <-stream.Context().Done():
				return stream.Context().Err()
			}
		}
		req, err := stream.Recv()
		if err == io.EOF {
			if r.fault == fNoClose {
				<-stream.Context().Done()
			}
			return nil
		}
		if err != nil {
			return err
		}
		r.rec.add(idx, req)
		if first {
			st.pc, first = req.GetProtocolConfig(), false
		}
		reqMode := st.pc.GetRequestBodyMode()
		respMode := st.pc.GetResponseBodyMode()
		switch v := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			switch r.fault {
			case fErrorStatus:
				return status.Error(codes.Internal, "picker failed")
			case fCloseOK:
				return nil
			case fImmediate503:
				return send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
					ImmediateResponse: &extprocv3.ImmediateResponse{
						Status:  &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable},
						Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{hv("retry-after", "1")}},
						Body:    []byte("no endpoint")}}})
			}
			if v.RequestHeaders.GetEndOfStream() {
				if err := send(&extprocv3.ProcessingResponse{Response: reqHeadersAnswer(r.routing(0, false)).Response,
					DynamicMetadata: r.metadata()}); err != nil {
					return err
				}
				if r.fault == fTwoAnswers {
					if err := send(reqHeadersAnswer(&extprocv3.CommonResponse{})); err != nil {
						return err
					}
				}
				continue
			}
			switch reqMode {
			case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
				st.held = true
			case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
				switch r.fault {
				case fWaitBodyBuffered:
					st.held = true
				case fBodyAnswerToHdrs:
					err = send(reqBodyAnswer(&extprocv3.CommonResponse{}))
				case fTwoAnswers:
					if err = send(reqHeadersAnswer(&extprocv3.CommonResponse{})); err == nil {
						err = send(reqHeadersAnswer(&extprocv3.CommonResponse{}))
					}
				default:
					err = send(reqHeadersAnswer(&extprocv3.CommonResponse{}))
				}
			case filterv3.ProcessingMode_STREAMED:
				if st.pc.GetSendBodyWithoutWaitingForHeaderResponse() {
					st.held = true
				} else {
					err = send(&extprocv3.ProcessingResponse{Response: reqHeadersAnswer(r.routing(0, false)).Response,
						DynamicMetadata: r.metadata()})
				}
			default: // NONE: route on headers
				err = send(&extprocv3.ProcessingResponse{Response: reqHeadersAnswer(r.routing(0, false)).Response,
					DynamicMetadata: r.metadata()})
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			b := v.RequestBody
			st.body = append(st.body, b.GetBody()...)
			st.chunks++
			switch reqMode {
			case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
				if b.GetEndOfStream() {
					err = r.duplexAnswer(send, st, false)
					if err == nil && r.fault == fMissingEOS {
						return nil
					}
				}
			case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
				if st.held {
					if err = send(reqHeadersAnswer(&extprocv3.CommonResponse{})); err != nil {
						return err
					}
				}
				cr := r.routing(len(st.body), false)
				switch r.fault {
				case fStreamedInBuffered:
					cr.BodyMutation = streamedCR(b.GetBody(), true).BodyMutation
				case fStaleCL:
					cr.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: append(append([]byte(nil), b.GetBody()...), '!')}}
				}
				err = send(&extprocv3.ProcessingResponse{Response: reqBodyAnswer(cr).Response, DynamicMetadata: r.metadata()})
			case filterv3.ProcessingMode_STREAMED:
				if !st.held {
					err = send(reqBodyAnswer(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
						SetHeaders: []*corev3.HeaderValueOption{hv("x-ignored", "1")}}}))
				} else if b.GetEndOfStream() || (r.fault != fWaitEOSStreamed && json.Valid(st.body)) {
					// Route as soon as the body is complete JSON: waiting for end_of_stream
					// deadlocks when trailers end the body.
					err = r.streamedRelease(send, st)
				}
			}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			switch {
			case reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
				err = r.duplexAnswer(send, st, true)
			case reqMode == filterv3.ProcessingMode_STREAMED && st.held:
				err = r.streamedRelease(send, st)
			}
			if err == nil {
				err = send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
					RequestTrailers: &extprocv3.TrailersResponse{HeaderMutation: trailerMutation()}}})
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			if r.fault == fResponseImmediate {
				return send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
					ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_InternalServerError}}}})
			}
			err = send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
					SetHeaders: []*corev3.HeaderValueOption{hv("x-picker", "on")}}}}}})
		case *extprocv3.ProcessingRequest_ResponseBody:
			b := v.ResponseBody
			st.respChunks++
			switch {
			case r.fault == fRespEmptyBody:
				err = send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
					ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}})
			case r.fault == fRespTwoAnswers:
				for i := 0; i < 2 && err == nil; i++ {
					err = send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
						ResponseBody: &extprocv3.BodyResponse{}}})
				}
			case respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
				for _, c := range rechunk(b.GetBody(), r.rechunk) {
					if err = send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
						ResponseBody: &extprocv3.BodyResponse{Response: streamedCR(c, false)}}}); err != nil {
						return err
					}
				}
				if b.GetEndOfStream() {
					err = send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
						ResponseBody: &extprocv3.BodyResponse{Response: streamedCR(nil, true)}}})
				}
			default:
				err = send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
					ResponseBody: &extprocv3.BodyResponse{}}})
			}
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			err = send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
				ResponseTrailers: &extprocv3.TrailersResponse{HeaderMutation: trailerMutation()}}})
		}
		if err != nil {
			return err
		}
	}
}

func rechunk(b []byte, n int) [][]byte {
	var out [][]byte
	for len(b) > n {
		out = append(out, b[:n])
		b = b[n:]
	}
	if len(b) > 0 {
		out = append(out, b)
	}
	return out
}

// duplexAnswer: the held headers answer (destination, content-length, metadata), then the whole
// body re-emitted in chunks of at most rechunk bytes.
func (r *router) duplexAnswer(send func(*extprocv3.ProcessingResponse) error, st *streamState, trailersEnd bool) error {
	headers := &extprocv3.ProcessingResponse{Response: reqHeadersAnswer(r.routing(len(st.body), true)).Response,
		DynamicMetadata: r.metadata()}
	if r.fault == fModeOverride {
		headers.ModeOverride = &filterv3.ProcessingMode{ResponseBodyMode: filterv3.ProcessingMode_BUFFERED}
	}
	size := r.rechunk
	if r.fault == fChunkTooBig {
		size = len(st.body) + 1
	}
	parts := rechunk(st.body, size)
	if len(parts) == 0 {
		parts = [][]byte{nil}
	}
	var bodies []*extprocv3.ProcessingResponse
	for i, p := range parts {
		eos := i == len(parts)-1 && !trailersEnd
		switch r.fault {
		case fMissingEOS:
			eos = false
		case fEOSWithTrailers:
			eos = i == len(parts)-1
		}
		cr := streamedCR(p, eos)
		if r.fault == fEmptyBodyAnswer && i == 0 {
			cr = &extprocv3.CommonResponse{}
		}
		if r.fault == fDuplexBodyMutation && i == 0 {
			cr = &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: p}}}
		}
		bodies = append(bodies, reqBodyAnswer(cr))
	}
	if r.fault == fTrailersNoBody {
		bodies = nil
	}
	order := append([]*extprocv3.ProcessingResponse{headers}, bodies...)
	if r.fault == fBodyBeforeHeaders {
		order = append(bodies, headers)
	}
	for _, m := range order {
		if err := send(m); err != nil {
			return err
		}
	}
	return nil
}

// streamedRelease (STREAMED with send_body_without_waiting_for_header_response): the held headers
// answer with the destination, then one answer per chunk, each with a header mutation the proxy
// must ignore.
func (r *router) streamedRelease(send func(*extprocv3.ProcessingResponse) error, st *streamState) error {
	if err := send(&extprocv3.ProcessingResponse{Response: reqHeadersAnswer(r.routing(0, false)).Response,
		DynamicMetadata: r.metadata()}); err != nil {
		return err
	}
	st.held = false
	for i := 0; i < st.chunks; i++ {
		if err := send(reqBodyAnswer(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
			SetHeaders: []*corev3.HeaderValueOption{hv("x-ignored", "1")}}})); err != nil {
			return err
		}
	}
	return nil
}

// funcServer runs a test's own handler.
type funcServer struct {
	extprocv3.UnimplementedExternalProcessorServer
	fn func(extprocv3.ExternalProcessor_ProcessServer) error
}

func (f *funcServer) Process(s extprocv3.ExternalProcessor_ProcessServer) error { return f.fn(s) }

// newEnv starts srv on a loopback listener and returns a Client over one ClientConn.
func newEnv(t testing.TB, srv extprocv3.ExternalProcessorServer, opts ...Option) *Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		gs.Stop()
	})
	// A server that answers is never failed for being slow on a loaded machine: the message
	// timeout is long unless a test that needs a timeout to see a stuck server sets one.
	return New(cc, append([]Option{WithMessageTimeout(time.Minute)}, opts...)...)
}
