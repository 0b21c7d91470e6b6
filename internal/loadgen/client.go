package loadgen

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/pkg/gateway"
)

// NewRequest prepares a POST /v1/chat/completions with body (dataplane.Prepare: the messages
// Envoy sends in FULL_DUPLEX_STREAMED, encoded once), cut into chunks of chunkBytes. The
// messages point into body: keep it unchanged while the request is in use.
func NewRequest(body []byte, chunkBytes int, requestID string) *dataplane.Prepared {
	return dataplane.Prepare(&dataplane.HTTPRequest{
		Method: "POST", Path: "/v1/chat/completions", Authority: "gateway.example", Scheme: "https",
		Headers: []dataplane.Header{
			{Key: "content-type", Value: "application/json"},
			{Key: "content-length", Value: strconv.Itoa(len(body))},
			{Key: gateway.RequestIDHeader, Value: requestID},
		},
		Body: body,
	}, chunkBytes)
}

// StampNonce makes into a copy of req whose body has nonce, in hex, at offset at (NonceLen
// bytes, where ChatPool.NonceAt says), and returns it (dataplane.Prepared.Stamp).
func StampNonce(req, into *dataplane.Prepared, at int, nonce uint64) *dataplane.Prepared {
	var hex [NonceLen]byte
	const digits = "0123456789abcdef"
	for i := range hex {
		hex[i] = digits[(nonce>>(4*(NonceLen-1-i)))&15]
	}
	return req.Stamp(into, at, hex[:])
}

// Client is the load generator's side of the ext_proc connection: a few gRPC connections, each
// with dataplane's fast path, and the responses it plays back, encoded once per endpoint.
type Client struct {
	conns []*grpc.ClientConn
	dps   []*dataplane.Client
	next  atomic.Uint32

	responses map[string]*playback // by served endpoint
	generic   *playback            // for a destination outside the known pool
	strict    bool                 // the destination must be one of the known endpoints
}

// Dial opens conns connections to addr (plaintext). endpoints, when given, are the picker's
// pool: a destination outside it is an error.
func Dial(addr string, conns int, endpoints []string) (*Client, error) {
	c := &Client{responses: map[string]*playback{}, strict: len(endpoints) > 0}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dataplane.DialOptions()...)
	for range max(conns, 1) {
		cc, err := grpc.NewClient(addr, opts...)
		if err != nil {
			c.Close()
			return nil, err
		}
		cc.Connect()
		c.conns = append(c.conns, cc)
		c.dps = append(c.dps, dataplane.New(cc))
	}
	for _, e := range endpoints {
		c.responses[e] = newPlayback(e)
	}
	c.generic = newPlayback("")
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

// conn returns connection i (modulo the number of connections); a negative i takes them in turn.
func (c *Client) conn(i int) *dataplane.Client {
	if i < 0 {
		i = int(c.next.Add(1))
	}
	return c.dps[i%len(c.dps)]
}

