package prefix

import (
	"math/bits"
	"slices"
)

// ghostTable remembers the hashes of the blocks an endpoint's LRU dropped for want of room (an
// eviction, or a commit's blocks beyond the capacity), the way ARC's ghost lists do: when the
// server later reports a cache hit on one of them, it still held a block the index had let go,
// so the capacity the index assumes for it is too small (evidence.go). How long ago the block
// was dropped, in drops, says by how much: the server also kept everything used after it.
//
// It is a direct-mapped table of the last drops: each hash has one slot, holding the hash and
// the sequence number of its drop. Placement is not keyed, unlike the index's tables: with no
// probing, colliding hashes cost nothing more, and a client who crafts prompts whose blocks
// collide only makes the table forget, which slows the learning of one capacity. A drop
// overwrites whatever its slot held, so the table is lossy — a drop survives k later ones with
// probability ~e^(-k/n) — but a push is one write with no probing or deletion: remembering
// evictions must not slow the commits that cause them (a ring with an exact hash table behind
// it nearly doubled the cost of a commit that evicts). Drops older than n are not reported, so
// that a slot left untouched for long cannot show an ancient drop. A bit per slot says whether
// the LRU holds the block again (committed after its drop), so that the drops since a block's
// can be counted without the blocks held again (Index.droppedSince). 12⅛ bytes per slot.
type ghostTable struct {
	keys []uint64
	seqs []uint32
	held []uint64 // bit i: the LRU holds keys[i] again
	seq  uint32   // drops so far; the next drop's sequence number
}

// Table sizes: half the capacity, within [minGhosts, maxGhosts]. A hit shows a capacity up to
// 1.5 times the index's; the floor lets a capacity set 10× too small find the server's size
// within a few hits; half keeps the table to ~6 bytes per index entry; the ceiling is 768 KiB
// per endpoint.
const (
	minGhosts = 4096
	maxGhosts = 1 << 16
)

func ghostsFor(capacity int) int { return min(max(capacity/2, minGhosts), maxGhosts) }

func newGhostTable(n int) *ghostTable {
	n = max(n, 1)
	return &ghostTable{keys: make([]uint64, n), seqs: make([]uint32, n), held: make([]uint64, (n+63)/64)}
}

func (g *ghostTable) slot(h uint64) int {
	hi, _ := bits.Mul64(fmix64(h), uint64(len(g.keys)))
	return int(hi)
}

// push records that h was dropped.
func (g *ghostTable) push(h uint64) {
	i := g.slot(h)
	g.keys[i], g.seqs[i] = h, g.seq
	g.markHeld(i, false)
	g.seq++
}

// heldAt reports slot i's held bit: the LRU holds keys[i] again.
func (g *ghostTable) heldAt(i int) bool { return g.held[uint(i)/64]&(1<<(uint(i)%64)) != 0 }

// markHeld sets or clears slot i's held bit.
func (g *ghostTable) markHeld(i int, held bool) {
	w, b := uint(i)/64, uint64(1)<<(uint(i)%64)
	if held {
		g.held[w] |= b
	} else {
		g.held[w] &^= b
	}
}

// since reports whether h was dropped within the last n drops and still has its slot, and how
// many drops came after its latest one.
func (g *ghostTable) since(h uint64) (int, bool) {
	i := g.slot(h)
	if h == 0 || g.keys[i] != h { // block hashes are never 0, the empty slot's key
		return 0, false
	}
	d := g.seq - 1 - g.seqs[i]
	if int64(d) >= int64(len(g.keys)) {
		return 0, false
	}
	return int(d), true
}

// setHeld notes that the LRU holds h again (a commit after its drop) or no longer does (Index.drop);
// a no-op when h is not in the table.
func (g *ghostTable) setHeld(h uint64, held bool) {
	if i := g.slot(h); g.keys[i] == h {
		g.markHeld(i, held)
	}
}

// countAfter counts the drops in slots [lo, hi) that came after the drop numbered cut and whose
// block the LRU does not hold again, and sums their ages in drops (Index.droppedSince).
func (g *ghostTable) countAfter(lo, hi int, cut uint32) (n, ages int) {
	keys, seqs := g.keys[lo:hi], g.seqs[lo:hi]
	seqs = seqs[:len(keys)]
	last := g.seq - 1
	for j, h := range keys {
		i := lo + j
		if int32(seqs[j]-cut) <= 0 || h == 0 || g.heldAt(i) {
			continue
		}
		n++
		ages += int(last - seqs[j])
	}
	return n, ages
}

// ghostDrop is one remembered drop, and whether the LRU holds its block again.
type ghostDrop struct {
	h    uint64
	held bool
}

// newest returns the remembered drops within the last n, oldest first.
func (g *ghostTable) newest(n int) []ghostDrop {
	type drop struct {
		seq uint32
		ghostDrop
	}
	var ds []drop
	for i, h := range g.keys {
		if d, ok := g.since(h); ok && d < n && g.slot(h) == i {
			ds = append(ds, drop{g.seqs[i], ghostDrop{h, g.heldAt(i)}})
		}
	}
	slices.SortFunc(ds, func(a, b drop) int { return int(int32(a.seq - b.seq)) })
	out := make([]ghostDrop, len(ds))
	for i, d := range ds {
		out[i] = d.ghostDrop
	}
	return out
}

// refill pushes drops, oldest first, keeping whether each is held again.
func (g *ghostTable) refill(ds []ghostDrop) {
	for _, d := range ds {
		g.push(d.h)
		g.setHeld(d.h, d.held)
	}
}

func (g *ghostTable) bytes() int { return len(g.keys)*12 + len(g.held)*8 }
