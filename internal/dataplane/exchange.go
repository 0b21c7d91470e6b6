package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvpick/kvpick/pkg/gateway"
)

// DestinationHeader and LBNamespace are pkg/gateway's, under the names some tests still use.
const (
	DestinationHeader = gateway.DestinationHeader
	LBNamespace       = gateway.LBNamespace
)

const (
	// MaxDuplexChunk is the largest streamed chunk a FULL_DUPLEX_STREAMED answer may carry
	// (docs/protocol.md:32).
	MaxDuplexChunk        = 62000
	contentLength         = "content-length"
	duplex                = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	streamed              = filterv3.ProcessingMode_STREAMED
	buffered              = filterv3.ProcessingMode_BUFFERED
	bufferedPartial       = filterv3.ProcessingMode_BUFFERED_PARTIAL
	none                  = filterv3.ProcessingMode_NONE
	continueAndReplace    = extprocv3.CommonResponse_CONTINUE_AND_REPLACE
	defaultImmediateCode  = 200
	invalidImmediateCode  = 500
	minValidImmediateCode = 200
)

// HTTPRequest is the request the proxy received from its client.
type HTTPRequest struct {
	Method, Path, Authority string
	Scheme                  string   // default "http"
	Headers                 []Header // lower-case keys, no pseudo headers
	// Body is the request body; nil means no body (request_headers end_of_stream=true).
	Body []byte
	// Chunks, if non-nil, is the body as the proxy received it (overrides splitting Body).
	Chunks [][]byte
	// Trailers, if non-nil, end the body instead of end_of_stream (sent when the mode says SEND).
	Trailers []Header
	// SubsetHint, if non-nil, is sent as filter metadata envoy.lb.subset_hint /
	// x-gateway-destination-endpoint-subset, a ListValue of strings.
	SubsetHint []string
	// SubsetHintAsString sends the hint as one comma-separated string instead.
	SubsetHintAsString bool
	// HeaderValueField puts header values in HeaderValue.value instead of raw_value (for the
	// whole exchange, response side included).
	HeaderValueField bool
}

// Immediate is an ImmediateResponse: the reply the proxy sends instead of going upstream.
type Immediate struct {
	Status     int
	Headers    []Header
	Body       []byte
	GRPCStatus *uint32
	Details    string
}

// Routed is what the proxy does with the request once the server has answered.
type Routed struct {
	// Immediate is set if the server answered with an ImmediateResponse; the rest is then empty
	// except Metadata and Notes.
	Immediate *Immediate
	// Headers are the request headers after mutations, pseudo headers (:method, :path,
	// :authority, :scheme) first. The proxy removed content-length in the modes where Envoy does.
	Headers []Header
	// Body is the body the proxy forwards: the server's re-emission (FULL_DUPLEX_STREAMED) or the
	// original after body mutations.
	Body []byte
	// Trailers are the request trailers after mutations (nil if none).
	Trailers []Header
	// Destination is x-gateway-destination-endpoint after mutation, else the metadata value.
	Destination string
	// Metadata is the dynamic_metadata the server returned, merged across answers.
	Metadata *structpb.Struct
	// ClearRouteCache: an applied answer carried a header mutation and clear_route_cache.
	ClearRouteCache bool
	// ServerGone: the server closed the stream with OK before answering everything ("continue
	// without me"); what it had not answered went on unmodified.
	ServerGone bool
	// IgnoredHeaderMutations are header mutations in body answers that the proxy did not apply
	// (STREAMED and FULL_DUPLEX_STREAMED), for tests to inspect.
	IgnoredHeaderMutations []*extprocv3.HeaderMutation
	// Notes lists mutations Envoy's default rules ignore (routing headers, x-envoy-*, ...).
	Notes []string
}

// HTTPResponse is an upstream response, for Exchange.Response.
type HTTPResponse struct {
	Status         int
	Headers        []Header
	ServedEndpoint string
	Body           []byte   // nil = no body
	Chunks         [][]byte // optional explicit chunking (an SSE stream, say)
	Trailers       []Header
}

// Forwarded is what the proxy sends downstream for a response.
type Forwarded struct {
	Immediate *Immediate
	Headers   []Header // ":status" first, after every applied mutation
	Chunks    [][]byte // body chunks in the order NextResponseBody returned them
	Body      []byte
	Trailers  []Header
}

type msgKind int

const (
	kHeaders msgKind = iota
	kBody
	kTrailers
)

// chunk is a piece of body on its way through the proxy, in order. awaiting: the server owes an
// answer that may change it; the chunks behind it wait (outside FULL_DUPLEX_STREAMED).
type chunk struct {
	data     []byte
	eos      bool
	awaiting bool
}

type owed struct {
	kind msgKind
	c    *chunk
}

// side is one direction (request or response) of the exchange.
type side struct {
	name         string
	body         filterv3.ProcessingMode_BodySendMode
	duplex       bool
	sendTrailers bool

	// What the proxy sent.
	headersSent, headersEOS bool
	bodyMsgs, bodyBytes     int
	bodyEOSSent             bool
	trailersSent            bool
	inputEnded              bool // the caller handed over the end of the body (or the trailers)

	// Answers owed outside FULL_DUPLEX_STREAMED, in message order.
	owed []owed

	// What the server answered.
	headersAnswered  bool
	bodyAnswers      int
	bodyEOSAnswered  bool
	trailersAnswered bool
	dropInput        bool // FULL_DUPLEX: the server re-emits; the input chunks are not forwarded

	headers  []Header
	trailers []Header
	pending  []*chunk
	out      []chunk // forwarded, in order
	ended    bool    // the body's end is in out (or there is no body)
	ignored  []*extprocv3.HeaderMutation

	buf         []byte // BUFFERED / BUFFERED_PARTIAL: the body collected so far (response side)
	partialDone bool   // BUFFERED_PARTIAL: the cut was sent; the rest passes through
}

func (s *side) phase(k msgKind) string {
	switch k {
	case kHeaders:
		return s.name + "_headers"
	case kBody:
		return s.name + "_body"
	}
	return s.name + "_trailers"
}

