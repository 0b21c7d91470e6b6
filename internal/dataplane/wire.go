package dataplane

import (
	"fmt"
	"math/bits"
	"sync"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kvpick/kvpick/pkg/gateway"
)

// The fast path's wire layer: a gRPC codec that sends messages encoded once (Encoded) as they
// are and reads the server's answers into an answer (what Duplex checks) without copying
// re-emitted bodies, and a buffer pool that does not zero what it hands out. Other messages go
// through the ordinary protobuf codec, so an Exchange works on the same connection.

// DialOptions are the gRPC dial options of a connection that carries load: HTTP/2 windows as
// large as Envoy's (grpc-go's 64 KiB default would make a 64 KB body wait for window updates,
// which Envoy does not), no message size limit below a body's, and the non-zeroing buffer pool.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(4 << 20),
		grpc.WithInitialConnWindowSize(64 << 20),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)),
		experimental.WithBufferPool(buffers),
	}
}

// Encoded is a ProcessingRequest encoded once and sent as it is, any number of times on any
// number of streams.
type Encoded struct {
	b    []byte
	body int  // the body bytes it carries
	eos  bool // it ends its direction's body
}

func encode(m *extprocv3.ProcessingRequest) *Encoded {
	e := &Encoded{}
	e.set(m)
	return e
}

// set encodes m into e, reusing e's buffer.
func (e *Encoded) set(m *extprocv3.ProcessingRequest) {
	b, err := proto.MarshalOptions{}.MarshalAppend(e.b[:0], m)
	if err != nil {
		panic(fmt.Sprintf("dataplane: encoding %T: %v", m, err)) // built here from valid fields
	}
	e.b = b
	switch r := m.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestBody:
		e.body, e.eos = len(r.RequestBody.GetBody()), r.RequestBody.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseBody:
		e.body, e.eos = len(r.ResponseBody.GetBody()), r.ResponseBody.GetEndOfStream()
	default:
		e.body, e.eos = 0, false
	}
}

// BodyLen is the number of body bytes the message carries.
func (e *Encoded) BodyLen() int { return e.body }

// fastCodec is the fast path's codec (see the top of this file).
type fastCodec struct{}

func (fastCodec) Name() string { return "proto" }

func (fastCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *Encoded:
		// SliceBuffer's Free is a no-op: the bytes stay the Encoded's.
		return mem.BufferSlice{mem.SliceBuffer(m.b)}, nil
	case proto.Message:
		buf := buffers.Get(proto.Size(m))
		out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], m)
		if err != nil {
			buffers.Put(buf)
			return nil, err
		}
		*buf = out
		return mem.BufferSlice{mem.NewBuffer(buf, buffers)}, nil
	}
	return nil, fmt.Errorf("dataplane codec: cannot marshal %T", v)
}

func (fastCodec) Unmarshal(data mem.BufferSlice, v any) error {
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData() // valid for this call only: nothing below keeps it
	} else {
		buf := data.MaterializeToBuffer(buffers)
		defer buf.Free()
		b = buf.ReadOnlyData()
	}
	switch m := v.(type) {
	case *answer:
		return m.decode(b)
	case proto.Message:
		return proto.Unmarshal(b, m)
	}
	return fmt.Errorf("dataplane codec: cannot unmarshal into %T", v)
}

// answer is what Duplex checks of one ProcessingResponse.
type answer struct {
	kind            protowire.Number // the response oneof's field: one of the f* numbers below
	headerMutation  bool
	dest            string // the destination header's raw_value
	destCount       int    // how many times the mutation sets it
	destInValue     bool   // set in value instead of raw_value
	contentLength   string // content-length set by the mutation
	clearRouteCache bool
	bodyMutation    bool // any body mutation
	streamed        bool // the body mutation is a streamed_response
	bodyLen         int  // its body's length (the bytes are not kept)
	eos             bool // its end_of_stream
	status          int  // immediate response: HTTP status
	detail          string
}

