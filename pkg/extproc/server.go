// Package extproc is the Envoy ext_proc server: one gRPC stream per HTTP request, in every body
// mode the proxy may be configured with. It reads the request, asks the router pipeline for an
// endpoint, answers with the x-gateway-destination-endpoint header and the matching envoy.lb
// dynamic metadata, and follows the response so that the pipeline learns the outcome.
// docs/protocol.md has the rules it follows.
package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/router"
)

// Options configure the server.
type Options struct {
	// MaxBodyBytes bounds the request body buffered for routing; larger bodies get 413.
	MaxBodyBytes int64
	// ChunkBytes bounds each body chunk sent back in FULL_DUPLEX_STREAMED mode.
	ChunkBytes int
	// AssumedBodyMode is the body mode assumed for both directions when the proxy sends no
	// protocol_config (proxies older than Envoy 1.34), by its name in the ext_proc API
	// ("FULL_DUPLEX_STREAMED", "BUFFERED", "NONE", ...). "" means FULL_DUPLEX_STREAMED, what
	// inference gateways configure; NONE is a mode like the others (route at the headers), not
	// "unset".
	AssumedBodyMode string
	Log             *zap.Logger
	Metrics         *Metrics // nil: no metrics
	// ExplainHeader lets a client ask, with the request header x-kvpick-explain: 1, for the
	// decision's score breakdown in the response header of the same name (explain.go).
	ExplainHeader bool
	// MatchBlocks, when set, gives explanations how many leading prompt blocks an endpoint
	// likely holds and how many the prompt has (the runner wires the prefix scorer's findings).
	MatchBlocks func(req *router.Request, ep *router.Endpoint) (match, total int)
}

// Server implements the ExternalProcessor service.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	pipe     *router.Pipeline
	opt      Options
	assumed  filterv3.ProcessingMode_BodySendMode // Options.AssumedBodyMode
	bufs     [(maxBufClass-minBufClass)/2 + 1]sync.Pool
	tails    sync.Pool // *[]byte of capacity openai.UsageTailBytes
	parsers  sync.Pool // *openai.Request
	explains sync.Pool // *router.Explanation
	once     sync.Once
	// warned: one warning per degraded-mode reason (degraded.go).
	warned [len(degradedReasons)]sync.Once
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// New returns a server that routes with pipe.
func New(pipe *router.Pipeline, opt Options) (*Server, error) {
	if opt.MaxBodyBytes <= 0 {
		return nil, fmt.Errorf("extproc: MaxBodyBytes must be positive")
	}
	if opt.ChunkBytes <= 0 {
		return nil, fmt.Errorf("extproc: ChunkBytes must be positive")
	}
	if opt.Log == nil {
		opt.Log = zap.NewNop()
	}
	assumed := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if opt.AssumedBodyMode != "" {
		v, ok := filterv3.ProcessingMode_BodySendMode_value[opt.AssumedBodyMode]
		if !ok {
			return nil, fmt.Errorf("extproc: unknown body mode %q", opt.AssumedBodyMode)
		}
		assumed = filterv3.ProcessingMode_BodySendMode(v)
	}
	return &Server{pipe: pipe, opt: opt, assumed: assumed}, nil
}

// phase is where a stream is in the request's life.
type phase uint8

const (
	phaseStart   phase = iota // waiting for request headers
	phaseHolding              // headers seen; reading the body before routing
	phaseRouted               // routing sent; remaining request messages pass through
)

type stream struct {
	s   *Server
	srv extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context
	log *zap.Logger

	configured    bool
	reqMode       filterv3.ProcessingMode_BodySendMode
	respMode      filterv3.ProcessingMode_BodySendMode
	bodyNoWait    bool // send_body_without_waiting_for_header_response
	phase         phase
	req           router.Request
	body          *openai.Request // pooled; nil outside parse..routing
	buf           []byte
	heldChunks    int    // STREAMED: body messages awaiting an answer until routing
	contentLength string // the request's content-length header, if any
	generatedID   bool
	parses        int    // body parse attempts, for tests: STREAMED must not re-parse per chunk
	wantExplain   bool   // the client asked for the explanation header, and it is enabled
	explained     string // the explanation header's value, once routed
	objEnd        objectEnd
	triedEarly    bool // STREAMED: the parse at the object's end was tried

	decision   router.Decision
	scheduled  bool
	dest       string
	status     int     // upstream response status, 0 until response headers
	servedAddr string  // the endpoint the proxy reports as served ("" when it does not say)
	usageTail  *[]byte // the end of a 2xx response body, for its usage report (nil: not wanted)
	firstByte  bool    // the response body's first byte was reported to the pipeline
	// What the response side showed, to tell a proxy that does not send it (degraded.go).
	respHeadersSeen, respHeadersEnd, respRestSeen, halfClosed bool
	outcome                                                   string // for metrics
	started                                                   time.Time
}