// flush moves the chunks at the head of pending that no longer wait for an answer to out.
func (s *side) flush() {
	i := 0
	for ; i < len(s.pending) && !s.pending[i].awaiting; i++ {
		c := s.pending[i]
		if len(c.data) > 0 || c.eos {
			s.out = append(s.out, chunk{data: c.data, eos: c.eos})
		}
		if c.eos {
			s.ended = true
		}
	}
	s.pending = s.pending[i:]
}

// outstanding describes what the server still owes on this side ("" if nothing).
func (s *side) outstanding() string {
	switch {
	case s.headersSent && !s.headersAnswered:
		return "the " + s.phase(kHeaders) + " answer"
	case len(s.owed) > 0:
		return fmt.Sprintf("%d answer(s), the next to %s", len(s.owed), s.phase(s.owed[0].kind))
	case s.duplex && s.bodyEOSSent && !s.bodyEOSAnswered:
		return "the " + s.phase(kBody) + " chunk with end_of_stream=true"
	case s.duplex && s.trailersSent && !s.trailersAnswered:
		return "the " + s.phase(kTrailers) + " answer"
	}
	return ""
}

func removesContentLength(m filterv3.ProcessingMode_BodySendMode) bool {
	return m == streamed || m == bufferedPartial || m == duplex
}

// Exchange is one HTTP request's life on one gRPC stream. Request, ResponseHeaders,
// ResponseBody and ResponseTrailers must be called from one goroutine at a time, in that order;
// NextResponseBody may run in another goroutine (to forward downstream while the upstream is
// still being read); Cancel may be called from anywhere. Always end with Close or Cancel.
type Exchange struct {
	c      *Client
	mode   Mode
	ctx    context.Context
	cancel context.CancelFunc
	stream extprocv3.ExternalProcessor_ProcessClient

	sendMu    sync.Mutex
	firstSent bool

	recvDone chan struct{}

	mu          sync.Mutex
	changed     chan struct{}
	err         error // sticky
	ended       bool  // the stream is over (Recv returned)
	serverGone  bool  // the server closed with OK before the proxy half-closed
	closeSent   bool
	closed      bool
	reqStarted  bool
	reqDone     bool
	respStarted bool
	immediate   *Immediate
	useValue    bool
	reqMeta     *corev3.Metadata
	respMeta    *corev3.Metadata
	metadata    *structpb.Struct
	clearRoute  bool
	notes       []string
	origCL      []string
	origBody    int
	req, resp   side
}

func newExchange(c *Client, mode Mode, ctx context.Context, cancel context.CancelFunc, stream extprocv3.ExternalProcessor_ProcessClient) *Exchange {
	return &Exchange{
		c: c, mode: mode, ctx: ctx, cancel: cancel, stream: stream,
		recvDone: make(chan struct{}),
		changed:  make(chan struct{}),
		req: side{name: "request", body: mode.RequestBody, duplex: mode.RequestBody == duplex,
			sendTrailers: mode.RequestTrailers},
		resp: side{name: "response", body: mode.ResponseBody, duplex: mode.ResponseBody == duplex,
			sendTrailers: mode.ResponseTrailers},
	}
}

// ---- receiving -------------------------------------------------------------------------------

func (x *Exchange) recvLoop() {
	defer close(x.recvDone)
	for {
		r, err := x.stream.Recv()
		x.mu.Lock()
		if err != nil {
			x.onEnd(err)
			x.broadcastLocked()
			x.mu.Unlock()
			return
		}
		if x.err == nil {
			if perr := x.handle(r); perr != nil {
				x.failLocked(perr)
			}
		}
		x.broadcastLocked()
		x.mu.Unlock()
	}
}

func (x *Exchange) broadcastLocked() {
	close(x.changed)
	x.changed = make(chan struct{})
}

// failLocked records the first error and resets the stream, as Envoy does when it fails a request.
func (x *Exchange) failLocked(err error) {
	if x.err == nil {
		x.err = err
	}
	x.cancel()
	x.broadcastLocked()
}

// streamErr classifies a stream failure: the caller's context ending, or a server status.
func (x *Exchange) streamErr(err error) error {
	if c := x.ctx.Err(); c != nil && !errors.Is(c, context.DeadlineExceeded) {
		return c
	}
	return newStreamError(err)
}

func (x *Exchange) onEnd(err error) {
	x.ended = true
	if x.err != nil {
		return
	}
	switch {
	case err == io.EOF && x.immediate != nil:
		// The immediate response ended processing; nothing else is owed.
	case err == io.EOF && x.closeSent:
		for _, s := range []*side{&x.req, &x.resp} {
			if o := s.outstanding(); o != "" {
				x.err = protoErr(RuleStreamEnd, "stream", "the server ended the stream while it still owed %s", o)
				return
			}
		}
	case err == io.EOF:
		x.err = x.onServerGone()
	default:
		x.err = x.streamErr(err)
	}
}

// onServerGone applies "continue without me" (docs/protocol.md:23): what was not answered goes on
// unmodified and no more messages are sent.
func (x *Exchange) onServerGone() error {
	x.serverGone = true
	for _, s := range []*side{&x.req, &x.resp} {
		if s.duplex && s.bodyAnswers > 0 && !s.bodyEOSAnswered && !s.trailersAnswered {
			return protoErr(RuleDuplexEndOfStream, s.phase(kBody),
				"the stream ended with status OK after %d body answer(s) but before the chunk with end_of_stream=true: the proxy forwards only what the server re-emits",
				s.bodyAnswers)
		}
		for _, c := range s.pending {
			c.awaiting = false
		}
		s.owed = nil
		s.flush()
		if s.duplex && s.trailersSent && !s.trailersAnswered && !s.ended {
			s.out = append(s.out, chunk{eos: true})
			s.ended = true
		}
	}
	return nil
}

