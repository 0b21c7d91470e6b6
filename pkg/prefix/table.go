package prefix

import (
	"crypto/rand"
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// table is an open-addressing hash table from non-zero uint64 keys (block hashes, already
// uniformly distributed) to values, with Robin Hood linear probing and backward-shift deletion. Unlike Go's
// maps it leaves no tombstones behind, so an index that inserts and evicts without end keeps
// the memory it was sized for; and its size need not be a power of two (slots are found by
// multiply-shift), so a table bounded to n entries takes n/maxLoad slots, not the next power of
// two above that.
type table[V uint32 | uint64] struct {
	slots []slot[V] // key 0 = empty; key and value side by side: one cache miss per probe
	n     int
	limit int // most slots the table may grow to; 0 = unbounded
}

type slot[V uint32 | uint64] struct {
	k uint64
	v V
}

// Tables grow past 3/4 full: inserting into a linear-probing table costs about
// (1 + 1/(1-load)^2)/2 probes, 8.5 at 3/4 against 32 at 7/8, and the index inserts and evicts
// on every commit. Unbounded tables grow by half (doubling would leave them barely over a
// third full right after growing) and shrink below 1/8 full (the reverse map after endpoints
// leave).
const (
	maxLoadNum, maxLoadDen = 3, 4
	minSlots               = 64
)

// slotsFor is the table size that holds n entries at the maximum load.
func slotsFor(n int) int { return max(minSlots, (n*maxLoadDen+maxLoadNum-1)/maxLoadNum+1) }

func newTable[V uint32 | uint64](bound int) *table[V] {
	t := &table[V]{}
	if bound > 0 {
		t.limit = slotsFor(bound)
	}
	t.resize(min(minSlots*16, max(t.limit, minSlots)))
	return t
}

// home is k's first slot. Keys are block hashes that clients choose the text of, and the hash
// function is public, so placing keys by their own bits would let a client craft prompts whose
// blocks all land in one probe run (each insert and lookup then walks the whole run). The
// placement is keyed per process instead: without the key a client cannot tell which keys
// collide. Only placement changes; the hashes themselves, and the tie-breaks replicas agree on,
// do not.
func (t *table[V]) home(k uint64) int {
	hi, _ := bits.Mul64(fmix64(k^placementKey), uint64(len(t.slots)))
	return int(hi)
}

// placementKey is drawn once per process.
var placementKey = func() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("prefix: no randomness for the table key: " + err.Error())
	}
	return binary.LittleEndian.Uint64(b[:])
}()

func (t *table[V]) next(i int) int {
	i++
	if i == len(t.slots) {
		return 0
	}
	return i
}

// dist is how far slot i is from the home slot of the key it holds.
func (t *table[V]) dist(i int) int {
	d := i - t.home(t.slots[i].k)
	if d < 0 {
		d += len(t.slots)
	}
	return d
}

// get returns the value stored under k. Robin Hood order lets a miss stop as soon as it meets a
// key closer to its own home than k would be.
func (t *table[V]) get(k uint64) (V, bool) {
	for i, d := t.home(k), 0; ; i, d = t.next(i), d+1 {
		s := &t.slots[i]
		if s.k == k {
			return s.v, true
		}
		if s.k == 0 || t.dist(i) < d {
			var zero V
			return zero, false
		}
	}
}

// put stores v under k.
func (t *table[V]) put(k uint64, v V) { *t.upsert(k) = v }

// upsert returns the value slot of k, inserting k with a zero value if it is absent; existed
// tells which. One probe sequence serves the lookup and the insertion. The pointer is valid until
// the next put, upsert or del.
func (t *table[V]) upsert(k uint64) *V {
	v, _ := t.upsertFound(k)
	return v
}

func (t *table[V]) upsertFound(k uint64) (*V, bool) {
	if (t.n+1)*maxLoadDen > len(t.slots)*maxLoadNum && (t.limit == 0 || len(t.slots) < t.limit) {
		size := len(t.slots) + len(t.slots)/2
		if t.limit > 0 {
			size = min(size, t.limit)
		}
		t.resize(size)
	}
	// Robin Hood insertion: a key further from its home takes the slot of one closer to its
	// own, which keeps probe runs of similar length and lets a miss stop early.
	cur := slot[V]{k: k}
	var mine *V
	for i, d := t.home(k), 0; ; i, d = t.next(i), d+1 {
		s := &t.slots[i]
		switch {
		case s.k == 0:
			*s = cur
			t.n++
			if mine == nil {
				mine = &s.v
			}
			return mine, false
		case mine == nil && s.k == k:
			return &s.v, true
		}
		if sd := t.dist(i); sd < d {
			*s, cur = cur, *s
			if mine == nil {
				mine = &s.v // k now lives here; what follows moves the displaced keys
			}
			d = sd
		}
	}
}

// del removes k. The keys after it shift back one slot until one sits at its home, so no
// tombstone is left and every key stays reachable.
func (t *table[V]) del(k uint64) {
	i := t.home(k)
	for d := 0; t.slots[i].k != k; i, d = t.next(i), d+1 {
		if t.slots[i].k == 0 || t.dist(i) < d {
			return
		}
	}
	for j := t.next(i); t.slots[j].k != 0 && t.dist(j) > 0; i, j = j, t.next(j) {
		t.slots[i] = t.slots[j]
	}
	t.slots[i] = slot[V]{}
	t.n--
	if t.limit == 0 && len(t.slots) > minSlots*16 && t.n*8 < len(t.slots) {
		t.resize(len(t.slots) / 3)
	}
}

func (t *table[V]) resize(size int) {
	old := t.slots
	t.slots = make([]slot[V], size)
	t.n = 0
	for _, s := range old {
		if s.k != 0 {
			t.put(s.k, s.v)
		}
	}
}

// bytes is the table's memory.
func (t *table[V]) bytes() int { return len(t.slots) * int(unsafe.Sizeof(slot[V]{})) }
