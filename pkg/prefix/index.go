package prefix

import (
	"sync"
	"unsafe"
)

// Index remembers, per endpoint, which prompt blocks that endpoint has served, in a bounded LRU
// per endpoint, plus a reverse map from block hash to the endpoints that hold it.
//
// Memory: every (endpoint, block) entry is one 32-byte node in a paged slab plus one 16-byte slot
// (at most 3/4 full) in its endpoint's hash→node table; each distinct block adds one 16-byte slot
// in the reverse table. That is ~60-85 bytes per entry in all, steady under endless churn
// (docs/benchmarks.md has the measurements), against 100+ bytes for a golang-lru cache alone:
// the slab links the LRU list and the holder list with 32-bit node numbers instead of pointers,
// and the tables (table.go) leave no tombstones.
//
// Lookups exploit two facts. Block hashes are chained, so holding block i implies having been
// given blocks 0..i-1 with it; and a request's blocks are inserted tail first, so within an
// endpoint's LRU a block is never older than any block after it. Hence the set of endpoints that
// hold block i shrinks as i grows, and the number of holders of block i, read from the reverse
// map, is a non-increasing step function of i. Match finds its steps by bisection and only looks
// at holder lists where the count drops: a handful of map lookups per request however many
// endpoints the pool has.
type Index struct {
	mu       sync.RWMutex
	capacity int               // default per-endpoint capacity in blocks
	blocks   *table[uint64]    // block hash → holder count<<32 | first holder node
	eps      []*endpointLRU    // by endpoint slot; nil when the slot holds nothing
	pages    []*[pageSize]node // node slab; node 0 is the nil node
	hw       uint32            // first never-used node
	free     uint32            // free-list head, linked through node.next
	nfree    int
	// tick counts commits (Insert calls), pool-wide: the index's clock for the age of an
	// endpoint's least recently used block (TailAges). It is a counter, not wall time, so that
	// ages compare across endpoints and do not depend on how fast requests come.
	tick uint32
	// ghosts gives new endpoints a ghost table (ghost.go): the capacities of endpoints whose
	// servers report no cache size are learned from the evidence.
	ghosts bool
}

const (
	pageBits = 12
	pageSize = 1 << pageBits
	freeEP   = ^uint32(0) // node.ep of a node on the free list
)

// node is one (endpoint, block) entry: a link in its endpoint's LRU list and in its block's
// holder list. Node numbers are uint32: 4 billion entries is far beyond any configured bound.
type node struct {
	hash         uint64
	prev, next   uint32 // endpoint LRU: prev is more recent, next is older
	sprev, snext uint32 // holders of the same block
	ep           uint32 // endpoint slot
	stamp        uint32 // Index.tick when the endpoint last used the block (fills the padding)
}

type endpointLRU struct {
	head, tail uint32 // head is the most recently used block
	n          int
	capacity   int
	byHash     *table[uint32]
	ghost      *ghostTable // blocks dropped for want of room; nil unless learning this capacity
	// trimmed: TrimOlder has cut this endpoint since its ghost table started. Its server was
	// shown to hold less than the index, so what the index dropped for room is gone there too,
	// and GhostMatch gives it no credit.
	trimmed bool
}

// NewIndex returns an index that keeps at most capacity blocks per endpoint.
func NewIndex(capacity int) *Index {
	return &Index{
		capacity: max(capacity, 1),
		hw:       1,
		blocks:   newTable[uint64](0),
		pages:    []*[pageSize]node{new([pageSize]node)}, // node 0, the nil node, is never handed out
	}
}

func (x *Index) node(i uint32) *node { return &x.pages[i>>pageBits][i&(pageSize-1)] }

func (x *Index) alloc() uint32 {
	if x.free != 0 {
		i := x.free
		x.free = x.node(i).next
		x.nfree--
		return i
	}
	// Hand out the next never-used node: they sit after the last used one on the last page.
	i := x.highWater()
	if int(i)>>pageBits == len(x.pages) {
		x.pages = append(x.pages, new([pageSize]node))
	}
	x.setHighWater(i + 1)
	return i
}

func (x *Index) highWater() uint32 { return x.hw }

