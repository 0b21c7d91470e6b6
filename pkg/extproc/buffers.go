package extproc

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
)

// Body buffers are pooled up to this capacity; rarer, larger ones are left to the GC so that a
// burst of huge bodies does not pin their memory.
const maxPooledBuf = 1 << 20

// getBuf returns an empty buffer for a request body, sized from content-length when the client
// sent one, so that accumulating chunks copies each byte once.
func (s *Server) getBuf(contentLength string, limit int64) []byte {
	want := 0
	if n, err := strconv.ParseInt(contentLength, 10, 64); err == nil && n > 0 && n <= limit {
		want = int(n)
	}
	if want <= maxPooledBuf {
		if p, ok := s.bufs.Get().(*[]byte); ok && cap(*p) >= want {
			return (*p)[:0]
		}
		return make([]byte, 0, max(want, 16<<10))
	}
	return make([]byte, 0, want)
}

func (s *Server) putBuf(buf []byte) {
	if cap(buf) == 0 || cap(buf) > maxPooledBuf {
		return
	}
	buf = buf[:0]
	s.bufs.Put(&buf)
}

// newRequestID returns 16 random bytes in hex, for requests that arrive without x-request-id.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
