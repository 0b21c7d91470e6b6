package scrape

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
)

// answerHead is what the scrape needs from an answer's status line and headers.
type answerHead struct {
	status  int
	close   bool  // the connection ends after this answer
	length  int64 // Content-Length; -1 when unknown
	chunked bool
}

// Bounds on what a server may send. An answer's head is a status line and a few headers;
// an error page is read to keep the connection when short.
const (
	maxHeadBytes = 64 << 10
	maxErrorBody = 4096
)

var errBadAnswer = errors.New("bad HTTP answer")

// readResponse reads one HTTP/1.x answer from br: the head, and the body of a 200 answer into
// *buf (reused), at most limit bytes; the body of another status is read and dropped when
// short (a.close otherwise). A body may be sized (Content-Length), chunked, or end with the
// connection. It allocates nothing once buf has grown to the page's size.
func readResponse(br *bufio.Reader, buf *[]byte, limit int64) (a answerHead, res result, err error) {
	for {
		if a, err = readHead(br); err != nil {
			return a, resultError, err
		}
		if a.status >= 200 {
			break
		}
		if a.status < 100 {
			return a, resultError, fmt.Errorf("%w: status %03d", errBadAnswer, a.status)
		}
		// 1xx answers are interim (100 Continue, 103 Early Hints): the real one follows. 101
		// would switch protocols, which a GET never asked for.
		if a.status == 101 {
			return a, resultError, fmt.Errorf("%w: status 101", errBadAnswer)
		}
	}
	if a.status == 204 || a.status == 304 {
		return a, resultOK, nil
	}
	if a.status != 200 {
		// Drop a short error page to keep the connection; give a long one up with it.
		if a.length < 0 || a.length > maxErrorBody || a.chunked {
			a.close = true
		} else if _, err := br.Discard(int(a.length)); err != nil {
			return a, resultError, err
		}
		return a, resultOK, nil
	}
	b := (*buf)[:0]
	defer func() { *buf = b }()
	switch {
	case a.chunked:
		b, res, err = readChunked(br, b, limit)
		return a, res, err
	case a.length > limit:
		a.close = true
		return a, resultTooLarge, fmt.Errorf("Content-Length %d over pool.metrics.maxBodyBytes %d", a.length, limit)
	case a.length >= 0:
		b = slices.Grow(b, int(a.length))[:a.length]
		if _, err := io.ReadFull(br, b); err != nil {
			return a, resultError, err
		}
		return a, resultOK, nil
	}
	// No length: the body ends with the connection.
	a.close = true
	for {
		if len(b) == cap(b) {
			b = slices.Grow(b, max(len(b), readBufSize))
		}
		n, err := br.Read(b[len(b):min(int64(cap(b)), limit+1)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			return a, resultTooLarge, fmt.Errorf("body over pool.metrics.maxBodyBytes %d", limit)
		}
		if err == io.EOF {
			return a, resultOK, nil
		}
		if err != nil {
			return a, resultError, err
		}
	}
}

// readHead reads the status line and the headers, keeping the few that frame the body.
func readHead(br *bufio.Reader) (a answerHead, err error) {
	a.length = -1
	line, err := readLine(br)
	if err != nil {
		return a, err
	}
	// HTTP/1.1 200 OK
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || (line[7] != '0' && line[7] != '1') ||
		line[8] != ' ' || (len(line) > 12 && line[12] != ' ') {
		return a, fmt.Errorf("%w: status line %.40q", errBadAnswer, line)
	}
	for _, d := range line[9:12] {
		if d < '0' || d > '9' {
			return a, fmt.Errorf("%w: status line %.40q", errBadAnswer, line)
		}
		a.status = a.status*10 + int(d-'0')
	}
	http10 := line[7] == '0'
	a.close = http10 // HTTP/1.0 ends the connection unless it says keep-alive
	sized := false
	for total := len(line); ; {
		if line, err = readLine(br); err != nil {
			return a, err
		}
		if len(line) == 0 {
			break
		}
		if total += len(line); total > maxHeadBytes {
			return a, fmt.Errorf("%w: head over %d bytes", errBadAnswer, maxHeadBytes)
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !validHeader(line[:colon], line[colon+1:]) {
			return a, fmt.Errorf("%w: header line %.40q", errBadAnswer, line)
		}
		name, value := line[:colon], bytes.Trim(line[colon+1:], " \t")
		switch {
		case asciiEqualFold(name, "Content-Length"):
			n, ok := parseLength(value)
			if !ok || (sized && n != a.length) {
				return a, fmt.Errorf("%w: Content-Length %.40q", errBadAnswer, value)
			}
			a.length, sized = n, true
		case asciiEqualFold(name, "Transfer-Encoding"):
			switch {
			case http10:
				// HTTP/1.0 has no transfer codings: net/http reads such a body raw.
				return a, fmt.Errorf("%w: Transfer-Encoding in an HTTP/1.0 answer", errBadAnswer)
			case a.chunked || !asciiEqualFold(value, "chunked"):
				// One Transfer-Encoding, chunked, as net/http and nginx accept: anything else is
				// where response smuggling hides.
				return a, fmt.Errorf("%w: Transfer-Encoding %.40q", errBadAnswer, value)
			}
			a.chunked = true
		case asciiEqualFold(name, "Connection"):
			for tok := range bytes.SplitSeq(value, []byte(",")) {
				switch tok = bytes.Trim(tok, " \t"); {
				case asciiEqualFold(tok, "close"):
					a.close = true
				case http10 && asciiEqualFold(tok, "keep-alive"):
					a.close = false
				}
			}
		}
	}
	if a.chunked {
		// A chunked body's length is its own; a Content-Length beside it is a smuggling
		// attempt or a broken proxy: read the chunks, and trust the connection no further.
		a.close = a.close || sized
		a.length = -1
	}
	return a, nil
}

// validHeader reports whether a header's name is a token and its value holds no control
// character (RFC 9110, section 5), as net/http requires: a server that breaks the syntax is not
// trusted to frame its body either.
func validHeader(name, value []byte) bool {
	for _, c := range name {
		if c <= ' ' || c >= 0x7f || bytes.IndexByte([]byte(`"(),/:;<=>?@[\]{}`), c) >= 0 {
			return false
		}
	}
	for _, c := range value {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// maxTrailerBytes bounds the trailers of a chunked body (net/http allows what its 4 KB buffer
// holds).
const maxTrailerBytes = 2048

// readChunked appends a chunked body to b, at most limit bytes. Its lines must end with CRLF
// (RFC 9112 allows a bare LF in a head, not in chunked framing), and a sender may not pad it
// with more extension bytes than it carries data (net/http's rule).
func readChunked(br *bufio.Reader, b []byte, limit int64) ([]byte, result, error) {
	excess := int64(0)
	for {
		line, err := readChunkLine(br)
		if err != nil {
			return b, resultError, err
		}
		excess += int64(len(line)) + 4 // the line's CRLF and the one after the data
		line = bytes.TrimRight(line, " \t")
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i] // chunk extensions
		}
		size, ok := parseHex(line)
		if !ok {
			return b, resultError, fmt.Errorf("%w: chunk size %.40q", errBadAnswer, line)
		}
		if excess = max(0, excess-16-2*size); excess > 16<<10 {
			return b, resultError, fmt.Errorf("%w: chunked framing with too much non-data", errBadAnswer)
		}
		if size == 0 {
			// Trailers, then the empty line.
			for total := 0; ; {
				if line, err = readChunkLine(br); err != nil {
					return b, resultError, err
				}
				if len(line) == 0 {
					return b, resultOK, nil
				}
				colon := bytes.IndexByte(line, ':')
				if total += len(line) + 2; total > maxTrailerBytes || colon <= 0 || !validHeader(line[:colon], line[colon+1:]) {
					return b, resultError, fmt.Errorf("%w: trailer %.40q", errBadAnswer, line)
				}
			}
		}
		if int64(len(b))+size > limit {
			return b, resultTooLarge, fmt.Errorf("body over pool.metrics.maxBodyBytes %d", limit)
		}
		n := len(b)
		b = slices.Grow(b, int(size))[:n+int(size)]
		if _, err := io.ReadFull(br, b[n:]); err != nil {
			return b, resultError, err
		}
		if end, err := br.Peek(2); err != nil || end[0] != '\r' || end[1] != '\n' {
			if err == nil {
				err = fmt.Errorf("%w: no line end after a chunk", errBadAnswer)
			}
			return b, resultError, err
		}
		_, _ = br.Discard(2)
	}
}

// readChunkLine reads a line of chunked framing without its CRLF; it must end with CRLF and
// hold no other CR.
func readChunkLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, fmt.Errorf("%w: line over %d bytes", errBadAnswer, br.Size())
	case errors.Is(err, io.EOF):
		return nil, io.ErrUnexpectedEOF
	case err != nil:
		return nil, err
	case len(line) < 2 || bytes.IndexByte(line, '\r') != len(line)-2:
		return nil, fmt.Errorf("%w: chunked framing line without CRLF", errBadAnswer)
	}
	return line[:len(line)-2], nil
}

