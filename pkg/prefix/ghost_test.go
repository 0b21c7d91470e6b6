package prefix

import "testing"

// distinctSlots returns n hashes with different slots in g, none in the slots of avoid.
func distinctSlots(g *ghostTable, n int, avoid ...uint64) []uint64 {
	used := map[int]bool{}
	for _, h := range avoid {
		used[g.slot(h)] = true
	}
	var out []uint64
	for h := uint64(1000); len(out) < n; h++ {
		if i := g.slot(h); !used[i] {
			used[i] = true
			out = append(out, h)
		}
	}
	return out
}

func TestGhostTableRemembersTheLastDropsAndHowLongAgo(t *testing.T) {
	g := newGhostTable(1024)
	hs := distinctSlots(g, 4)
	a, b, c, d := hs[0], hs[1], hs[2], hs[3]
	for _, h := range []uint64{a, b, a, c} {
		g.push(h)
	}
	for _, tc := range []struct {
		h     uint64
		since int
		ok    bool
	}{{c, 0, true}, {a, 1, true}, {b, 2, true}, {d, 0, false}} {
		if since, ok := g.since(tc.h); ok != tc.ok || since != tc.since {
			t.Errorf("since(%d) = %d, %v; want %d, %v", tc.h, since, ok, tc.since, tc.ok)
		}
	}
	if got := g.newest(2); len(got) != 2 || got[0].h != a || got[1].h != c {
		t.Errorf("newest(2) = %v, want [a c]: the remembered drops within the last two, oldest first", got)
	}
	// A drop that another takes the slot of is forgotten (the table is lossy).
	var x uint64
	for h := uint64(1); ; h++ {
		if h != b && g.slot(h) == g.slot(b) {
			x = h
			break
		}
	}
	g.push(x)
	if _, ok := g.since(b); ok {
		t.Error("b still remembered after a drop took its slot")
	}
	if since, ok := g.since(x); !ok || since != 0 {
		t.Errorf("since(x) = %d, %v; want 0, true", since, ok)
	}
	// Drops older than the table's size are not reported, even when their slot is intact.
	for _, h := range distinctSlots(g, 1023, a) {
		g.push(h)
	}
	if since, ok := g.since(a); ok {
		t.Errorf("a reported %d drops ago, beyond the table's 1,024", since)
	}
}

// TestGhostTableCountsEachBlockDroppedAfterOnceAndNotTheHeld: the drops after a given one count
// each block once, without those the LRU holds again; a trim's drop counts again.
func TestGhostTableCountsEachBlockDroppedAfterOnceAndNotTheHeld(t *testing.T) {
	g := newGhostTable(1024)
	hs := distinctSlots(g, 5)
	a, b, c, d, e := hs[0], hs[1], hs[2], hs[3], hs[4]
	for _, h := range []uint64{a, b, c, b, d, e} { // a is drop 0; b dropped twice
		g.push(h)
	}
	afterA := func(g *ghostTable) int {
		n, _ := g.countAfter(0, len(g.keys), g.seqs[g.slot(a)])
		return n
	}
	if got := afterA(g); got != 4 {
		t.Fatalf("%d blocks dropped after a, want 4: b, c, d, e once each", got)
	}
	g.setHeld(c, true) // committed again: the LRU holds it
	g.setHeld(a, true) // a itself is not after a
	if got := afterA(g); got != 3 {
		t.Fatalf("%d with c held again, want 3", got)
	}
	g.setHeld(c, false) // trimmed: no longer held, and no new drop
	if got := afterA(g); got != 4 {
		t.Fatalf("%d with c no longer held, want 4", got)
	}
	g.setHeld(d, true)
	g.push(d) // dropped again: a fresh drop, not held
	if got := afterA(g); got != 4 {
		t.Fatalf("%d after d's new drop, want 4", got)
	}
	// Drops 0-6 were a, b, c, b, d, e, d: after c's, b (3 drops ago), e (1) and d (0).
	if n, ages := g.countAfter(0, len(g.keys), g.seqs[g.slot(c)]); n != 3 || ages != 3+1+0 {
		t.Fatalf("after c: %d drops aged %d in all, want b, e and d aged 4 in all", n, ages)
	}
	g.setHeld(b, true)
	r := newGhostTable(2048)
	r.refill(g.newest(1024))
	if got := afterA(r); got != 3 {
		t.Fatalf("after a refill %d, want 3: b still held", got)
	}
}

