package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// Names from the endpoint-picker protocol.
const (
	DestinationHeader = "x-gateway-destination-endpoint"
	servedKey         = "x-gateway-destination-endpoint-served"
	lbNamespace       = "envoy.lb"
)

// fullDuplex is the processing mode an inference gateway configures, as sent on the first
// message of a stream.
var fullDuplex = &extprocv3.ProtocolConfiguration{
	RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
}

func header(k, v string) *corev3.HeaderValue {
	return &corev3.HeaderValue{Key: k, RawValue: []byte(v)}
}

// Request is one HTTP request's worth of pre-built ext_proc messages: request headers (with
// protocol_config) and the body in chunks, end_of_stream on the last. Its messages are only
// read while sending, so one Request may be sent on many streams at once.
type Request struct {
	msgs       []*extprocv3.ProcessingRequest
	enc        []*encoded // msgs, encoded: what is sent
	BodyLen    int
	chunkBytes int
	// For stamped copies (see Stamp): the copied chunks and their encodings.
	own    [][]byte
	ownEnc []encoded
}

// NewRequest builds the messages for a POST /v1/chat/completions with body, cut into chunks of
// chunkBytes. The messages point into body: keep it unchanged while the Request is in use.
func NewRequest(body []byte, chunkBytes int, requestID string) *Request {
	r := &Request{BodyLen: len(body)}
	r.msgs = append(r.msgs, &extprocv3.ProcessingRequest{
		ProtocolConfig: fullDuplex,
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				header(":method", "POST"),
				header(":path", "/v1/chat/completions"),
				header(":authority", "gateway.example"),
				header(":scheme", "https"),
				header("content-type", "application/json"),
				header("content-length", strconv.Itoa(len(body))),
				header("x-request-id", requestID),
			}},
		}},
	})
	r.setBody(body, chunkBytes)
	return r
}

// setBody replaces the body messages (reusing them where possible) and the content-length.
func (r *Request) setBody(body []byte, chunkBytes int) {
	chunkBytes = max(chunkBytes, 1)
	r.BodyLen, r.chunkBytes = len(body), chunkBytes
	hs := r.msgs[0].GetRequestHeaders().GetHeaders().GetHeaders()
	for _, h := range hs {
		if h.Key == "content-length" {
			h.RawValue = strconv.AppendInt(h.RawValue[:0], int64(len(body)), 10)
		}
	}
	n := 1
	for off := 0; ; off += chunkBytes {
		end := min(off+chunkBytes, len(body))
		var m *extprocv3.ProcessingRequest
		if n < len(r.msgs) {
			m = r.msgs[n]
		} else {
			m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{}}}
			r.msgs = append(r.msgs, m)
		}
		b := m.GetRequestBody()
		b.Body, b.EndOfStream = body[off:end], end == len(body)
		n++
		if end == len(body) {
			break
		}
	}
	r.msgs = r.msgs[:n]
	// Encode once; a reused Request re-encodes into the buffers it already has.
	for i, m := range r.msgs {
		if i >= len(r.enc) {
			r.enc = append(r.enc, &encoded{})
		}
		b, err := proto.MarshalOptions{}.MarshalAppend(r.enc[i].b[:0], m)
		if err != nil {
			panic(fmt.Sprintf("loadgen: encoding the request: %v", err)) // built here from valid fields
		}
		r.enc[i].b = b
	}
	r.enc = r.enc[:n]
}

// Stamp makes into a copy of r whose body has nonce, in hex, at offset at (NonceLen bytes, as
// ChatPool.NonceAt gives), and returns it. Only the chunks holding those bytes are copied and
// re-encoded; the others are shared with r. into is reused from one call to the next: stamp a
// new copy only once the previous one is no longer being sent.
func (r *Request) Stamp(into *Request, at int, nonce uint64) *Request {
	into.msgs, into.BodyLen, into.chunkBytes = r.msgs, r.BodyLen, r.chunkBytes
	into.enc = append(into.enc[:0], r.enc...)
	if at < 0 || at+NonceLen > r.BodyLen {
		return into
	}
	var hex [NonceLen]byte
	const digits = "0123456789abcdef"
	for i := range hex {
		hex[i] = digits[(nonce>>(4*(NonceLen-1-i)))&15]
	}
	first, last := at/r.chunkBytes, (at+NonceLen-1)/r.chunkBytes
	for len(into.own) < last-first+1 {
		into.own = append(into.own, nil)
		into.ownEnc = append(into.ownEnc, encoded{})
	}
	for k := first; k <= last; k++ {
		src := r.msgs[1+k].GetRequestBody()
		buf := append(into.own[k-first][:0], src.GetBody()...)
		for i := range hex {
			if off := at + i - k*r.chunkBytes; off >= 0 && off < len(buf) {
				buf[off] = hex[i]
			}
		}
		into.own[k-first] = buf
		m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: buf, EndOfStream: src.GetEndOfStream()}}}
		e := &into.ownEnc[k-first]
		b, err := proto.MarshalOptions{}.MarshalAppend(e.b[:0], m)
		if err != nil {
			panic(fmt.Sprintf("loadgen: encoding the request: %v", err))
		}
		e.b = b
		into.enc[1+k] = e
	}
	return into
}

