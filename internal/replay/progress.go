package replay

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progressBar shows a run's progress on a terminal (redrawn in place at most 10 times a second)
// or, when the output is not a terminal, one line when the run ends.
type progressBar struct {
	w     io.Writer
	tty   bool
	label string
	total int
	start time.Time

	mu   sync.Mutex
	last time.Time
	done int
}

func newProgressBar(w io.Writer, label string, total int) *progressBar {
	b := &progressBar{w: w, label: label, total: total, start: time.Now()}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			b.tty = true
		}
	}
	return b
}

func (b *progressBar) update(done, total int) {
	if b.w == nil || !b.tty {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done = max(b.done, done)
	if now := time.Now(); now.Sub(b.last) >= 100*time.Millisecond || b.done == total {
		b.last = now
		b.draw()
	}
}

func (b *progressBar) draw() {
	const width = 30
	frac := 0.0
	if b.total > 0 {
		frac = float64(b.done) / float64(b.total)
	}
	fill := int(frac * width)
	fmt.Fprintf(b.w, "\r%-28s [%s%s] %5.1f%% %d/%d %5.1fs", b.label, strings.Repeat("#", fill), strings.Repeat(".", width-fill),
		100*frac, b.done, b.total, time.Since(b.start).Seconds())
}

func (b *progressBar) finish(err error) {
	if b.w == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	status := "done"
	if err != nil {
		status = "FAILED"
	}
	if b.tty {
		b.draw()
		fmt.Fprintf(b.w, " %s\n", status)
		return
	}
	fmt.Fprintf(b.w, "%-28s %d requests, %.1fs wall: %s\n", b.label, b.total, time.Since(b.start).Seconds(), status)
}
