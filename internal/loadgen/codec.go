package loadgen

import (
	"fmt"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// leanCodec is the client's gRPC codec. It sends pre-encoded messages as they are (no marshalling
// per request), decodes the picker's answers into an answer (only what the checks need, without
// copying re-emitted bodies), and uses dirtyPool instead of grpc-go's default pool. Any other
// message goes through the ordinary protobuf codec.
type leanCodec struct{}

func (leanCodec) Name() string { return "proto" }

// encoded is a message encoded once, sent many times.
type encoded struct{ b []byte }

func encode(m proto.Message) *encoded {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("loadgen: encoding %T: %v", m, err)) // built here from valid fields
	}
	return &encoded{b}
}

func (leanCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *encoded:
		// SliceBuffer's Free is a no-op: the bytes stay ours.
		return mem.BufferSlice{mem.SliceBuffer(m.b)}, nil
	case proto.Message:
		size := proto.Size(m)
		buf := bufferPool.Get(size)
		out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], m)
		if err != nil {
			bufferPool.Put(buf)
			return nil, err
		}
		*buf = out
		return mem.BufferSlice{mem.NewBuffer(buf, bufferPool)}, nil
	}
	return nil, fmt.Errorf("loadgen codec: cannot marshal %T", v)
}

func (leanCodec) Unmarshal(data mem.BufferSlice, v any) error {
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData() // valid for this call only: nothing below keeps it
	} else {
		buf := data.MaterializeToBuffer(bufferPool)
		defer buf.Free()
		b = buf.ReadOnlyData()
	}
	switch m := v.(type) {
	case *answer:
		return m.decode(b)
	case proto.Message:
		return proto.Unmarshal(b, m)
	}
	return fmt.Errorf("loadgen codec: cannot unmarshal into %T", v)
}

// answer is what the checks need from one ProcessingResponse.
type answer struct {
	kind            protowire.Number // the response oneof's field: one of the fX constants
	dest            string           // x-gateway-destination-endpoint's raw_value, first list entry
	clearRouteCache bool
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
	fSetHeaders, fHeader, fKey, fRawValue                                      protowire.Number
	fStreamed, fStreamedBody, fStreamedEOS                                     protowire.Number
	fImmStatus, fImmBody, fStatusCode                                          protowire.Number
	kindNames                                                                  = map[protowire.Number]string{}
)

func init() {
	num := func(m protoreflect.MessageDescriptor, name string) protowire.Number {
		f := m.Fields().ByName(protoreflect.Name(name))
		if f == nil {
			panic("loadgen: no field " + name + " in " + string(m.FullName()))
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
		panic("loadgen: HeadersResponse and BodyResponse differ")
	}
	cr := (&extprocv3.CommonResponse{}).ProtoReflect().Descriptor()
	fHeaderMutation, fBodyMutation, fClearRouteCache = num(cr, "header_mutation"), num(cr, "body_mutation"), num(cr, "clear_route_cache")
	fSetHeaders = num((&extprocv3.HeaderMutation{}).ProtoReflect().Descriptor(), "set_headers")
	hvo := (&extprocv3.ProcessingRequest{}).ProtoReflect().Descriptor().Fields().ByName("request_headers").Message().
		Fields().ByName("headers").Message().Fields().ByName("headers").Message() // HeaderValue
	fKey, fRawValue = num(hvo, "key"), num(hvo, "raw_value")
	opt := (&extprocv3.HeaderMutation{}).ProtoReflect().Descriptor().Fields().ByName("set_headers").Message()
	fHeader = num(opt, "header")
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
// length-delimited fields and its value for varints.
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
			return fields(v, func(n protowire.Number, t protowire.Type, opt []byte, _ uint64) error {
				if n != fSetHeaders || t != protowire.BytesType {
					return nil
				}
				return fields(opt, func(n protowire.Number, t protowire.Type, hv []byte, _ uint64) error {
					if n != fHeader || t != protowire.BytesType {
						return nil
					}
					var key, raw []byte
					if err := fields(hv, func(n protowire.Number, t protowire.Type, s []byte, _ uint64) error {
						switch n {
						case fKey:
							key = s
						case fRawValue:
							raw = s
						}
						return nil
					}); err != nil {
						return err
					}
					if string(key) == DestinationHeader {
						for i, c := range raw {
							if c == ',' {
								raw = raw[:i]
								break
							}
						}
						a.dest = string(raw)
					}
					return nil
				})
			})
		case num == fBodyMutation && typ == protowire.BytesType:
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
