package scrape

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// readResponse reads every way an HTTP/1.x server may frame its answer, keeps the connection
// only when the answer's end is known, and refuses what it cannot read safely.
func TestReadResponseFramings(t *testing.T) {
	long := strings.Repeat("x", 5000)
	tests := []struct {
		name   string
		answer string
		status int
		body   string
		close  bool
		res    result
		err    string // part of the error; "" for none
	}{
		{"sized", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello", 200, "hello", false, resultOK, ""},
		{"no reason phrase, bare LF line ends", "HTTP/1.1 200\nContent-Length: 2\n\nhi", 200, "hi", false, resultOK, ""},
		{"header names in any case", "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nCONNECTION: Close\r\n\r\nhi", 200, "hi", true, resultOK, ""},
		{"chunked, with extensions and trailers", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n", 200, "hello world", false, resultOK, ""},
		{"chunk sizes in upper case hex", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n", 200, "0123456789", false, resultOK, ""},
		{"HTTP/1.0 without length: to the end, then closed", "HTTP/1.0 200 OK\r\n\r\nall of it", 200, "all of it", true, resultOK, ""},
		{"HTTP/1.0 keep-alive with a length", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi", 200, "hi", false, resultOK, ""},
		{"HTTP/1.1 without length: to the end, then closed", "HTTP/1.1 200 OK\r\n\r\nall of it", 200, "all of it", true, resultOK, ""},
		{"Connection: close among tokens", "HTTP/1.1 200 OK\r\nConnection: foo, close\r\nContent-Length: 0\r\n\r\n", 200, "", true, resultOK, ""},
		{"interim 100 and 103 before the answer", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", 200, "hi", false, resultOK, ""},
		{"short error page kept", "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found", 404, "", false, resultOK, ""},
		{"long error page closes", "HTTP/1.1 500 Oops\r\nContent-Length: 5000\r\n\r\n" + long, 500, "", true, resultOK, ""},
		{"chunked error page closes", "HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nno\r\n0\r\n\r\n", 503, "", true, resultOK, ""},
		{"204 has no body", "HTTP/1.1 204 No Content\r\n\r\n", 204, "", false, resultOK, ""},
		{"chunked beside a length: chunks read, connection not trusted", "HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", 200, "hi", true, resultOK, ""},
		{"length over the limit", "HTTP/1.1 200 OK\r\nContent-Length: 101\r\n\r\n", 200, "", true, resultTooLarge, "Content-Length 101 over"},
		{"chunks over the limit", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n" + long[:64] + "\r\n40\r\n" + long[:64] + "\r\n0\r\n\r\n", 200, "", false, resultTooLarge, "over pool.metrics.maxBodyBytes"},
		{"unsized body over the limit", "HTTP/1.1 200 OK\r\n\r\n" + long, 200, "", true, resultTooLarge, "over pool.metrics.maxBodyBytes"},
		{"HTTP/2 status line", "HTTP/2 200 OK\r\n\r\n", 0, "", false, resultError, "status line"},
		{"not HTTP", "ICY 200 OK\r\n\r\n", 0, "", false, resultError, "status line"},
		{"status not a number", "HTTP/1.1 2x0 OK\r\n\r\n", 0, "", false, resultError, "status line"},
		{"status of four digits", "HTTP/1.1 2000 OK\r\n\r\n", 0, "", false, resultError, "status line"},
		{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi", 200, "", false, resultError, "Content-Length"},
		{"negative length", "HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nhi", 200, "", false, resultError, "Content-Length"},
		{"gzip transfer coding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", 200, "", false, resultError, "Transfer-Encoding"},
		{"folded header", "HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", 200, "", false, resultError, "header line"},
		{"header without a colon", "HTTP/1.1 200 OK\r\nbroken\r\n\r\n", 200, "", false, resultError, "header line"},
		{"header line over the buffer", "HTTP/1.1 200 OK\r\nX: " + long + "\r\n\r\n", 200, "", false, resultError, "line over"},
		{"101 switching protocols", "HTTP/1.1 101 Switching Protocols\r\n\r\n", 101, "", false, resultError, "101"},
		{"body cut short", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", 200, "", false, resultError, "EOF"},
		{"chunk without its line end", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiX\r\n0\r\n\r\n", 200, "", false, resultError, "line end"},
		{"chunk size not hex", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 200, "", false, resultError, "chunk size"},
		{"head cut short", "HTTP/1.1 200 OK\r\nContent-Le", 200, "", false, resultError, "EOF"},
		// Where net/http refuses, so does readResponse (FuzzReadResponse found these).
		{"two Transfer-Encodings", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 200, "", false, resultError, "Transfer-Encoding"},
		{"Transfer-Encoding in HTTP/1.0", "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 200, "", false, resultError, "HTTP/1.0"},
		{"status 000", "HTTP/1.1 000 Zero\r\n\r\n", 0, "", false, resultError, "status 000"},
		{"chunk line with a bare LF", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nhi\r\n0\r\n\r\n", 200, "", false, resultError, "CRLF"},
		{"an empty chunk line", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\n", 200, "", false, resultError, "CRLF"},
		{"chunk size padded before its extension", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2 ;x\r\nhi\r\n0\r\n\r\n", 200, "", false, resultError, "chunk size"},
		{"header name not a token", "HTTP/1.1 200 OK\r\n\"x\": 1\r\n\r\n", 200, "", false, resultError, "header line"},
		{"control character in a header value", "HTTP/1.1 200 OK\r\nX: a\x01b\r\n\r\n", 200, "", false, resultError, "header line"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tc.answer), readBufSize)
			buf := new([]byte)
			a, res, err := readResponse(br, buf, 100)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want one mentioning %q", err, tc.err)
			case res != tc.res:
				t.Fatalf("result %v, want %v", res, tc.res)
			}
			if err != nil {
				return
			}
			if a.status != tc.status || a.close != tc.close {
				t.Fatalf("status %d close %v, want %d %v", a.status, a.close, tc.status, tc.close)
			}
			if tc.status == 200 && string(*buf) != tc.body {
				t.Fatalf("body %q, want %q", *buf, tc.body)
			}
			if !a.close {
				if rest, _ := io.ReadAll(br); len(rest) != 0 {
					t.Fatalf("%d bytes left after a kept answer", len(rest))
				}
			}
		})
	}
}

// Answers on a kept connection are read one after the other, each whole.
func TestReadResponseInSequence(t *testing.T) {
	stream := "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none" +
		"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\nnope" +
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\ntwo\r\n0\r\n\r\n" +
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nthree"
	br := bufio.NewReaderSize(strings.NewReader(stream), readBufSize)
	buf := new([]byte)
	for i, want := range []struct {
		status int
		body   string
	}{{200, "one"}, {404, ""}, {200, "two"}, {200, "three"}} {
		a, _, err := readResponse(br, buf, 100)
		if err != nil || a.status != want.status || (want.status == 200 && string(*buf) != want.body) || a.close {
			t.Fatalf("answer %d: %v %+v %q, want %d %q", i, err, a, *buf, want.status, want.body)
		}
	}
}

// What readResponse takes as a 200 answer, net/http reads the same way: it is never more
// lenient than the standard library about where an answer ends.
func FuzzReadResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nbody",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		buf := new([]byte)
		a, res, err := readResponse(bufio.NewReaderSize(bytes.NewReader(answer), readBufSize), buf, 1<<16)
		if err != nil || res != resultOK || a.status != 200 {
			return
		}
		// net/http hands interim answers up; its Transport skips them, as readResponse does.
		br := bufio.NewReader(bytes.NewReader(answer))
		resp, err := http.ReadResponse(br, nil)
		for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 {
			resp, err = http.ReadResponse(br, nil)
		}
		if err != nil {
			t.Fatalf("readResponse read %q, net/http refuses it: %v", answer, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != 200 || !bytes.Equal(body, *buf) {
			t.Fatalf("readResponse: 200 %q; net/http: %d %q %v", *buf, resp.StatusCode, body, err)
		}
	})
}