// Error is an exchange that went wrong: Phase says where, Kind is a short stable reason for
// grouping (no request-specific detail), Detail the rest.
type Error struct {
	Phase  string // open, route, body, response-headers, response-body, close
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

// failed classifies an error of the fast path (dataplane's error types) in phase.
func failed(phase string, err error) *Error {
	var pe *dataplane.ProtocolError
	var se *dataplane.StreamError
	var ie *dataplane.ImmediateError
	switch {
	case errors.As(err, &pe):
		return &Error{Phase: phase, Kind: "protocol rule " + string(pe.Rule), Detail: pe.Detail}
	case errors.As(err, &se):
		return &Error{Phase: phase, Kind: "grpc " + se.Status.Code().String(), Detail: se.Status.Message()}
	case errors.As(err, &ie):
		return immediate(phase, ie.Immediate)
	case errors.Is(err, dataplane.ErrServerGone):
		return &Error{Phase: phase, Kind: "stream ended early with OK"}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &Error{Phase: phase, Kind: "canceled", Detail: err.Error()}
	}
	return &Error{Phase: phase, Kind: "stream error", Detail: err.Error()}
}

func immediate(phase string, im *dataplane.Immediate) *Error {
	return &Error{Phase: phase, Kind: fmt.Sprintf("immediate response %d", im.Status), Detail: string(im.Body)}
}

// Held is a stream whose request has been routed and whose body came back, waiting for the
// response (as an LLM request is while the model generates).
type Held struct {
	c *Client
	d *dataplane.Duplex
	// Dest is the routing answer's destination (its first entry when it is a list).
	Dest string
	// Added is the picker's added latency: from sending the request headers to receiving the
	// routing answer and the whole body back.
	Added time.Duration
}

// Open starts a stream on connection conn (-1: the next one in turn), sends req and reads the
// routing answer and the re-emitted body. It checks that the destination is there (in
// raw_value), inside the pool, with clear_route_cache, and that the body came back whole. On
// error the stream is already cancelled.
func (c *Client) Open(ctx context.Context, conn int, req *dataplane.Prepared) (*Held, error) {
	d, err := c.conn(conn).OpenDuplex(ctx)
	if err != nil {
		return nil, failed("open", err)
	}
	start := time.Now()
	r, err := d.Route(req)
	added := time.Since(start)
	var e *Error
	dest, _, _ := strings.Cut(r.Destination, ",")
	switch {
	case err != nil:
		e = failed("route", err)
	case r.Immediate != nil:
		e = immediate("route", r.Immediate)
	case dest == "":
		e = &Error{Phase: "route", Kind: "no destination header"}
	case !r.ClearRouteCache:
		e = &Error{Phase: "route", Kind: "clear_route_cache not set"}
	case c.strict && c.responses[dest] == nil:
		e = &Error{Phase: "route", Kind: "destination outside the pool", Detail: dest}
	case r.Body != req.BodyLen():
		e = &Error{Phase: "body", Kind: "re-emitted body length differs", Detail: fmt.Sprintf("got %d bytes, sent %d", r.Body, req.BodyLen())}
	}
	if e != nil {
		d.Cancel()
		return nil, e
	}
	return &Held{c: c, d: d, Dest: dest, Added: added}, nil
}

// Finish plays a short response: headers (:status 200, the served endpoint in envoy.lb
// metadata), one SSE chunk holding the whole answer, then the half-close, which the picker
// must answer by ending the stream with OK.
func (h *Held) Finish() error { return h.Stream(Tokens{}) }

// Tokens says how Stream plays a response.
type Tokens struct {
	// N is the number of single-token SSE chunks; 0 plays Finish's one-chunk response.
	N int
	// Gap is the time between two tokens; Stop, when it closes, ends the gaps early (the
	// response still completes).
	Gap  time.Duration
	Stop <-chan struct{}
	// Sent, when set, counts the chunks sent.
	Sent *atomic.Int64
}

// Stream plays a response streamed token by token: headers, then t.N SSE chunks of one token
// each (the size and shape vLLM writes) t.Gap apart, then the final chunk with [DONE], then the
// half-close. Each chunk must come back whole before the next is sent: the picker passes a
// response through chunk by chunk.
func (h *Held) Stream(t Tokens) error {
	defer h.d.Cancel()
	p := h.c.responses[h.Dest]
	if p == nil {
		p = h.c.generic
	}
	im, err := h.d.ResponseHeaders(p.headers)
	switch {
	case err != nil:
		return failed("response-headers", err)
	case im != nil:
		return immediate("response-headers", im)
	}
	send := func(m *dataplane.Encoded) error {
		if err := h.d.ResponseChunk(m); err != nil {
			return failed("response-body", err)
		}
		if t.Sent != nil {
			t.Sent.Add(1)
		}
		return nil
	}
	if t.N == 0 {
		if err := send(p.whole); err != nil {
			return err
		}
	} else {
		var timer *time.Timer
		for i := range t.N {
			if t.Gap > 0 && i > 0 {
				if timer == nil {
					timer = time.NewTimer(t.Gap)
					defer timer.Stop()
				} else {
					timer.Reset(t.Gap)
				}
				select {
				case <-timer.C:
				case <-t.Stop:
				}
			}
			if err := send(p.tokens[i%len(p.tokens)]); err != nil {
				return err
			}
		}
		if err := send(p.done); err != nil {
			return err
		}
	}
	if sent, back, ended := h.d.ResponseBody(); sent != back || !ended {
		return &Error{Phase: "response-body", Kind: "response not echoed whole",
			Detail: fmt.Sprintf("sent %d bytes, got %d, end of stream %v", sent, back, ended)}
	}
	if err := h.d.Close(); err != nil {
		return failed("close", err)
	}
	return nil
}

// Abort cancels the stream (as the proxy does when the client goes away).
func (h *Held) Abort() { h.d.Cancel() }

// Exchange runs one whole request on connection conn: Open then Finish. It returns the added
// latency and the destination.
func (c *Client) Exchange(ctx context.Context, conn int, req *dataplane.Prepared) (time.Duration, string, error) {
	h, err := c.Open(ctx, conn, req)
	if err != nil {
		return 0, "", err
	}
	return h.Added, h.Dest, h.Finish()
}
