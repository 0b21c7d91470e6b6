// Package peers shares what each active picker replica learns with the others. A replica's
// prefix index otherwise knows only the requests that replica routed, so with two replicas
// side by side a prefix the other one placed looks new, gets placed again elsewhere, and the
// two copies crowd the servers' caches (the replay: a fifth to a third of the cache hits lost
// on shared prompts, docs/benchmarks.md "Active-active router replicas").
//
// Each replica keeps a bounded log of what it did with the prompts it routed — picked for an
// endpoint (its pending record), taken by the endpoint's server (the blocks it commits to its
// index on the response path) or dropped (the request failed or ended first) — and serves it
// on its metrics port (GET /peer/commits?since=N, with &wait=MS a long poll that waits for the
// next entry when there is none); every replica polls its peers' logs and
// applies their entries to its own index and pending records, as if it had routed the
// requests. A peer's pick also counts as a pick of its endpoint there (what the scrape has not
// seen yet) and, with the prefill scorer, as prefill work queued there until its commit or drop,
// so that replicas which see the same scraped state do not send their prefills to the same
// endpoints in pairs. In-flight counts and learned capacities stay each replica's own. Entries carry the
// endpoint's address, so replicas whose pools list the same servers agree on them; an entry for
// an endpoint a replica does not have is skipped.
package peers

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
)

// Wire format of a GET /peer/commits answer (little endian):
//
//	"KVPC" version:u8 instance:u64 next:u64 first:u64 count:u32
//	count × ( seq:u64 kind:u8 id:u64 addrLen:u8 addr blocks:u32 blocks×hash:u64 )
//
// kind is KindPick, KindCommit or KindDrop; id is the publisher's number for the request, the
// same in its pick and in the commit or drop that ends it (a drop has no address or blocks).
// instance identifies the process (random at start): a poller that reaches its own log, or a
// peer that restarted, tells by it. next is the sequence number the log will give its next
// entry, first the oldest it still holds; the entries are those with seq ≥ since, oldest first,
// up to maxAnswerBytes.
const (
	magic          = "KVPC"
	version        = 1
	headerBytes    = 4 + 1 + 8 + 8 + 8 + 4
	maxAnswerBytes = 1 << 20
	// maxEntryBlocks bounds one entry, as prefix-scorer's maxBlocksPerRequest is bounded.
	maxEntryBlocks = 1 << 20
)

// DefaultLogBlocks bounds a Log: 524,288 block hashes × 8 bytes = 4 MiB. At 100 requests/s of
// ~300 blocks each it holds the last ~17 s, far more than a poll interval.
const DefaultLogBlocks = 1 << 19

// Entry kinds.
const (
	KindPick   byte = 1 // a request was picked for the endpoint: its blocks are about to be cached
	KindCommit byte = 2 // the endpoint's server took the request: its blocks are cached
	KindDrop   byte = 3 // the picked request failed or ended before its server took it
)

type entry struct {
	seq    uint64
	kind   byte
	id     uint64
	addr   string
	hashes []uint64
}

// entryBytes is an entry's size on the wire.
func entryBytes(e *entry) int { return 8 + 1 + 8 + 1 + len(e.addr) + 4 + 8*len(e.hashes) }

// Log is a replica's recent commits, oldest dropped first once they hold more than its bound
// of block hashes. Safe for concurrent use.
type Log struct {
	id        uint64
	maxBlocks int

	mu      sync.Mutex
	entries []entry // oldest first from start
	start   int
	next    uint64
	blocks  int
	wake    chan struct{} // closed at the next entry; nil while no poll waits for one
	stopped bool          // StopWaiting was called: polls no longer wait
}