func (x *Exchange) handle(r *extprocv3.ProcessingResponse) error {
	if x.immediate != nil {
		return protoErr(RuleAfterImmediate, "stream", "%T after the immediate response that ended processing", r.GetResponse())
	}
	var s *side
	var kind msgKind
	var cr *extprocv3.CommonResponse
	var tr *extprocv3.TrailersResponse
	switch v := r.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		s, kind, cr = &x.req, kHeaders, v.RequestHeaders.GetResponse()
	case *extprocv3.ProcessingResponse_RequestBody:
		s, kind, cr = &x.req, kBody, v.RequestBody.GetResponse()
	case *extprocv3.ProcessingResponse_RequestTrailers:
		s, kind, tr = &x.req, kTrailers, v.RequestTrailers
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		s, kind, cr = &x.resp, kHeaders, v.ResponseHeaders.GetResponse()
	case *extprocv3.ProcessingResponse_ResponseBody:
		s, kind, cr = &x.resp, kBody, v.ResponseBody.GetResponse()
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		s, kind, tr = &x.resp, kTrailers, v.ResponseTrailers
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		im, err := convertImmediate(v.ImmediateResponse)
		if err != nil {
			return err
		}
		x.immediate = im
		x.mergeMetadata(r.GetDynamicMetadata())
		return nil
	case nil:
		return protoErr(RuleAnswerKind, "stream", "a ProcessingResponse without a response")
	default:
		return protoErr(RuleUnsupported, "stream", "%T is not supported by this client", v)
	}
	if r.GetModeOverride() != nil {
		if x.req.duplex || x.resp.duplex {
			return protoErr(RuleModeOverride, s.phase(kind), "mode_override is not supported in FULL_DUPLEX_STREAMED")
		}
		x.notes = append(x.notes, s.phase(kind)+": mode_override ignored (allow_mode_override is off by default)")
	}
	if cr.GetStatus() == continueAndReplace {
		return protoErr(RuleUnsupported, s.phase(kind), "CONTINUE_AND_REPLACE is not supported by this client")
	}
	var err error
	switch kind {
	case kHeaders:
		err = x.onHeaders(s, cr)
	case kBody:
		err = x.onBody(s, cr)
	default:
		err = x.onTrailers(s, tr)
	}
	if err != nil {
		return err
	}
	x.mergeMetadata(r.GetDynamicMetadata())
	return nil
}

// routeCache records clear_route_cache as Envoy's DEFAULT route cache action does: only on the
// request side and only with a header mutation in the same answer.
func (x *Exchange) routeCache(s *side, cr *extprocv3.CommonResponse, phase string) {
	if s != &x.req || !cr.GetClearRouteCache() {
		return
	}
	if cr.GetHeaderMutation() == nil {
		x.notes = append(x.notes, phase+": clear_route_cache ignored (no header mutation in the same answer)")
		return
	}
	x.clearRoute = true
}

func (x *Exchange) applyHeaders(s *side, cr *extprocv3.CommonResponse, phase string) error {
	hs, notes, err := applyMutation(s.headers, cr.GetHeaderMutation(), phase)
	if err != nil {
		return err
	}
	s.headers = hs
	x.notes = append(x.notes, notes...)
	x.routeCache(s, cr, phase)
	return nil
}

// ignoreMutation records a header mutation the proxy does not apply (in a body answer outside
// BUFFERED). It is still checked: a server that breaks the header rules breaks them anywhere.
func (x *Exchange) ignoreMutation(s *side, hm *extprocv3.HeaderMutation, phase string) error {
	if _, _, err := applyMutation(cloneHeaders(s.headers), hm, phase); err != nil {
		return err
	}
	s.ignored = append(s.ignored, hm)
	x.notes = append(x.notes, fmt.Sprintf("%s: header mutation in a body answer ignored in %v mode", phase, s.body))
	return nil
}

func (x *Exchange) onHeaders(s *side, cr *extprocv3.CommonResponse) error {
	phase := s.phase(kHeaders)
	switch {
	case !s.headersSent:
		return protoErr(RuleAnswerKind, phase, "an answer to %s, but the proxy sent no such message", phase)
	case s.headersAnswered:
		return protoErr(RuleOneAnswer, phase, "a second answer to %s", phase)
	}
	if !s.duplex {
		s.owed = s.owed[1:] // headers are always the first message of a side
	}
	if cr.GetBodyMutation() != nil {
		x.notes = append(x.notes, phase+": body_mutation in a headers answer ignored (only with CONTINUE_AND_REPLACE)")
	}
	if err := x.applyHeaders(s, cr, phase); err != nil {
		return err
	}
	s.headersAnswered = true
	return nil
}

func (x *Exchange) onBody(s *side, cr *extprocv3.CommonResponse) error {
	phase := s.phase(kBody)
	switch {
	case s.bodyMsgs == 0:
		return protoErr(RuleAnswerKind, phase, "an answer to %s, but the proxy sent no body", phase)
	case s.headersSent && !s.headersAnswered:
		return protoErr(RuleOrder, phase, "a body answer before the %s answer: answers keep the order headers, body, trailers", s.phase(kHeaders))
	}
	if s.duplex {
		return x.onDuplexBody(s, cr)
	}
	if len(s.owed) == 0 {
		return protoErr(RuleOneAnswer, phase, "an answer to %s with no message waiting for one (more than one answer to one message)", phase)
	}
	if s.owed[0].kind != kBody {
		return protoErr(RuleAnswerKind, phase, "a body answer where the %s answer is owed", s.phase(s.owed[0].kind))
	}
	c := s.owed[0].c
	s.owed = s.owed[1:]
	mutated := false
	switch m := cr.GetBodyMutation().GetMutation().(type) {
	case *extprocv3.BodyMutation_Body:
		c.data, mutated = m.Body, true
	case *extprocv3.BodyMutation_ClearBody:
		if m.ClearBody {
			c.data, mutated = nil, true
		}
	case *extprocv3.BodyMutation_StreamedResponse:
		return protoErr(RuleStreamedOutsideDuplex, phase,
			"body_mutation.streamed_response in %v mode: only FULL_DUPLEX_STREAMED reads it (the change would be lost)", s.body)
	}
	if hm := cr.GetHeaderMutation(); hm != nil {
		if s.body == buffered || s.body == bufferedPartial {
			if err := x.applyHeaders(s, cr, phase); err != nil {
				return err
			}
		} else if err := x.ignoreMutation(s, hm, phase); err != nil {
			return err
		}
	} else {
		x.routeCache(s, cr, phase)
	}
	if mutated && s.body == buffered {
		if cl, ok := Lookup(s.headers, contentLength); ok && cl != strconv.Itoa(len(c.data)) {
			return protoErr(RuleContentLength, phase,
				"the body was changed to %d bytes but content-length is %s: Envoy rejects the mutation", len(c.data), cl)
		}
	}
	c.awaiting = false
	s.bodyAnswers++
	if c.eos {
		s.bodyEOSAnswered = true
	}
	s.flush()
	return nil
}

