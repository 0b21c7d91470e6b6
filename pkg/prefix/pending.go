package prefix

import (
	"sync"
	"time"

	"github.com/kvpick/kvpick/pkg/router"
)

// pendingSet holds, for requests that were picked but whose response has not arrived yet, the
// blocks the picked endpoint is about to cache. Scoring counts them like index entries, so a
// burst of requests that share a new prefix follows the first one instead of spreading before
// the first response commits the prefix to the index.
//
// Records are grouped by the hash of their first block: only records that share it can match,
// and a match is a binary search over two hash chains (equal at i implies equal before i).
// The work of one match is bounded: a group keeps at most pendingPerEndpoint records per
// endpoint (the newest; a burst on one prefix repeats the same blocks, so older records add
// nothing a newer one does not), expired records are dropped when a match meets them, and the
// groups are spread over shards with a lock each, so that unrelated prefixes do not contend.
type pendingSet struct {
	ttl    time.Duration
	shards [pendingShards]pendingShard
}

const (
	pendingShards = 64
	// pendingPerEndpoint bounds a group's records per endpoint: a match scans at most this many
	// times the pool's size.
	pendingPerEndpoint = 4
)

type pendingShard struct {
	mu      sync.Mutex
	byFirst map[uint64][]*pendingRecord
}

type pendingRecord struct {
	hashes  []uint64
	ep      *router.Endpoint
	seq     int64 // the request's pick number on ep (router.Request.PickSeq)
	expires time.Time
	live    bool
	at      int // index in its group (under the shard's lock)
}

func newPendingSet(ttl time.Duration) *pendingSet {
	p := &pendingSet{ttl: ttl}
	for i := range p.shards {
		p.shards[i].byFirst = map[uint64][]*pendingRecord{}
	}
	return p
}

func (p *pendingSet) shard(first uint64) *pendingShard { return &p.shards[first>>58] }

func (p *pendingSet) add(r *pendingRecord, now time.Time) {
	if len(r.hashes) == 0 || p.ttl <= 0 {
		return
	}
	r.expires = now.Add(p.ttl)
	k := r.hashes[0]
	sh := p.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	recs := sh.byFirst[k]
	// Keep at most pendingPerEndpoint records of this endpoint in the group: drop the oldest.
	same, oldest := 0, -1
	for i, o := range recs {
		if o.ep == r.ep {
			same++
			if oldest < 0 || o.expires.Before(recs[oldest].expires) {
				oldest = i
			}
		}
	}
	if same >= pendingPerEndpoint {
		recs = removeAt(recs, oldest)
	}
	r.live = true
	r.at = len(recs)
	sh.byFirst[k] = append(recs, r)
}

// removeAt drops recs[i] (swap with the last) and returns the shorter group.
func removeAt(recs []*pendingRecord, i int) []*pendingRecord {
	recs[i].live = false
	last := len(recs) - 1
	recs[i] = recs[last]
	recs[i].at = i
	recs[last] = nil
	return recs[:last]
}

func (p *pendingSet) remove(r *pendingRecord) {
	if len(r.hashes) == 0 {
		return
	}
	k := r.hashes[0]
	sh := p.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !r.live {
		return
	}
	recs := removeAt(sh.byFirst[k], r.at)
	if len(recs) == 0 {
		delete(sh.byFirst, k)
	} else {
		sh.byFirst[k] = recs
	}
}

// match raises lens[slot] to the number of leading blocks of hashes that a live, unexpired
// pending record on that endpoint shares, and counts in counts[slot] (when counts is not nil)
// the records there that share at least minBlocks and are still prefilling; a record whose
// request is known to be past its prefill (Endpoint.PrefilledThrough) raises prefilled[slot]
// instead (when not nil): its prompt is in the cache, its answer just has not come. It drops
// the expired records it meets.
func (p *pendingSet) match(hashes []uint64, now time.Time, lens, counts, prefilled []int32, minBlocks int) {
	if len(hashes) == 0 {
		return
	}
	k := hashes[0]
	sh := p.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	recs := sh.byFirst[k]
	for i := 0; i < len(recs); {
		r := recs[i]
		if now.After(r.expires) || r.ep.Removed() {
			recs = removeAt(recs, i)
			continue
		}
		i++
		if r.ep.Slot >= len(lens) {
			continue
		}
		n := int32(commonPrefix(r.hashes, hashes))
		if lens[r.ep.Slot] < n {
			lens[r.ep.Slot] = n
		}
		if r.seq > 0 && r.seq <= r.ep.PrefilledThrough() {
			if prefilled != nil && prefilled[r.ep.Slot] < n {
				prefilled[r.ep.Slot] = n
			}
			continue
		}
		if counts != nil && int(n) >= minBlocks {
			counts[r.ep.Slot]++
		}
	}
	if len(recs) == 0 {
		delete(sh.byFirst, k)
	} else {
		sh.byFirst[k] = recs
	}
}

func (p *pendingSet) len() int {
	n := 0
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.Lock()
		for _, recs := range sh.byFirst {
			n += len(recs)
		}
		sh.mu.Unlock()
	}
	return n
}

// commonPrefix returns how many leading hashes a and b share, given a[0] == b[0] and chained
// hashes (a[i] == b[i] implies a[j] == b[j] for all j < i).
func commonPrefix(a, b []uint64) int {
	lo, hi := 1, min(len(a), len(b)) // a[:lo] is shared; the answer is in [lo, hi]
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if a[mid-1] == b[mid-1] {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}