func (x *Index) setHighWater(hw uint32) { x.hw = hw }

func (x *Index) release(i uint32) {
	n := x.node(i)
	*n = node{ep: freeEP, next: x.free}
	x.free = i
	x.nfree++
}

func (x *Index) lru(slot int) *endpointLRU {
	for slot >= len(x.eps) {
		x.eps = append(x.eps, nil)
	}
	l := x.eps[slot]
	if l == nil {
		l = &endpointLRU{capacity: x.capacity, byHash: newTable[uint32](x.capacity)}
		if x.ghosts {
			l.ghost = newGhostTable(ghostsFor(l.capacity))
		}
		x.eps[slot] = l
	}
	return l
}

// SetCapacity bounds one endpoint's LRU, for servers that report their real KV capacity.
// Entries over the new bound are evicted at once, oldest first, removeChunk per hold of the
// write lock.
func (x *Index) SetCapacity(slot, capacity int) {
	capacity = max(capacity, 1)
	for {
		x.mu.Lock()
		l := x.lru(slot)
		l.capacity = capacity
		for i := 0; i < removeChunk && l.n > l.capacity; i++ {
			x.evictForRoom(l)
		}
		if l.n <= l.capacity {
			l.byHash.limit = slotsFor(l.capacity)
			if len(l.byHash.slots) > l.byHash.limit {
				l.byHash.resize(l.byHash.limit)
			}
			x.mu.Unlock()
			x.resizeGhost(slot, capacity)
			return
		}
		x.mu.Unlock()
	}
}

// resizeGhost fits endpoint slot's ghost table to a new capacity when the size it wants is at
// least twice or at most half the table's: rebuilding a table of up to 65,536 slots takes a
// millisecond or more, so it is rare and built outside the write lock, from a copy of the
// newest hashes (drops between the copy and the swap are lost, a handful at most).
func (x *Index) resizeGhost(slot, capacity int) {
	want := ghostsFor(capacity)
	x.mu.RLock()
	if slot >= len(x.eps) || x.eps[slot] == nil || x.eps[slot].ghost == nil {
		x.mu.RUnlock()
		return
	}
	old := x.eps[slot].ghost
	if n := len(old.keys); want < 2*n && 2*want > n {
		x.mu.RUnlock()
		return
	}
	newest := old.newest(want)
	x.mu.RUnlock()
	r := newGhostTable(want)
	r.refill(newest)
	x.mu.Lock()
	if slot < len(x.eps) && x.eps[slot] != nil && x.eps[slot].ghost == old {
		x.eps[slot].ghost = r
	}
	x.mu.Unlock()
}

// SetDefaultCapacity sets the capacity of endpoints that get their first entry from now on.
func (x *Index) SetDefaultCapacity(capacity int) {
	x.mu.Lock()
	x.capacity = max(capacity, 1)
	x.mu.Unlock()
}

// SetCapacityAll bounds every endpoint's LRU, and those of endpoints to come, to capacity
// blocks, evicting the oldest entries over the new bound.
func (x *Index) SetCapacityAll(capacity int) { x.ResizeDefault(capacity, nil) }

// ResizeDefault sets the capacity of endpoints to come and resizes every endpoint's LRU to it,
// except those for whose slot keep reports true.
func (x *Index) ResizeDefault(capacity int, keep func(slot int) bool) {
	x.SetDefaultCapacity(capacity)
	x.mu.RLock()
	n := len(x.eps)
	x.mu.RUnlock()
	for slot := range n {
		if keep != nil && keep(slot) {
			continue
		}
		x.mu.RLock()
		resize := slot < len(x.eps) && x.eps[slot] != nil && x.eps[slot].capacity != max(capacity, 1)
		x.mu.RUnlock()
		if resize {
			x.SetCapacity(slot, capacity)
		}
	}
}

// CapacityOf returns endpoint slot's capacity (the default for one with no entries yet).
func (x *Index) CapacityOf(slot int) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if slot < len(x.eps) && x.eps[slot] != nil {
		return x.eps[slot].capacity
	}
	return x.capacity
}

// Capacity returns the capacity new endpoints get.
func (x *Index) Capacity() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.capacity
}

