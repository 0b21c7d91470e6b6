package devgateway

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"

	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/pkg/gateway"
)

// HealthPath is answered by the gateway itself (200) instead of being proxied: it says the
// gateway is up, for scripts and tests waiting on it.
const HealthPath = "/health"

// Gateway is the HTTP handler. Create it with New; it is safe for concurrent use.
type Gateway struct {
	o         Options
	dp        *dataplane.Client
	transport *http.Transport
	rr        atomic.Uint64
}

// New returns a gateway for o.
func New(o Options) (*Gateway, error) {
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	g := &Gateway{o: o, transport: newTransport(o.ConnectTimeout)}
	if o.Policy == PolicyPicker {
		g.dp = dataplane.New(o.Picker, dataplane.WithMessageTimeout(o.MessageTimeout))
	}
	return g, nil
}

// Close releases the pooled upstream connections.
func (g *Gateway) Close() { g.transport.CloseIdleConnections() }

// ServeHTTP proxies one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == HealthPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		w.Header().Set("content-type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`)
		return
	}
	start := time.Now()
	// Envoy generates x-request-id before any filter runs; the picker logs with it.
	id := r.Header.Get(gateway.RequestIDHeader)
	if id == "" {
		id = newRequestID()
		r.Header.Set(gateway.RequestIDHeader, id)
	}
	log := g.o.Log.With(zap.String("request_id", id))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.o.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
				"request body exceeds the gateway's limit of "+strconv.FormatInt(g.o.MaxBodyBytes, 10)+" bytes")
			return
		}
		log.Debug("reading the request body failed", zap.Error(err))
		writeError(w, http.StatusBadRequest, "invalid_request_error", "body_read_failed", "reading the request body failed: "+err.Error())
		return
	}
	if len(body) == 0 {
		body = nil // no body: request_headers carries end_of_stream
	}
	rec := &recorder{ResponseWriter: w}
	if g.o.Policy == PolicyPicker {
		g.servePicker(rec, r, log, body)
	} else {
		g.serveDirect(rec, r, log, body)
	}
	if ce := log.Check(zap.DebugLevel, "request"); ce != nil {
		ce.Write(zap.String("path", r.URL.Path), zap.Int("status", rec.status), zap.String("endpoint", rec.served),
			zap.Duration("duration", time.Since(start)))
	}
}

// servePicker is the data plane: ext_proc request path, upstream with fallbacks, ext_proc
// response path.
func (g *Gateway) servePicker(w *recorder, r *http.Request, log *zap.Logger, body []byte) {
	ctx := r.Context()
	// The stream follows the client until the response is complete, not after: a client that
	// hangs up as soon as it has the last byte must not turn a finished stream into a cancelled
	// one (Envoy ends the stream normally then).
	xctx, xcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer xcancel()
	detach := context.AfterFunc(ctx, xcancel)
	defer detach()
	x, err := g.dp.Open(xctx, g.o.Mode)
	if err != nil {
		g.pickerFailed(w, r, log, err)
		return
	}
	// Cancel releases the stream (and its goroutine) on every path; after Close it only waits
	// for what already ended.
	defer x.Cancel()

	routed, err := x.Request(&dataplane.HTTPRequest{
		Method:    r.Method,
		Path:      r.URL.RequestURI(),
		Authority: r.Host,
		Headers:   requestHeaders(r, len(body)),
		Body:      body,
	})
	if err != nil {
		g.pickerFailed(w, r, log, err)
		return
	}
	if im := routed.Immediate; im != nil {
		writeImmediate(w, im)
		detach()
		_ = x.Close()
		return
	}
	method, path, host := r.Method, r.URL.RequestURI(), r.Host
	if v, ok := dataplane.Lookup(routed.Headers, ":path"); ok {
		path = v
	}
	up, err := g.forward(ctx, log, parseDestinations(routed.Destination), method, path, host, routed.Headers, routed.Body)
	if err != nil {
		if ctx.Err() != nil {
			return // the client went away
		}
		// Envoy's local reply goes through ext_proc's response path too, with no served
		// endpoint: the picker learns that the request failed.
		up = localReply(err)
	}
	g.respond(w, r, log, x, up, detach)
}