// Process handles one HTTP request's stream. It returns when the proxy half-closes the stream
// (status OK), after an ImmediateResponse, or when the stream is cancelled; in every case the
// request leaves the pipeline's accounting before Process returns. A panic (a plugin's bug)
// fails this stream alone (recovered).
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) (err error) {
	st := &stream{s: s, srv: srv, ctx: srv.Context(), log: s.opt.Log, started: time.Now()}
	if m := s.opt.Metrics; m != nil {
		m.streams.Inc()
		defer m.streams.Dec()
	}
	defer func() {
		if r := recover(); r != nil {
			err = st.recovered(r)
		}
		st.finish()
	}()
	for {
		msg, err := srv.Recv()
		if err == io.EOF {
			st.halfClosed = true
			return nil
		}
		if err != nil {
			if st.outcome == "" {
				st.outcome = "cancelled"
			}
			if status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
				return status.Error(codes.Canceled, "stream cancelled by the proxy")
			}
			return err
		}
		done, err := st.handle(msg)
		if err != nil {
			st.log.Debug("stream send failed", st.id(), zap.Error(err))
			if st.outcome == "" {
				st.outcome = "cancelled"
			}
			return err
		}
		if done {
			return nil
		}
	}
}

// handle processes one message; done means the stream should end with OK now.
func (st *stream) handle(msg *extprocv3.ProcessingRequest) (done bool, err error) {
	if !st.configured {
		st.configure(msg)
	}
	if msg.GetObservabilityMode() {
		// The proxy ignores answers in observability mode, and routing cannot happen: step
		// out of the request at once so that nothing is held for it.
		return true, nil
	}
	switch r := msg.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.onRequestHeaders(msg, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.onRequestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.onRequestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		st.respHeadersSeen, st.respHeadersEnd = true, r.ResponseHeaders.GetEndOfStream()
		return false, st.onResponseHeaders(msg, r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		st.respRestSeen = true
		return false, st.onResponseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.respRestSeen = true
		if err := st.srv.Send(responseTrailersResponse()); err != nil {
			return false, err
		}
		st.reportUsage() // trailers end the response
		return false, nil
	default:
		// A message carrying only flow-control fields needs no answer.
		return false, nil
	}
}

// configure reads protocol_config, which only the first message of a stream carries.
func (st *stream) configure(msg *extprocv3.ProcessingRequest) {
	st.configured = true
	pc := msg.GetProtocolConfig()
	if pc == nil {
		st.reqMode, st.respMode = st.s.assumed, st.s.assumed
		return
	}
	st.reqMode = pc.GetRequestBodyMode()
	st.respMode = pc.GetResponseBodyMode()
	st.bodyNoWait = pc.GetSendBodyWithoutWaitingForHeaderResponse()
}

func (st *stream) onRequestHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	if st.phase != phaseStart {
		return true, st.srv.Send(st.reject(500, "internal_error", "protocol_error", "", "request headers received twice"))
	}
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":path":
			st.req.Path = headerValue(hv)
		case ":method":
			st.req.Method = headerValue(hv)
		case RequestIDHeader:
			st.req.ID = headerValue(hv)
		case contentLengthHeader:
			st.contentLength = headerValue(hv)
		case ExplainHeader:
			st.wantExplain = st.s.opt.ExplainHeader && explainAsked(headerValue(hv))
		}
	}
	if st.req.ID == "" {
		st.req.ID = newRequestID()
		st.generatedID = true
	}
	st.req.API = openai.APIForPath(st.req.Path)
	st.req.Subset, st.req.HasSubset = subsetHint(msg.GetMetadataContext())

	switch {
	case h.GetEndOfStream():
		// No body: GET, or a POST without one.
		if st.req.API != openai.APIOther {
			return true, st.srv.Send(st.reject(400, "invalid_request_error", "missing_body", "",
				"this endpoint requires a JSON request body"))
		}
		return st.routeAtHeaders(false)
	case st.req.API == openai.APIOther:
		// Nothing in the body matters for routing: route now and stream the body through.
		return st.routeAtHeaders(true)
	}
	switch st.reqMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		st.phase = phaseHolding
		return false, nil
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		// The proxy waits for this answer before sending the body: answer now, route on the
		// body answer.
		st.phase = phaseHolding
		return false, st.srv.Send(headersResponse(&extprocv3.CommonResponse{}))
	case filterv3.ProcessingMode_STREAMED:
		if st.bodyNoWait {
			st.phase = phaseHolding
			return false, nil
		}
	}
	// STREAMED without send_body_without_waiting_for_header_response, NONE, or a mode this
	// version does not know: the body cannot be read before the headers are answered.
	st.s.once.Do(func() {
		st.log.Warn("the proxy's body mode does not let the picker read request bodies before routing; "+
			"routing by load alone (configure FULL_DUPLEX_STREAMED, or BUFFERED)",
			st.id(), zap.String("request_body_mode", st.reqMode.String()))
	})
	return st.routeAtHeaders(true)
}

