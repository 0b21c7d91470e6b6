// Package progress shows a long run's progress. On a terminal it is one line redrawn in place a
// few times a second; on anything else (a file, a pipe, a CI log) it writes a plain line every
// few seconds and one at the end, never a carriage return, so that a log reads line by line.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/term"
)

// How often the bar is drawn: redrawn in place on a terminal, a new line elsewhere.
var (
	terminalEvery = 200 * time.Millisecond
	plainEvery    = 5 * time.Second
)

// Bar is a running progress display. A nil *Bar does nothing, so callers need not check.
type Bar struct {
	w     io.Writer
	tty   bool
	label string
	state func() (frac float64, status string)
	start time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once

	// Count bars: items done of total.
	done, total atomic.Int64
}

// IsTerminal reports whether w is a terminal (an *os.File on a tty).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Start draws to w what state returns: the fraction done (negative when unknown) and a short
// status. w nil draws nothing (and returns nil).
func Start(w io.Writer, label string, state func() (frac float64, status string)) *Bar {
	if w == nil {
		return nil
	}
	b := &Bar{w: w, tty: IsTerminal(w), label: label, state: state, start: time.Now(), stop: make(chan struct{})}
	b.run()
	return b
}

// Count starts a bar over total items named unit ("requests"); Update moves it.
func Count(w io.Writer, label, unit string, total int) *Bar {
	if w == nil {
		return nil
	}
	b := &Bar{w: w, tty: IsTerminal(w), label: label, start: time.Now(), stop: make(chan struct{})}
	b.state = func() (float64, string) {
		d, t := b.done.Load(), b.total.Load()
		if t <= 0 {
			return -1, fmt.Sprintf("%d %s", d, unit)
		}
		return float64(d) / float64(t), fmt.Sprintf("%d/%d %s", d, t, unit)
	}
	b.total.Store(int64(total))
	b.run()
	return b
}

// run draws every period until Stop.
func (b *Bar) run() {
	every := plainEvery
	if b.tty {
		every = terminalEvery
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-t.C:
				b.draw("")
			}
		}
	}()
}

// Update sets a Count bar's progress: done of total items (total ≤ 0 keeps the current total).
// Counts never go back: updates from concurrent workers may arrive out of order.
func (b *Bar) Update(done, total int) {
	if b == nil {
		return
	}
	if total > 0 {
		b.total.Store(int64(total))
	}
	for {
		cur := b.done.Load()
		if int64(done) <= cur || b.done.CompareAndSwap(cur, int64(done)) {
			return
		}
	}
}

// Stop draws the final state, followed by note when it is not empty ("done", "FAILED"), ends
// the line and stops. Later calls do nothing.
func (b *Bar) Stop(note string) {
	if b == nil {
		return
	}
	b.once.Do(func() {
		close(b.stop)
		b.wg.Wait()
		b.draw(note)
		if b.tty {
			fmt.Fprintln(b.w)
		}
	})
}

// draw writes the current state: in place on a terminal, as a line elsewhere. Only the ticker
// goroutine and then Stop call it, one after the other.
func (b *Bar) draw(note string) {
	frac, status := b.state()
	var sb strings.Builder
	sb.WriteString(b.label)
	if frac >= 0 {
		const width = 24
		frac = min(frac, 1)
		n := int(frac * width)
		fmt.Fprintf(&sb, " [%s%s] %3.0f%%", strings.Repeat("=", n), strings.Repeat(" ", width-n), 100*frac)
	}
	fmt.Fprintf(&sb, " %6.1fs  %s", time.Since(b.start).Seconds(), status)
	if note != "" {
		sb.WriteString("  " + note)
	}
	if b.tty {
		fmt.Fprintf(b.w, "\r\033[K%s", sb.String())
		return
	}
	fmt.Fprintln(b.w, sb.String())
}
