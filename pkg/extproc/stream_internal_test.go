package extproc

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	fullDuplex = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	streamedM  = filterv3.ProcessingMode_STREAMED
)

// newTestStream is a stream on s whose answers go to a scriptStream, driven message by message
// with handle.
func newTestStream(s *Server) (*stream, *scriptStream) {
	ss := newScript()
	return &stream{s: s, srv: ss, ctx: ss.ctx, log: s.opt.Log}, ss
}

// TestAnnouncedLengthReservesNoMoreThanTheBytesReceived: a client that announces a large body
// and sends a byte must not make the picker reserve the announced size; as the body arrives,
// what the stream holds stays within a small factor of what it received.
func TestAnnouncedLengthReservesNoMoreThanTheBytesReceived(t *testing.T) {
	const preSizeCap = 64 << 10
	tests := []struct {
		name          string
		contentLength string
		total         int // body bytes sent, in 16 KiB chunks
	}{
		{"32 MiB announced, one byte sent", strconv.Itoa(32 << 20), 1},
		{"32 MiB announced, 3 MiB sent", strconv.Itoa(32 << 20), 3 << 20},
		{"no content-length, 3 MiB sent", "", 3 << 20},
		{"exact content-length, 300 KiB", strconv.Itoa(300 << 10), 300 << 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := testServer(t, Options{}, "10.0.0.1:8000")
			st, _ := newTestStream(s)
			defer st.finish()
			if _, err := st.handle(chatHeaders(protocol(fullDuplex, fullDuplex, false), tc.contentLength)); err != nil {
				t.Fatal(err)
			}
			chunk := bytes.Repeat([]byte(" "), 16<<10)
			for sent := 0; sent < tc.total; {
				n := min(len(chunk), tc.total-sent)
				if _, err := st.handle(reqBody(chunk[:n], false)); err != nil {
					t.Fatal(err)
				}
				sent += n
				if limit := max(preSizeCap, 4*sent); cap(st.buf) > limit {
					t.Fatalf("after %d bytes the stream holds a %d-byte buffer (limit %d)", sent, cap(st.buf), limit)
				}
			}
			if len(st.buf) != tc.total {
				t.Fatalf("buffered %d bytes, sent %d", len(st.buf), tc.total)
			}
		})
	}
}

// chunkedAfterBraces splits body after every '}' (and so into many chunks, each of which ends
// like a complete object).
func chunkedAfterBraces(body []byte) [][]byte {
	var out [][]byte
	for len(body) > 0 {
		i := bytes.IndexByte(body, '}')
		if i < 0 {
			out = append(out, body)
			break
		}
		out = append(out, body[:i+1])
		body = body[i+1:]
	}
	return out
}