// routeAtHeaders routes without a body and answers the request headers.
func (st *stream) routeAtHeaders(hasBody bool) (bool, error) {
	if resp := st.schedule(); resp != nil {
		return true, st.srv.Send(resp)
	}
	st.phase = phaseRouted
	cl := ""
	if hasBody {
		// The body passes unchanged; restore content-length where the proxy drops it
		// (FULL_DUPLEX_STREAMED, STREAMED, BUFFERED_PARTIAL), harmless where it does not.
		cl = st.contentLength
	}
	resp := headersResponse(st.routeCommon(cl))
	resp.DynamicMetadata = routeMetadata(st.dest)
	return false, st.srv.Send(resp)
}

func (st *stream) onRequestBody(b *extprocv3.HttpBody) (bool, error) {
	switch st.phase {
	case phaseRouted:
		return false, st.passRequestBody(b)
	case phaseStart:
		return true, st.srv.Send(st.reject(500, "internal_error", "protocol_error", "", "request body before headers"))
	}
	switch st.reqMode {
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		// The whole (or cut) body in one message, held by the proxy: no copy needed.
		if int64(len(b.GetBody())) > st.s.opt.MaxBodyBytes {
			return true, st.srv.Send(st.tooLarge())
		}
		partial := st.reqMode == filterv3.ProcessingMode_BUFFERED_PARTIAL && !b.GetEndOfStream()
		return st.complete(b.GetBody(), b.GetEndOfStream(), partial)
	}
	if int64(len(st.buf))+int64(len(b.GetBody())) > st.s.opt.MaxBodyBytes {
		return true, st.srv.Send(st.tooLarge())
	}
	if st.buf == nil {
		st.buf = st.s.getBuf(st.contentLength)
	}
	st.buf = st.s.appendBody(st.buf, b.GetBody(), st.s.opt.MaxBodyBytes)
	if st.reqMode == filterv3.ProcessingMode_STREAMED {
		st.heldChunks++
		// In STREAMED mode the proxy sends trailers only once every chunk is answered, and
		// chunks cannot be answered before the headers: a body that ends with trailers would
		// never end. Route as soon as the body is a complete JSON object instead. The scanner
		// looks at each byte once and says when the top-level object closes: one parse per
		// stream, however many chunks end in '}'.
		// Once the object has closed, nothing but whitespace can make the body valid: a body
		// that does not parse then is answered now (400), not at an end that cannot come.
		if st.objEnd.feed(b.GetBody()) && !b.GetEndOfStream() && !st.triedEarly {
			st.triedEarly = true
			return st.complete(st.buf, false, false)
		}
	}
	if !b.GetEndOfStream() {
		return false, nil
	}
	return st.complete(st.buf, true, false)
}