func (x *Exchange) onDuplexBody(s *side, cr *extprocv3.CommonResponse) error {
	phase := s.phase(kBody)
	switch {
	case s.bodyEOSAnswered:
		return protoErr(RuleDuplexEndOfStream, phase, "a body answer after the chunk with end_of_stream=true")
	case s.trailersAnswered:
		return protoErr(RuleOrder, phase, "a body answer after the trailers answer")
	}
	sr := cr.GetBodyMutation().GetStreamedResponse()
	if sr == nil {
		if cr.GetBodyMutation() != nil {
			return protoErr(RuleDuplexStreamed, phase,
				"body answers must be body_mutation.streamed_response, got %T", cr.GetBodyMutation().GetMutation())
		}
		return protoErr(RuleDuplexEmptyBodyAnswer, phase,
			"an empty body answer (a CommonResponse without body_mutation.streamed_response): gateways fail the request")
	}
	if len(sr.GetBody()) > MaxDuplexChunk {
		return protoErr(RuleDuplexChunkSize, phase, "a streamed chunk of %d bytes: at most %d", len(sr.GetBody()), MaxDuplexChunk)
	}
	if sr.GetEndOfStream() {
		switch {
		case s.trailersSent:
			return protoErr(RuleDuplexEndOfStream, phase,
				"end_of_stream=true on a body chunk, but the input ended with trailers: the last chunk has end_of_stream=false and a TrailersResponse follows")
		case !s.bodyEOSSent:
			return protoErr(RuleDuplexEndOfStream, phase, "end_of_stream=true before the input's end was sent")
		}
	}
	if hm := cr.GetHeaderMutation(); hm != nil {
		if err := x.ignoreMutation(s, hm, phase); err != nil {
			return err
		}
	}
	if s.bodyAnswers == 0 {
		s.pending, s.dropInput = nil, true
	}
	s.bodyAnswers++
	if len(sr.GetBody()) > 0 || sr.GetEndOfStream() {
		s.out = append(s.out, chunk{data: sr.GetBody(), eos: sr.GetEndOfStream()})
	}
	if sr.GetEndOfStream() {
		s.bodyEOSAnswered, s.ended = true, true
	}
	return nil
}

func (x *Exchange) onTrailers(s *side, tr *extprocv3.TrailersResponse) error {
	phase := s.phase(kTrailers)
	switch {
	case !s.trailersSent:
		return protoErr(RuleAnswerKind, phase, "an answer to %s, but the proxy sent no trailers", phase)
	case s.trailersAnswered:
		return protoErr(RuleOneAnswer, phase, "a second answer to %s", phase)
	case s.headersSent && !s.headersAnswered:
		return protoErr(RuleOrder, phase, "a trailers answer before the %s answer", s.phase(kHeaders))
	}
	if s.duplex {
		if s.bodyBytes > 0 && s.bodyAnswers == 0 {
			return protoErr(RuleOrder, phase,
				"a trailers answer before any body answer: the server must re-emit the %d-byte body first", s.bodyBytes)
		}
	} else {
		if len(s.owed) == 0 || s.owed[0].kind != kTrailers {
			return protoErr(RuleOrder, phase, "a trailers answer while body answers are owed")
		}
		s.owed = s.owed[1:]
	}
	hs, notes, err := applyMutation(s.trailers, tr.GetHeaderMutation(), phase)
	if err != nil {
		return err
	}
	s.trailers = hs
	x.notes = append(x.notes, notes...)
	s.trailersAnswered = true
	if s.duplex && !s.ended {
		s.pending, s.dropInput = nil, true
		s.out = append(s.out, chunk{eos: true})
		s.ended = true
	}
	return nil
}

