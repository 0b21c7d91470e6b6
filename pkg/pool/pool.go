// Package pool holds the set of model-server endpoints that the picker schedules over. The set
// can change at any time (static configuration today, Kubernetes discovery later); readers get
// immutable snapshots, so a request never sees a half-applied change.
package pool

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvpick/kvpick/pkg/router"
)

// Pool is a changing set of endpoints.
type Pool struct {
	mu        sync.Mutex // serialises changes and listener calls
	byAddr    map[string]*router.Endpoint
	freeSlots []int
	nextSlot  int
	listeners []router.PoolListener
	onAdd     []func(*router.Endpoint)

	snap   atomic.Pointer[[]*router.Endpoint]
	lookup atomic.Pointer[map[string]*router.Endpoint]
	synced atomic.Bool
}

var _ router.Endpoints = (*Pool)(nil)

// New returns an empty pool that has not been synced yet.
func New() *Pool {
	p := &Pool{byAddr: map[string]*router.Endpoint{}}
	empty := []*router.Endpoint{}
	p.snap.Store(&empty)
	m := map[string]*router.Endpoint{}
	p.lookup.Store(&m)
	return p
}

// Listen registers l for every later change. Register before the first Set.
func (p *Pool) Listen(l router.PoolListener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listeners = append(p.listeners, l)
}

// OnAdd registers f to run on every endpoint that joins the pool from now on, before the pool
// publishes it: what f sets (the health checker marks it unhealthy until its first good probe)
// holds before any request can pick the endpoint. f runs under the pool's lock: it must be
// quick and must not change the pool (Set, Listen, OnAdd).
func (p *Pool) OnAdd(f func(*router.Endpoint)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onAdd = append(p.onAdd, f)
}

// Snapshot returns the current endpoints, ordered by address. Do not modify it.
func (p *Pool) Snapshot() []*router.Endpoint { return *p.snap.Load() }

// Lookup returns the live endpoint with that address, or nil.
func (p *Pool) Lookup(addr string) *router.Endpoint { return (*p.lookup.Load())[addr] }

// Synced reports whether the pool has been populated from its source at least once.
func (p *Pool) Synced() bool { return p.synced.Load() }

// Set replaces the pool's membership with addrs (already validated "ip:port" strings) and marks
// the pool synced. Endpoints that stay keep their identity, in-flight counts and slots.
func (p *Pool) Set(addrs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	want := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		want[a] = true
	}
	var added, removed []*router.Endpoint
	for a, ep := range p.byAddr {
		if !want[a] {
			ep.MarkRemoved()
			removed = append(removed, ep)
			delete(p.byAddr, a)
		}
	}
	for a := range want {
		if _, ok := p.byAddr[a]; ok {
			continue
		}
		ep := router.NewEndpoint(a, p.takeSlot())
		for _, f := range p.onAdd {
			f(ep)
		}
		p.byAddr[a] = ep
		added = append(added, ep)
	}
	p.publish()
	if len(added) > 0 || len(removed) > 0 {
		for _, l := range p.listeners {
			l.EndpointsChanged(added, removed)
		}
	}
	// Only now may a removed endpoint's slot be reused: every listener has forgotten it.
	for _, ep := range removed {
		p.freeSlots = append(p.freeSlots, ep.Slot)
	}
	p.synced.Store(true)
}

func (p *Pool) takeSlot() int {
	if n := len(p.freeSlots); n > 0 {
		s := p.freeSlots[n-1]
		p.freeSlots = p.freeSlots[:n-1]
		return s
	}
	p.nextSlot++
	return p.nextSlot - 1
}

func (p *Pool) publish() {
	snap := make([]*router.Endpoint, 0, len(p.byAddr))
	m := make(map[string]*router.Endpoint, len(p.byAddr))
	for a, ep := range p.byAddr {
		snap = append(snap, ep)
		m[a] = ep
	}
	sortByAddr(snap)
	p.snap.Store(&snap)
	p.lookup.Store(&m)
}

// MaxSlot returns one more than the largest slot ever handed out: the length of a per-slot array.
func (p *Pool) MaxSlot() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nextSlot
}

// ParseAddrs validates a list of "ip:port" endpoint addresses (IPv6 in brackets) and returns them
// in canonical form without duplicates. what names the source in error messages.
func ParseAddrs(what string, in []string) ([]string, error) {
	seen := map[string]bool{}
	out := make([]string, 0, len(in))
	for i, raw := range in {
		a, err := CanonicalAddr(strings.TrimSpace(raw))
		if err != nil {
			return nil, fmt.Errorf("%s[%d] %q: %w", what, i, raw, err)
		}
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out, nil
}

// CanonicalAddr checks that s is "ip:port" with a literal IP and a port in 1..65535 and returns
// it in the form the proxy will report back (IPv6 compressed, in brackets).
func CanonicalAddr(s string) (string, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", fmt.Errorf("want ip:port: %v", err)
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return "", fmt.Errorf("host %q is not an IP address", host)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("port %q is not in 1..65535", port)
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(n)), nil
}

func sortByAddr(eps []*router.Endpoint) {
	slices.SortFunc(eps, func(a, b *router.Endpoint) int { return strings.Compare(a.Addr, b.Addr) })
}