// NewLog returns an empty log holding at most maxBlocks block hashes (≤ 0: DefaultLogBlocks).
func NewLog(maxBlocks int) *Log {
	if maxBlocks <= 0 {
		maxBlocks = DefaultLogBlocks
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Log{id: binary.LittleEndian.Uint64(b[:]) | 1, maxBlocks: maxBlocks}
}

// Instance is the log's process identity, sent with every answer.
func (l *Log) Instance() uint64 { return l.id }

// Pick appends that request id was picked for the endpoint at addr, with its blocks (copied).
func (l *Log) Pick(id uint64, addr string, hashes []uint64) { l.publish(KindPick, id, addr, hashes) }

// Commit appends that the endpoint at addr took request id, with its blocks (copied).
func (l *Log) Commit(id uint64, addr string, hashes []uint64) {
	l.publish(KindCommit, id, addr, hashes)
}

// Drop appends that request id ended without its blocks being cached.
func (l *Log) Drop(id uint64) { l.publish(KindDrop, id, "", nil) }

func (l *Log) publish(kind byte, id uint64, addr string, hashes []uint64) {
	if (kind != KindDrop && len(hashes) == 0) || len(addr) > 255 {
		return
	}
	if len(hashes) > maxEntryBlocks {
		hashes = hashes[:maxEntryBlocks]
	}
	e := entry{kind: kind, id: id, addr: addr}
	if len(hashes) > 0 {
		e.hashes = append([]uint64(nil), hashes...)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e.seq = l.next
	l.next++
	l.wakeLocked()
	l.entries = append(l.entries, e)
	l.blocks += len(e.hashes)
	for l.blocks > l.maxBlocks && l.start < len(l.entries)-1 {
		l.blocks -= len(l.entries[l.start].hashes)
		l.entries[l.start] = entry{}
		l.start++
	}
	if l.start > 64 && l.start > len(l.entries)/2 {
		n := copy(l.entries, l.entries[l.start:])
		clear(l.entries[n:])
		l.entries = l.entries[:n]
		l.start = 0
	}
}

// waitFor returns a channel closed once the log holds an entry numbered since or later (at
// once if it does).
func (l *Log) waitFor(since uint64) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.next > since || l.stopped {
		return closed
	}
	if l.wake == nil {
		l.wake = make(chan struct{})
	}
	return l.wake
}

// StopWaiting answers every waiting long poll at once, and every later one without waiting:
// a server shutting down does not hold its followers' polls (nor its own shutdown) for a wait.
func (l *Log) StopWaiting() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	l.wakeLocked()
}

// wakeLocked answers the polls waiting for the next entry.
func (l *Log) wakeLocked() {
	if l.wake != nil {
		close(l.wake)
		l.wake = nil
	}
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// appendAnswer appends the answer to a poll for the entries from since on to dst. The entries
// are picked under the lock and encoded after it (their hashes never change once published),
// so a large answer does not hold up the commits of the response path.
func (l *Log) appendAnswer(dst []byte, since uint64) []byte {
	l.mu.Lock()
	live := l.entries[l.start:]
	next, first := l.next, l.next
	if len(live) > 0 {
		first = live[0].seq
	}
	i := 0
	if since > first {
		i = int(min(since-first, uint64(len(live))))
	}
	var picked []entry
	size := headerBytes
	for ; i < len(live); i++ {
		e := live[i]
		n := entryBytes(&e)
		if len(picked) > 0 && size+n > maxAnswerBytes {
			break
		}
		picked = append(picked, e)
		size += n
	}
	l.mu.Unlock()

	dst = append(dst, magic...)
	dst = append(dst, version)
	dst = binary.LittleEndian.AppendUint64(dst, l.id)
	dst = binary.LittleEndian.AppendUint64(dst, next)
	dst = binary.LittleEndian.AppendUint64(dst, first)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(picked)))
	for _, e := range picked {
		dst = binary.LittleEndian.AppendUint64(dst, e.seq)
		dst = append(dst, e.kind)
		dst = binary.LittleEndian.AppendUint64(dst, e.id)
		dst = append(dst, byte(len(e.addr)))
		dst = append(dst, e.addr...)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(e.hashes)))
		for _, h := range e.hashes {
			dst = binary.LittleEndian.AppendUint64(dst, h)
		}
	}
	return dst
}