// Insert records that endpoint slot served a prompt with these block hashes. Blocks are
// inserted tail first, so the head of the prompt, the part most likely shared, is the most
// recently used and the last to be evicted, as in vLLM's free-block queue.
func (x *Index) Insert(slot int, hashes []uint64) { x.InsertIf(slot, hashes, nil) }

// commitChunk bounds the blocks one commit inserts per hold of the write lock, so that a long
// prompt's commit (8,192 blocks each evicting one: over a millisecond) does not stall the
// decisions queued behind it. Between chunks the endpoint holds the prompt's tail without its
// head for a few microseconds; Match tolerates that (it may credit the endpoint with the whole
// prompt that much early, when the commit is about to make it true anyway).
const commitChunk = 512

// InsertIf is Insert, skipped when keep (if not nil) reports false under the index lock. The
// prefix plugin uses it so that a commit for an endpoint removed concurrently cannot land after
// the removal.
func (x *Index) InsertIf(slot int, hashes []uint64, keep func() bool) {
	end := -1
	for end != 0 {
		x.mu.Lock()
		if keep != nil && !keep() {
			x.mu.Unlock()
			return
		}
		l := x.lru(slot)
		if end < 0 {
			// Blocks beyond the capacity would be evicted by the head's own insertion: skip them.
			end = min(len(hashes), l.capacity)
			x.tick++
			if l.ghost != nil {
				// The skipped blocks were dropped for want of room, too; head-most last, so
				// that those are the newest drops.
				for i := min(len(hashes), end+len(l.ghost.keys)) - 1; i >= end; i-- {
					l.ghost.push(hashes[i])
				}
			}
		}
		start := max(0, end-commitChunk)
		x.insertLocked(l, slot, hashes[start:end])
		x.mu.Unlock()
		end = start
	}
}

// insertLocked inserts hashes tail first into l.
func (x *Index) insertLocked(l *endpointLRU, slot int, hashes []uint64) {
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if ni, ok := l.byHash.get(h); ok {
			x.unlinkLRU(l, ni)
			x.pushFront(l, ni)
			continue
		}
		if l.n >= l.capacity {
			x.evictForRoom(l)
		}
		ni := x.alloc()
		n := x.node(ni)
		*n = node{hash: h, ep: uint32(slot)}
		x.pushFront(l, ni)
		l.byHash.put(h, ni)
		l.n++
		if l.ghost != nil {
			l.ghost.setHeld(h, true)
		}
		ref := x.blocks.upsert(h)
		first, count := uint32(*ref), uint32(*ref>>32)
		n.snext = first
		if first != 0 {
			x.node(first).sprev = ni
		}
		*ref = uint64(count+1)<<32 | uint64(ni)
	}
}

func (x *Index) pushFront(l *endpointLRU, ni uint32) {
	n := x.node(ni)
	n.prev, n.next, n.stamp = 0, l.head, x.tick
	if l.head != 0 {
		x.node(l.head).prev = ni
	}
	l.head = ni
	if l.tail == 0 {
		l.tail = ni
	}
}

func (x *Index) unlinkLRU(l *endpointLRU, ni uint32) {
	n := x.node(ni)
	if n.prev != 0 {
		x.node(n.prev).next = n.next
	} else {
		l.head = n.next
	}
	if n.next != 0 {
		x.node(n.next).prev = n.prev
	} else {
		l.tail = n.prev
	}
	n.prev, n.next = 0, 0
}

// evict drops the endpoint's least recently used block.
func (x *Index) evict(l *endpointLRU) {
	ni := l.tail
	if ni == 0 {
		return
	}
	x.drop(l, ni)
}

// evictForRoom evicts the least recently used block to make room, remembering it in the ghost
// table; evictions on the server's evidence (TrimOlder) are not remembered: the server no longer
// has those blocks.
func (x *Index) evictForRoom(l *endpointLRU) {
	if l.ghost != nil && l.tail != 0 {
		l.ghost.push(x.node(l.tail).hash)
	}
	x.evict(l)
}

// SetGhosts decides whether endpoints that get their first entry from now on keep a ghost table.
func (x *Index) SetGhosts(on bool) {
	x.mu.Lock()
	x.ghosts = on
	x.mu.Unlock()
}

