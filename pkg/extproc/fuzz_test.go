package extproc

import (
	"io"
	"runtime"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/pool"
)

// The stream fuzzer turns its input into one ext_proc stream: an assumed body mode, maybe a
// protocol_config, then a sequence of valid and invalid messages in any order (request and
// response headers, body chunks and trailers, empty and observability-mode messages) with a
// cancellation or a failing proxy anywhere. The input is read byte by byte (fuzzIn):
//
//	byte 0: the server's assumed body mode (index into fuzzAssumed)
//	byte 1: protocol_config: bit 0 present, bits 1-3 request body mode, bits 4-6 response body
//	        mode (values 0-4 are NONE, STREAMED, BUFFERED, BUFFERED_PARTIAL, FULL_DUPLEX_STREAMED;
//	        5-7 are modes this version does not know), bit 7 send_body_without_waiting
//	byte 2: the request body (index into fuzzBodies); byte 3: the response body (fuzzResponses)
//	then one op per byte, its low nibble the kind (op* below) and its high nibble a parameter;
//	body ops take a length from the next byte.
const (
	opReqHeaders    = iota // param: bit 0 end_of_stream, bit 1 a path not routed on the body, bit 2 content-length, bit 3 subset hint
	opReqBody              // param: bit 0 end_of_stream, bit 1 garbage instead of the body; next byte: length
	opReqTrailers          //
	opRespHeaders          // param: bits 0-1 status (200, 500, 204, 429), bit 2 end_of_stream, bit 3 served-endpoint metadata
	opRespBody             // param: bit 0 end_of_stream; next byte: length
	opRespTrailers         //
	opEmpty                // a message with no request in it
	opObservability        // request headers in observability mode
	opCancel               // the proxy cancels the stream here
	opFailSends            // from the param-th answer on, sends fail (the proxy went away)
	opLateConfig           // a protocol_config on the next message (only the first one's counts)
	numOps
)

// fuzzAssumed are the assumed body modes the fuzzer's servers are built with.
var fuzzAssumed = []string{"", "FULL_DUPLEX_STREAMED", "BUFFERED", "BUFFERED_PARTIAL", "STREAMED", "NONE"}

// fuzzMaxBody is the fuzz servers' body limit: small, so that 413 is reachable.
const fuzzMaxBody = 4096

var fuzzBodies = [][]byte{
	[]byte(`{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("You are terse. ", 10) + `"},{"role":"user","content":"hi } {"}],"stream":true}`),
	[]byte(`{"model":"m","prompt":"` + strings.Repeat("complete me ", 20) + `"}`),
	[]byte(`{"model":"m","messages":[`),
	[]byte(`{"messages":[{"role":"user","content":"no model"}]}`),
	[]byte(`{"model":"m","prompt":"` + strings.Repeat("x", fuzzMaxBody) + `"}`),
	[]byte(`{}{}`),
	[]byte(`  {"model":"m","prompt":"a\"}\\"}  `),
}

var fuzzResponses = [][]byte{
	[]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\ndata: [DONE]\n\n"),
	[]byte(`{"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3}}`),
	[]byte(`{"error":{"message":"overloaded"}}`),
}

var fuzzPool = []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}

type fuzzIn struct {
	b []byte
	i int
}

func (r *fuzzIn) next() byte {
	if r.i >= len(r.b) {
		return 0
	}
	c := r.b[r.i]
	r.i++
	return c
}

func (r *fuzzIn) more() bool { return r.i < len(r.b) }

// fuzzStream is the stream the input describes.
type fuzzStream struct {
	assumed    int
	msgs       []*extprocv3.ProcessingRequest
	cancelAt   int
	failSend   int
	firstIsObs bool
}

