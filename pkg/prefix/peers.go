package prefix

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvpick/kvpick/pkg/router"
)

// PeerPublisher takes what this replica does with the prompts it routes (pkg/peers' Log), for
// the other active replicas: a pick, then the commit or the drop that ends it, under one id.
type PeerPublisher interface {
	Pick(id uint64, addr string, hashes []uint64)
	Commit(id uint64, addr string, hashes []uint64)
	Drop(id uint64)
}

// maxPeerPending bounds the pending records held for other replicas' picks: a peer that stops
// publishing the end of its requests (it crashed) leaves at most this many, each expiring with
// pendingTTL like this replica's own.
const maxPeerPending = 1 << 16

type peerKey struct{ peer, id uint64 }

type peerPending struct {
	rec  *pendingRecord
	at   time.Time
	pick *PeerPick // told to the observers (nil: none)
}

// PeerPick is another replica's pick as this replica applies it: the endpoint, the pick's
// number there (counted here, in the order the picks reach this replica: Endpoint.CountPeerPick)
// and the prompt blocks the endpoint neither held nor was about to hold (index and pending
// records) when it was applied — the prefill work the pick brings there, as this replica sees it.
type PeerPick struct {
	Endpoint *router.Endpoint
	Seq      int64
	Uncached int
}

// PeerObserver is told of the other replicas' picks (the prefill scorer counts them in its
// queue estimate): PeerPicked when one is applied, then exactly one PeerEnded with the same
// pointer — committed when its server took the request (its prefill is over), not when it was
// dropped or expired (pendingTTL).
type PeerObserver interface {
	PeerPicked(p *PeerPick)
	PeerEnded(p *PeerPick, committed bool)
}

// peerLink is the plugin's side of sharing with the other active replicas (pkg/peers): the
// publisher its picks and commits go to, its endpoints by address, and the pending records of
// the peers' picks.
type peerLink struct {
	pub    atomic.Pointer[PeerPublisher]
	nextID atomic.Uint64
	mu     sync.RWMutex
	byAddr map[string]*router.Endpoint

	obs atomic.Pointer[[]PeerObserver]

	pmu     sync.Mutex
	pending map[peerKey]peerPending
	swept   time.Time // when the expired peer picks were last dropped
}

// ObservePeers adds o to the observers of the peers' picks (before the first is applied).
func (pl *Plugin) ObservePeers(o PeerObserver) {
	for {
		old := pl.peers.obs.Load()
		var next []PeerObserver
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, o)
		if pl.peers.obs.CompareAndSwap(old, &next) {
			return
		}
	}
}

func (pl *Plugin) peerObservers() []PeerObserver {
	if o := pl.peers.obs.Load(); o != nil {
		return *o
	}
	return nil
}

// PublishTo sends every later pick, commit and drop to pub as well; nil stops it.
func (pl *Plugin) PublishTo(pub PeerPublisher) {
	if pub == nil {
		pl.peers.pub.Store(nil)
		return
	}
	pl.peers.pub.Store(&pub)
}

func (pl *Plugin) endpointAt(addr string) *router.Endpoint {
	pl.peers.mu.RLock()
	defer pl.peers.mu.RUnlock()
	return pl.peers.byAddr[addr]
}

func (pl *Plugin) clip(hashes []uint64) []uint64 {
	return hashes[:min(len(hashes), pl.p.MaxBlocksPerRequest)]
}

// ApplyPeerPick records another replica's pick as a pending record on the endpoint at addr,
// as this replica's own picks are, until the commit or drop that ends it (or pendingTTL), and
// tells the PeerObservers. It reports false when the pool has no such endpoint.
func (pl *Plugin) ApplyPeerPick(peer, id uint64, addr string, hashes []uint64) bool {
	ep := pl.endpointAt(addr)
	if ep == nil || len(hashes) == 0 {
		return false
	}
	hashes = pl.clip(hashes)
	now := pl.now()
	obs := pl.peerObservers()
	var ended []peerPending
	defer func() { pl.tellEnded(ended, false) }()
	l := &pl.peers
	l.pmu.Lock()
	defer l.pmu.Unlock()
	if l.pending == nil {
		l.pending = map[peerKey]peerPending{}
	}
	// Expired picks (a peer that stopped publishing: it crashed) go every pendingTTL, or at
	// once when the map is full.
	ttl := pl.p.PendingTTL.D()
	if len(l.pending) >= maxPeerPending || now.Sub(l.swept) > ttl {
		l.swept = now
		for k, v := range l.pending {
			if now.Sub(v.at) > ttl {
				pl.pending.remove(v.rec)
				delete(l.pending, k)
				ended = append(ended, v)
			}
		}
		if len(l.pending) >= maxPeerPending {
			return true // full of live picks: this one is not remembered
		}
	}
	// Counted as a pick of the endpoint here (load and KV room count the picks a scrape has
	// not seen yet). Without observers its record has no pick number: a peer's request never
	// counts as past its prefill, as nothing would tell (the prefill scorer tells).
	seq := ep.CountPeerPick()
	rec := &pendingRecord{hashes: hashes, ep: ep, seq: math.MaxInt64}
	v := peerPending{rec: rec, at: now}
	if len(obs) > 0 {
		v.pick = &PeerPick{Endpoint: ep, Seq: seq, Uncached: len(hashes) - pl.heldOn(ep, hashes, now)}
		rec.seq = seq
		for _, o := range obs {
			o.PeerPicked(v.pick)
		}
	}
	pl.pending.add(rec, now)
	l.pending[peerKey{peer, id}] = v
	return true
}