// SetBody points a Request at a new body, for generators that reuse one Request per worker.
// Only call it when no stream is sending the Request.
func (r *Request) SetBody(body []byte, chunkBytes int) { r.setBody(body, chunkBytes) }

// Client is a lean ext_proc client over a few gRPC connections.
type Client struct {
	conns []*grpc.ClientConn
	stubs []extprocv3.ExternalProcessorClient
	next  atomic.Uint32

	// Pre-built response-path messages: response headers per known endpoint (carrying the
	// served endpoint, as the proxy reports it), and the one response chunk.
	respHeaders map[string]*encoded
	respGeneric *encoded
	respBody    *encoded
	respBodyLen int
	strict      bool // the destination must be one of the known endpoints
}

// responseChunk is a small SSE response, the way a streamed chat completion ends.
var responseChunk = func() []byte {
	var sb strings.Builder
	for i := range 8 {
		fmt.Fprintf(&sb, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"token%d \"}}]}\n\n", Model, i)
	}
	sb.WriteString("data: [DONE]\n\n")
	return []byte(sb.String())
}()

// bufferPool is the client's gRPC buffer pool (see dirtyPool).
var bufferPool = &dirtyPool{}

// Dial opens conns connections to addr (plaintext). endpoints, when given, are the picker's
// pool: a destination outside it is an error.
func Dial(addr string, conns int, endpoints []string) (*Client, error) {
	c := &Client{respHeaders: map[string]*encoded{}, strict: len(endpoints) > 0}
	for range max(conns, 1) {
		cc, err := grpc.NewClient(addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			// Envoy's HTTP/2 windows are large (256 MiB); grpc-go's 64 KiB default would make
			// a 64 KB body wait for window updates, which Envoy does not.
			grpc.WithInitialWindowSize(4<<20),
			grpc.WithInitialConnWindowSize(64<<20),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20),
				grpc.ForceCodecV2(leanCodec{})),
			experimental.WithBufferPool(bufferPool),
		)
		if err != nil {
			c.Close()
			return nil, err
		}
		cc.Connect()
		c.conns = append(c.conns, cc)
		c.stubs = append(c.stubs, extprocv3.NewExternalProcessorClient(cc))
	}
	respHeaders := func(served string) *encoded {
		m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				header(":status", "200"),
				header("content-type", "text/event-stream"),
			}},
		}}}
		if served != "" {
			m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
				lbNamespace: {Fields: map[string]*structpb.Value{servedKey: structpb.NewStringValue(served)}},
			}}
		}
		return encode(m)
	}
	for _, e := range endpoints {
		c.respHeaders[e] = respHeaders(e)
	}
	c.respGeneric = respHeaders("")
	c.respBody = encode(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: responseChunk, EndOfStream: true},
	}})
	c.respBodyLen = len(responseChunk)
	return c, nil
}

// Close closes every connection.
func (c *Client) Close() {
	for _, cc := range c.conns {
		cc.Close()
	}
}

// Conns is the number of connections.
func (c *Client) Conns() int { return len(c.conns) }

// Stub returns the stub of connection i (modulo the number of connections).
func (c *Client) Stub(i int) extprocv3.ExternalProcessorClient { return c.stubs[i%len(c.stubs)] }

// NextStub returns the connections' stubs in turn.
func (c *Client) NextStub() extprocv3.ExternalProcessorClient {
	return c.stubs[int(c.next.Add(1))%len(c.stubs)]
}

// Error is an exchange that went wrong: Phase says where, Kind is a short stable reason for
// grouping (no request-specific detail), Detail the rest.
type Error struct {
	Phase  string // open, request, route, body, response-headers, response-body, close
	Kind   string
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return e.Phase + ": " + e.Kind
	}
	return e.Phase + ": " + e.Kind + ": " + e.Detail
}

// Key is the phase and kind, for counting errors by cause.
func (e *Error) Key() string { return e.Phase + ": " + e.Kind }

// ErrorKey returns err's grouping key.
func ErrorKey(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Key()
	}
	return "other: " + err.Error()
}

func streamErr(phase string, err error) *Error {
	if err == io.EOF {
		return &Error{Phase: phase, Kind: "stream ended early with OK"}
	}
	if s, ok := status.FromError(err); ok {
		return &Error{Phase: phase, Kind: "grpc " + s.Code().String(), Detail: s.Message()}
	}
	return &Error{Phase: phase, Kind: "stream error", Detail: err.Error()}
}