func decodeStream(data []byte) fuzzStream {
	r := &fuzzIn{b: data}
	fs := fuzzStream{assumed: int(r.next()) % len(fuzzAssumed), cancelAt: -1, failSend: -1}
	cfg := r.next()
	var pc *extprocv3.ProtocolConfiguration
	if cfg&1 != 0 {
		pc = &extprocv3.ProtocolConfiguration{
			RequestBodyMode:                         filterv3.ProcessingMode_BodySendMode(cfg >> 1 & 7),
			ResponseBodyMode:                        filterv3.ProcessingMode_BodySendMode(cfg >> 4 & 7),
			SendBodyWithoutWaitingForHeaderResponse: cfg&0x80 != 0,
		}
	}
	reqBodyBytes := fuzzBodies[int(r.next())%len(fuzzBodies)]
	respBodyBytes := fuzzResponses[int(r.next())%len(fuzzResponses)]
	var reqOff, respOff int
	take := func(src []byte, off *int, n int) []byte {
		end := min(*off+n, len(src))
		c := src[*off:end]
		*off = end
		return c
	}
	late := false
	for len(fs.msgs) < 64 && r.more() {
		op := r.next()
		kind, param := int(op&0x0f)%numOps, op>>4
		var m *extprocv3.ProcessingRequest
		switch kind {
		case opReqHeaders:
			path := "/v1/chat/completions"
			if param&2 != 0 {
				path = "/v1/files"
			}
			hs := []*corev3.HeaderValue{hdr(":method", "POST"), hdr(":path", path), hdr("x-request-id", "fuzz"), hdr(ExplainHeader, "1")}
			if param&4 != 0 {
				hs = append(hs, hdr("content-length", "33554432"))
			}
			m = reqHeaders(nil, param&1 != 0, hs...)
			if param&8 != 0 {
				m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
					SubsetNamespace: {Fields: map[string]*structpb.Value{SubsetKey: structpb.NewStringValue(fuzzPool[1] + ",bogus")}},
				}}
			}
		case opReqBody:
			n := int(r.next())
			chunk := take(reqBodyBytes, &reqOff, n)
			if param&2 != 0 {
				chunk = data[:min(n, len(data))]
			}
			m = reqBody(chunk, param&1 != 0)
		case opReqTrailers:
			m = reqTrailers()
		case opRespHeaders:
			code := [...]string{"200", "500", "204", "429"}[param&3]
			m = respHeaders(code, param&4 != 0)
			if param&8 != 0 {
				m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
					LBNamespace: {Fields: map[string]*structpb.Value{ServedKey: structpb.NewStringValue(fuzzPool[2])}},
				}}
			}
		case opRespBody:
			m = respBody(take(respBodyBytes, &respOff, int(r.next())), param&1 != 0)
		case opRespTrailers:
			m = respTrailers()
		case opEmpty:
			m = &extprocv3.ProcessingRequest{}
		case opObservability:
			m = reqHeaders(nil, false, hdr(":method", "POST"), hdr(":path", "/v1/completions"))
			m.ObservabilityMode = true
		case opCancel:
			if fs.cancelAt < 0 {
				fs.cancelAt = len(fs.msgs)
			}
			continue
		case opFailSends:
			if fs.failSend < 0 {
				fs.failSend = int(param)
			}
			continue
		case opLateConfig:
			late = true
			continue
		}
		if len(fs.msgs) == 0 {
			m.ProtocolConfig = pc
		} else if late {
			m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED}
			late = false
		}
		fs.msgs = append(fs.msgs, m)
	}
	fs.firstIsObs = len(fs.msgs) > 0 && fs.msgs[0].GetObservabilityMode()
	return fs
}

type fuzzServer struct {
	s   *Server
	p   *pool.Pool
	reg *prometheus.Registry
}

// FuzzStream runs the stream the input describes against the real server and pipeline, and
// checks what must hold however the stream goes: Process returns without a panic (one the
// server recovered counts as a failure here), nothing is answered in observability mode nor
// after an ImmediateResponse, and the request leaves no in-flight count, no pending prefix
// record and no goroutine behind.
func FuzzStream(f *testing.F) {
	for _, s := range streamSeeds() {
		f.Add(s)
	}
	servers := make([]fuzzServer, len(fuzzAssumed))
	// Every other server explains its decisions, in the debug log and the header the fuzzed
	// requests ask for: that path runs too.
	debug := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zapcore.DebugLevel))
	for i, mode := range fuzzAssumed {
		reg := prometheus.NewRegistry()
		opt := Options{MaxBodyBytes: fuzzMaxBody, ChunkBytes: 100, AssumedBodyMode: mode, Metrics: NewMetrics(reg)}
		if i%2 == 1 {
			opt.Log, opt.ExplainHeader, opt.MatchBlocks = debug, true, prefixMatch
		}
		s, p := buildTestServer(f, opt, config.Default().Plugins, nil, reg, fuzzPool...)
		servers[i] = fuzzServer{s, p, reg}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fs := decodeStream(data)
		srv := servers[fs.assumed]
		ss := newScript(fs.msgs...)
		ss.cancelAt, ss.failSend = fs.cancelAt, fs.failSend
		before := runtime.NumGoroutine()
		_ = srv.s.Process(ss)
		ss.cancel()
		// Process runs on this goroutine and must start none that outlive it. Counted before
		// the checks below, whose metric gathering starts goroutines of its own.
		if after := runtime.NumGoroutine(); after > before {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines grew from %d to %d:\n%s", before, after, buf[:runtime.Stack(buf, true)])
		}

		if n := metricValue(t, srv.reg, "kvpick_extproc_panics_total"); n != 0 {
			t.Fatalf("the server recovered %v panics", n)
		}
		if fs.firstIsObs && len(ss.out) > 0 {
			t.Fatalf("%d answers in observability mode", len(ss.out))
		}
		for i, r := range ss.out {
			if r.GetImmediateResponse() != nil && i != len(ss.out)-1 {
				t.Fatalf("answer %d is an ImmediateResponse, yet %d answers follow", i, len(ss.out)-1-i)
			}
		}
		for _, e := range srv.p.Snapshot() {
			if n := e.InFlight(); n != 0 {
				t.Fatalf("endpoint %s left with %d in flight", e.Addr, n)
			}
		}
		if n := metricValue(t, srv.reg, "kvpick_prefix_pending_records"); n != 0 {
			t.Fatalf("%v pending prefix records left", n)
		}
	})
}

