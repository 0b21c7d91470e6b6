package scrape

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"
)

// conn is one endpoint's keep-alive HTTP/1.1 connection for scrapes. A loop sends one request
// at a time, so the connection needs none of net/http's Transport machinery (a connection pool
// under one mutex, two goroutines per connection handing every response over channels, a
// context per request): the request is written from a prebuilt buffer under a deadline, and the
// answer is parsed by net/http's own ReadResponse. That takes 15-45% off a scrape's CPU against a
// net/http Client (docs/benchmarks.md, "Model-server scraping").
type conn struct {
	addr     string
	requests [numVariants][]byte // the whole GET request of each variant (nil: not used)
	status   int                 // the HTTP status of the last answer
	c        net.Conn
	br       *bufio.Reader
	wrap     func(net.Conn) net.Conn // tests' hook on new connections
}

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
			d := net.Dialer{Deadline: deadline, KeepAlive: 30 * time.Second}
			nc, err := d.DialContext(ctx, "tcp", c.addr)
			if err != nil {
				return classify(err), err
			}
			if c.wrap != nil {
				nc = c.wrap(nc)
			}
			c.c = nc
			if c.br == nil {
				c.br = bufio.NewReaderSize(nc, 4096)
			} else {
				c.br.Reset(nc)
			}
		}
		nc := c.c
		_ = nc.SetDeadline(deadline)
		stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(aLongTimeAgo) })
		res, err, retry := c.roundTrip(c.requests[v], limit, buf)
		stop()
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

// roundTrip writes the request and reads the answer. retry reports a failure before any byte of
// an answer, the sign of a connection the server closed.
func (c *conn) roundTrip(request []byte, limit int64, buf *[]byte) (res result, err error, retry bool) {
	if _, err := c.c.Write(request); err != nil {
		return classify(err), err, true
	}
	if _, err := c.br.Peek(1); err != nil {
		return classify(err), err, errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return resultError, fmt.Errorf("bad HTTP answer: %w", err), false
	}
	defer resp.Body.Close()
	c.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		// Read a short error page to keep the connection; give a long one up with it.
		if n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 4097)); err != nil || n > 4096 || resp.Close {
			c.close()
		}
		return resultBadStatus, fmt.Errorf("HTTP status %d", resp.StatusCode), false
	}
	if resp.ContentLength > limit {
		return resultTooLarge, fmt.Errorf("Content-Length %d over pool.metrics.maxBodyBytes %d", resp.ContentLength, limit), false
	}
	if res, err := readBody(resp.Body, resp.ContentLength, buf, limit); err != nil {
		if res == resultError {
			res = classify(err)
		}
		return res, err, false
	}
	if resp.Close {
		c.close()
	}
	return resultOK, nil, false
}

func (c *conn) close() {
	if c.c != nil {
		_ = c.c.Close()
		c.c = nil
	}
}

func classify(err error) result {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) || (errors.As(err, &ne) && ne.Timeout()) {
		return resultTimeout
	}
	return resultError
}
