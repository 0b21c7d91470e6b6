package engine

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// Clock is the engine's only source of time. The HTTP simulator uses
// RealClock; a replay benchmark drives many engines on one VirtualClock, so
// the model must never call time.Now or time.Sleep itself.
type Clock interface {
	// Now returns the current (real or simulated) time.
	Now() time.Time
	// AfterFunc calls f once d has elapsed on this clock. A d <= 0 runs f
	// as soon as possible, but never synchronously inside AfterFunc, so a
	// caller may hold its own locks while scheduling.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it
	// did so.
	Stop() bool
}

// RealClock is wall-clock time; AfterFunc callbacks run on their own
// goroutines (time.AfterFunc).
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (RealClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// SleepUntil waits until t on clock c, or until ctx is done (then it
// returns ctx.Err()). It works on any Clock, so the HTTP layer paces its
// stream with the same clock that the engine uses.
func SleepUntil(ctx context.Context, c Clock, t time.Time) error {
	d := t.Sub(c.Now())
	if d <= 0 {
		return ctx.Err()
	}
	ch := make(chan struct{})
	tm := c.AfterFunc(d, func() { close(ch) })
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		tm.Stop()
		return ctx.Err()
	}
}

// VirtualClock is a manual clock for discrete-event simulation: time moves
// only when the driver calls Step, AdvanceTo, Advance or RunUntilIdle, and
// scheduled callbacks run synchronously in the driver's goroutine, in time
// order (ties in scheduling order), so a run is deterministic.
//
// It is safe for concurrent use, but callbacks run only inside the driver's
// calls; a callback may schedule further callbacks.
type VirtualClock struct {
	mu  sync.Mutex
	now time.Time
	seq uint64
	q   eventHeap
}

// NewVirtualClock returns a manual clock that reads start.
func NewVirtualClock(start time.Time) *VirtualClock {
	return &VirtualClock{now: start}
}

// Now returns the simulated time.
func (c *VirtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now()+d (at Now() if d <= 0).
func (c *VirtualClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d < 0 {
		d = 0
	}
	ev := &vEvent{c: c, when: c.now.Add(d), seq: c.seq, f: f, idx: -1}
	c.seq++
	heap.Push(&c.q, ev)
	return ev
}

// Pending returns how many callbacks are scheduled.
func (c *VirtualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.q)
}

// Next returns the time of the earliest scheduled callback.
func (c *VirtualClock) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.q) == 0 {
		return time.Time{}, false
	}
	return c.q[0].when, true
}

// popDue removes and returns the earliest event if it is due at or before
// limit (any time when limit is zero), moving the clock to its time.
func (c *VirtualClock) popDue(limit time.Time) *vEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.q) == 0 {
		return nil
	}
	ev := c.q[0]
	if !limit.IsZero() && ev.when.After(limit) {
		return nil
	}
	heap.Pop(&c.q)
	if ev.when.After(c.now) {
		c.now = ev.when
	}
	return ev
}

// Step runs the earliest scheduled callback, moving time to it. It reports
// false when nothing is scheduled.
func (c *VirtualClock) Step() bool {
	ev := c.popDue(time.Time{})
	if ev == nil {
		return false
	}
	ev.f()
	return true
}

// AdvanceTo runs, in order, every callback due at or before t (including
// ones those callbacks schedule), then sets the time to t if it is later.
// It returns the number of callbacks run.
func (c *VirtualClock) AdvanceTo(t time.Time) int {
	n := 0
	for {
		ev := c.popDue(t)
		if ev == nil {
			break
		}
		ev.f()
		n++
	}
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	c.mu.Unlock()
	return n
}

// Advance is AdvanceTo(Now()+d).
func (c *VirtualClock) Advance(d time.Duration) int {
	return c.AdvanceTo(c.Now().Add(d))
}

// RunUntilIdle runs callbacks until none is scheduled and returns how many
// ran. Requests that hang schedule nothing, so it terminates with them
// still running.
func (c *VirtualClock) RunUntilIdle() int {
	n := 0
	for c.Step() {
		n++
	}
	return n
}

type vEvent struct {
	c    *VirtualClock
	when time.Time
	seq  uint64
	f    func()
	idx  int // position in the heap, -1 once popped or stopped
}

// Stop removes the event from its clock's queue.
func (ev *vEvent) Stop() bool {
	ev.c.mu.Lock()
	defer ev.c.mu.Unlock()
	if ev.idx < 0 {
		return false
	}
	heap.Remove(&ev.c.q, ev.idx)
	return true
}

type eventHeap []*vEvent

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if !h[i].when.Equal(h[j].when) {
		return h[i].when.Before(h[j].when)
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}
func (h *eventHeap) Push(x any) {
	ev := x.(*vEvent)
	ev.idx = len(*h)
	*h = append(*h, ev)
}
func (h *eventHeap) Pop() any {
	old := *h
	n := len(old)
	ev := old[n-1]
	old[n-1] = nil
	ev.idx = -1
	*h = old[:n-1]
	return ev
}