// heldOn is how many leading blocks of hashes ep holds or is about to hold (index, pending
// records).
func (pl *Plugin) heldOn(ep *router.Endpoint, hashes []uint64, now time.Time) int {
	n := pl.index.MatchSlot(ep.Slot, hashes)
	lens := make([]int32, ep.Slot+1)
	pl.pending.match(hashes, now, lens, nil, nil, 0)
	return max(n, int(lens[ep.Slot]))
}

// tellEnded tells the observers that the peers' picks in vs ended.
func (pl *Plugin) tellEnded(vs []peerPending, committed bool) {
	for _, v := range vs {
		if v.pick == nil {
			continue
		}
		for _, o := range pl.peerObservers() {
			o.PeerEnded(v.pick, committed)
		}
	}
}

// ApplyPeerCommit ends the peer's pick id and commits hashes to the endpoint at addr, as if
// this replica had routed the request there and seen it served. It reports false when the pool
// has no such endpoint.
func (pl *Plugin) ApplyPeerCommit(peer, id uint64, addr string, hashes []uint64) bool {
	pl.endPeerPick(peer, id, true)
	ep := pl.endpointAt(addr)
	if ep == nil || len(hashes) == 0 {
		return false
	}
	pl.index.InsertIf(ep.Slot, pl.clip(hashes), func() bool { return !ep.Removed() })
	return true
}

// ApplyPeerDrop ends the peer's pick id: its pending record goes.
func (pl *Plugin) ApplyPeerDrop(peer, id uint64) { pl.endPeerPick(peer, id, false) }

func (pl *Plugin) endPeerPick(peer, id uint64, committed bool) {
	l := &pl.peers
	l.pmu.Lock()
	v, ok := l.pending[peerKey{peer, id}]
	delete(l.pending, peerKey{peer, id})
	l.pmu.Unlock()
	if ok {
		pl.pending.remove(v.rec)
		pl.tellEnded([]peerPending{v}, committed)
	}
}

// peerPendingCount is the number of peers' picks held (tests).
func (pl *Plugin) peerPendingCount() int {
	pl.peers.pmu.Lock()
	defer pl.peers.pmu.Unlock()
	return len(pl.peers.pending)
}

// publishPick publishes a pick of st's prompt for ep (ending an earlier pick of the same
// request first: the pipeline picked again).
func (pl *Plugin) publishPick(st *state, ep *router.Endpoint) {
	p := pl.peers.pub.Load()
	if p == nil {
		return
	}
	if st.peerID != 0 {
		(*p).Drop(st.peerID)
	}
	st.peerID = pl.peers.nextID.Add(1)
	(*p).Pick(st.peerID, ep.Addr, st.hashes)
}

// publishEnd publishes how st's pick ended: committed to served, or dropped (served nil).
func (pl *Plugin) publishEnd(st *state, served *router.Endpoint) {
	id := st.peerID
	st.peerID = 0
	p := pl.peers.pub.Load()
	if p == nil || id == 0 {
		return
	}
	if served != nil {
		(*p).Commit(id, served.Addr, st.hashes)
	} else {
		(*p).Drop(id)
	}
}

// endpointsChanged keeps the endpoints by address.
func (l *peerLink) endpointsChanged(added, removed []*router.Endpoint) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byAddr == nil {
		l.byAddr = map[string]*router.Endpoint{}
	}
	for _, e := range removed {
		if l.byAddr[e.Addr] == e {
			delete(l.byAddr, e.Addr)
		}
	}
	for _, e := range added {
		l.byAddr[e.Addr] = e
	}
}