// SetGhost starts or stops endpoint slot's ghost table (sized to its capacity).
func (x *Index) SetGhost(slot int, on bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	l := x.lru(slot)
	switch {
	case !on:
		l.ghost = nil
	case l.ghost == nil:
		l.ghost = newGhostTable(ghostsFor(l.capacity))
		l.trimmed = false
	}
}

// ghostSince reports whether l's LRU dropped h for want of room and does not hold it again, and
// how many drops came after.
func (l *endpointLRU) ghostSince(h uint64) (int, bool) {
	d, ok := l.ghost.since(h)
	if !ok {
		return 0, false
	}
	if _, held := l.byHash.get(h); held {
		return 0, false
	}
	return d, true
}

// GhostMatch extends lens[slot], the leading blocks of hashes that endpoint slot holds, by the
// blocks that follow and that its LRU dropped for want of room within its last capacity's worth
// of drops — for the endpoints with ghost tables that no trim has cut. A capacity learned too
// small hides itself: the index forgets prompts its server still holds, the scorer sends them
// elsewhere, and no report comes back that could show the ghost hit that would grow it. The
// credit draws such a prompt back when the endpoint is not much busier than the others, and its
// report settles it: the hit grows the capacity (evidence.go), a miss costs what routing it
// elsewhere would have. Full credit, not half: a server whose capacity was never shown smaller
// than the index's most likely still holds what the index dropped last (half credit gave back
// 1.8 points of capacity-x0.1 shared-prefix hit ratio on the tuning seeds; docs/benchmarks.md).
func (x *Index) GhostMatch(hashes []uint64, lens []int32) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for slot, l := range x.eps {
		if slot >= len(lens) || l == nil || l.ghost == nil || l.trimmed || l.ghost.seq == 0 {
			continue
		}
		n := 0
		for _, h := range hashes[min(int(lens[slot]), len(hashes)):] {
			if d, ok := l.ghostSince(h); !ok || d >= l.capacity {
				break
			}
			n++
		}
		lens[slot] += int32(n)
	}
}

// Tick is the index's commit clock: a block committed later has a newer stamp.
func (x *Index) Tick() uint32 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.tick
}

// GhostHits counts the blocks of hashes that endpoint slot's LRU dropped for want of room and
// did not hold at commit clock after (Tick): not held again, or committed again since — the
// request that a report is about has its own blocks committed again at its first byte, before
// the report comes, and they count. It returns how many distinct blocks were dropped after the
// one dropped longest ago and are not held again (droppedSince); and the endpoint's capacity.
func (x *Index) GhostHits(slot int, hashes []uint64, after uint32) (hits, dropped, capacity int) {
	x.mu.RLock()
	if slot >= len(x.eps) || x.eps[slot] == nil || x.eps[slot].ghost == nil {
		x.mu.RUnlock()
		return 0, 0, 0
	}
	l := x.eps[slot]
	oldest := 0
	for _, h := range hashes {
		d, ok := l.ghost.since(h)
		if !ok {
			continue
		}
		if ni, held := l.byHash.get(h); held && int32(x.node(ni).stamp-after) <= 0 {
			continue // held again before the pick: the index promised it, or could have
		}
		hits++
		oldest = max(oldest, d)
	}
	g, capacity := l.ghost, l.capacity
	cut := g.seq - 1 - uint32(oldest) // the oldest hit's drop
	x.mu.RUnlock()
	if hits == 0 {
		return 0, 0, capacity
	}
	return hits, x.droppedSince(slot, g, cut), capacity
}

// ghostScanChunk is how many ghost slots droppedSince counts per hold of the read lock: ~10 µs,
// so that a commit waiting for the write lock (and the decisions queued behind it) waits no
// longer than a decision takes.
const ghostScanChunk = 4096

