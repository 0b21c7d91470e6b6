//go:build !unix

package scrape

import (
	"errors"
	"syscall"
)

// run is unix-only: elsewhere the request is written through the connection.
func (w *rawSend) run(syscall.RawConn, []byte) (int, error) { return 0, errors.ErrUnsupported }
