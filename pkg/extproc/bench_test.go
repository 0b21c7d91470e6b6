package extproc

import (
	"fmt"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// BenchmarkStream is one whole FULL_DUPLEX_STREAMED stream over the default pipeline: a ~5 KB
// chat request (a shared system prompt, a new question per iteration so the index keeps
// learning), routing, a streamed response of 20 SSE chunks, the proxy's half-close. The fake
// stream reuses its messages, so what is measured is the server's own work and allocations.
func BenchmarkStream(b *testing.B) { benchmarkStream(b, false) }

func benchmarkStream(b *testing.B, explain bool) {
	s, _ := testServer(b, Options{ExplainHeader: explain, MatchBlocks: prefixMatch}, "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000")
	system := strings.Repeat("You are a meticulous assistant. ", 100)
	const variants = 1024
	bodies := make([][]byte, variants)
	for i := range bodies {
		bodies[i] = fmt.Appendf(nil, `{"model":"m","stream":true,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d: %s"}]}`,
			system, i, strings.Repeat("details please ", 30))
	}
	pc := protocol(fullDuplex, fullDuplex, false)
	headers := reqHeaders(pc, false, hdr(":method", "POST"), hdr(":path", "/v1/chat/completions"),
		hdr("x-request-id", "bench"), hdr("content-length", fmt.Sprint(len(bodies[0]))))
	if explain {
		headers.GetRequestHeaders().Headers.Headers = append(headers.GetRequestHeaders().Headers.Headers, hdr(ExplainHeader, "1"))
	}
	msgs := []*extprocv3.ProcessingRequest{headers, nil, respHeaders("200", false)}
	for range 19 {
		msgs = append(msgs, respBody([]byte(`data: {"choices":[{"delta":{"content":"token"}}]}`+"\n\n"), false))
	}
	msgs = append(msgs, respBody([]byte("data: [DONE]\n\n"), true))
	bodyMsgs := make([]*extprocv3.ProcessingRequest, variants)
	for i := range bodyMsgs {
		bodyMsgs[i] = reqBody(bodies[i], true)
	}
	ss := newScript(msgs...)
	ss.out = make([]*extprocv3.ProcessingResponse, 0, 64)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		msgs[1] = bodyMsgs[i%variants]
		ss.next, ss.out = 0, ss.out[:0]
		if err := s.Process(ss); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStreamExplained is BenchmarkStream with the explanation header asked for and enabled:
// what explaining costs per request (off, it costs nothing: compare with BenchmarkStream).
func BenchmarkStreamExplained(b *testing.B) {
	benchmarkStream(b, true)
}