// serveDirect is the baseline: no ext_proc, endpoints in turn (or at random).
func (g *Gateway) serveDirect(w *recorder, r *http.Request, log *zap.Logger, body []byte) {
	eps := g.o.Endpoints
	var first int
	if g.o.Policy == PolicyRandom {
		first = rand.IntN(len(eps))
	} else {
		first = int((g.rr.Add(1) - 1) % uint64(len(eps)))
	}
	// A connection failure moves on to the next endpoint, as Envoy's retry policy would with
	// a normal load balancer: the same two retries the picker's fallbacks give.
	dests := make([]string, 0, 3)
	for i := 0; i < min(3, len(eps)); i++ {
		dests = append(dests, eps[(first+i)%len(eps)])
	}
	up, err := g.forward(r.Context(), log, dests, r.Method, r.URL.RequestURI(), r.Host, requestHeaders(r, len(body)), body)
	if err != nil {
		if r.Context().Err() != nil {
			return
		}
		up = localReply(err)
	}
	defer up.close()
	w.served = up.served
	copyHeaders(w.Header(), responseHeaders(up.header, up.contentLength))
	w.WriteHeader(up.status)
	if up.body == nil {
		return
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := up.body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			w.Flush()
		}
		if err == io.EOF {
			writeTrailers(w, toHeaders(up.trailer()))
			return
		}
		if err != nil {
			log.Warn("upstream response failed mid-body", zap.String("endpoint", up.served), zap.Error(err))
			if r.Context().Err() == nil {
				panic(http.ErrAbortHandler) // only a reset tells the client the body is incomplete
			}
			return
		}
	}
}

// upstream is a model server's response (or the gateway's local reply).
type upstream struct {
	status        int
	header        http.Header
	contentLength int64     // -1: unknown
	body          io.Reader // nil: no body
	trailer       func() http.Header
	served        string // "" for a local reply
	cancel        context.CancelFunc
	closer        io.Closer
}

func (u *upstream) close() {
	if u.closer != nil {
		_ = u.closer.Close()
	}
	if u.cancel != nil {
		u.cancel()
	}
}

var errNoDestination = errors.New("the picker named no valid destination")

// upstreamError is the last attempt's failure, classified for the local reply.
type upstreamError struct {
	err     error
	timeout bool
}

func (e *upstreamError) Error() string { return e.err.Error() }
func (e *upstreamError) Unwrap() error { return e.err }

