package kubetest

import (
	"bytes"
	"sync"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Logger returns a debug-level logger for the code under test that keeps its output and prints
// it only if the test fails. Unlike zaptest's, it may be written to after the test ends (by an
// informer or a health-check goroutine winding down) without panicking.
func Logger(t testing.TB) *zap.Logger {
	t.Helper()
	buf := &lockedBuffer{}
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of the code under test:\n%s", buf.String())
		}
	})
	return zap.New(zapcore.NewCore(enc, buf, zapcore.DebugLevel))
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Sync() error { return nil }

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