// Field numbers, read from the generated descriptors so that they cannot drift.
var (
	fRequestHeaders, fResponseHeaders, fRequestBody, fResponseBody, fImmediate protowire.Number
	fCommon, fHeaderMutation, fBodyMutation, fClearRouteCache                  protowire.Number
	fSetHeaders, fHeader, fKey, fValue, fRawValue                              protowire.Number
	fStreamed, fStreamedBody, fStreamedEOS                                     protowire.Number
	fImmStatus, fImmBody, fStatusCode                                          protowire.Number
	kindNames                                                                  = map[protowire.Number]string{}
)

func init() {
	num := func(m protoreflect.MessageDescriptor, name string) protowire.Number {
		f := m.Fields().ByName(protoreflect.Name(name))
		if f == nil {
			panic("dataplane: no field " + name + " in " + string(m.FullName()))
		}
		return f.Number()
	}
	pr := (&extprocv3.ProcessingResponse{}).ProtoReflect().Descriptor()
	fRequestHeaders, fResponseHeaders = num(pr, "request_headers"), num(pr, "response_headers")
	fRequestBody, fResponseBody, fImmediate = num(pr, "request_body"), num(pr, "response_body"), num(pr, "immediate_response")
	for i := range pr.Oneofs().ByName("response").Fields().Len() {
		f := pr.Oneofs().ByName("response").Fields().Get(i)
		kindNames[f.Number()] = string(f.Name())
	}
	fCommon = num((&extprocv3.HeadersResponse{}).ProtoReflect().Descriptor(), "response")
	if num((&extprocv3.BodyResponse{}).ProtoReflect().Descriptor(), "response") != fCommon {
		panic("dataplane: HeadersResponse and BodyResponse differ")
	}
	cr := (&extprocv3.CommonResponse{}).ProtoReflect().Descriptor()
	fHeaderMutation, fBodyMutation, fClearRouteCache = num(cr, "header_mutation"), num(cr, "body_mutation"), num(cr, "clear_route_cache")
	fSetHeaders = num((&extprocv3.HeaderMutation{}).ProtoReflect().Descriptor(), "set_headers")
	hvo := (&extprocv3.HeaderMutation{}).ProtoReflect().Descriptor().Fields().ByName("set_headers").Message()
	fHeader = num(hvo, "header")
	hv := hvo.Fields().ByName("header").Message()
	fKey, fValue, fRawValue = num(hv, "key"), num(hv, "value"), num(hv, "raw_value")
	fStreamed = num((&extprocv3.BodyMutation{}).ProtoReflect().Descriptor(), "streamed_response")
	sb := (&extprocv3.StreamedBodyResponse{}).ProtoReflect().Descriptor()
	fStreamedBody, fStreamedEOS = num(sb, "body"), num(sb, "end_of_stream")
	ir := (&extprocv3.ImmediateResponse{}).ProtoReflect().Descriptor()
	fImmStatus, fImmBody = num(ir, "status"), num(ir, "body")
	fStatusCode = num(ir.Fields().ByName("status").Message(), "code")
}

func (a *answer) kindName() string {
	if n, ok := kindNames[a.kind]; ok {
		return n
	}
	return fmt.Sprintf("field %d", a.kind)
}

// fields calls f for each field of the message encoded in b; v is the field's bytes for
// length-delimited fields and x its value for varints.
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

func (a *answer) decode(b []byte) error {
	*a = answer{}
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case fImmediate:
			a.kind = num
			return a.decodeImmediate(v)
		case fRequestHeaders, fResponseHeaders, fRequestBody, fResponseBody:
			a.kind = num
			return fields(v, func(n protowire.Number, t protowire.Type, cr []byte, _ uint64) error {
				if n == fCommon && t == protowire.BytesType {
					return a.decodeCommon(cr)
				}
				return nil
			})
		default:
			if _, ok := kindNames[num]; ok {
				a.kind = num
			}
		}
		return nil
	})
}