// streamSeeds are typical streams of every mode, in the input encoding described above.
func streamSeeds() [][]byte {
	const (
		none, streamedMode, buffered, partial, duplex = 0, 1, 2, 3, 4
	)
	cfg := func(req, resp byte, noWait bool) byte {
		c := 1 | req<<1 | resp<<4
		if noWait {
			c |= 0x80
		}
		return c
	}
	op := func(kind, param byte) byte { return kind | param<<4 }
	// A whole exchange: headers, the body in chunks of 64, the response in chunks of 50.
	whole := func(trailers bool) []byte {
		b := []byte{op(opReqHeaders, 0)}
		for range 3 {
			b = append(b, op(opReqBody, 0), 64)
		}
		b = append(b, op(opReqBody, 1), 255)
		if trailers {
			b = append(b, op(opReqTrailers, 0))
		}
		b = append(b, op(opRespHeaders, 0), op(opRespBody, 0), 50, op(opRespBody, 0), 50, op(opRespBody, 1), 255)
		if trailers {
			b = append(b, op(opRespTrailers, 0))
		}
		return b
	}
	var seeds [][]byte
	for _, m := range []struct {
		assumed, cfg byte
	}{
		{0, cfg(duplex, duplex, false)},
		{0, cfg(buffered, buffered, false)},
		{0, cfg(partial, streamedMode, false)},
		{0, cfg(streamedMode, streamedMode, true)},
		{0, cfg(streamedMode, streamedMode, false)},
		{0, cfg(none, none, false)},
		{0, 0}, // no protocol_config: the assumed mode
		{2, 0},
		{5, 0},
	} {
		for _, trailers := range []bool{false, true} {
			server := m.assumed
			if trailers && m.cfg != 0 {
				server = 1 // a server that explains (with protocol_config its assumed mode is moot)
			}
			for body := range byte(len(fuzzBodies)) {
				seeds = append(seeds, append([]byte{server, m.cfg, body, body % 3}, whole(trailers)...))
			}
		}
	}
	fd := cfg(duplex, duplex, false)
	seeds = append(seeds,
		// Cancelled mid-body, after routing, mid-response.
		[]byte{0, fd, 0, 0, op(opReqHeaders, 0), op(opReqBody, 0), 64, op(opCancel, 0)},
		[]byte{0, fd, 0, 0, op(opReqHeaders, 0), op(opReqBody, 1), 255, op(opCancel, 0)},
		[]byte{0, fd, 0, 0, op(opReqHeaders, 0), op(opReqBody, 1), 255, op(opRespHeaders, 0), op(opRespBody, 0), 20, op(opCancel, 0)},
		// The proxy goes away while the body is re-emitted.
		[]byte{0, fd, 0, 0, op(opFailSends, 1), op(opReqHeaders, 0), op(opReqBody, 1), 255},
		// Out of order: body first, response before request, headers twice.
		[]byte{0, fd, 0, 0, op(opReqBody, 1), 10, op(opReqHeaders, 0)},
		[]byte{0, fd, 0, 0, op(opRespHeaders, 0), op(opRespBody, 1), 10, op(opReqHeaders, 1)},
		[]byte{0, fd, 0, 0, op(opReqHeaders, 0), op(opReqHeaders, 0)},
		// Observability mode, an empty message, a late protocol_config, a subset hint, a
		// GET, a path routed at the headers, a served-endpoint report.
		[]byte{0, fd, 0, 0, op(opObservability, 0), op(opReqBody, 1), 10},
		[]byte{0, fd, 0, 0, op(opEmpty, 0), op(opReqHeaders, 0), op(opLateConfig, 0), op(opReqBody, 1), 255},
		[]byte{0, fd, 0, 0, op(opReqHeaders, 8), op(opReqBody, 1), 255, op(opRespHeaders, 8), op(opRespBody, 1), 255},
		[]byte{0, fd, 0, 0, op(opReqHeaders, 1), op(opRespHeaders, 4)},
		[]byte{0, fd, 0, 0, op(opReqHeaders, 2|4), op(opReqBody, 1|2), 40, op(opRespHeaders, 1), op(opRespBody, 1), 30},
		// An unknown body mode.
		[]byte{0, cfg(6, 7, false), 0, 0, op(opReqHeaders, 0), op(opReqBody, 1), 255, op(opRespHeaders, 0)},
	)
	return seeds
}