func (x *Exchange) mergeMetadata(md *structpb.Struct) {
	if len(md.GetFields()) == 0 {
		return
	}
	if x.metadata == nil {
		x.metadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	for ns, v := range md.GetFields() {
		cur := x.metadata.Fields[ns].GetStructValue()
		add := v.GetStructValue()
		if cur == nil || add == nil {
			x.metadata.Fields[ns] = proto.Clone(v).(*structpb.Value)
			continue
		}
		for k, fv := range add.GetFields() {
			cur.Fields[k] = proto.Clone(fv).(*structpb.Value)
		}
	}
}

func convertImmediate(ir *extprocv3.ImmediateResponse) (*Immediate, error) {
	im := &Immediate{Status: defaultImmediateCode, Body: ir.GetBody(), Details: ir.GetDetails()}
	if ir.GetStatus() != nil {
		im.Status = int(ir.GetStatus().GetCode())
		if im.Status < minValidImmediateCode {
			im.Status = invalidImmediateCode
		}
	}
	if g := ir.GetGrpcStatus(); g != nil {
		v := g.GetStatus()
		im.GRPCStatus = &v
	}
	hs, _, err := applyMutation(nil, ir.GetHeaders(), "immediate_response")
	if err != nil {
		return nil, err
	}
	im.Headers = hs
	return im, nil
}

// ---- waiting ---------------------------------------------------------------------------------

// wait blocks until cond (checked under x.mu) holds or the exchange fails. Once armed (checked
// under x.mu) reports true, a message timer runs; when it fires, onTimeout's error fails the
// exchange. ctx may be nil.
func (x *Exchange) wait(ctx context.Context, cond, armed func() bool, onTimeout func() error) error {
	var tc <-chan time.Time
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	for {
		x.mu.Lock()
		if x.err != nil {
			err := x.err
			x.mu.Unlock()
			return err
		}
		if cond() {
			x.mu.Unlock()
			return nil
		}
		if tc == nil && x.c.messageTimeout > 0 && armed() {
			t := time.NewTimer(x.c.messageTimeout)
			defer t.Stop()
			tc = t.C
		}
		ch := x.changed
		x.mu.Unlock()
		select {
		case <-ch:
		case <-done:
			return ctx.Err()
		case <-tc:
			x.mu.Lock()
			if x.err == nil && !cond() {
				x.failLocked(onTimeout())
			}
			err := x.err
			x.mu.Unlock()
			return err
		}
	}
}

// finished: processing ended for good (immediate response, or the server left).
func (x *Exchange) finished() bool { return x.immediate != nil || x.serverGone || x.ended }

func always() bool { return true }

func (x *Exchange) timeoutErr(s *side) func() error {
	return func() error {
		return protoErr(RuleMessageTimeout, s.name, "no answer within the message timeout (%v) while the server owes %s",
			x.c.messageTimeout, s.outstanding())
	}
}

// waitAnswered waits until the side owes nothing.
func (x *Exchange) waitAnswered(s *side) error {
	return x.wait(nil, func() bool { return x.finished() || s.outstanding() == "" }, always, x.timeoutErr(s))
}

// ---- sending ---------------------------------------------------------------------------------

// errStop: processing had ended (immediate response, or the server left) before the message was
// registered; it was not sent, and the caller forwards it itself.
var errStop = errors.New("processing complete")

// emit registers a message (under x.mu) and sends it. protocol_config rides on the first one.
func (x *Exchange) emit(register func(), req *extprocv3.ProcessingRequest) error {
	x.mu.Lock()
	if x.err != nil {
		err := x.err
		x.mu.Unlock()
		return err
	}
	if x.finished() {
		x.mu.Unlock()
		return errStop
	}
	register()
	x.mu.Unlock()

	x.sendMu.Lock()
	if !x.firstSent {
		x.firstSent = true
		if !x.mode.OmitProtocolConfig {
			req.ProtocolConfig = x.mode.protocolConfig()
		}
	}
	err := x.stream.Send(req)
	x.sendMu.Unlock()
	if err == nil {
		return nil
	}
	if err != io.EOF {
		x.mu.Lock()
		x.failLocked(x.streamErr(err))
		x.mu.Unlock()
	}
	<-x.recvDone // the stream is over; the receiver recorded why
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.err != nil {
		return x.err
	}
	// The message was registered before the stream ended, so the receiver's end-of-stream handling
	// (onServerGone's "continue without me", or the immediate response) already accounted for it:
	// passing it through again would forward it twice.
	return nil
}

func (x *Exchange) headersMsg(s *side, hs []Header, eos bool) *extprocv3.ProcessingRequest {
	if s == &x.req {
		return headersMessage(true, hs, x.useValue, eos, x.reqMeta)
	}
	return headersMessage(false, hs, x.useValue, eos, x.respMeta)
}

func (x *Exchange) sendHeaders(s *side, hs []Header, eos bool) error {
	return x.emit(func() {
		s.headersSent, s.headersEOS = true, eos
		if !s.duplex {
			s.owed = append(s.owed, owed{kind: kHeaders})
		}
		if eos {
			s.ended, s.inputEnded = true, true
		}
	}, x.headersMsg(s, hs, eos))
}

// sendBody sends one body message. The chunk is kept (awaiting its answer) so that it can go on
// unmodified if the server leaves, or be replaced by the server's answer.
func (x *Exchange) sendBody(s *side, data []byte, eos bool) error {
	req := bodyMessage(true, data, eos, x.reqMeta)
	if s != &x.req {
		req = bodyMessage(false, data, eos, x.respMeta)
	}
	err := x.emit(func() {
		s.bodyMsgs++
		s.bodyBytes += len(data)
		if eos {
			s.bodyEOSSent = true
		}
		if s.duplex && s.dropInput {
			return
		}
		c := &chunk{data: data, eos: eos, awaiting: true}
		s.pending = append(s.pending, c)
		if !s.duplex {
			s.owed = append(s.owed, owed{kind: kBody, c: c})
		}
	}, req)
	if err == errStop {
		x.passThrough(s, data, eos)
		return nil
	}
	return err
}

// passThrough forwards a chunk without the server (mode NONE, the part BUFFERED_PARTIAL does not
// send, or after the server left).
func (x *Exchange) passThrough(s *side, data []byte, eos bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.immediate != nil {
		return
	}
	s.pending = append(s.pending, &chunk{data: data, eos: eos})
	s.flush()
	x.broadcastLocked()
}

func (x *Exchange) sendTrailers(s *side, ts []Header) error {
	tr := &extprocv3.HttpTrailers{Trailers: toHeaderMap(ts, x.useValue)}
	req := &extprocv3.ProcessingRequest{}
	if s == &x.req {
		req.Request, req.MetadataContext = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: tr}, x.reqMeta
	} else {
		req.Request, req.MetadataContext = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: tr}, x.respMeta
	}
	err := x.emit(func() {
		s.trailersSent = true
		if !s.duplex {
			s.owed = append(s.owed, owed{kind: kTrailers})
			// Outside FULL_DUPLEX the body is complete once the trailers are sent.
			s.pending = append(s.pending, &chunk{eos: true})
			s.flush()
		}
	}, req)
	if err == errStop {
		x.passThrough(s, nil, true)
		return nil
	}
	return err
}

// endBodyWithTrailers handles trailers the mode does not send (SKIP): the body just ends.
func (x *Exchange) endBodyWithTrailers(s *side) { x.passThrough(s, nil, true) }

// ---- the request -----------------------------------------------------------------------------

func splitBody(body []byte, chunks [][]byte, size int) [][]byte {
	if chunks != nil {
		if len(chunks) == 0 {
			return [][]byte{{}}
		}
		return chunks
	}
	if body == nil {
		return nil
	}
	if len(body) == 0 {
		return [][]byte{{}}
	}
	out := make([][]byte, 0, (len(body)+size-1)/size)
	for len(body) > size {
		out = append(out, body[:size])
		body = body[size:]
	}
	return append(out, body)
}

func totalLen(chunks [][]byte) int {
	n := 0
	for _, c := range chunks {
		n += len(c)
	}
	return n
}

func concat(chunks [][]byte) []byte {
	out := make([]byte, 0, totalLen(chunks))
	for _, c := range chunks {
		out = append(out, c...)
	}
	return out
}

func subsetHint(req *HTTPRequest) *structpb.Struct {
	if req.SubsetHint == nil {
		return nil
	}
	var v *structpb.Value
	if req.SubsetHintAsString {
		s := ""
		for i, h := range req.SubsetHint {
			if i > 0 {
				s += ","
			}
			s += h
		}
		v = structpb.NewStringValue(s)
	} else {
		vals := make([]*structpb.Value, len(req.SubsetHint))
		for i, h := range req.SubsetHint {
			vals[i] = structpb.NewStringValue(h)
		}
		v = structpb.NewListValue(&structpb.ListValue{Values: vals})
	}
	return &structpb.Struct{Fields: map[string]*structpb.Value{gateway.SubsetKey: v}}
}