// TestGhostHitsCountBlocksCommittedAgainOnce: a block the server kept shows it kept every block
// used after it; blocks dropped and committed again are among those the index holds, and the
// growth bound counts them there only.
func TestGhostHitsCountBlocksCommittedAgainOnce(t *testing.T) {
	x := NewIndex(4)
	x.SetGhosts(true)
	first, a, b := chain(1, 1), chain(2, 4), chain(3, 4)
	x.Insert(0, first)
	x.Insert(0, a) // first dropped
	x.Insert(0, b) // a dropped
	x.Insert(0, a) // b dropped; a held again
	hits, dropped, capacity := x.GhostHits(0, first, x.Tick())
	// Used after first: a and b, 8 blocks; the index holds a's 4, b's 4 are dropped. Counting
	// drops (8 after first's) would say 4 + 8 + 1 = 13.
	if hits != 1 || dropped != 4 || capacity != 4 {
		t.Fatalf("hits %d dropped %d capacity %d, want 1, 4, 4 (a server of 9 blocks keeps first)", hits, dropped, capacity)
	}
	// A trim drops a on the server's evidence: no longer held, its earlier drops count again.
	stamp, _ := x.Stamp(0, a[0])
	if evicted, _ := x.TrimOlder(0, stamp); evicted != 4 {
		t.Fatalf("trim evicted %d, want a's 4", evicted)
	}
	if _, dropped, _ := x.GhostHits(0, first, x.Tick()); dropped != 8 {
		t.Fatalf("after the trim %d blocks dropped since, want a's 4 and b's 4", dropped)
	}
}

// TestGhostTableFollowsLargeCapacityChanges: the ring is rebuilt, keeping its newest drops, when
// the capacity moves it by 2× or more, and left alone for smaller moves.
func TestGhostTableFollowsLargeCapacityChanges(t *testing.T) {
	x := NewIndex(20000)
	x.SetGhosts(true)
	x.Insert(0, chain(1, 1))
	ringLen := func() int {
		x.mu.RLock()
		defer x.mu.RUnlock()
		return len(x.eps[0].ghost.keys)
	}
	if n := ringLen(); n != 10000 {
		t.Fatalf("ring of %d for capacity 20000, want 10000", n)
	}
	x.SetCapacity(0, 30000)
	if n := ringLen(); n != 10000 {
		t.Fatalf("ring rebuilt to %d for a 1.5x change", n)
	}
	x.SetCapacity(0, 16)
	x.Insert(0, chain(2, 40)) // 16 kept; 24 skipped and evicted blocks dropped into the ring
	x.SetCapacity(0, 100000)
	if n := ringLen(); n != 50000 {
		t.Fatalf("ring of %d after capacity 100000, want 50000", n)
	}
	if hits, _, _ := x.GhostHits(0, chain(2, 40), x.Tick()); hits != 24 {
		t.Fatalf("%d ghost hits after the rebuild, want the 24 drops kept", hits)
	}
}

