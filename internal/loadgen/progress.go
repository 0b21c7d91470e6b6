package loadgen

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Progress draws a one-line progress bar on a terminal (redrawn in place every 250 ms), or
// writes a plain line every 5 s to anything else. A nil *Progress does nothing.
type Progress struct {
	w     io.Writer
	tty   bool
	label string
	state func() (frac float64, status string)
	start time.Time
	stop  chan struct{}
	done  sync.WaitGroup
}

// StartProgress starts drawing; state returns the fraction done (negative: unknown) and a
// short status. w nil draws nothing.
func StartProgress(w io.Writer, label string, state func() (float64, string)) *Progress {
	if w == nil {
		return nil
	}
	p := &Progress{w: w, label: label, state: state, start: time.Now(), stop: make(chan struct{})}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	every := 5 * time.Second
	if p.tty {
		every = 250 * time.Millisecond
	}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.draw(false)
			}
		}
	}()
	return p
}

func (p *Progress) draw(final bool) {
	frac, status := p.state()
	el := time.Since(p.start).Truncate(100 * time.Millisecond)
	var bar string
	if frac >= 0 {
		frac = min(frac, 1)
		const width = 24
		n := int(frac * width)
		bar = "[" + strings.Repeat("=", n) + strings.Repeat(" ", width-n) + fmt.Sprintf("] %3.0f%% ", 100*frac)
	}
	line := fmt.Sprintf("%s %s%6s  %s", p.label, bar, el, status)
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		if final {
			fmt.Fprintln(p.w)
		}
		return
	}
	fmt.Fprintln(p.w, line)
}

// Stop draws the final state and stops.
func (p *Progress) Stop() {
	if p == nil {
		return
	}
	close(p.stop)
	p.done.Wait()
	p.draw(true)
}