// Request sends the request through the server the way the proxy's mode dictates and returns
// what the proxy would do with it. It returns a *ProtocolError for every rule the server breaks.
func (x *Exchange) Request(req *HTTPRequest) (*Routed, error) {
	hs := requestHeaders(req)
	chunks := splitBody(req.Body, req.Chunks, x.c.chunkSize)
	hasBody, hasTrailers := chunks != nil, req.Trailers != nil
	s := &x.req

	x.mu.Lock()
	if x.reqStarted {
		x.mu.Unlock()
		return nil, usageError("Request called twice")
	}
	x.reqStarted = true
	x.useValue = req.HeaderValueField
	if hint := subsetHint(req); hint != nil {
		x.reqMeta = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{gateway.SubsetNamespace: hint}}
	}
	x.respMeta = x.reqMeta
	s.headers = cloneHeaders(hs)
	if removesContentLength(s.body) {
		s.headers = removeKey(s.headers, contentLength)
	}
	s.trailers = cloneHeaders(req.Trailers)
	x.origCL = Values(hs, contentLength)
	x.origBody = totalLen(chunks)
	x.mu.Unlock()

	err := x.request(s, hs, chunks, hasBody, hasTrailers, req.Trailers)
	if err != nil && err != errStop {
		return nil, err
	}
	return x.routed(hasBody)
}

func (x *Exchange) request(s *side, hs []Header, chunks [][]byte, hasBody, hasTrailers bool, trailers []Header) error {
	if err := x.sendHeaders(s, hs, !hasBody && !hasTrailers); err != nil {
		return err
	}
	if s.duplex {
		for i, c := range chunks {
			if err := x.sendBody(s, c, i == len(chunks)-1 && !hasTrailers); err != nil {
				return err
			}
		}
		if hasTrailers {
			if err := x.sendTrailers(s, trailers); err != nil {
				return err
			}
		}
		return x.waitAnswered(s)
	}
	if s.body != streamed || !x.mode.SendBodyWithoutWaitingForHeaderResponse {
		// The proxy waits for the headers answer before it sends any body (docs/protocol.md:39-46).
		err := x.wait(nil, func() bool { return x.finished() || s.headersAnswered }, always, func() error {
			if hasBody && s.body != none {
				return protoErr(RuleHeadersDeadlock, s.phase(kHeaders),
					"no answer to request_headers within %v in %v mode: the proxy sends the body only after the headers answer, so a server that waits for the body first deadlocks",
					x.c.messageTimeout, s.body)
			}
			return x.timeoutErr(s)()
		})
		if err != nil {
			return err
		}
	}
	if hasBody {
		whole := func() []byte {
			if len(chunks) == 1 {
				return chunks[0]
			}
			return concat(chunks)
		}
		switch s.body {
		case streamed:
			for i, c := range chunks {
				if err := x.sendBody(s, c, i == len(chunks)-1 && !hasTrailers); err != nil {
					return err
				}
			}
		case buffered:
			if err := x.sendBody(s, whole(), !hasTrailers); err != nil {
				return err
			}
		case bufferedPartial:
			b := whole()
			if len(b) > x.c.bufferLimit {
				if err := x.sendBody(s, b[:x.c.bufferLimit], false); err != nil {
					return err
				}
				x.passThrough(s, b[x.c.bufferLimit:], !hasTrailers)
			} else if err := x.sendBody(s, b, !hasTrailers); err != nil {
				return err
			}
		case none:
			x.passThrough(s, whole(), !hasTrailers)
		}
	}
	if hasTrailers {
		// Outside FULL_DUPLEX the proxy sends trailers once no body chunk awaits an answer.
		err := x.wait(nil, func() bool { return x.finished() || s.outstanding() == "" }, always, func() error {
			return protoErr(RuleHeadersDeadlock, s.name,
				"no answer within %v while the server owes %s: the proxy holds the trailers (the body's end) until every message is answered, so a server that waits for the end first deadlocks",
				x.c.messageTimeout, s.outstanding())
		})
		if err != nil {
			return err
		}
		if !s.sendTrailers {
			x.endBodyWithTrailers(s)
		} else if err := x.sendTrailers(s, trailers); err != nil {
			return err
		}
	}
	return x.waitAnswered(s)
}

// routed builds the Routed result and checks the rules that hold on the final request.
func (x *Exchange) routed(hasBody bool) (*Routed, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.err != nil {
		return nil, x.err
	}
	x.reqDone = true
	s := &x.req
	r := &Routed{
		Immediate:              x.immediate,
		ClearRouteCache:        x.clearRoute,
		ServerGone:             x.serverGone,
		IgnoredHeaderMutations: append([]*extprocv3.HeaderMutation(nil), s.ignored...),
		Notes:                  append([]string(nil), x.notes...),
	}
	if x.metadata != nil {
		r.Metadata = proto.Clone(x.metadata).(*structpb.Struct)
	}
	if x.immediate != nil {
		return r, nil
	}
	r.Headers = cloneHeaders(s.headers)
	r.Trailers = cloneHeaders(s.trailers)
	parts := make([][]byte, len(s.out))
	for i, c := range s.out {
		parts[i] = c.data
	}
	if hasBody {
		r.Body = concat(parts)
	}
	if err := x.checkRouted(r, hasBody); err != nil {
		x.failLocked(err)
		return nil, err
	}
	return r, nil
}

// checkContentLength: a content-length the server set, or left in front of a body it changed,
// must equal the forwarded body's length. A client's own wrong content-length on an unchanged
// body is not the server's fault.
func checkContentLength(phase string, cls, origCL []string, n, origN int, serverOwnsBody bool) error {
	if len(cls) > 1 {
		return protoErr(RuleContentLength, phase, "content-length has %d values %q", len(cls), cls)
	}
	changed := serverOwnsBody || n != origN || fmt.Sprint(cls) != fmt.Sprint(origCL)
	if len(cls) == 1 && changed && cls[0] != strconv.Itoa(n) {
		return protoErr(RuleContentLength, phase, "content-length is %s but the forwarded body has %d bytes", cls[0], n)
	}
	return nil
}