// forward sends the request to dests in order: the next one is tried when a connection cannot
// be made, or (RetryOnReset) when the connection broke before any response header. hs are
// request headers as the data plane holds them (pseudo headers are skipped).
func (g *Gateway) forward(ctx context.Context, log *zap.Logger, dests []string, method, path, host string, hs []dataplane.Header, body []byte) (*upstream, error) {
	if len(dests) == 0 {
		return nil, &upstreamError{err: errNoDestination}
	}
	var last *upstreamError
	for i, dest := range dests {
		uctx, cancel := context.WithTimeout(ctx, g.o.UpstreamTimeout)
		var rb io.Reader = http.NoBody
		if body != nil {
			rb = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(uctx, method, "http://"+dest+path, rb)
		if err != nil {
			cancel()
			return nil, &upstreamError{err: err}
		}
		req.Host = host
		for _, h := range hs {
			if strings.HasPrefix(h.Key, ":") || h.Key == "content-length" || h.Key == "host" || hopByHop[h.Key] {
				continue
			}
			req.Header.Add(h.Key, h.Value)
		}
		req.ContentLength = int64(len(body))
		resp, err := g.transport.RoundTrip(req)
		if err == nil {
			up := &upstream{
				status: resp.StatusCode, header: resp.Header, contentLength: resp.ContentLength,
				trailer: func() http.Header { return resp.Trailer },
				served:  dest, cancel: cancel, closer: resp.Body,
			}
			if resp.ContentLength != 0 && method != http.MethodHead && resp.StatusCode != http.StatusNoContent &&
				resp.StatusCode != http.StatusNotModified {
				up.body = resp.Body
			}
			if i > 0 {
				log.Info("served by a fallback", zap.String("endpoint", dest), zap.Int("attempt", i+1))
			}
			return up, nil
		}
		timedOut := errors.Is(uctx.Err(), context.DeadlineExceeded)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		dialFailed := isDialError(err)
		last = &upstreamError{err: err, timeout: timedOut}
		retry := !timedOut && (dialFailed || g.o.RetryOnReset) && i+1 < len(dests)
		log.Warn("upstream attempt failed", zap.String("endpoint", dest), zap.Int("attempt", i+1),
			zap.Bool("connect_failure", dialFailed), zap.Bool("timeout", timedOut), zap.Bool("retrying", retry), zap.Error(err))
		if !retry {
			break
		}
	}
	return nil, last
}

// localReply is the gateway's own answer when no model server answered: Envoy's 503
// "upstream connect error or disconnect/reset before headers", or 504 on the route timeout.
func localReply(err error) *upstream {
	status, code, msg := http.StatusServiceUnavailable, "upstream_unavailable",
		"no model server could be reached: "+err.Error()
	var ue *upstreamError
	if errors.As(err, &ue) {
		switch {
		case ue.timeout:
			status, code, msg = http.StatusGatewayTimeout, "upstream_timeout", "the model server did not answer in time"
		case errors.Is(ue.err, errNoDestination):
			msg = "no model server to route to: " + ue.err.Error()
		}
	}
	b := errorBody(typeForStatus(status), code, msg)
	return &upstream{
		status:        status,
		header:        http.Header{"Content-Type": {"application/json"}},
		contentLength: int64(len(b)),
		body:          bytes.NewReader(b),
		trailer:       func() http.Header { return nil },
	}
}

// respond runs the response path through ext_proc and writes what the proxy would forward.
// detach stops a client disconnect from cancelling the stream, once the response is complete.
func (g *Gateway) respond(w *recorder, r *http.Request, log *zap.Logger, x *dataplane.Exchange, up *upstream, detach func() bool) {
	defer up.close()
	ctx := r.Context()
	w.served = up.served
	out, im, err := x.ResponseHeaders(up.status, responseHeaders(up.header, up.contentLength), up.served, up.body == nil)
	if err != nil {
		g.pickerFailed(w, r, log, err)
		return
	}
	if im != nil {
		writeImmediate(w, im)
		return
	}
	status := up.status
	if v, ok := dataplane.Lookup(out, ":status"); ok {
		if s, err := strconv.Atoi(v); err == nil {
			status = s
		}
	}
	copyHeaders(w.Header(), out)
	w.WriteHeader(status)
	w.Flush() // the client sees the headers before the first token
	if up.body == nil {
		g.finish(log, x, detach)
		return
	}

	// The upstream body is fed to the picker in one goroutine while this one writes what the
	// picker re-emits: an SSE event reaches the client as soon as the picker answers it.
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan pumpResult, 1)
	go func() { done <- pump(x, up, stop) }()
	abort := func(why string, err error) {
		up.close() // unblocks the pump's read
		x.Cancel() // unblocks the pump's sends
		pr := <-done
		if ctx.Err() != nil {
			return // the client went away: nothing to tell it
		}
		if pr.err != nil {
			err = pr.err
		}
		log.Warn(why, zap.String("endpoint", up.served), zap.Error(err))
		panic(http.ErrAbortHandler) // the response started: only a reset tells the client it is incomplete
	}
	for {
		chunk, eos, err := x.NextResponseBody(pctx)
		if err != nil {
			abort("response body failed", err)
			return
		}
		if len(chunk) > 0 {
			if _, err := w.Write(chunk); err != nil {
				abort("writing to the client failed", err)
				return
			}
			w.Flush()
		}
		if eos {
			break
		}
	}
	pr := <-done
	if pr.err != nil {
		log.Warn("response body failed after its end", zap.Error(pr.err))
	}
	writeTrailers(w, pr.trailers)
	g.finish(log, x, detach)
}