func manyMessages(n int, content string) []byte {
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"role":"user","content":%q,"meta":{"i":{}}}`, content)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// TestStreamedBodyIsParsedOnceItCompletes: in STREAMED mode with
// send_body_without_waiting_for_header_response, the picker routes as soon as the body is a
// complete JSON object, and a body cut into many chunks that each end in '}' is not re-parsed
// per chunk (which costs the square of the body's size).
func TestStreamedBodyIsParsedOnceItCompletes(t *testing.T) {
	tests := []struct {
		name   string
		body   []byte
		chunks [][]byte // nil: split after every '}'
	}{
		{"500 messages, a chunk per brace", manyMessages(500, "hello"), nil},
		{"braces and quotes inside strings", manyMessages(50, `}{ "\"}" \\`), nil},
		{"trailing whitespace in its own chunk", nil, [][]byte{[]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), []byte(" \n")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, p := testServer(t, Options{}, "10.0.0.1:8000")
			st, ss := newTestStream(s)
			chunks := tc.chunks
			if chunks == nil {
				chunks = chunkedAfterBraces(tc.body)
			}
			if _, err := st.handle(chatHeaders(protocol(streamedM, streamedM, true), "")); err != nil {
				t.Fatal(err)
			}
			routedAt := -1
			for i, c := range chunks {
				if _, err := st.handle(reqBody(c, false)); err != nil {
					t.Fatal(err)
				}
				if routedAt < 0 && st.phase == phaseRouted {
					routedAt = i
				}
			}
			if routedAt < 0 {
				t.Fatalf("not routed after the last of %d chunks completed the object; answers: %d", len(chunks), len(ss.out))
			}
			if want := lastNonBlank(chunks); routedAt != want {
				t.Fatalf("routed at chunk %d, want %d (the one that completes the object)", routedAt, want)
			}
			if st.parses > 1 {
				t.Fatalf("the body was parsed %d times for %d chunks, want once", st.parses, len(chunks))
			}
			if _, err := st.handle(reqTrailers()); err != nil {
				t.Fatal(err)
			}
			// One answer per message: headers, every chunk, trailers.
			if want := 1 + len(chunks) + 1; len(ss.out) != want {
				t.Fatalf("%d answers, want %d", len(ss.out), want)
			}
			st.finish()
			if n := inFlight(p); n != 0 {
				t.Fatalf("in flight %d after the stream ended", n)
			}
		})
	}
}

func lastNonBlank(chunks [][]byte) int {
	for i := len(chunks) - 1; i >= 0; i-- {
		if len(bytes.TrimSpace(chunks[i])) > 0 {
			return i
		}
	}
	return -1
}

// TestStreamedBodyThatClosesInvalidIsRejectedAtOnce: in STREAMED mode the proxy sends trailers
// only once every chunk is answered, so a complete object that is no valid request must be
// answered when it closes, not when a body end that cannot come arrives.
func TestStreamedBodyThatClosesInvalidIsRejectedAtOnce(t *testing.T) {
	s, p := testServer(t, Options{}, "10.0.0.1:8000")
	st, ss := newTestStream(s)
	defer st.finish()
	if _, err := st.handle(chatHeaders(protocol(streamedM, streamedM, true), "")); err != nil {
		t.Fatal(err)
	}
	var done bool
	for _, c := range chunkedAfterBraces([]byte(`{"messages":[{"role":"user","content":"no model"}]}`)) {
		var err error
		if done, err = st.handle(reqBody(c, false)); err != nil {
			t.Fatal(err)
		}
	}
	if len(ss.out) == 0 {
		t.Fatal("no answer after the object closed")
	}
	im := ss.out[len(ss.out)-1].GetImmediateResponse()
	if !done || im == nil || im.GetStatus().GetCode() != 400 {
		t.Fatalf("done %v, last answer %v; want a 400 when the object closed", done, ss.out[len(ss.out)-1])
	}
	if n := inFlight(p); n != 0 {
		t.Fatalf("in flight %d", n)
	}
}

// TestCancelBeforeTheBodyEnds: a proxy that cancels after the headers or in the middle of the
// body, before the picker could route, gets Process's cancellation, no route, and leaves no
// in-flight count. The cancel points are exact here (the gRPC-level test cannot know which
// message the server had read).
func TestCancelBeforeTheBodyEnds(t *testing.T) {
	body := manyMessages(20, "hello")
	tests := []struct {
		name     string
		pc       *extprocv3.ProtocolConfiguration
		cancelAt int // messages delivered before the cancel
	}{
		{"full duplex, after headers", protocol(fullDuplex, fullDuplex, false), 1},
		{"full duplex, mid body", protocol(fullDuplex, fullDuplex, false), 2},
		{"streamed, mid body", protocol(streamedM, streamedM, true), 2},
		{"buffered, after headers", protocol(filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED, false), 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, p := testServer(t, Options{}, "10.0.0.1:8000")
			ss := newScript(chatHeaders(tc.pc, ""), reqBody(body[:len(body)/2], false), reqBody(body[len(body)/2:], true))
			ss.cancelAt = tc.cancelAt
			err := s.Process(ss)
			if status.Code(err) != codes.Canceled {
				t.Fatalf("Process returned %v, want Canceled", err)
			}
			if routedTo(ss.out) != "" {
				t.Fatal("routed before the body ended")
			}
			if n := inFlight(p); n != 0 {
				t.Fatalf("in flight %d", n)
			}
		})
	}
}