func (st *stream) onRequestTrailers() (bool, error) {
	if st.phase == phaseHolding {
		// Trailers end the body.
		body := st.buf
		if st.reqMode == filterv3.ProcessingMode_BUFFERED || st.reqMode == filterv3.ProcessingMode_BUFFERED_PARTIAL {
			body = nil // the proxy sends trailers before a body only when there is none
		}
		if done, err := st.complete(body, false, false); done || err != nil {
			return done, err
		}
	}
	return false, st.srv.Send(requestTrailersResponse())
}

// complete routes on the whole body and sends every answer the mode requires.
// eos: the body ended with end_of_stream (not with trailers). partial: the proxy may have cut it.
func (st *stream) complete(body []byte, eos, partial bool) (bool, error) {
	start := time.Now()
	if err := st.parse(body); err != nil {
		if !partial {
			var pe *openai.Error
			if errors.As(err, &pe) {
				return true, st.srv.Send(st.reject(pe.Status, pe.Type, pe.Code, pe.Param, pe.Message))
			}
			return true, st.srv.Send(st.reject(400, "invalid_request_error", "invalid_body", "", err.Error()))
		}
		// A body the proxy cut at its buffer limit: route by load alone.
		st.releaseParser()
		return st.route(body, eos, start)
	}
	return st.routeParsed(body, eos, start)
}

// parse parses the request body into st.body, a pooled parser: its scratch (the structural
// index of the body, interned names) is reused across requests and held only until routing.
func (st *stream) parse(body []byte) error {
	st.parses++
	if st.body == nil {
		st.body = st.s.getParser()
	}
	return openai.Parse(st.req.API, body, st.body)
}

// releaseParser returns the parser to the pool; the request must no longer refer to it.
func (st *stream) releaseParser() {
	st.req.Body = nil
	if st.body != nil {
		st.s.putParser(st.body)
		st.body = nil
	}
}

// routeParsed routes a request whose body st.body holds, parsed.
func (st *stream) routeParsed(body []byte, eos bool, start time.Time) (bool, error) {
	st.req.Body = st.body
	st.req.Model = st.body.Model
	return st.route(body, eos, start)
}

// route schedules the request and sends every answer the body mode requires, then lets the
// body go.
func (st *stream) route(body []byte, eos bool, start time.Time) (bool, error) {
	done, err := st.answer(body, eos, start)
	st.releaseBody()
	return done, err
}

