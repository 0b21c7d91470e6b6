package prefix

// ghostRing remembers the hashes of the blocks an endpoint's LRU dropped for want of room (an
// eviction, or a commit's blocks beyond the capacity), the way ARC's ghost lists do: when the
// server later reports a cache hit on one of them, it still held a block the index had let go,
// so the capacity the index assumes for it is too small (evidence.go). How long ago the block
// was dropped, in drops, says by how much: the server also kept everything used after it. A
// ring of the last drops plus a table from each hash to the sequence number of its latest drop;
// ~30 bytes per hash (8 in the ring, 16-byte table slots at most 3/4 full).
type ghostRing struct {
	ring  []uint64
	seq   uint32 // drops so far; the next drop's sequence number
	count *table[uint32]
}

// Ring sizes: half the capacity, within [minGhosts, maxGhosts]. A hit shows a capacity up to
// 1.5 times the index's (growth also doubles an endpoint no trim has shrunk, evidence.go); the
// floor lets a capacity set 10× too small find the server's size within a few hits; half keeps
// the ring's ~30 bytes per hash to ~15 per index entry, so that the index with its rings stays
// under 100 bytes per entry; the ceiling is ~2 MiB per endpoint.
const (
	minGhosts = 4096
	maxGhosts = 1 << 16
)

func ghostsFor(capacity int) int { return min(max(capacity/2, minGhosts), maxGhosts) }

func newGhostRing(n int) *ghostRing {
	n = max(n, 1)
	return &ghostRing{ring: make([]uint64, n), count: newTable[uint32](n)}
}

// push records that h was dropped, forgetting the oldest drop when the ring is full.
func (g *ghostRing) push(h uint64) {
	i := int(g.seq % uint32(len(g.ring)))
	if g.seq >= uint32(len(g.ring)) {
		// The drop being overwritten is len(ring) drops old; its hash stays if dropped again since.
		old := g.ring[i]
		if s, ok := g.count.get(old); ok && s == g.seq-uint32(len(g.ring)) {
			g.count.del(old)
		}
	}
	g.ring[i] = h
	g.count.put(h, g.seq)
	g.seq++
}

// since reports whether h is in the ring and how many drops came after its latest one.
func (g *ghostRing) since(h uint64) (int, bool) {
	s, ok := g.count.get(h)
	if !ok {
		return 0, false
	}
	return int(g.seq - 1 - s), true
}

// len is the number of drops the ring holds.
func (g *ghostRing) len() int { return int(min(g.seq, uint32(len(g.ring)))) }

// newest returns a copy of the last n drops (fewer if the ring holds fewer), oldest first.
func (g *ghostRing) newest(n int) []uint64 {
	k := min(g.len(), n)
	out := make([]uint64, k)
	for i := range out {
		out[i] = g.ring[(g.seq-uint32(k-i))%uint32(len(g.ring))]
	}
	return out
}

func (g *ghostRing) bytes() int { return len(g.ring)*8 + g.count.bytes() }
