package prefix

import (
	"sync"
	"sync/atomic"

	"github.com/kvpick/kvpick/pkg/router"
)

// CommitPublisher takes the prompts this replica's servers took (pkg/peers' Log), for the
// other active replicas.
type CommitPublisher interface {
	Publish(addr string, hashes []uint64)
}

// peerLink is the plugin's side of sharing commits between active replicas (pkg/peers): the
// publisher its commits go to, and its endpoints by address for the peers' commits.
type peerLink struct {
	pub    atomic.Pointer[CommitPublisher]
	mu     sync.RWMutex
	byAddr map[string]*router.Endpoint
}

// PublishCommits sends every later commit (endpoint address, the prompt's block hashes) to
// pub as well; nil stops it.
func (pl *Plugin) PublishCommits(pub CommitPublisher) {
	if pub == nil {
		pl.peers.pub.Store(nil)
		return
	}
	pl.peers.pub.Store(&pub)
}

// ApplyPeerCommit commits hashes to the endpoint at addr, as if this replica had routed the
// request there and seen it served: another replica did. It reports false when the pool has
// no such endpoint.
func (pl *Plugin) ApplyPeerCommit(addr string, hashes []uint64) bool {
	pl.peers.mu.RLock()
	ep := pl.peers.byAddr[addr]
	pl.peers.mu.RUnlock()
	if ep == nil || len(hashes) == 0 {
		return false
	}
	if len(hashes) > pl.p.MaxBlocksPerRequest {
		hashes = hashes[:pl.p.MaxBlocksPerRequest]
	}
	pl.index.InsertIf(ep.Slot, hashes, func() bool { return !ep.Removed() })
	return true
}

// published sends one commit to the publisher, if there is one.
func (pl *Plugin) published(ep *router.Endpoint, hashes []uint64) {
	if p := pl.peers.pub.Load(); p != nil {
		(*p).Publish(ep.Addr, hashes)
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
