package pool

import (
	"strings"
	"sync"
	"testing"

	"github.com/kvpick/kvpick/pkg/router"
)

type changes struct {
	mu             sync.Mutex
	added, removed []string
}

func (c *changes) EndpointsChanged(added, removed []*router.Endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range added {
		c.added = append(c.added, e.Addr)
	}
	for _, e := range removed {
		if !e.Removed() {
			panic("listener told about a removal before the endpoint was marked removed")
		}
		c.removed = append(c.removed, e.Addr)
	}
}

func TestSetAddsRemovesAndKeepsIdentity(t *testing.T) {
	p := New()
	c := &changes{}
	p.Listen(c)
	if p.Synced() {
		t.Fatal("a new pool is not synced")
	}
	p.Set([]string{"10.0.0.2:8000", "10.0.0.1:8000"})
	if !p.Synced() {
		t.Fatal("Set must mark the pool synced")
	}
	a := p.Lookup("10.0.0.1:8000")
	a.AddInFlight(3)
	p.Set([]string{"10.0.0.1:8000", "10.0.0.3:8000"})
	if got := p.Lookup("10.0.0.1:8000"); got != a || got.InFlight() != 3 {
		t.Fatal("an endpoint that stays must keep its identity and in-flight count")
	}
	if p.Lookup("10.0.0.2:8000") != nil {
		t.Fatal("removed endpoint still found")
	}
	var snap []string
	for _, e := range p.Snapshot() {
		snap = append(snap, e.Addr)
	}
	if strings.Join(snap, ",") != "10.0.0.1:8000,10.0.0.3:8000" {
		t.Fatalf("snapshot %v", snap)
	}
	if strings.Join(c.removed, ",") != "10.0.0.2:8000" || len(c.added) != 3 {
		t.Fatalf("listener saw added %v removed %v", c.added, c.removed)
	}
}

func TestSlotsAreDenseAndReusedAfterRemoval(t *testing.T) {
	p := New()
	p.Set([]string{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"})
	slots := map[int]bool{}
	for _, e := range p.Snapshot() {
		slots[e.Slot] = true
	}
	if len(slots) != 3 || !slots[0] || !slots[1] || !slots[2] {
		t.Fatalf("slots %v", slots)
	}
	old := p.Lookup("10.0.0.2:1")
	p.Set([]string{"10.0.0.1:1", "10.0.0.3:1"})
	p.Set([]string{"10.0.0.1:1", "10.0.0.3:1", "10.0.0.9:1"})
	n := p.Lookup("10.0.0.9:1")
	if n.Slot != old.Slot || p.MaxSlot() != 3 {
		t.Fatalf("new endpoint got slot %d (freed %d), max %d", n.Slot, old.Slot, p.MaxSlot())
	}
	if !old.Removed() || n.Removed() {
		t.Fatal("removed flags wrong")
	}
}

func TestParseAddrs(t *testing.T) {
	got, err := ParseAddrs("x", []string{" 10.0.0.1:8000", "10.0.0.1:8000", "[::1]:9000", "[0:0::1]:9000"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "10.0.0.1:8000,[::1]:9000" {
		t.Fatalf("got %v", got)
	}
	for _, bad := range []string{"10.0.0.1", "host:80", "10.0.0.1:0", "10.0.0.1:70000", "10.0.0.1:http", ""} {
		if _, err := ParseAddrs("pool.endpoints", []string{bad}); err == nil || !strings.Contains(err.Error(), "pool.endpoints[0]") {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
}

func TestConcurrentReadersSeeConsistentSnapshots(t *testing.T) {
	p := New()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				p.Set([]string{"10.0.0.1:1", "10.0.0.2:1"})
			} else {
				p.Set([]string{"10.0.0.3:1"})
			}
		}
	}()
	for range 10000 {
		s := p.Snapshot()
		if len(s) != 0 && len(s) != 1 && len(s) != 2 {
			t.Fatalf("snapshot of %d", len(s))
		}
	}
	close(stop)
	wg.Wait()
}

// TestOnAddRunsBeforeTheEndpointIsVisible: what an OnAdd hook sets on a new endpoint holds before
// any reader of the pool can see the endpoint, and endpoints that stay are not passed again.
func TestOnAddRunsBeforeTheEndpointIsVisible(t *testing.T) {
	p := New()
	var seen []string
	p.OnAdd(func(e *router.Endpoint) {
		if p.Lookup(e.Addr) != nil || len(p.Snapshot()) != len(seen) {
			t.Errorf("%s is visible before its OnAdd hook ran", e.Addr)
		}
		e.SetHealthy(false)
		seen = append(seen, e.Addr)
	})
	p.Set([]string{"10.0.0.1:8000"})
	p.Set([]string{"10.0.0.1:8000", "10.0.0.2:8000"})
	if strings.Join(seen, ",") != "10.0.0.1:8000,10.0.0.2:8000" {
		t.Fatalf("hook ran for %v, want each new endpoint once", seen)
	}
	for _, e := range p.Snapshot() {
		if e.Healthy() {
			t.Fatalf("%s published without what its hook set", e.Addr)
		}
	}
}
