package extproc

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"

	"github.com/kvpick/kvpick/pkg/openai"
)

// Body buffers are pooled in size classes so that a small request never holds on to a large
// buffer for its whole life. Classes are powers of four from 16 KiB (a typical chat body) to
// 1 MiB; larger, rarer bodies are left to the GC so that a burst of them does not pin memory.
const (
	minBufClass = 14 // 16 KiB
	maxBufClass = 20 // 1 MiB
)

// bufClass returns the pool index and capacity for a body of n bytes (n <= 1 MiB).
func bufClass(n int) (int, int) {
	c := minBufClass
	for 1<<c < n {
		c += 2
	}
	return (c - minBufClass) / 2, 1 << c
}

// preSizeCap bounds the buffer a stream reserves from the client's content-length before the
// bytes exist: a client that announces 32 MiB and sends one byte gets 64 KiB (four typical chat
// bodies), not 32 MiB. Beyond it the buffer grows with the bytes received (appendBody).
const preSizeCap = 64 << 10

// getBuf returns an empty buffer for a request body, sized from content-length up to
// preSizeCap, so that a typical body is accumulated without a copy.
func (s *Server) getBuf(contentLength string) []byte {
	want := 0
	if n, err := strconv.ParseInt(contentLength, 10, 64); err == nil && n > 0 {
		want = int(min(n, preSizeCap))
	}
	return s.classBuf(want)
}

// classBuf returns an empty pooled buffer of the smallest class that holds n <= 1 MiB bytes.
func (s *Server) classBuf(n int) []byte {
	i, size := bufClass(n)
	if p, ok := s.bufs[i].Get().(*[]byte); ok {
		return (*p)[:0]
	}
	return make([]byte, 0, size)
}

// appendBody appends chunk to buf, growing it with what was received: to the next size class
// up to 1 MiB (at most 4x the bytes held), then by doubling, never past limit. What a stream
// holds is so bounded by what its client really sent.
func (s *Server) appendBody(buf, chunk []byte, limit int64) []byte {
	need := len(buf) + len(chunk)
	if need <= cap(buf) {
		return append(buf, chunk...)
	}
	var nb []byte
	if need <= 1<<maxBufClass {
		nb = s.classBuf(need)
	} else {
		c := max(need, 2*cap(buf))
		if int64(c) > limit {
			c = max(need, int(limit))
		}
		nb = make([]byte, 0, c)
	}
	nb = append(append(nb, buf...), chunk...)
	s.putBuf(buf)
	return nb
}

// putBuf returns a buffer to the pool of the class its capacity fills exactly; buffers that
// grew by append land in the largest class they fill.
func (s *Server) putBuf(buf []byte) {
	c := cap(buf)
	if c < 1<<minBufClass || c > 1<<maxBufClass {
		return
	}
	i, size := bufClass(c)
	if size > c {
		i-- // capacity between classes: file it under the class it fully covers
	}
	buf = buf[:0]
	s.bufs[i].Put(&buf)
}

// newRequestID returns 16 random bytes in hex, for requests that arrive without x-request-id.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// getTail returns an empty buffer for the end of a response body (stream.keepUsageTail).
func (s *Server) getTail() *[]byte {
	if p, ok := s.tails.Get().(*[]byte); ok {
		*p = (*p)[:0]
		return p
	}
	b := make([]byte, 0, openai.UsageTailBytes)
	return &b
}

func (s *Server) putTail(p *[]byte) { s.tails.Put(p) }

// getParser returns a request parser; its scratch buffers come from earlier requests.
func (s *Server) getParser() *openai.Request {
	if r, ok := s.parsers.Get().(*openai.Request); ok {
		return r
	}
	return &openai.Request{}
}

// putParser resets r (dropping its reference to the body) and pools it.
func (s *Server) putParser(r *openai.Request) {
	r.Reset()
	s.parsers.Put(r)
}