func (x *Exchange) checkRouted(r *Routed, hasBody bool) error {
	const phase = "request"
	// content-length (docs/protocol.md:33-34, 43).
	duplexAnswered := x.req.duplex && x.req.bodyAnswers > 0
	cls := Values(r.Headers, contentLength)
	if duplexAnswered && hasBody && len(cls) == 0 {
		return protoErr(RuleContentLength, phase,
			"FULL_DUPLEX_STREAMED: the proxy removed content-length and the server did not set it again (body %d bytes)", len(r.Body))
	}
	if err := checkContentLength(phase, cls, x.origCL, len(r.Body), x.origBody, duplexAnswered); err != nil {
		return err
	}
	// The destination, both ways and identical (docs/protocol.md:58-62).
	dests := Values(r.Headers, gateway.DestinationHeader)
	if len(dests) > 1 {
		return protoErr(RuleDestination, phase, "%s has %d values %q (append instead of replace?)", gateway.DestinationHeader, len(dests), dests)
	}
	mdv, hasMD := r.Metadata.GetFields()[gateway.LBNamespace].GetStructValue().GetFields()[gateway.DestinationHeader]
	md := ""
	if hasMD {
		sv, ok := mdv.GetKind().(*structpb.Value_StringValue)
		if !ok {
			return protoErr(RuleDestination, phase, "dynamic metadata %s/%s is not a string: %v", gateway.LBNamespace, gateway.DestinationHeader, mdv)
		}
		md = sv.StringValue
	}
	if len(dests) == 1 && hasMD && dests[0] != md {
		return protoErr(RuleDestination, phase, "header %s=%q but dynamic metadata %s/%s=%q: they must be identical",
			gateway.DestinationHeader, dests[0], gateway.LBNamespace, gateway.DestinationHeader, md)
	}
	if len(dests) == 1 {
		r.Destination = dests[0]
	} else {
		r.Destination = md
	}
	return nil
}

// ---- the response ----------------------------------------------------------------------------

func (x *Exchange) respCheckLocked() error {
	switch {
	case x.err != nil:
		return x.err
	case !x.reqDone:
		return usageError("the response side starts after Request succeeded")
	case x.immediate != nil:
		return &ImmediateError{Immediate: x.immediate}
	}
	return nil
}