func unexpected(phase string, a *answer) *Error {
	if a.kind == fImmediate {
		return &Error{Phase: phase, Kind: fmt.Sprintf("immediate response %d", a.status), Detail: a.detail}
	}
	return &Error{Phase: phase, Kind: "unexpected " + a.kindName()}
}

// Held is a stream whose request has been routed and whose body came back, waiting for the
// response (as an LLM request is while the model generates).
type Held struct {
	c      *Client
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	// Dest is the routing answer's destination (its first entry when it is a list).
	Dest string
	// Added is the picker's added latency: from sending the request headers to receiving the
	// routing answer and the whole body back.
	Added time.Duration
	a     answer
}

// Open starts a stream on stub, sends req and reads the routing answer and the re-emitted
// body. On error the stream is already cancelled.
func (c *Client) Open(ctx context.Context, stub extprocv3.ExternalProcessorClient, req *Request) (*Held, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := stub.Process(ctx)
	if err != nil {
		cancel()
		return nil, streamErr("open", err)
	}
	h := &Held{c: c, stream: st, cancel: cancel}
	if err := h.route(req); err != nil {
		cancel()
		return nil, err
	}
	return h, nil
}

func (h *Held) route(req *Request) error {
	st := h.stream
	start := time.Now()
	for _, m := range req.enc {
		if err := st.SendMsg(m); err != nil {
			return streamErr("request", sendErr(st, err))
		}
	}
	a := &h.a
	if err := st.RecvMsg(a); err != nil {
		return streamErr("route", err)
	}
	if a.kind != fRequestHeaders {
		return unexpected("route", a)
	}
	h.Dest = a.dest
	switch {
	case h.Dest == "":
		return &Error{Phase: "route", Kind: "no destination header (raw_value)"}
	case !a.clearRouteCache:
		return &Error{Phase: "route", Kind: "clear_route_cache not set"}
	case h.c.strict && h.c.respHeaders[h.Dest] == nil:
		return &Error{Phase: "route", Kind: "destination outside the pool", Detail: h.Dest}
	}
	got := 0
	for {
		if err := st.RecvMsg(a); err != nil {
			return streamErr("body", err)
		}
		if a.kind != fRequestBody || !a.streamed {
			return unexpected("body", a)
		}
		got += a.bodyLen
		if a.eos || got > req.BodyLen {
			break
		}
	}
	if got != req.BodyLen {
		return &Error{Phase: "body", Kind: "re-emitted body length differs", Detail: fmt.Sprintf("got %d bytes, sent %d", got, req.BodyLen)}
	}
	h.Added = time.Since(start)
	return nil
}

// Finish plays the response: headers (:status 200, the served endpoint in envoy.lb metadata),
// one body chunk (which must come back whole), then the half-close, which the picker must
// answer by ending the stream with OK.
func (h *Held) Finish() error {
	defer h.cancel()
	st := h.stream
	rh := h.c.respHeaders[h.Dest]
	if rh == nil {
		rh = h.c.respGeneric
	}
	a := &h.a
	if err := st.SendMsg(rh); err != nil {
		return streamErr("response-headers", sendErr(st, err))
	}
	if err := st.RecvMsg(a); err != nil {
		return streamErr("response-headers", err)
	}
	if a.kind != fResponseHeaders {
		return unexpected("response-headers", a)
	}
	if err := st.SendMsg(h.c.respBody); err != nil {
		return streamErr("response-body", sendErr(st, err))
	}
	if err := st.RecvMsg(a); err != nil {
		return streamErr("response-body", err)
	}
	if a.kind != fResponseBody || !a.streamed {
		return unexpected("response-body", a)
	}
	if a.bodyLen != h.c.respBodyLen || !a.eos {
		return &Error{Phase: "response-body", Kind: "response chunk not echoed whole",
			Detail: fmt.Sprintf("got %d bytes eos=%v, sent %d", a.bodyLen, a.eos, h.c.respBodyLen)}
	}
	if err := st.CloseSend(); err != nil {
		return streamErr("close", err)
	}
	err := st.RecvMsg(a)
	if err == io.EOF {
		return nil
	}
	if err != nil {
		return streamErr("close", err)
	}
	return unexpected("close", a)
}

// sendErr turns Send's io.EOF (the server ended the stream) into the stream's status.
func sendErr(st extprocv3.ExternalProcessor_ProcessClient, err error) error {
	if err != io.EOF {
		return err
	}
	var a answer
	if rerr := st.RecvMsg(&a); rerr != nil {
		return rerr
	}
	return err
}

// Abort cancels the stream (as the proxy does when the client goes away).
func (h *Held) Abort() { h.cancel() }

// Exchange runs one whole request: Open then Finish. It returns the added latency and the
// destination.
func (c *Client) Exchange(ctx context.Context, stub extprocv3.ExternalProcessorClient, req *Request) (time.Duration, string, error) {
	h, err := c.Open(ctx, stub, req)
	if err != nil {
		return 0, "", err
	}
	return h.Added, h.Dest, h.Finish()
}