// droppedSince counts the blocks that endpoint slot's LRU dropped after the drop numbered cut
// and does not hold again, each once however often it was dropped: a block that the server
// kept shows that it also kept every block used after it, those the index holds and these.
// Counting the drops themselves counted a block dropped and committed again twice (once as a
// drop, once among the held) and sized a server at twice its cache (capacity-x10 multi-turn,
// docs/benchmarks.md, "Ghost hits count each block once"). The table is lossy: a drop
// survives k later ones with probability (1 − 1/n)^k ≈ e^(−k/n), so each drop remembered
// counts 1 + k/n, a first-order correction for those overwritten (within 1% up to k = n/7,
// short beyond: the bound errs low). A pass over the table, a chunk per hold of the read lock:
// drops during the pass may count or not; a table replaced meanwhile (resizeGhost, the
// endpoint removed) ends the count with what it has.
func (x *Index) droppedSince(slot int, g *ghostTable, cut uint32) int {
	n, ages := 0, 0
	for lo := 0; lo < len(g.keys); lo += ghostScanChunk {
		x.mu.RLock()
		if slot >= len(x.eps) || x.eps[slot] == nil || x.eps[slot].ghost != g {
			x.mu.RUnlock()
			break
		}
		c, a := g.countAfter(lo, min(lo+ghostScanChunk, len(g.keys)), cut)
		x.mu.RUnlock()
		n, ages = n+c, ages+a
	}
	return n + (ages+len(g.keys)/2)/len(g.keys)
}

// drop removes node ni from its endpoint's LRU, its block's holder list and the slab.
func (x *Index) drop(l *endpointLRU, ni uint32) {
	n := x.node(ni)
	h := n.hash
	x.unlinkLRU(l, ni)
	l.byHash.del(h)
	l.n--
	if l.ghost != nil {
		// Whatever the drop (for room, whose push has just cleared the bit; a trim; a
		// removal), the LRU no longer holds h: Index.droppedSince counts it again.
		l.ghost.setHeld(h, false)
	}
	ref, _ := x.blocks.get(h)
	first, count := uint32(ref), uint32(ref>>32)
	if n.sprev != 0 {
		x.node(n.sprev).snext = n.snext
	} else {
		first = n.snext
	}
	if n.snext != 0 {
		x.node(n.snext).sprev = n.sprev
	}
	if count <= 1 {
		x.blocks.del(h)
	} else {
		x.blocks.put(h, uint64(count-1)<<32|uint64(first))
	}
	x.release(ni)
}

// RemoveEndpoint forgets everything the endpoint in slot holds and gives its memory back. It
// takes the write lock removeChunk entries at a time, so that a rolling restart's removals do
// not stall the decisions queued behind them; while it runs, the removed endpoint's remaining
// entries may still be credited to its slot, which no live endpoint owns until the pool's
// listeners have returned.
func (x *Index) RemoveEndpoint(slot int) {
	for {
		x.mu.Lock()
		if slot >= len(x.eps) || x.eps[slot] == nil {
			x.mu.Unlock()
			return
		}
		l := x.eps[slot]
		for i := 0; i < removeChunk && l.tail != 0; i++ {
			x.drop(l, l.tail)
		}
		if l.tail == 0 {
			x.eps[slot] = nil
			x.mu.Unlock()
			x.Compact()
			return
		}
		x.mu.Unlock()
	}
}

// removeChunk is how many entries removal, trimming or compaction handles per hold of the write
// lock: ~100 µs of work, a fraction of one decision's budget.
const removeChunk = 4096

// Compact moves live nodes out of the slab's last pages into free nodes further down and drops
// the emptied pages, so that removing endpoints returns memory instead of leaving a free list
// the size of the largest pool ever seen. It does nothing until at least a quarter of the slab
// (and more than a page) is free: freed nodes are reused by later inserts first, so a rolling
// restart, whose new pods fill the nodes the old ones left, never pays for it. When it runs it
// holds the write lock for one pass over the free list and one move per live node above the
// pages it keeps.
func (x *Index) Compact() {
	x.mu.Lock()
	defer x.mu.Unlock()
	hw := x.highWater()
	live := int(hw) - 1 - x.nfree
	keepPages := (live+1)/pageSize + 1 // pages needed for the live nodes and the nil node
	if keepPages >= len(x.pages) || x.nfree <= pageSize || x.nfree*4 < int(hw) {
		return
	}
	limit := uint32(keepPages * pageSize)
	// Split the free list: low nodes stay usable (and receive the moved nodes), high nodes
	// vanish with their pages. Every free node is on the list, so what is left of the low part
	// after the moves is exactly the free space below the limit.
	var low uint32
	nlow := 0
	for i := x.free; i != 0; {
		next := x.node(i).next
		if i < limit {
			x.node(i).next = low
			low = i
			nlow++
		}
		i = next
	}
	for i := limit; i < hw; i++ {
		if x.node(i).ep == freeEP {
			continue
		}
		dst := low
		low = x.node(dst).next
		nlow--
		x.move(i, dst)
	}
	x.free, x.nfree = low, nlow
	for p := keepPages; p < len(x.pages); p++ {
		x.pages[p] = nil
	}
	x.pages = x.pages[:keepPages]
	x.setHighWater(limit)
}

