package progress

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPTY returns both ends of a new pseudo-terminal: what is written to the slave can be read
// from the master.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		t.Skipf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		m.Close()
		t.Skipf("ptsname: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Skipf("open slave: %v", err)
	}
	t.Cleanup(func() { s.Close(); m.Close() })
	return m, s
}

// capture collects what is written to it, and lets a test wait until the output holds enough.
type capture struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newCapture() *capture { return &capture{changed: make(chan struct{}, 1)} }

func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	select {
	case c.changed <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (c *capture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// waitFor blocks until the output holds n copies of sub: the bar draws on its own clock, so the
// test waits for the draws rather than for a time.
func (c *capture) waitFor(sub string, n int) {
	for strings.Count(c.String(), sub) < n {
		<-c.changed
	}
}

// countTo10 moves a Count bar to 10 of 10 once it has drawn twice.
func countTo10(b *Bar, c *capture, drawn string) {
	b.Update(3, 10)
	c.waitFor(drawn, 2)
	b.Update(10, 10)
	b.Stop("done")
}

func TestNotATerminalGetsPlainLines(t *testing.T) {
	defer func(d time.Duration) { plainEvery = d }(plainEvery)
	plainEvery = 10 * time.Millisecond
	_, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if IsTerminal(w) {
		t.Fatal("a pipe is a terminal")
	}
	c := newCapture()
	countTo10(Count(c, "replay", "requests", 10), c, "\n")
	out := c.String()
	if strings.ContainsAny(out, "\r\033") {
		t.Errorf("carriage return or escape written to a non-terminal: %q", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) < 3 {
		t.Errorf("want periodic lines and a final one, got %q", out)
	}
	if !strings.Contains(lines[0], "3/10 requests") {
		t.Errorf("first periodic line %q", lines[0])
	}
	last := lines[len(lines)-1]
	if !strings.Contains(last, "10/10 requests") || !strings.Contains(last, "100%") || !strings.HasSuffix(last, "done") {
		t.Errorf("final line %q", last)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "replay [") {
			t.Errorf("line %q does not start with the label and the bar", l)
		}
	}
}

func TestTerminalRedrawsInPlace(t *testing.T) {
	defer func(d time.Duration) { terminalEvery = d }(terminalEvery)
	terminalEvery = 10 * time.Millisecond
	m, s := openPTY(t)
	if !IsTerminal(s) {
		t.Fatal("a pseudo-terminal is not a terminal")
	}
	c := newCapture()
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(c, m); close(copied) }()
	countTo10(Count(s, "replay", "requests", 10), c, "\r\033[K")
	c.waitFor("done", 1)
	s.Close() // the master reads an error once the slave is closed
	<-copied
	out := c.String()
	// One line in all: the redraws, then the final newline (the terminal may add a \r to it).
	if n := strings.Count(out, "\n"); n != 1 {
		t.Errorf("%d newlines on a terminal: %q", n, out)
	}
	if !strings.Contains(out, "10/10 requests  done") {
		t.Errorf("final state missing: %q", out)
	}
}

func TestPolledStateAndUnknownFraction(t *testing.T) {
	var buf bytes.Buffer // not a terminal
	var n atomic.Int64
	b := Start(&buf, "churn", func() (float64, string) { return -1, fmt.Sprintf("%d exchanges", n.Load()) })
	n.Store(42)
	b.Stop("")
	b.Stop("again") // no second final line
	if got := buf.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "42 exchanges") || strings.Contains(got, "[") {
		t.Errorf("got %q", got)
	}
}

func TestNilWriterAndNilBar(t *testing.T) {
	if Start(nil, "x", nil) != nil || Count(nil, "x", "y", 1) != nil {
		t.Fatal("a nil writer gave a bar")
	}
	var b *Bar
	b.Update(1, 2)
	b.Stop("done")
}

func TestUpdateNeverGoesBack(t *testing.T) {
	var buf bytes.Buffer
	b := Count(&buf, "x", "items", 0)
	b.Update(5, 10)
	b.Update(3, 0)
	b.Stop("")
	if !strings.Contains(buf.String(), "5/10 items") {
		t.Errorf("got %q", buf.String())
	}
}
