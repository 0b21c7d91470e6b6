package dataplane

import (
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvpick/kvpick/pkg/gateway"
)

// Prepared is one HTTP request's messages for a FULL_DUPLEX_STREAMED stream, built as an
// Exchange builds them and encoded once: request headers with protocol_config (and the subset
// hint, if any), then the body in chunks, end_of_stream on the last. Duplex.Route sends them.
// Sending only reads a Prepared, so one may be sent on many streams at once; SetBody and Stamp
// change it and may be called only while no stream sends it. Trailers are not sent.
type Prepared struct {
	msgs      []*extprocv3.ProcessingRequest
	enc       []*Encoded
	bodyLen   int
	chunkSize int
	// Stamp's copies: the chunks it changed and their encodings.
	own    [][]byte
	ownEnc []Encoded
}

// Prepare builds req's messages, cutting the body into chunks of chunkSize (16 KiB, Envoy's
// buffer size, when ≤ 0). The messages point into req.Body: keep it unchanged while the Prepared
// is in use.
func Prepare(req *HTTPRequest, chunkSize int) *Prepared {
	if chunkSize <= 0 {
		chunkSize = 16 << 10
	}
	var md *corev3.Metadata
	if hint := subsetHint(req); hint != nil {
		md = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{gateway.SubsetNamespace: hint}}
	}
	h := headersMessage(true, requestHeaders(req), req.HeaderValueField, req.Body == nil, md)
	h.ProtocolConfig = FullDuplex().protocolConfig()
	p := &Prepared{msgs: []*extprocv3.ProcessingRequest{h}, enc: []*Encoded{encode(h)}, chunkSize: chunkSize}
	if req.Body != nil {
		p.setBody(req.Body)
	}
	return p
}

// BodyLen is the body's length.
func (p *Prepared) BodyLen() int { return p.bodyLen }

// Body returns a copy of the body the messages carry.
func (p *Prepared) Body() []byte {
	out := make([]byte, 0, p.bodyLen)
	for _, m := range p.msgs[1:] {
		out = append(out, m.GetRequestBody().GetBody()...)
	}
	return out
}

// SetBody replaces the body (and the content-length header, if the request has one), reusing
// the messages and their buffers: for generators that keep one Prepared per worker.
func (p *Prepared) SetBody(body []byte) { p.setBody(body) }

func (p *Prepared) setBody(body []byte) {
	p.bodyLen = len(body)
	h := p.msgs[0].GetRequestHeaders()
	h.EndOfStream = false
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == contentLength {
			if hv.GetRawValue() != nil {
				hv.RawValue = strconv.AppendInt(hv.RawValue[:0], int64(len(body)), 10)
			} else {
				hv.Value = strconv.Itoa(len(body))
			}
		}
	}
	p.enc[0].set(p.msgs[0])
	chunks := splitBody(body, nil, p.chunkSize)
	for i, c := range chunks {
		n := 1 + i
		if n == len(p.msgs) {
			p.msgs = append(p.msgs, bodyMessage(true, nil, false, p.msgs[0].GetMetadataContext()))
			p.enc = append(p.enc, &Encoded{})
		}
		b := p.msgs[n].GetRequestBody()
		b.Body, b.EndOfStream = c, i == len(chunks)-1
		p.enc[n].set(p.msgs[n])
	}
	p.msgs, p.enc = p.msgs[:1+len(chunks)], p.enc[:1+len(chunks)]
}

// Stamp makes into a copy of p whose body has b written at offset at, and returns it: a
// request that differs from p in a few bytes (a nonce) without re-encoding the whole body. Only
// the chunks holding those bytes are copied and re-encoded; the others are shared with p. into
// is reused from one call to the next: stamp a new copy only once the previous one is no longer
// being sent. Bytes outside the body are ignored.
func (p *Prepared) Stamp(into *Prepared, at int, b []byte) *Prepared {
	into.bodyLen, into.chunkSize = p.bodyLen, p.chunkSize
	into.msgs = append(into.msgs[:0], p.msgs...)
	into.enc = append(into.enc[:0], p.enc...)
	if at < 0 || len(b) == 0 || at+len(b) > p.bodyLen {
		return into
	}
	first, last := at/p.chunkSize, (at+len(b)-1)/p.chunkSize
	for len(into.own) < last-first+1 {
		into.own = append(into.own, nil)
		into.ownEnc = append(into.ownEnc, Encoded{})
	}
	for k := first; k <= last; k++ {
		src := p.msgs[1+k]
		buf := append(into.own[k-first][:0], src.GetRequestBody().GetBody()...)
		for i := range b {
			if off := at + i - k*p.chunkSize; off >= 0 && off < len(buf) {
				buf[off] = b[i]
			}
		}
		into.own[k-first] = buf
		m := bodyMessage(true, buf, src.GetRequestBody().GetEndOfStream(), src.GetMetadataContext())
		e := &into.ownEnc[k-first]
		e.set(m)
		into.msgs[1+k], into.enc[1+k] = m, e
	}
	return into
}

// PrepareResponseHeaders encodes the upstream response headers the proxy sends: :status first,
// and the endpoint that served the request in envoy.lb metadata when served is not empty.
// endOfStream means the response has no body.
func PrepareResponseHeaders(status int, headers []Header, served string, endOfStream bool) *Encoded {
	hs := append([]Header{{":status", strconv.Itoa(status)}}, headers...)
	var md *corev3.Metadata
	if served != "" {
		md = servedMetadata(nil, served)
	}
	return encode(headersMessage(false, hs, false, endOfStream, md))
}

// PrepareResponseChunk encodes one chunk of an upstream response body, endOfStream on the
// last, with the served endpoint's metadata as PrepareResponseHeaders puts it (an Exchange sends
// it on every message of the response).
func PrepareResponseChunk(data []byte, served string, endOfStream bool) *Encoded {
	var md *corev3.Metadata
	if served != "" {
		md = servedMetadata(nil, served)
	}
	return encode(bodyMessage(false, data, endOfStream, md))
}
