//go:build unix

package scrape

import (
	"io"
	"syscall"
)

// run writes request to the socket and returns once the socket is readable (the answer, or
// the server's close, has arrived), with no read system call in between. The wait is the
// runtime's poller, under the connection's deadline. It returns what was written: a full send
// buffer returns EAGAIN with the rest of the request to write.
//
// Writing from within the read callback keeps the wake-up safe: the poller's readiness is
// reset before the callback runs, so an answer that arrives after the write (every answer
// does) wakes the wait.
func (w *rawSend) run(raw syscall.RawConn, request []byte) (sent int, err error) {
	if w.fn == nil {
		w.fn = w.step // the method value is made once: a new one per scrape would allocate
	}
	w.req, w.sent, w.err, w.wrote = request, 0, nil, false
	err = raw.Read(w.fn)
	w.req = nil
	if w.err != nil {
		return w.sent, w.err
	}
	return w.sent, err
}

// step is raw.Read's callback: the first call writes, the next finds the socket readable.
func (w *rawSend) step(fd uintptr) bool {
	if w.wrote {
		return true
	}
	for w.sent < len(w.req) {
		n, err := syscall.Write(int(fd), w.req[w.sent:])
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			w.err = err
			return true
		case n <= 0:
			w.err = io.ErrShortWrite
			return true
		}
		w.sent += n
	}
	w.wrote = true
	return false // wait until the socket is readable
}