// readLine reads a line of a head without its CRLF (or LF). A line longer than the reader's
// buffer is an error: no header the scrape reads is that long.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, fmt.Errorf("%w: line over %d bytes", errBadAnswer, br.Size())
	case errors.Is(err, io.EOF) && len(line) > 0:
		return nil, io.ErrUnexpectedEOF
	case err != nil:
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// parseLength parses a Content-Length: decimal digits, at most 2^62.
func parseLength(s []byte) (int64, bool) {
	if len(s) == 0 || len(s) > 18 {
		return 0, false
	}
	var n int64
	for _, d := range s {
		if d < '0' || d > '9' {
			return 0, false
		}
		n = n*10 + int64(d-'0')
	}
	return n, true
}

// parseHex parses a chunk size: hexadecimal digits, at most 2^60.
func parseHex(s []byte) (int64, bool) {
	if len(s) == 0 || len(s) > 15 {
		return 0, false
	}
	var n int64
	for _, d := range s {
		switch {
		case d >= '0' && d <= '9':
			d -= '0'
		case d >= 'a' && d <= 'f':
			d -= 'a' - 10
		case d >= 'A' && d <= 'F':
			d -= 'A' - 10
		default:
			return 0, false
		}
		n = n<<4 | int64(d)
	}
	return n, true
}

// asciiEqualFold reports whether b equals s (ASCII) ignoring case.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