// ResponseHeaders hands the upstream response headers to the proxy. servedEndpoint, if not
// empty, is sent as metadata envoy.lb/x-gateway-destination-endpoint-served. endOfStream means
// the response has no body. It returns the headers after mutation (":status" first), or the
// ImmediateResponse the server answered with. It waits for the headers answer even in
// FULL_DUPLEX_STREAMED (the downstream needs the headers before the first body byte).
func (x *Exchange) ResponseHeaders(status int, headers []Header, servedEndpoint string, endOfStream bool) ([]Header, *Immediate, error) {
	s := &x.resp
	hs := make([]Header, 0, len(headers)+1)
	hs = append(hs, Header{":status", strconv.Itoa(status)})
	hs = append(hs, headers...)

	x.mu.Lock()
	if err := x.respCheckLocked(); err != nil {
		x.mu.Unlock()
		var ie *ImmediateError
		if errors.As(err, &ie) {
			return nil, nil, usageError("the request was answered with an immediate response")
		}
		return nil, nil, err
	}
	if x.respStarted {
		x.mu.Unlock()
		return nil, nil, usageError("ResponseHeaders called twice")
	}
	x.respStarted = true
	if servedEndpoint != "" {
		x.respMeta = servedMetadata(x.reqMeta, servedEndpoint)
	}
	s.headers = cloneHeaders(hs)
	if removesContentLength(s.body) || (s.body == buffered && !x.mode.ResponseHeaders) {
		s.headers = removeKey(s.headers, contentLength)
	}
	if endOfStream {
		s.ended, s.inputEnded = true, true
	}
	x.mu.Unlock()

	if x.mode.ResponseHeaders {
		err := x.sendHeaders(s, hs, endOfStream)
		if err == nil {
			err = x.wait(nil, func() bool { return x.finished() || s.headersAnswered }, always, x.timeoutErr(s))
		}
		if err != nil && err != errStop {
			return nil, nil, err
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.err != nil {
		return nil, nil, x.err
	}
	if x.immediate != nil {
		return nil, x.immediate, nil
	}
	return cloneHeaders(s.headers), nil, nil
}

func (x *Exchange) respBodyCheck(s *side) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.respCheckLocked(); err != nil {
		return err
	}
	switch {
	case !x.respStarted:
		return usageError("ResponseBody or ResponseTrailers before ResponseHeaders")
	case s.inputEnded:
		return usageError("the response body already ended")
	}
	return nil
}

// ResponseBody hands one upstream body chunk to the proxy. It does not wait for answers: read
// what the proxy forwards downstream with NextResponseBody.
func (x *Exchange) ResponseBody(data []byte, endOfStream bool) error {
	s := &x.resp
	if err := x.respBodyCheck(s); err != nil {
		return err
	}
	x.mu.Lock()
	s.inputEnded = endOfStream
	gone := x.serverGone
	x.mu.Unlock()
	if gone || s.body == none {
		x.passThrough(s, data, endOfStream)
		return nil
	}
	switch s.body {
	case buffered:
		s.buf = append(s.buf, data...)
		if endOfStream {
			return x.sendBody(s, s.buf, true)
		}
	case bufferedPartial:
		if s.partialDone {
			x.passThrough(s, data, endOfStream)
			return nil
		}
		s.buf = append(s.buf, data...)
		if len(s.buf) > x.c.bufferLimit {
			s.partialDone = true
			if err := x.sendBody(s, s.buf[:x.c.bufferLimit], false); err != nil {
				return err
			}
			x.passThrough(s, s.buf[x.c.bufferLimit:], endOfStream)
		} else if endOfStream {
			s.partialDone = true
			return x.sendBody(s, s.buf, true)
		}
	default:
		return x.sendBody(s, data, endOfStream)
	}
	return nil
}

// NextResponseBody returns the next body chunk the proxy forwards downstream, as soon as it is
// available: the server's re-emission in FULL_DUPLEX_STREAMED, the (mutated) chunk otherwise.
// endOfStream is true on the last chunk; after it, (nil, true, nil). A server ImmediateResponse
// surfaces as *ImmediateError.
func (x *Exchange) NextResponseBody(ctx context.Context) ([]byte, bool, error) {
	s := &x.resp
	err := x.wait(ctx, func() bool {
		return len(s.out) > 0 || s.ended || x.immediate != nil || x.ended
	}, func() bool {
		return s.outstanding() != "" && (!s.duplex || s.inputEnded)
	}, x.timeoutErr(s))
	if err != nil {
		return nil, false, err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(s.out) > 0 {
		c := s.out[0]
		s.out[0] = chunk{}
		s.out = s.out[1:]
		return c.data, c.eos, nil
	}
	if s.ended {
		return nil, true, nil
	}
	if x.immediate != nil {
		return nil, false, &ImmediateError{Immediate: x.immediate}
	}
	return nil, false, usageError("the stream ended before the response body did (Close called too early?)")
}

// ResponseTrailers hands the upstream trailers to the proxy (they end the body) and returns them
// after mutation.
func (x *Exchange) ResponseTrailers(trailers []Header) ([]Header, error) {
	s := &x.resp
	if err := x.respBodyCheck(s); err != nil {
		return nil, err
	}
	x.mu.Lock()
	s.inputEnded = true
	s.trailers = cloneHeaders(trailers)
	gone := x.serverGone
	x.mu.Unlock()
	if !gone && (s.body == buffered || s.body == bufferedPartial) && !s.partialDone && s.buf != nil {
		s.partialDone = true
		if err := x.sendBody(s, s.buf, false); err != nil {
			return nil, err
		}
	}
	if !s.sendTrailers {
		x.endBodyWithTrailers(s)
	} else {
		if !s.duplex {
			if err := x.waitAnswered(s); err != nil {
				return nil, err
			}
		}
		err := x.sendTrailers(s, trailers)
		if err == nil {
			err = x.wait(nil, func() bool { return x.finished() || s.trailersAnswered }, always, x.timeoutErr(s))
		}
		if err != nil {
			return nil, err
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.err != nil {
		return nil, x.err
	}
	if x.immediate != nil {
		return nil, &ImmediateError{Immediate: x.immediate}
	}
	return cloneHeaders(s.trailers), nil
}

// Response runs the whole response side for an upstream response: headers, every chunk,
// trailers, then collects what the proxy forwards downstream.
func (x *Exchange) Response(resp *HTTPResponse) (*Forwarded, error) {
	chunks := splitBody(resp.Body, resp.Chunks, x.c.chunkSize)
	hasTrailers := resp.Trailers != nil
	hs, im, err := x.ResponseHeaders(resp.Status, resp.Headers, resp.ServedEndpoint, chunks == nil && !hasTrailers)
	if err != nil {
		return nil, err
	}
	f := &Forwarded{Immediate: im}
	if im != nil {
		return f, nil
	}
	f.Headers = hs
	immediate := func(err error) (*Forwarded, error) {
		var ie *ImmediateError
		if errors.As(err, &ie) {
			return &Forwarded{Immediate: ie.Immediate}, nil
		}
		return nil, err
	}
	for i, c := range chunks {
		if err := x.ResponseBody(c, i == len(chunks)-1 && !hasTrailers); err != nil {
			return immediate(err)
		}
	}
	if hasTrailers {
		if f.Trailers, err = x.ResponseTrailers(resp.Trailers); err != nil {
			return immediate(err)
		}
	}
	for {
		c, eos, err := x.NextResponseBody(nil)
		if err != nil {
			return immediate(err)
		}
		if len(c) > 0 {
			f.Chunks = append(f.Chunks, c)
		}
		if eos {
			break
		}
	}
	f.Body = concat(f.Chunks)
	x.mu.Lock()
	f.Headers = cloneHeaders(x.resp.headers) // BUFFERED body answers may have changed them
	reemitted := x.resp.duplex && x.resp.bodyAnswers > 0
	x.mu.Unlock()
	if chunks != nil {
		err := checkContentLength("response", Values(f.Headers, contentLength), Values(resp.Headers, contentLength),
			len(f.Body), totalLen(chunks), reemitted)
		if err != nil {
			x.mu.Lock()
			x.failLocked(err)
			x.mu.Unlock()
			return nil, err
		}
	}
	return f, nil
}

// ---- the end ---------------------------------------------------------------------------------

// Metadata returns the dynamic metadata the server returned so far, merged.
func (x *Exchange) Metadata() *structpb.Struct {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.metadata == nil {
		return nil
	}
	return proto.Clone(x.metadata).(*structpb.Struct)
}

// Notes lists the mutations the proxy ignored so far.
func (x *Exchange) Notes() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]string(nil), x.notes...)
}

// Close half-closes the stream (CloseSend) and waits for the server to end it with OK. It returns
// the exchange's first error: a server that ends otherwise, still owes answers, sends anything
// more, or does not end the stream within the message timeout is an error.
func (x *Exchange) Close() error {
	x.mu.Lock()
	if x.closed {
		err := x.err
		x.mu.Unlock()
		return err
	}
	x.closed = true
	halfClose := x.err == nil && !x.ended
	if halfClose {
		x.closeSent = true
	}
	x.mu.Unlock()
	if halfClose {
		x.sendMu.Lock()
		_ = x.stream.CloseSend() // the receiver reports how the stream ends
		x.sendMu.Unlock()
		_ = x.wait(nil, func() bool { return x.ended }, always, func() error {
			return protoErr(RuleStreamEnd, "stream", "the server did not end the stream within %v after the proxy half-closed it", x.c.messageTimeout)
		})
	}
	x.cancel()
	<-x.recvDone
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.err
}

// Cancel abandons the stream at any point (the client went away), like Envoy resetting it. It
// waits for the exchange's goroutine to stop. Calls in progress return ErrCanceled.
func (x *Exchange) Cancel() {
	x.mu.Lock()
	x.closed = true
	if x.err == nil && !x.ended {
		x.err = ErrCanceled
	}
	x.cancel()
	x.broadcastLocked()
	x.mu.Unlock()
	<-x.recvDone
}