// TestIndexGhostsTheBlocksItDropsForRoom: evictions for room and a commit's blocks beyond the
// capacity go to the ghost table; a trim on the server's evidence, or a block held again, does
// not count; an index without ghosts counts nothing.
func TestIndexGhostsTheBlocksItDropsForRoom(t *testing.T) {
	x := NewIndex(4)
	x.SetGhosts(true)
	first := chain(1, 6)
	x.Insert(0, first) // keeps blocks 0-3; 4 and 5 dropped
	if hits, since, capacity := x.GhostHits(0, first[4:], x.Tick()); hits != 2 || since != 1 || capacity != 4 {
		t.Fatalf("skipped blocks: hits %d since %d capacity %d, want 2, 1, 4", hits, since, capacity)
	}
	x.Insert(0, chain(2, 4)) // evicts blocks 0-3
	if hits, _, _ := x.GhostHits(0, first, x.Tick()); hits != 6 {
		t.Fatalf("after eviction: %d ghost hits, want 6", hits)
	}
	x.Insert(0, first[:2])
	if hits, _, _ := x.GhostHits(0, first, x.Tick()); hits != 4 {
		t.Fatalf("blocks held again still counted: %d ghost hits, want 4", hits)
	}

	y := NewIndex(10)
	y.SetGhosts(true)
	third := chain(3, 3)
	y.Insert(0, third)
	stamp, _ := y.Stamp(0, third[2])
	if evicted, _ := y.TrimOlder(0, stamp); evicted != 3 {
		t.Fatalf("trim evicted %d, want 3", evicted)
	}
	if hits, _, _ := y.GhostHits(0, third, y.Tick()); hits != 0 {
		t.Fatalf("trimmed blocks counted as ghosts: %d", hits)
	}

	z := NewIndex(4)
	z.Insert(0, first)
	if hits, _, _ := z.GhostHits(0, first, z.Tick()); hits != 0 {
		t.Fatalf("index without ghosts: %d hits", hits)
	}
	z.SetGhost(0, true)
	z.Insert(0, chain(4, 4))
	if hits, _, _ := z.GhostHits(0, first, z.Tick()); hits != 4 {
		t.Fatalf("after SetGhost: %d hits, want 4", hits)
	}
	z.SetGhost(0, false)
	if hits, _, _ := z.GhostHits(0, first, z.Tick()); hits != 0 {
		t.Fatalf("ghost turned off: %d hits", hits)
	}
}

// TestGhostMatchCountsWhatTheIndexDroppedRecently: an endpoint whose capacity may be too small
// gets credit for the blocks its LRU dropped for room within its last capacity's worth of
// drops, counted on from what it holds; a held block, an old drop, a trim's probe
// switch or no ghost table end or stop the credit.
func TestGhostMatchCountsWhatTheIndexDroppedRecently(t *testing.T) {
	match := func(x *Index, slot int, hashes []uint64) int32 {
		t.Helper()
		lens := make([]int32, 4)
		ages := make([]uint32, 4)
		x.MatchAges(hashes, lens, ages)
		x.GhostMatch(hashes, lens)
		return lens[slot]
	}
	x := NewIndex(4)
	x.SetGhosts(true)
	first := chain(1, 8)
	x.Insert(0, first) // holds blocks 0-3; 4-7 dropped for room
	if got := match(x, 0, first); got != 4+4 {
		t.Fatalf("held 4, dropped 4 just now: match %d, want 4 + 4", got)
	}
	if got := match(x, 1, first); got != 0 {
		t.Fatalf("endpoint without the prompt or ghosts: match %d, want 0", got)
	}
	x.Insert(0, chain(2, 4)) // evicts blocks 0-3: the whole prompt is now ghosts, 8 drops ago at most
	// Blocks 3, 2, 1, 0 were the last four drops (the LRU's tail first); 4-7 went before them.
	if got := match(x, 0, first); got != 4 {
		t.Fatalf("whole prompt dropped, capacity 4: match %d, want 4 (the 4 blocks dropped within the last 4 drops)", got)
	}

	y := NewIndex(4)
	y.SetGhosts(true)
	y.Insert(0, chain(3, 1))
	stamp, _ := y.Stamp(0, chain(3, 1)[0])
	y.Insert(0, first)    // holds blocks 0-3 and drops 4-7 for room, after evicting chain 3
	y.TrimOlder(0, stamp) // the server showed it lost chain 3 (already gone from the index)
	if got := match(y, 0, first); got != 4 {
		t.Fatalf("after a trim: match %d, want the 4 held blocks only", got)
	}
	y.SetGhost(0, false)
	y.SetGhost(0, true)      // a new table (the server stopped, then resumed, reporting no size)
	y.Insert(0, chain(4, 8)) // evicts blocks 0-3 of first into the new table
	if got := match(y, 0, first); got != 4 {
		t.Fatalf("new ghost table after a trim: match %d, want 4", got)
	}

	z := NewIndex(4)
	z.Insert(0, first)
	if got := match(z, 0, first); got != 4 {
		t.Fatalf("no ghost table: match %d, want 4", got)
	}
}
