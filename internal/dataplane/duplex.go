package dataplane

import (
	"context"
	"errors"
	"io"
	"strconv"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// Duplex drives one FULL_DUPLEX_STREAMED stream for load: it sends messages encoded once
// (Prepare, PrepareResponseHeaders, PrepareResponseChunk) and reads each answer into a summary
// instead of an Exchange's whole picture of the request. It has no goroutine of its own: each
// call sends, then reads the answers it waits for. It checks the rules that a summary can see
// (listed at each method) and nothing about what an Exchange reconstructs (header mutation
// semantics, metadata, the forwarded bytes themselves): test a server with an Exchange, load it
// with a Duplex.
type Duplex struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	ctx    context.Context
	cancel context.CancelFunc
	a      answer

	respSent, respBack int  // response body bytes sent and re-emitted
	respEOS            bool // the server re-emitted the response's end
}

// ErrServerGone: the server ended the stream with status OK before answering what the proxy
// waits for. The proxy would go on without it (docs/protocol.md:23); a load test counts it as a
// failure.
var ErrServerGone = errors.New("dataplane: the server ended the stream with OK before answering")

// OpenDuplex starts one stream. ctx bounds it; so does the Client's stream timeout.
func (c *Client) OpenDuplex(ctx context.Context) (*Duplex, error) {
	var cancel context.CancelFunc
	if c.streamTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.streamTimeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	opts := append(c.callOpts[:len(c.callOpts):len(c.callOpts)], grpc.ForceCodecV2(fastCodec{}))
	st, err := c.epc.Process(ctx, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	return &Duplex{stream: st, ctx: ctx, cancel: cancel}, nil
}

// Routing is what the server answered to a request on a Duplex.
type Routing struct {
	// Destination is x-gateway-destination-endpoint as the headers answer set it (raw_value; a
	// list when it carries fallbacks); "" when it did not.
	Destination string
	// ClearRouteCache: the headers answer carried clear_route_cache with a header mutation
	// (Envoy's default route-cache action ignores it otherwise).
	ClearRouteCache bool
	// Body is the number of body bytes the server re-emitted.
	Body int
	// Immediate is set when the server answered with an immediate response instead (the rest is
	// then empty).
	Immediate *Immediate
}

// recv reads the next answer into d.a. The stream's end is io.EOF (status OK) or the error it
// ended with: a *StreamError, or the context's error when the caller ended it.
func (d *Duplex) recv() error {
	err := d.stream.RecvMsg(&d.a)
	if err == nil || err == io.EOF {
		return err
	}
	if c := d.ctx.Err(); c != nil && !errors.Is(c, context.DeadlineExceeded) {
		return c
	}
	return newStreamError(err)
}

// send sends m. A stream the server has ended (io.EOF) is not an error here: the next recv
// reports how it ended.
func (d *Duplex) send(m *Encoded) (ended bool, err error) {
	if err := d.stream.SendMsg(m); err != nil {
		if err == io.EOF {
			return true, nil
		}
		if c := d.ctx.Err(); c != nil && !errors.Is(c, context.DeadlineExceeded) {
			return true, c
		}
		return true, newStreamError(err)
	}
	return false, nil
}

func (a *answer) immediate() *Immediate {
	st := a.status
	if st == 0 {
		st = defaultImmediateCode
	} else if st < minValidImmediateCode {
		st = invalidImmediateCode
	}
	return &Immediate{Status: st, Body: []byte(a.detail)}
}

// Route sends p and reads the routing answer and the re-emitted body. Besides the stream's
// status (*StreamError) and ErrServerGone, it fails with a *ProtocolError when the first answer
// is not the request_headers answer (RuleOrder), the destination is set twice (RuleDestination)
// or in value (RuleHeaderValueOnly, RuleHeaderBothValues), a body answer is not a
// streamed_response (RuleDuplexStreamed, RuleDuplexEmptyBodyAnswer) or is over MaxDuplexChunk
// (RuleDuplexChunkSize), the stream ends before the re-emission's end (RuleDuplexEndOfStream),
// or content-length is not set to the re-emitted length (RuleContentLength). An immediate
// response is not an error: Routing.Immediate.
func (d *Duplex) Route(p *Prepared) (Routing, error) {
	var r Routing
	for _, m := range p.enc {
		if ended, err := d.send(m); err != nil {
			return r, err
		} else if ended {
			break
		}
	}
	a := &d.a
	if err := d.recv(); err == io.EOF {
		return r, ErrServerGone
	} else if err != nil {
		return r, err
	}
	switch a.kind {
	case fImmediate:
		r.Immediate = a.immediate()
		return r, nil
	case fRequestHeaders:
	default:
		return r, protoErr(RuleOrder, "request_headers", "a %s answer where the request_headers answer is owed", a.kindName())
	}
	switch {
	case a.destCount > 1:
		return r, protoErr(RuleDestination, "request_headers", "%s is set %d times (append instead of replace?)", DestinationHeader, a.destCount)
	case a.destInValue && a.dest != "":
		return r, protoErr(RuleHeaderBothValues, "request_headers", "header %q has both value and raw_value set", DestinationHeader)
	case a.destInValue:
		return r, protoErr(RuleHeaderValueOnly, "request_headers", "header %q is set in value only: Envoy reads raw_value", DestinationHeader)
	}
	r.Destination = a.dest
	r.ClearRouteCache = a.clearRouteCache && a.headerMutation
	cl := a.contentLength
	if p.bodyLen == 0 && p.msgs[0].GetRequestHeaders().GetEndOfStream() {
		return r, nil
	}
	for {
		err := d.recv()
		if err == io.EOF {
			if r.Body == 0 {
				return r, ErrServerGone
			}
			return r, protoErr(RuleDuplexEndOfStream, "request_body",
				"the stream ended with status OK after %d re-emitted bytes but before the chunk with end_of_stream=true", r.Body)
		}
		if err != nil {
			return r, err
		}
		switch a.kind {
		case fImmediate:
			return Routing{Immediate: a.immediate()}, nil
		case fRequestBody:
		default:
			return r, protoErr(RuleOrder, "request_body", "a %s answer while the request body's re-emission is owed", a.kindName())
		}
		if err := a.checkStreamed("request_body"); err != nil {
			return r, err
		}
		r.Body += a.bodyLen
		if a.eos {
			break
		}
	}
	switch {
	case cl == "":
		return r, protoErr(RuleContentLength, "request",
			"FULL_DUPLEX_STREAMED: the proxy removed content-length and the server did not set it again (body %d bytes)", r.Body)
	case cl != strconv.Itoa(r.Body):
		return r, protoErr(RuleContentLength, "request", "content-length is %s but the forwarded body has %d bytes", cl, r.Body)
	}
	return r, nil
}

// checkStreamed checks a FULL_DUPLEX_STREAMED body answer.
func (a *answer) checkStreamed(phase string) error {
	switch {
	case !a.streamed && a.bodyMutation:
		return protoErr(RuleDuplexStreamed, phase, "body answers must be body_mutation.streamed_response")
	case !a.streamed:
		return protoErr(RuleDuplexEmptyBodyAnswer, phase,
			"an empty body answer (a CommonResponse without body_mutation.streamed_response): gateways fail the request")
	case a.bodyLen > MaxDuplexChunk:
		return protoErr(RuleDuplexChunkSize, phase, "a streamed chunk of %d bytes: at most %d", a.bodyLen, MaxDuplexChunk)
	}
	return nil
}

// ResponseHeaders sends the upstream response headers (PrepareResponseHeaders) and reads their
// answer. It returns the server's immediate response when it answered with one; an answer of
// another kind is a *ProtocolError (RuleOrder).
func (d *Duplex) ResponseHeaders(m *Encoded) (*Immediate, error) {
	if _, err := d.send(m); err != nil {
		return nil, err
	}
	if err := d.recv(); err == io.EOF {
		return nil, ErrServerGone
	} else if err != nil {
		return nil, err
	}
	switch d.a.kind {
	case fResponseHeaders:
		return nil, nil
	case fImmediate:
		return d.a.immediate(), nil
	}
	return nil, protoErr(RuleOrder, "response_headers", "a %s answer where the response_headers answer is owed", d.a.kindName())
}

// ResponseChunk sends one upstream body chunk (PrepareResponseChunk) and reads answers until
// the server has re-emitted as many bytes as were sent so far, and the end if this chunk is the
// last (or until it re-emits the end: ResponseBody then tells whether every byte came back): the picker passes a response through chunk by chunk (docs/protocol.md:52-53), so a
// server that holds chunks back keeps this call waiting. A body answer that is not a
// streamed_response or is too large, or an end_of_stream before the last chunk, is a
// *ProtocolError; an immediate response is an *ImmediateError.
func (d *Duplex) ResponseChunk(m *Encoded) error {
	if ended, err := d.send(m); err != nil {
		return err
	} else if !ended {
		d.respSent += m.body
	}
	// Once the server has re-emitted the end, nothing more comes: the caller compares the counts.
	for !d.respEOS && (d.respBack < d.respSent || m.eos) {
		if err := d.recv(); err == io.EOF {
			return ErrServerGone
		} else if err != nil {
			return err
		}
		a := &d.a
		switch a.kind {
		case fResponseBody:
		case fImmediate:
			return &ImmediateError{Immediate: a.immediate()}
		default:
			return protoErr(RuleOrder, "response_body", "a %s answer while the response body's re-emission is owed", a.kindName())
		}
		if err := a.checkStreamed("response_body"); err != nil {
			return err
		}
		d.respBack += a.bodyLen
		if a.eos {
			if !m.eos {
				return protoErr(RuleDuplexEndOfStream, "response_body", "end_of_stream=true before the input's end was sent")
			}
			d.respEOS = true
		}
	}
	return nil
}

// ResponseBody says how many response body bytes were sent and re-emitted so far, and whether
// the server re-emitted the end.
func (d *Duplex) ResponseBody() (sent, reemitted int, ended bool) {
	return d.respSent, d.respBack, d.respEOS
}

// Close half-closes the stream and expects the server to end it with status OK; any answer
// after the half-close is a *ProtocolError (RuleAnswerKind).
func (d *Duplex) Close() error {
	defer d.cancel()
	if err := d.stream.CloseSend(); err != nil {
		return newStreamError(err)
	}
	switch err := d.recv(); {
	case err == io.EOF:
		return nil
	case err != nil:
		return err
	}
	return protoErr(RuleAnswerKind, "stream", "a %s answer after every message was answered and the proxy half-closed", d.a.kindName())
}

// Cancel abandons the stream (the client went away): the proxy resets it.
func (d *Duplex) Cancel() { d.cancel() }
