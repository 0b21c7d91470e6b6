package scrape

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
)

// conn is one endpoint's keep-alive HTTP/1.1 connection for scrapes. A loop sends one request
// at a time, so the connection needs none of net/http's Transport machinery (a connection pool
// under one mutex, two goroutines per connection handing every response over channels, a
// context per request), nor its general response parser (a header map and a body reader per
// answer): the request is written from a prebuilt buffer under a deadline, and the answer is
// read by readResponse into the loop's buffer. A filtered page then costs one write and one
// read system call (rawSend.run), and no allocation.
type conn struct {
	addr     string
	requests [numVariants][]byte // the whole GET request of each variant (nil: not used)
	status   int                 // the HTTP status of the last answer
	c        net.Conn
	raw      syscall.RawConn // c's, when c is a plain TCP connection
	br       *bufio.Reader
	wrap     func(net.Conn) net.Conn // tests' hook on new connections

	// The connection is aborted when the loop's context ends: one AfterFunc per connection
	// and context, not one per request (it allocates).
	stopCtx  func() bool
	watching context.Context
	rs       rawSend
	deadline time.Time // the current request's
}

// rawSend is send's state on a plain TCP connection (conn_unix.go): kept with the connection
// so that a scrape allocates nothing for it.
type rawSend struct {
	req   []byte
	sent  int
	err   error
	wrote bool
	fn    func(fd uintptr) bool
}

// readBufSize is the connection's read buffer: a filtered page and its headers (~1.7 KB) fit
// in it whole, so one read takes the answer; a whole page's body is read straight into the
// page buffer past it.
const readBufSize = 4096

func newConn(addr string, paths [numVariants]string) *conn {
	c := &conn{addr: addr}
	for v, p := range paths {
		if p != "" {
			c.requests[v] = []byte("GET " + p + " HTTP/1.1\r\nHost: " + addr +
				// The classic text format: what the reader selects lines from (OpenMetrics
				// differs). No Accept-Encoding: gzip cuts a vLLM page ~10x but inflating it
				// costs more CPU than the rest of the scrape (BenchmarkGunzipPage).
				"\r\nUser-Agent: kvpick\r\nAccept: text/plain;version=0.0.4\r\n\r\n")
		}
	}
	return c
}

// aLongTimeAgo is a deadline that has passed: setting it aborts a blocked read or write.
var aLongTimeAgo = time.Unix(1, 0)

// get sends variant v's request and reads a 200 answer's body into buf, at most limit bytes,
// before deadline; ctx's end aborts it. Any failure but a short error page closes the
// connection; the next get dials again.
func (c *conn) get(ctx context.Context, deadline time.Time, v variant, limit int64, buf *[]byte) (result, error) {
	c.status = 0
	for attempt := 0; ; attempt++ {
		reused := c.c != nil
		if !reused {
			if err := c.dial(ctx, deadline); err != nil {
				return classify(err), err
			}
		}
		if c.watching != ctx {
			c.watch(ctx)
		}
		if c.raw != nil {
			// The request is written without blocking (send): the read deadline bounds the
			// scrape, and one deadline costs half the timer work of two.
			_ = c.c.SetReadDeadline(deadline)
		} else {
			_ = c.c.SetDeadline(deadline)
		}
		c.deadline = deadline
		if err := ctx.Err(); err != nil {
			// Ended before the deadline was set, which may have undone the abort.
			return classify(err), err
		}
		res, err, retry := c.roundTrip(c.requests[v], limit, buf)
		if err == nil {
			return resultOK, nil
		}
		if res != resultBadStatus {
			c.close() // the connection is in an unknown state
		}
		// A server may close a keep-alive connection while it is idle; the request then fails
		// before any answer: send it again once on a new connection, as net/http does.
		if retry && reused && attempt == 0 && ctx.Err() == nil {
			continue
		}
		return res, err
	}
}

func (c *conn) dial(ctx context.Context, deadline time.Time) error {
	d := net.Dialer{Deadline: deadline, KeepAlive: 30 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return err
	}
	c.raw = nil
	if c.wrap != nil {
		nc = c.wrap(nc)
	} else if tc, ok := nc.(*net.TCPConn); ok {
		c.raw, _ = tc.SyscallConn()
	}
	c.c = nc
	if c.br == nil {
		c.br = bufio.NewReaderSize(nc, readBufSize)
	} else {
		c.br.Reset(nc)
	}
	c.watching = nil
	return nil
}

// watch aborts the connection's blocked reads and writes when ctx ends.
func (c *conn) watch(ctx context.Context) {
	if c.stopCtx != nil {
		c.stopCtx()
	}
	nc := c.c
	c.stopCtx = context.AfterFunc(ctx, func() { _ = nc.SetDeadline(aLongTimeAgo) })
	c.watching = ctx
}

// roundTrip writes the request and reads the answer. retry reports a failure before any byte of
// an answer, the sign of a connection the server closed.
func (c *conn) roundTrip(request []byte, limit int64, buf *[]byte) (res result, err error, retry bool) {
	if err := c.send(request); err != nil {
		return classify(err), err, true
	}
	if _, err := c.br.Peek(1); err != nil {
		return classify(err), err, errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
	}
	a, res, err := readResponse(c.br, buf, limit)
	c.status = a.status
	if err != nil {
		if res == resultError {
			res = classify(err)
		}
		return res, err, false
	}
	if a.close || c.br.Buffered() > 0 {
		// The server ends the connection, or sent more than one answer: it cannot be trusted
		// with the next request.
		c.close()
	}
	if a.status != 200 {
		return resultBadStatus, fmt.Errorf("HTTP status %d", a.status), false
	}
	return resultOK, nil, false
}

// send writes the request. On a plain TCP connection it writes it and waits until the answer
// starts to arrive without trying to read first: a read right after the write finds nothing
// yet (the server has not run), and that read, which fails, is a system call per scrape.
func (c *conn) send(request []byte) error {
	sent := 0
	if c.raw != nil {
		var err error
		sent, err = c.rs.run(c.raw, request)
		// A full send buffer (or a platform without it) leaves the rest to the poller.
		if err == nil || !(errors.Is(err, syscall.EAGAIN) || errors.Is(err, errors.ErrUnsupported)) {
			return err
		}
		_ = c.c.SetWriteDeadline(c.deadline) // get set only the read deadline
	}
	_, err := c.c.Write(request[sent:])
	return err
}

func (c *conn) close() {
	if c.stopCtx != nil {
		c.stopCtx()
		c.stopCtx, c.watching = nil, nil
	}
	if c.c != nil {
		_ = c.c.Close()
		c.c, c.raw = nil, nil
	}
}

func classify(err error) result {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) || (errors.As(err, &ne) && ne.Timeout()) {
		return resultTimeout
	}
	return resultError
}
