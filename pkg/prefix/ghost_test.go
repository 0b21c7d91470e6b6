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
	r := g.resized(2)
	if _, ok := r.since(a); ok {
		t.Error("a resized ring of 2 kept a drop older than the newest two")
	}
	if since, ok := r.since(c); !ok || since != 1 {
		t.Errorf("resized: since(c) = %d, %v; want 1, true", since, ok)
	}
	if g.resized(3) != g {
		t.Error("resizing to the same size must return the ring itself")
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