func (st *stream) answer(body []byte, eos bool, start time.Time) (bool, error) {
	resp := st.schedule()
	if m := st.s.opt.Metrics; m != nil {
		m.decision.Observe(time.Since(start).Seconds())
	}
	if resp != nil {
		return true, st.srv.Send(resp)
	}
	st.phase = phaseRouted
	md := routeMetadata(st.dest)
	switch st.reqMode {
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		// Header mutations ride on the body answer in BUFFERED mode. The body passes
		// unchanged, so the client's content-length is right; BUFFERED_PARTIAL drops it.
		r := requestBodyResponse(st.routeCommon(st.contentLength))
		r.DynamicMetadata = md
		return false, st.srv.Send(r)
	case filterv3.ProcessingMode_STREAMED:
		// The proxy drops content-length in this mode; the body passes unchanged (and may not
		// be complete yet, when it ends with trailers), so restore the client's.
		r := headersResponse(st.routeCommon(st.contentLength))
		r.DynamicMetadata = md
		if err := st.srv.Send(r); err != nil {
			return false, err
		}
		for ; st.heldChunks > 0; st.heldChunks-- {
			if err := st.srv.Send(requestBodyResponse(&extprocv3.CommonResponse{})); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	// FULL_DUPLEX_STREAMED: headers answer, then the whole body re-emitted in bounded chunks.
	r := headersResponse(st.routeCommon(strconv.Itoa(len(body))))
	r.DynamicMetadata = md
	if err := st.srv.Send(r); err != nil {
		return false, err
	}
	return false, st.emitBody(body, eos)
}

// emitBody sends body back in chunks of at most ChunkBytes, end_of_stream on the last one when
// the input ended with end_of_stream. An empty body is one empty chunk.
func (st *stream) emitBody(body []byte, eos bool) error {
	n := st.s.opt.ChunkBytes
	for off := 0; ; off += n {
		end := min(off+n, len(body))
		last := end == len(body)
		if err := st.srv.Send(requestBodyResponse(streamed(body[off:end], eos && last))); err != nil {
			return err
		}
		if last {
			return nil
		}
	}
}

// passRequestBody answers a body message after routing: echoed in FULL_DUPLEX_STREAMED, left
// unchanged otherwise.
func (st *stream) passRequestBody(b *extprocv3.HttpBody) error {
	if st.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return st.emitBody(b.GetBody(), b.GetEndOfStream())
	}
	return st.srv.Send(requestBodyResponse(&extprocv3.CommonResponse{}))
}

// schedule asks the pipeline for an endpoint; a non-nil result is the ImmediateResponse to send.
func (st *stream) schedule() *extprocv3.ProcessingResponse {
	// An explanation is collected only when someone reads it: the debug log, or a client that
	// asked for the header. Otherwise the pipeline sees a nil Explain and allocates nothing.
	var ex *router.Explanation
	if st.wantExplain || st.log.Core().Enabled(zapcore.DebugLevel) {
		ex = st.s.getExplanation()
		st.req.Explain = ex
		defer st.s.putExplanation(ex)
	}
	d, err := st.s.pipe.Schedule(st.ctx, &st.req)
	st.req.Explain = nil
	if err != nil {
		var re *router.Error
		if errors.As(err, &re) {
			st.log.Info("request not routed", st.id(), zap.Int("status", re.Status), zap.String("reason", re.Message))
			return st.reject(re.Status, re.Type, re.Code, "", re.Message)
		}
		return st.reject(500, "internal_error", "routing_failed", "", err.Error())
	}
	st.decision, st.scheduled = d, true
	st.dest = d.Endpoint.Addr
	if len(d.Fallbacks) > 0 {
		var sb strings.Builder
		sb.WriteString(d.Endpoint.Addr)
		for _, e := range d.Fallbacks {
			sb.WriteByte(',')
			sb.WriteString(e.Addr)
		}
		st.dest = sb.String()
	}
	if ce := st.log.Check(zap.DebugLevel, "routed"); ce != nil {
		fields := []zap.Field{st.id(), zap.String("endpoint", st.dest), zap.String("model", st.req.Model),
			zap.String("path", st.req.Path)}
		if ex != nil {
			fields = append(fields, zap.Array("candidates", candidates{st, ex}))
		}
		ce.Write(fields...)
	}
	if st.wantExplain && ex != nil {
		st.explained = st.explainText(ex)
	}
	return nil
}

// routeCommon is the header mutation that carries the decision.
func (st *stream) routeCommon(contentLength string) *extprocv3.CommonResponse {
	set := []*corev3.HeaderValueOption{setHeader(DestinationHeader, st.dest)}
	if contentLength != "" {
		set = append(set, setHeader(contentLengthHeader, contentLength))
	}
	if st.generatedID {
		set = append(set, setHeader(RequestIDHeader, st.req.ID))
	}
	return &extprocv3.CommonResponse{
		HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set},
		ClearRouteCache: true,
	}
}

func (st *stream) reject(code int, typ, errCode, param, msg string) *extprocv3.ProcessingResponse {
	st.outcome = "rejected"
	st.status = code
	return immediate(code, typ, errCode, param, msg, st.req.ID)
}

func (st *stream) tooLarge() *extprocv3.ProcessingResponse {
	return st.reject(413, "invalid_request_error", "request_too_large", "",
		fmt.Sprintf("request body exceeds the limit of %d bytes", st.s.opt.MaxBodyBytes))
}

func (st *stream) onResponseHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	cl := ""
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":status":
			st.status, _ = strconv.Atoi(headerValue(hv))
		case contentLengthHeader:
			cl = headerValue(hv)
		}
	}
	if st.scheduled {
		st.servedAddr = servedEndpoint(msg.GetMetadataContext())
		st.s.pipe.ResponseHeaders(&st.req, st.decision.Endpoint, st.servedAddr, st.status)
	}
	if st.status >= 200 && st.status <= 299 {
		st.outcome = "success"
	} else {
		st.outcome = "upstream_error"
	}
	common := &extprocv3.CommonResponse{}
	if cl != "" && st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && !h.GetEndOfStream() {
		// The proxy drops content-length in this mode; the body passes unchanged.
		common.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			setHeader(contentLengthHeader, cl),
		}}
	}
	if st.explained != "" {
		if common.HeaderMutation == nil {
			common.HeaderMutation = &extprocv3.HeaderMutation{}
		}
		common.HeaderMutation.SetHeaders = append(common.HeaderMutation.SetHeaders, setHeader(ExplainHeader, st.explained))
	}
	return st.srv.Send(responseHeadersResponse(common))
}

