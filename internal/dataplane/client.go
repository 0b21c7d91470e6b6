package dataplane

import (
	"context"
	"fmt"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// Mode is the proxy's processing_mode for one stream.
type Mode struct {
	// RequestBody and ResponseBody: NONE, STREAMED, BUFFERED, BUFFERED_PARTIAL or FULL_DUPLEX_STREAMED.
	RequestBody, ResponseBody filterv3.ProcessingMode_BodySendMode
	// SendBodyWithoutWaitingForHeaderResponse (STREAMED only): send chunks before the headers answer.
	SendBodyWithoutWaitingForHeaderResponse bool
	// RequestTrailers and ResponseTrailers: true = SEND, false = SKIP.
	RequestTrailers, ResponseTrailers bool
	// ResponseHeaders: true = SEND, false = SKIP. Request headers are always sent.
	ResponseHeaders bool
	// OmitProtocolConfig emulates old proxies that do not send protocol_config.
	OmitProtocolConfig bool
}

// FullDuplex is the reference wiring of docs/protocol.md: every header and trailer mode SEND, both
// bodies FULL_DUPLEX_STREAMED.
func FullDuplex() Mode {
	return Mode{
		RequestBody:      filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBody:     filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		RequestTrailers:  true,
		ResponseTrailers: true,
		ResponseHeaders:  true,
	}
}

func (m Mode) validate() error {
	for _, d := range []struct {
		name     string
		body     filterv3.ProcessingMode_BodySendMode
		trailers bool
	}{{"request", m.RequestBody, m.RequestTrailers}, {"response", m.ResponseBody, m.ResponseTrailers}} {
		switch d.body {
		case filterv3.ProcessingMode_NONE, filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_BUFFERED,
			filterv3.ProcessingMode_BUFFERED_PARTIAL:
		case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
			if !d.trailers {
				// Envoy rejects this configuration (docs/protocol.md:34).
				return usageError(d.name + " trailer mode must be SEND with FULL_DUPLEX_STREAMED")
			}
		default:
			return usageError(fmt.Sprintf("%s body mode %v is not supported", d.name, d.body))
		}
	}
	return nil
}

func (m Mode) protocolConfig() *extprocv3.ProtocolConfiguration {
	return &extprocv3.ProtocolConfiguration{
		RequestBodyMode:                         m.RequestBody,
		ResponseBodyMode:                        m.ResponseBody,
		SendBodyWithoutWaitingForHeaderResponse: m.SendBodyWithoutWaitingForHeaderResponse,
	}
}

// Option configures a Client.
type Option func(*Client)

// WithChunkSize sets how the proxy splits a body it streams (default 16 KiB, Envoy's buffer size).
func WithChunkSize(n int) Option {
	return func(c *Client) {
		if n > 0 {
			c.chunkSize = n
		}
	}
}

// WithStreamTimeout bounds the life of each stream (default: none beyond the caller's context).
func WithStreamTimeout(d time.Duration) Option { return func(c *Client) { c.streamTimeout = d } }

// WithMessageTimeout sets how long the proxy waits for an answer it is owed (Envoy's
// message_timeout; default 5s, "a long message_timeout" as in the reference wiring). Outside
// FULL_DUPLEX_STREAMED it runs from each message that needs an answer, as in Envoy. Envoy has no
// timer in FULL_DUPLEX_STREAMED; this client still arms it once the whole input of a direction has
// been sent, so a server that never finishes fails a test instead of hanging it. Zero disables.
func WithMessageTimeout(d time.Duration) Option { return func(c *Client) { c.messageTimeout = d } }

// WithBufferLimit sets where BUFFERED_PARTIAL cuts a body (default 1 MiB, Envoy's default
// per-connection buffer limit).
func WithBufferLimit(n int) Option {
	return func(c *Client) {
		if n > 0 {
			c.bufferLimit = n
		}
	}
}

// WithCallOptions adds gRPC call options to every stream.
func WithCallOptions(opts ...grpc.CallOption) Option {
	return func(c *Client) { c.callOpts = append(c.callOpts, opts...) }
}

// Client is an ext_proc client that behaves as Envoy's ext_proc filter documents. It is safe for
// concurrent use; each Exchange is one HTTP request on its own gRPC stream.
type Client struct {
	epc            extprocv3.ExternalProcessorClient
	chunkSize      int
	bufferLimit    int
	streamTimeout  time.Duration
	messageTimeout time.Duration
	callOpts       []grpc.CallOption
}

// New returns a Client over cc (typically one *grpc.ClientConn shared by all exchanges).
func New(cc grpc.ClientConnInterface, opts ...Option) *Client {
	c := &Client{
		epc:            extprocv3.NewExternalProcessorClient(cc),
		chunkSize:      16 << 10,
		bufferLimit:    1 << 20,
		messageTimeout: 5 * time.Second,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Open starts one stream (one HTTP request's life). ctx bounds the whole stream.
func (c *Client) Open(ctx context.Context, mode Mode) (*Exchange, error) {
	if err := mode.validate(); err != nil {
		return nil, err
	}
	var cancel context.CancelFunc
	sctx := ctx
	if c.streamTimeout > 0 {
		sctx, cancel = context.WithTimeout(ctx, c.streamTimeout)
	} else {
		sctx, cancel = context.WithCancel(ctx)
	}
	stream, err := c.epc.Process(sctx, c.callOpts...)
	if err != nil {
		cancel()
		return nil, err
	}
	x := newExchange(c, mode, sctx, cancel, stream)
	go x.recvLoop()
	return x, nil
}

// Do runs one whole HTTP request: Open, Request, then (unless resp is nil or the server answered
// with an ImmediateResponse) Response, then Close. It is the shape the replay benchmark needs.
func (c *Client) Do(ctx context.Context, mode Mode, req *HTTPRequest, resp *HTTPResponse) (*Routed, *Forwarded, error) {
	x, err := c.Open(ctx, mode)
	if err != nil {
		return nil, nil, err
	}
	routed, err := x.Request(req)
	if err != nil {
		x.Cancel()
		return nil, nil, err
	}
	var fwd *Forwarded
	if routed.Immediate == nil && resp != nil {
		if fwd, err = x.Response(resp); err != nil {
			x.Cancel()
			return routed, nil, err
		}
	}
	if err := x.Close(); err != nil {
		return routed, fwd, err
	}
	return routed, fwd, nil
}
