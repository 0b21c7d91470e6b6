package prefix

import (
	"slices"
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
type pendingSet struct {
	mu      sync.Mutex
	ttl     time.Duration
	byFirst map[uint64][]*pendingRecord
}

type pendingRecord struct {
	hashes  []uint64
	ep      *router.Endpoint
	expires time.Time
	live    bool
}

func newPendingSet(ttl time.Duration) *pendingSet {
	return &pendingSet{ttl: ttl, byFirst: map[uint64][]*pendingRecord{}}
}

func (p *pendingSet) add(r *pendingRecord, now time.Time) {
	if len(r.hashes) == 0 || p.ttl <= 0 {
		return
	}
	r.expires = now.Add(p.ttl)
	r.live = true
	p.mu.Lock()
	p.byFirst[r.hashes[0]] = append(p.byFirst[r.hashes[0]], r)
	p.mu.Unlock()
}

func (p *pendingSet) remove(r *pendingRecord) {
	if !r.live {
		return
	}
	r.live = false
	k := r.hashes[0]
	p.mu.Lock()
	defer p.mu.Unlock()
	recs := p.byFirst[k]
	if i := slices.Index(recs, r); i >= 0 {
		recs[i] = recs[len(recs)-1]
		recs[len(recs)-1] = nil
		recs = recs[:len(recs)-1]
	}
	if len(recs) == 0 {
		delete(p.byFirst, k)
	} else {
		p.byFirst[k] = recs
	}
}

// match raises lens[slot] to the number of leading blocks of hashes that a live, unexpired
// pending record on that endpoint shares.
func (p *pendingSet) match(hashes []uint64, now time.Time, lens []int32) {
	if len(hashes) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.byFirst[hashes[0]] {
		if now.After(r.expires) || r.ep.Removed() || r.ep.Slot >= len(lens) {
			continue
		}
		n := int32(commonPrefix(r.hashes, hashes))
		if lens[r.ep.Slot] < n {
			lens[r.ep.Slot] = n
		}
	}
}

func (p *pendingSet) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, recs := range p.byFirst {
		n += len(recs)
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