// move relocates live node src to free node dst, fixing every reference to it.
func (x *Index) move(src, dst uint32) {
	n := *x.node(src)
	*x.node(dst) = n
	l := x.eps[n.ep]
	if n.prev != 0 {
		x.node(n.prev).next = dst
	} else {
		l.head = dst
	}
	if n.next != 0 {
		x.node(n.next).prev = dst
	} else {
		l.tail = dst
	}
	if n.sprev != 0 {
		x.node(n.sprev).snext = dst
	} else {
		ref, _ := x.blocks.get(n.hash)
		x.blocks.put(n.hash, ref&^0xffffffff|uint64(dst))
	}
	if n.snext != 0 {
		x.node(n.snext).sprev = dst
	}
	l.byHash.put(n.hash, dst)
	*x.node(src) = node{ep: freeEP}
}

// Stamp returns the commit count at which endpoint slot last used block h, and whether it
// holds it: how recent that block is in the endpoint's LRU.
func (x *Index) Stamp(slot int, h uint64) (uint32, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.stampLocked(slot, h)
}

// TickAndStamp is Tick and, when want, Stamp(slot, h), under one read lock: a pick needs both.
func (x *Index) TickAndStamp(slot int, h uint64, want bool) (tick, stamp uint32, held bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if want {
		stamp, held = x.stampLocked(slot, h)
	}
	return x.tick, stamp, held
}

func (x *Index) stampLocked(slot int, h uint64) (uint32, bool) {
	if slot >= len(x.eps) || x.eps[slot] == nil {
		return 0, false
	}
	ni, ok := x.eps[slot].byHash.get(h)
	if !ok {
		return 0, false
	}
	return x.node(ni).stamp, true
}

// TrimOlder evicts every entry of endpoint slot last used at or before commit stamp: when the
// server shows that it no longer holds a block the index had at that age, it holds nothing
// older either (both evict least recently used first). It returns the entries evicted and
// kept, and ends the endpoint's ghost credit (GhostMatch). Stamps compare modulo 2^32, so a
// stamp from the last two billion commits is read right.
func (x *Index) TrimOlder(slot int, stamp uint32) (evicted, kept int) {
	for {
		x.mu.Lock()
		if slot >= len(x.eps) || x.eps[slot] == nil {
			x.mu.Unlock()
			return evicted, 0
		}
		l := x.eps[slot]
		l.trimmed = true
		i := 0
		for ; i < removeChunk && l.tail != 0 && int32(x.node(l.tail).stamp-stamp) <= 0; i++ {
			x.evict(l)
			evicted++
		}
		more := i == removeChunk
		kept = l.n
		x.mu.Unlock()
		if !more {
			return evicted, kept
		}
	}
}

// Len returns how many entries endpoint slot holds.
func (x *Index) Len(slot int) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if slot >= len(x.eps) || x.eps[slot] == nil {
		return 0
	}
	return x.eps[slot].n
}

// MatchSlot is the number of leading blocks of hashes that endpoint slot holds.
func (x *Index) MatchSlot(slot int, hashes []uint64) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if slot >= len(x.eps) || x.eps[slot] == nil {
		return 0
	}
	l := x.eps[slot]
	n := 0
	for _, h := range hashes {
		if _, ok := l.byHash.get(h); !ok {
			break
		}
		n++
	}
	return n
}

