package prefix

import "testing"

func TestGhostRingRemembersTheLastDropsAndHowLongAgo(t *testing.T) {
	const a, b, c, d = 11, 12, 13, 14
	g := newGhostRing(3)
	for _, h := range []uint64{a, b, a, c} {
		g.push(h)
	}
	// c overwrote a's first drop, but a was dropped again since: it stays.
	for _, tc := range []struct {
		h     uint64
		since int
		ok    bool
	}{{c, 0, true}, {a, 1, true}, {b, 2, true}, {d, 0, false}} {
		if since, ok := g.since(tc.h); ok != tc.ok || since != tc.since {
			t.Errorf("since(%d) = %d, %v; want %d, %v", tc.h, since, ok, tc.since, tc.ok)
		}
	}
	g.push(d) // overwrites b, a's second drop stays
	if _, ok := g.since(b); ok {
		t.Error("b still remembered after the ring wrapped over it")
	}
	if since, ok := g.since(a); !ok || since != 2 {
		t.Errorf("since(a) = %d, %v after one more drop; want 2, true", since, ok)
	}
	if got := g.newest(2); len(got) != 2 || got[0] != c || got[1] != d {
		t.Errorf("newest(2) = %v, want [c d] oldest first", got)
	}
	if got := g.newest(10); len(got) != 3 {
		t.Errorf("newest(10) of a ring of 3: %d hashes", len(got))
	}
}

// TestGhostRingFollowsLargeCapacityChanges: the ring is rebuilt, keeping its newest drops, when
// the capacity moves it by 2× or more, and left alone for smaller moves.
func TestGhostRingFollowsLargeCapacityChanges(t *testing.T) {
	x := NewIndex(20000)
	x.SetGhosts(true)
	x.Insert(0, chain(1, 1))
	ringLen := func() int {
		x.mu.RLock()
		defer x.mu.RUnlock()
		return len(x.eps[0].ghost.ring)
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
	if hits, _, _ := x.GhostHits(0, chain(2, 40)); hits != 24 {
		t.Fatalf("%d ghost hits after the rebuild, want the 24 drops kept", hits)
	}
}

// TestIndexGhostsTheBlocksItDropsForRoom: evictions for room and a commit's blocks beyond the
// capacity go to the ghost ring; a trim on the server's evidence, or a block held again, does
// not count; an index without ghosts counts nothing.
func TestIndexGhostsTheBlocksItDropsForRoom(t *testing.T) {
	x := NewIndex(4)
	x.SetGhosts(true)
	first := chain(1, 6)
	x.Insert(0, first) // keeps blocks 0-3; 4 and 5 dropped
	if hits, since, capacity := x.GhostHits(0, first[4:]); hits != 2 || since != 1 || capacity != 4 {
		t.Fatalf("skipped blocks: hits %d since %d capacity %d, want 2, 1, 4", hits, since, capacity)
	}
	x.Insert(0, chain(2, 4)) // evicts blocks 0-3
	if hits, _, _ := x.GhostHits(0, first); hits != 6 {
		t.Fatalf("after eviction: %d ghost hits, want 6", hits)
	}
	x.Insert(0, first[:2])
	if hits, _, _ := x.GhostHits(0, first); hits != 4 {
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
	if hits, _, _ := y.GhostHits(0, third); hits != 0 {
		t.Fatalf("trimmed blocks counted as ghosts: %d", hits)
	}

	z := NewIndex(4)
	z.Insert(0, first)
	if hits, _, _ := z.GhostHits(0, first); hits != 0 {
		t.Fatalf("index without ghosts: %d hits", hits)
	}
	z.SetGhost(0, true)
	z.Insert(0, chain(4, 4))
	if hits, _, _ := z.GhostHits(0, first); hits != 4 {
		t.Fatalf("after SetGhost: %d hits, want 4", hits)
	}
	z.SetGhost(0, false)
	if hits, _, _ := z.GhostHits(0, first); hits != 0 {
		t.Fatalf("ghost turned off: %d hits", hits)
	}
}