func (a *answer) decodeCommon(b []byte) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == fClearRouteCache && typ == protowire.VarintType:
			a.clearRouteCache = x != 0
		case num == fHeaderMutation && typ == protowire.BytesType:
			a.headerMutation = true
			return fields(v, func(n protowire.Number, t protowire.Type, opt []byte, _ uint64) error {
				if n != fSetHeaders || t != protowire.BytesType {
					return nil
				}
				return fields(opt, func(n protowire.Number, t protowire.Type, hv []byte, _ uint64) error {
					if n != fHeader || t != protowire.BytesType {
						return nil
					}
					return a.decodeHeader(hv)
				})
			})
		case num == fBodyMutation && typ == protowire.BytesType:
			a.bodyMutation = true
			return fields(v, func(n protowire.Number, t protowire.Type, sr []byte, _ uint64) error {
				if n != fStreamed || t != protowire.BytesType {
					return nil
				}
				a.streamed = true
				return fields(sr, func(n protowire.Number, t protowire.Type, body []byte, x uint64) error {
					switch {
					case n == fStreamedBody && t == protowire.BytesType:
						a.bodyLen += len(body)
					case n == fStreamedEOS && t == protowire.VarintType:
						a.eos = x != 0
					}
					return nil
				})
			})
		}
		return nil
	})
}

// decodeHeader reads one HeaderValue of a set_headers mutation: the destination and the
// content-length are kept.
func (a *answer) decodeHeader(hv []byte) error {
	var key, value, raw []byte
	if err := fields(hv, func(n protowire.Number, _ protowire.Type, s []byte, _ uint64) error {
		switch n {
		case fKey:
			key = s
		case fValue:
			value = s
		case fRawValue:
			raw = s
		}
		return nil
	}); err != nil {
		return err
	}
	switch string(key) {
	case gateway.DestinationHeader:
		a.destCount++
		a.dest = string(raw)
		a.destInValue = len(value) > 0
	case contentLength:
		a.contentLength = string(raw)
	}
	return nil
}

func (a *answer) decodeImmediate(b []byte) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		switch {
		case num == fImmStatus && typ == protowire.BytesType:
			return fields(v, func(n protowire.Number, t protowire.Type, _ []byte, x uint64) error {
				if n == fStatusCode && t == protowire.VarintType {
					a.status = int(x)
				}
				return nil
			})
		case num == fImmBody && typ == protowire.BytesType:
			a.detail = string(v[:min(len(v), 300)])
		}
		return nil
	})
}

// buffers is the fast path's gRPC buffer pool.
var buffers = &dirtyPool{}

// dirtyPool is a gRPC buffer pool in power-of-two tiers from 256 B to 1 MiB that does not zero
// the buffers it hands out. gRPC overwrites every byte it reads from a pooled buffer (frames are
// read into it, messages marshalled or copied over it), so zeroing is pure cost — and grpc-go's
// default pool both zeroes a buffer's whole capacity on each Get and jumps from a 32 KiB tier to
// a 1 MiB one, so that each ~62,000-byte body chunk the picker re-emits would cost the client a
// 1 MiB clear. Larger buffers are allocated and left to the collector.
type dirtyPool struct {
	tiers [maxTier - minTier + 1]sync.Pool
}

const (
	minTier = 8
	maxTier = 20
)

var _ mem.BufferPool = (*dirtyPool)(nil)

func tierOf(size int) int {
	if size <= 1<<minTier {
		return minTier
	}
	return bits.Len(uint(size - 1))
}

func (p *dirtyPool) Get(size int) *[]byte {
	t := tierOf(size)
	if t > maxTier {
		b := make([]byte, size)
		return &b
	}
	if b, ok := p.tiers[t-minTier].Get().(*[]byte); ok {
		*b = (*b)[:size]
		return b
	}
	b := make([]byte, size, 1<<t)
	return &b
}

func (p *dirtyPool) Put(b *[]byte) {
	c := cap(*b)
	if c < 1<<minTier || c > 1<<maxTier {
		return
	}
	// Largest tier the capacity fills.
	t := bits.Len(uint(c)) - 1
	*b = (*b)[:0]
	p.tiers[t-minTier].Put(b)
}