// Match writes into lens[slot], for every endpoint slot that holds the first block, the number
// of leading blocks of hashes that the endpoint holds (keeping a larger value already there).
// lens must have room for every slot in the index.
func (x *Index) Match(hashes []uint64, lens []int32) { x.MatchAges(hashes, lens, nil) }

// MatchAges is Match plus TailAges into ages (if not nil), under one hold of the read lock.
func (x *Index) MatchAges(hashes []uint64, lens []int32, ages []uint32) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	x.tailAgesLocked(ages)
	if len(hashes) == 0 {
		return
	}
	last := len(hashes) - 1
	c0 := x.count(hashes[0])
	if c0 == 0 {
		return
	}
	cl := c0
	if last > 0 {
		cl = x.count(hashes[last])
	}
	if cl > 0 {
		x.credit(hashes[last], int32(last+1), lens)
	}
	x.bisect(hashes, 0, last, c0, cl, lens)
}

// NotFull is the age TailAges reports for an endpoint whose LRU has room left: a new prompt
// evicts nothing there.
const NotFull = ^uint32(0)

// TailAges writes into ages[slot], for every slot below len(ages), the age of the endpoint's
// least recently used block in commits (pool-wide Insert calls since the endpoint last used it),
// or NotFull when the endpoint's LRU is below its capacity. It is how long the blocks a new
// prompt would push out have gone unused: a young tail means evicting blocks that are still
// being reused. The commit counter wraps after 2^32 commits; an endpoint left untouched for that
// long reads younger than it is, which only costs placement quality.
func (x *Index) TailAges(ages []uint32) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	x.tailAgesLocked(ages)
}

func (x *Index) tailAgesLocked(ages []uint32) {
	for slot := range ages {
		ages[slot] = NotFull
		if slot < len(x.eps) {
			if l := x.eps[slot]; l != nil && l.n >= l.capacity && l.tail != 0 {
				ages[slot] = x.tick - x.node(l.tail).stamp
			}
		}
	}
}

func (x *Index) count(h uint64) uint32 {
	ref, _ := x.blocks.get(h)
	return uint32(ref >> 32)
}

// bisect finds where the holder count drops between lo and hi and credits, at each drop, the
// holders of the block before it.
func (x *Index) bisect(hashes []uint64, lo, hi int, clo, chi uint32, lens []int32) {
	for clo != chi {
		if hi-lo <= 1 {
			x.credit(hashes[lo], int32(lo+1), lens)
			return
		}
		mid := lo + (hi-lo)/2
		cm := x.count(hashes[mid])
		x.bisect(hashes, lo, mid, clo, cm, lens)
		lo, clo = mid, cm
	}
}

// credit raises lens[slot] to n for every holder of block h.
func (x *Index) credit(h uint64, n int32, lens []int32) {
	ref, _ := x.blocks.get(h)
	for i := uint32(ref); i != 0; {
		nd := x.node(i)
		if int(nd.ep) < len(lens) && lens[nd.ep] < n {
			lens[nd.ep] = n
		}
		i = nd.snext
	}
}

// Holds reports whether endpoint slot holds block h (for tests and debugging).
func (x *Index) Holds(slot int, h uint64) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if slot >= len(x.eps) || x.eps[slot] == nil {
		return false
	}
	_, ok := x.eps[slot].byHash.get(h)
	return ok
}

// Stats is the index's size.
type Stats struct {
	Entries   int // (endpoint, block) entries
	Blocks    int // distinct blocks
	SlabBytes int // node slab, including free nodes
	Bytes     int // everything: slab plus tables
}

// Stats reports the index's current size.
func (x *Index) Stats() Stats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	slab := len(x.pages) * pageSize * int(unsafe.Sizeof(node{}))
	b := slab + x.blocks.bytes()
	for _, l := range x.eps {
		if l != nil {
			b += l.byHash.bytes()
			if l.ghost != nil {
				b += l.ghost.bytes()
			}
		}
	}
	return Stats{
		Entries:   int(x.highWater()) - 1 - x.nfree,
		Blocks:    x.blocks.n,
		SlabBytes: slab,
		Bytes:     b,
	}
}