// finish ends a stream whose response was delivered.
func (g *Gateway) finish(log *zap.Logger, x *dataplane.Exchange, detach func() bool) {
	if !detach() {
		// The client left before the response was complete: the stream was cancelled.
		return
	}
	if err := x.Close(); err != nil {
		log.Warn("ext_proc stream ended badly", zap.Error(err))
	}
}

type pumpResult struct {
	trailers []dataplane.Header
	err      error
}

// pump feeds the upstream body to the proxy chunk by chunk as it is read, then its end
// (trailers, or an empty end_of_stream chunk). On failure it calls stop so that the writer
// stops waiting.
func pump(x *dataplane.Exchange, up *upstream, stop context.CancelFunc) (res pumpResult) {
	defer func() {
		if res.err != nil {
			stop()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := up.body.Read(buf)
		if n > 0 {
			// The exchange keeps the chunk until the picker answers it: copy.
			if serr := x.ResponseBody(bytes.Clone(buf[:n]), false); serr != nil {
				return pumpResult{err: serr}
			}
		}
		if err == io.EOF {
			if tr := toHeaders(up.trailer()); len(tr) > 0 {
				out, terr := x.ResponseTrailers(tr)
				return pumpResult{trailers: out, err: terr}
			}
			return pumpResult{err: x.ResponseBody(nil, true)}
		}
		if err != nil {
			return pumpResult{err: &upstreamError{err: err}}
		}
	}
}

// pickerFailed answers a request whose ext_proc stream failed, as Envoy does without
// failure_mode_allow: StatusOnError (504 on a deadline), without going upstream.
func (g *Gateway) pickerFailed(w *recorder, r *http.Request, log *zap.Logger, err error) {
	if r.Context().Err() != nil {
		return // the client went away: the stream failed because of it
	}
	status := g.o.StatusOnError
	var se *dataplane.StreamError
	if errors.As(err, &se) && se.HTTPStatus == http.StatusGatewayTimeout {
		status = http.StatusGatewayTimeout
	}
	var pe *dataplane.ProtocolError
	if errors.As(err, &pe) {
		log.Error("the picker broke the ext_proc protocol", zap.Error(err))
	} else {
		log.Warn("ext_proc stream failed", zap.Error(err))
	}
	if w.wrote {
		panic(http.ErrAbortHandler)
	}
	msg := "the endpoint picker failed: " + err.Error()
	if se != nil && se.Status.Code() == codes.Unavailable {
		msg = "the endpoint picker is unavailable: " + se.Status.Message()
	}
	writeError(w, status, typeForStatus(status), "ext_proc_error", msg)
}

func typeForStatus(status int) string {
	switch {
	case status == http.StatusGatewayTimeout:
		return "timeout_error"
	case status >= 500:
		return "service_unavailable_error"
	}
	return "invalid_request_error"
}

// recorder remembers what was written, for logs and for knowing whether headers went out.
type recorder struct {
	http.ResponseWriter
	status int
	wrote  bool
	served string
}

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if !r.wrote {
		r.status, r.wrote = http.StatusOK, true
	}
	return r.ResponseWriter.Write(b)
}

// Flush sends what was written so far: every SSE chunk is flushed on its own.
func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// newTransport is the pool of keep-alive connections to the model servers. Dial errors are
// marked so that a connection failure (retry on the next fallback) is told apart from a
// failure after the request went out.
func newTransport(connectTimeout time.Duration) *http.Transport {
	d := &net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy: nil, // loopback model servers: never through an environment proxy
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &dialError{err}
			}
			return c, nil
		},
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		// Pass Accept-Encoding and compressed bodies through untouched, as a proxy does.
		DisableCompression: true,
	}
}

type dialError struct{ err error }

func (e *dialError) Error() string { return "connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

func isDialError(err error) bool {
	var de *dialError
	return errors.As(err, &de)
}

func newRequestID() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // UUID v4, as Envoy generates
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