// onResponseBody passes response chunks on as they come: LLM responses are often SSE streams,
// and holding them would destroy the client's time to first token.
func (st *stream) onResponseBody(b *extprocv3.HttpBody) error {
	if !st.firstByte && st.scheduled && len(b.GetBody()) > 0 && st.status >= 200 && st.status <= 299 {
		// For a stream this is the first token: the server's prefill is over (its headers came
		// when the request arrived). Reported before the chunk is passed on, so that a
		// decision racing the client's first token already sees the queue shortened.
		st.firstByte = true
		st.s.pipe.FirstByte(&st.req, st.decision.Endpoint, st.servedAddr)
	}
	st.keepUsageTail(b.GetBody())
	var err error
	if st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		err = st.srv.Send(responseBodyResponse(streamed(b.GetBody(), b.GetEndOfStream())))
	} else {
		err = st.srv.Send(responseBodyResponse(&extprocv3.CommonResponse{}))
	}
	if err == nil && b.GetEndOfStream() {
		// The response is over and its last chunk passed on: hand its usage report to the
		// plugins now, so that the stream's end only has to take the request out of the
		// accounting.
		st.reportUsage()
	}
	return err
}

// keepUsageTail keeps the last openai.UsageTailBytes of a successful response's body, where the
// server's usage report is, for plugins that learn from it (one copy of at most that much per
// chunk; nothing when no plugin wants usage).
func (st *stream) keepUsageTail(chunk []byte) {
	if !st.scheduled || st.status < 200 || st.status > 299 || !st.s.pipe.WantsUsage() || len(chunk) == 0 {
		return
	}
	if st.usageTail == nil {
		st.usageTail = st.s.getTail()
	}
	t := *st.usageTail
	if len(chunk) >= openai.UsageTailBytes {
		t = append(t[:0], chunk[len(chunk)-openai.UsageTailBytes:]...)
	} else {
		if over := len(t) + len(chunk) - openai.UsageTailBytes; over > 0 {
			t = t[:copy(t, t[over:])]
		}
		t = append(t, chunk...)
	}
	*st.usageTail = t
}

// reportUsage hands the server's usage report, if the response ended with one, to the pipeline,
// once: at the response's end, or at the stream's end for a response whose end the picker does
// not see (BUFFERED_PARTIAL cut it, the stream was cancelled).
func (st *stream) reportUsage() {
	tail := st.usageTail
	if tail == nil {
		return
	}
	st.usageTail = nil // once, even if a plugin panics
	u, ok := openai.ParseUsage(*tail)
	st.s.putTail(tail)
	if ok {
		st.s.pipe.Usage(&st.req, st.decision.Endpoint, st.servedAddr, u)
	}
}

// id is the request id as a log field. Fields are built per log line rather than with a child
// logger per stream: most streams log nothing, and a child logger costs ~1 KB each.
func (st *stream) id() zap.Field { return zap.String("request_id", st.req.ID) }

// releaseBody drops the request body once the routing answers are sent: only the prompt's
// hashes live on, and an LLM stream may stay open for minutes while the response is generated.
func (st *stream) releaseBody() {
	st.releaseParser()
	if st.buf != nil {
		st.s.putBuf(st.buf)
		st.buf = nil
	}
}

// finish runs once the stream is over, however it ended.
func (st *stream) finish() {
	if st.scheduled {
		st.deliverUsage()
		st.done()
		st.reportDegraded()
	}
	// A stream that ended before its request headers (observability mode) is no request.
	if m := st.s.opt.Metrics; m != nil && (st.phase != phaseStart || st.outcome != "") {
		out := st.outcome
		if out == "" {
			out = "cancelled"
		}
		m.observeRequest(out, st.status)
	}
	if st.buf != nil {
		st.s.putBuf(st.buf)
		st.buf = nil
	}
	st.releaseParser()
	st.req.Reset()
}
