package prefix

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// chain returns n distinct chained-looking hashes starting from tag.
func chain(tag uint64, n int) []uint64 {
	out := make([]uint64, n)
	h := tag*0x9E3779B97F4A7C15 + 1
	for i := range out {
		h = h*6364136223846793005 + 1442695040888963407
		out[i] = h
	}
	return out
}

func cat(parts ...[]uint64) []uint64 {
	var out []uint64
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func match(x *Index, hashes []uint64, slots int) []int32 {
	lens := make([]int32, slots)
	x.Match(hashes, lens)
	return lens
}

func TestIndexMatchCountsLeadingBlocksPerEndpoint(t *testing.T) {
	shared, a, b := chain(1, 10), chain(2, 5), chain(3, 7)
	x := NewIndex(1000)
	x.Insert(0, cat(shared, a))
	x.Insert(1, cat(shared, b))
	x.Insert(2, shared[:4])
	tests := []struct {
		name  string
		query []uint64
		want  []int32
	}{
		{"prompt continuing a", cat(shared, a, chain(9, 3)), []int32{15, 10, 4, 0}},
		{"prompt continuing b", cat(shared, b), []int32{10, 17, 4, 0}},
		{"only the shared head", shared[:3], []int32{3, 3, 3, 0}},
		{"unknown prompt", chain(42, 20), []int32{0, 0, 0, 0}},
		{"empty prompt", nil, []int32{0, 0, 0, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := match(x, tc.query, 4)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("Match = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestIndexEvictsTailBeforeHead(t *testing.T) {
	x := NewIndex(5)
	p := chain(1, 10)
	x.Insert(0, p)
	for i, h := range p {
		if got, want := x.Holds(0, h), i < 5; got != want {
			t.Errorf("block %d held = %v, want %v (a long prompt keeps its head)", i, got, want)
		}
	}
	// A second prompt of 3 blocks evicts the least recently used: the first prompt's tail end.
	q := chain(2, 3)
	x.Insert(0, q)
	for i, h := range p[:5] {
		if got, want := x.Holds(0, h), i < 2; got != want {
			t.Errorf("after second prompt, block %d held = %v, want %v", i, got, want)
		}
	}
	if got := match(x, p, 1)[0]; got != 2 {
		t.Errorf("first prompt now matches %d blocks, want 2", got)
	}
}

func TestIndexReinsertRefreshesRecency(t *testing.T) {
	x := NewIndex(6)
	a, b, c := chain(1, 3), chain(2, 3), chain(3, 3)
	x.Insert(0, a)
	x.Insert(0, b)
	x.Insert(0, a) // a is used again: b is now the oldest
	x.Insert(0, c)
	if got := match(x, a, 1)[0]; got != 3 {
		t.Errorf("refreshed prompt matches %d, want 3", got)
	}
	if got := match(x, b, 1)[0]; got != 0 {
		t.Errorf("least recently used prompt matches %d, want 0 (evicted)", got)
	}
}

// TestIndexRollingRestartReusesMemory: removing one endpoint of eight and filling its successor
// reuses the freed nodes: no compaction (which moves nodes under the write lock) and no growth.
func TestIndexRollingRestartReusesMemory(t *testing.T) {
	x := NewIndex(100_000)
	for slot := range 8 {
		for r := range 20 {
			x.Insert(slot, chain(uint64(slot*1000+r), 200))
		}
	}
	pages := len(x.pages)
	for round := range 8 {
		x.RemoveEndpoint(round)
		if len(x.pages) != pages {
			t.Fatalf("round %d: removing one endpoint of eight changed the slab from %d to %d pages", round, pages, len(x.pages))
		}
		for r := range 20 {
			x.Insert(round, chain(uint64(round*1000+500+r), 200))
		}
		if len(x.pages) != pages {
			t.Fatalf("round %d: the successor grew the slab from %d to %d pages instead of reusing nodes", round, pages, len(x.pages))
		}
	}
}

// TestIndexTrimOlder: trimming at a stamp evicts exactly the entries last used at or before it.
func TestIndexTrimOlder(t *testing.T) {
	x := NewIndex(1000)
	old, mid, recent := chain(1, 30), chain(2, 20), chain(3, 10)
	x.Insert(0, old)
	x.Insert(0, mid)
	x.Insert(0, recent)
	x.Insert(1, old)
	s, ok := x.Stamp(0, mid[5])
	if !ok {
		t.Fatal("stamp of a held block not found")
	}
	if _, ok := x.Stamp(0, chain(9, 1)[0]); ok {
		t.Fatal("stamp found for a block the endpoint does not hold")
	}
	evicted, kept := x.TrimOlder(0, s)
	if evicted != 50 || kept != 10 {
		t.Fatalf("evicted %d, kept %d; want 50 (old and mid), 10 (recent)", evicted, kept)
	}
	if got := match(x, old, 2); got[0] != 0 || got[1] != 30 {
		t.Fatalf("old prompt matches %v: endpoint 0 must have lost it, endpoint 1 kept it", got)
	}
	if got := match(x, recent, 2)[0]; got != 10 {
		t.Fatalf("recent prompt matches %d, want 10", got)
	}
}

// TestTickAndStampReadsTheClockAndTheStampTogether: what a pick reads under one lock is what
// Tick and Stamp read one at a time.
func TestTickAndStampReadsTheClockAndTheStampTogether(t *testing.T) {
	x := NewIndex(1000)
	a, b := chain(1, 10), chain(2, 10)
	x.Insert(0, a)
	x.Insert(0, b)
	for _, c := range []struct {
		name string
		slot int
		h    uint64
		want bool
		held bool
	}{
		{"older block held", 0, a[9], true, true},
		{"newer block held", 0, b[0], true, true},
		{"block not held", 0, chain(9, 1)[0], true, false},
		{"endpoint unknown", 5, a[0], true, false},
		{"no stamp wanted", 0, a[0], false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tick, stamp, held := x.TickAndStamp(c.slot, c.h, c.want)
			if tick != x.Tick() {
				t.Fatalf("tick %d, Tick() %d", tick, x.Tick())
			}
			ws, wh := x.Stamp(c.slot, c.h)
			if !c.want {
				ws, wh = 0, false
			}
			if held != c.held || held != wh || stamp != ws {
				t.Fatalf("stamp %d held %v; Stamp gives %d %v, want held %v", stamp, held, ws, wh, c.held)
			}
		})
	}
	_, sa, _ := x.TickAndStamp(0, a[9], true)
	_, sb, _ := x.TickAndStamp(0, b[0], true)
	if sb <= sa {
		t.Fatalf("stamp of the block inserted later %d, not after the earlier one's %d", sb, sa)
	}
}

func TestIndexRemoveEndpointFreesEverything(t *testing.T) {
	x := NewIndex(100_000)
	for slot := range 8 {
		for r := range 50 {
			x.Insert(slot, chain(uint64(slot*1000+r), 200))
		}
	}
	before := x.Stats()
	if before.Entries != 8*50*200 {
		t.Fatalf("entries = %d, want %d", before.Entries, 8*50*200)
	}
	for slot := 1; slot < 8; slot++ {
		x.RemoveEndpoint(slot)
	}
	after := x.Stats()
	if after.Entries != 50*200 || after.Blocks != 50*200 {
		t.Fatalf("after removal entries=%d blocks=%d, want %d each", after.Entries, after.Blocks, 50*200)
	}
	if after.SlabBytes >= before.SlabBytes/4 {
		t.Errorf("slab kept %d of %d bytes after removing 7 of 8 endpoints", after.SlabBytes, before.SlabBytes)
	}
	// The remaining endpoint's entries survived compaction intact.
	for r := range 50 {
		p := chain(uint64(r), 200)
		if got := match(x, p, 8); got[0] != 200 || got[1] != 0 {
			t.Fatalf("prompt %d after compaction: %v", r, got)
		}
	}
	x.RemoveEndpoint(0)
	if s := x.Stats(); s.Entries != 0 || s.Blocks != 0 {
		t.Fatalf("empty index reports %+v", s)
	}
	// And it is usable again.
	x.Insert(3, chain(7, 10))
	if got := match(x, chain(7, 10), 4)[3]; got != 10 {
		t.Fatalf("insert after full removal: %d", got)
	}
}

func TestIndexSetCapacityEvictsOldest(t *testing.T) {
	x := NewIndex(100)
	a, b := chain(1, 10), chain(2, 10)
	x.Insert(0, a)
	x.Insert(0, b)
	x.SetCapacity(0, 12)
	if got := match(x, b, 1)[0]; got != 10 {
		t.Errorf("newest prompt matches %d, want 10", got)
	}
	if got := match(x, a, 1)[0]; got != 2 {
		t.Errorf("older prompt keeps %d head blocks, want 2", got)
	}
}

// TestIndexAgreesWithReferenceLRU drives the index and a straightforward model (one
// golang-lru cache per endpoint, blocks inserted tail first) with the same random operations
// and checks that Match equals, for every endpoint, the number of leading blocks its reference
// cache holds. Prompts come from a small tree so that prefixes are shared across endpoints.
func TestIndexAgreesWithReferenceLRU(t *testing.T) {
	const slots, capacity = 6, 150
	rng := rand.New(rand.NewPCG(1, 2))
	// A tree of prompts: each new prompt extends a random earlier one.
	prompts := [][]uint64{chain(0, 30)}
	for i := 1; i < 200; i++ {
		base := prompts[rng.IntN(len(prompts))]
		keep := rng.IntN(len(base) + 1)
		p := cat(base[:keep], chain(uint64(i), 1+rng.IntN(40)))
		prompts = append(prompts, p)
	}
	x := NewIndex(capacity)
	ref := make([]*simplelru.LRU[uint64, struct{}], slots)
	for i := range ref {
		ref[i], _ = simplelru.NewLRU[uint64, struct{}](capacity, nil)
	}
	for step := range 5000 {
		slot := rng.IntN(slots)
		switch op := rng.IntN(100); {
		case op < 2:
			x.RemoveEndpoint(slot)
			ref[slot].Purge()
		default:
			p := prompts[rng.IntN(len(prompts))]
			x.Insert(slot, p)
			for i := len(p) - 1; i >= 0; i-- {
				if _, ok := ref[slot].Get(p[i]); !ok {
					ref[slot].Add(p[i], struct{}{})
				}
			}
		}
		q := prompts[rng.IntN(len(prompts))]
		got := match(x, q, slots)
		for s := range slots {
			want := int32(0)
			for want < int32(len(q)) && ref[s].Contains(q[want]) {
				want++
			}
			if got[s] != want {
				t.Fatalf("step %d: endpoint %d matches %d blocks, reference %d", step, s, got[s], want)
			}
			if s < len(x.eps) && x.eps[s] != nil && x.eps[s].n != ref[s].Len() {
				t.Fatalf("step %d: endpoint %d holds %d entries, reference %d", step, s, x.eps[s].n, ref[s].Len())
			}
		}
	}
}

// BenchmarkIndexBytesPerEntry measures the heap cost of one (endpoint, block) entry with all of
// the index's structures: with unique blocks (the worst case: no sharing across endpoints), with
// blocks shared by 4 endpoints, and after churning through 5x the capacity (evictions).
func BenchmarkIndexBytesPerEntry(b *testing.B) {
	for _, tc := range []struct {
		name   string
		share  int  // endpoints per group sharing the same prompts
		rounds int  // capacity multiples inserted
		ghosts bool // ghost tables on (servers that report no cache size, learnCapacity)
	}{{"unique-blocks", 1, 1, false}, {"blocks-on-4-endpoints", 4, 1, false}, {"unique-blocks-after-churn", 1, 5, false},
		{"unique-blocks-after-churn-with-ghost-tables", 1, 5, true}} {
		b.Run(tc.name, func(b *testing.B) {
			const slots, capacity = 16, 25000
			var perEntry, reported float64
			for range b.N {
				runtime.GC()
				var m0, m1 runtime.MemStats
				runtime.ReadMemStats(&m0)
				x := NewIndex(capacity)
				x.SetGhosts(tc.ghosts)
				for s := range slots {
					for r := range tc.rounds * capacity / 100 {
						x.Insert(s, chain(uint64((s/tc.share)*1_000_000+r), 100))
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&m1)
				st := x.Stats()
				perEntry = float64(m1.HeapAlloc-m0.HeapAlloc) / float64(st.Entries)
				reported = float64(st.Bytes) / float64(st.Entries)
				runtime.KeepAlive(x)
			}
			b.ReportMetric(perEntry, "bytes/entry")
			b.ReportMetric(reported, "reported-bytes/entry")
		})
	}
}

// BenchmarkGolangLRUBytesPerEntry is the comparison that decided against one golang-lru cache
// per endpoint: the cache alone, with no reverse index, costs this much per entry.
func BenchmarkGolangLRUBytesPerEntry(b *testing.B) {
	const slots, capacity = 16, 25000
	var perEntry float64
	for range b.N {
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		caches := make([]*simplelru.LRU[uint64, struct{}], slots)
		for s := range caches {
			caches[s], _ = simplelru.NewLRU[uint64, struct{}](capacity, nil)
			for _, h := range chain(uint64(s), capacity) {
				caches[s].Add(h, struct{}{})
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		perEntry = float64(m1.HeapAlloc-m0.HeapAlloc) / float64(slots*capacity)
		runtime.KeepAlive(caches)
	}
	b.ReportMetric(perEntry, "bytes/entry")
}

// BenchmarkIndexInsert measures committing a 1,000-block prompt to an endpoint: already held
// (LRU moves only) and new into a full endpoint (one eviction per block).
func BenchmarkIndexInsert(b *testing.B) {
	const capacity = 25000
	b.Run("held", func(b *testing.B) {
		x := NewIndex(capacity)
		p := chain(1, 1000)
		x.Insert(0, p)
		b.ResetTimer()
		for range b.N {
			x.Insert(0, p)
		}
	})
	for _, ghosts := range []bool{false, true} {
		name := "new-into-full"
		if ghosts {
			name += "-with-ghost-table" // a server reporting no cache size: evictions remembered
		}
		b.Run(name, func(b *testing.B) { benchInsertNew(b, capacity, ghosts) })
	}
}

// benchInsertNew commits new 1,000-block prompts into a full endpoint: one eviction per block.
func benchInsertNew(b *testing.B, capacity int, ghosts bool) {
	x := NewIndex(capacity)
	x.SetGhosts(ghosts)
	for r := range capacity / 1000 {
		x.Insert(0, chain(uint64(r), 1000))
	}
	prompts := make([][]uint64, 64)
	for i := range prompts {
		prompts[i] = chain(uint64(1000+i), 1000)
	}
	b.ResetTimer()
	for i := range b.N {
		x.Insert(0, prompts[i%len(prompts)])
	}
}

func TestLongPromptsCommittedInChunksKeepLRUOrder(t *testing.T) {
	x := NewIndex(3000)
	p := chain(1, 2000) // four chunks
	x.Insert(0, p)
	x.Insert(0, chain(2, 1500))
	// 500 blocks had to go: the first prompt's tail, not its head.
	for i, h := range p {
		if got, want := x.Holds(0, h), i < 1500; got != want {
			t.Fatalf("block %d held = %v, want %v", i, got, want)
		}
	}
	if got := match(x, p, 1)[0]; got != 1500 {
		t.Fatalf("match %d, want 1500", got)
	}
}

// TestConcurrentCommitsMatchesAndRemovals runs the index's operations from several goroutines
// (under -race) and checks that it ends consistent: every endpoint's LRU size equals what its
// table holds, and the reverse table's holder counts add up to the entries.
func TestConcurrentCommitsMatchesAndRemovals(t *testing.T) {
	x := NewIndex(2000)
	prompts := make([][]uint64, 40)
	for i := range prompts {
		prompts[i] = cat(chain(99, 50), chain(uint64(i), 100+i*40)) // shared head, up to 1,700 blocks
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			lens := make([]int32, 8)
			for range 400 {
				slot := rng.IntN(8)
				switch op := rng.IntN(20); {
				case op == 0:
					x.RemoveEndpoint(slot)
				case op < 10:
					x.Insert(slot, prompts[rng.IntN(len(prompts))])
				default:
					clear(lens)
					x.Match(prompts[rng.IntN(len(prompts))], lens)
				}
			}
		}()
	}
	wg.Wait()
	entries := 0
	for _, l := range x.eps {
		if l != nil {
			if l.n != l.byHash.n || l.n > l.capacity {
				t.Fatalf("LRU holds %d, its table %d, capacity %d", l.n, l.byHash.n, l.capacity)
			}
			entries += l.n
		}
	}
	holders := 0
	for _, s := range x.blocks.slots {
		if s.k != 0 {
			holders += int(s.v >> 32)
		}
	}
	if holders != entries || x.Stats().Entries != entries {
		t.Fatalf("holder counts %d, LRU entries %d, stats %d", holders, entries, x.Stats().Entries)
	}
}

func TestIndexTailAges(t *testing.T) {
	x := NewIndex(20)
	ages := make([]uint32, 3)
	x.TailAges(ages)
	for slot, a := range ages {
		if a != NotFull {
			t.Fatalf("empty endpoint %d: age %d, want NotFull", slot, a)
		}
	}
	a := chain(1, 20)
	x.Insert(0, a)            // commit 1: endpoint 0 full, its tail used at commit 1
	x.Insert(1, chain(2, 5))  // commit 2: endpoint 1 has room
	x.Insert(2, chain(3, 20)) // commit 3: endpoint 2 full
	x.Insert(2, chain(4, 10)) // commit 4: endpoint 2 evicts half of commit 3's blocks
	x.TailAges(ages)
	if want := []uint32{3, NotFull, 1}; ages[0] != want[0] || ages[1] != want[1] || ages[2] != want[2] {
		t.Errorf("ages %v, want %v (commits since each full endpoint's tail was used)", ages, want)
	}
	x.Insert(0, a) // commit 5: endpoint 0 uses every block again
	x.TailAges(ages)
	if ages[0] != 0 || ages[2] != 2 {
		t.Errorf("after endpoint 0 reused its blocks: ages %v, want 0 for it and 2 for endpoint 2", ages)
	}
	// MatchAges reports the same ages alongside the match.
	lens, ages2 := make([]int32, 3), make([]uint32, 3)
	x.MatchAges(a, lens, ages2)
	if lens[0] != 20 || ages2[0] != ages[0] || ages2[1] != ages[1] || ages2[2] != ages[2] {
		t.Errorf("MatchAges: lens %v ages %v, want 20 blocks on endpoint 0 and ages %v", lens, ages2, ages)
	}
}

func TestNodeStaysThirtyTwoBytes(t *testing.T) {
	// The recency stamp fills the node's padding: the index's bytes per entry do not grow.
	if s := unsafe.Sizeof(node{}); s != 32 {
		t.Errorf("node is %d bytes, want 32", s)
	}
}

func TestIndexSetCapacityAll(t *testing.T) {
	x := NewIndex(100)
	a, b := chain(1, 60), chain(2, 60)
	x.Insert(0, a)
	x.Insert(1, b)
	x.SetCapacityAll(40)
	if got := match(x, a, 2); got[0] != 40 {
		t.Errorf("endpoint 0 keeps %d head blocks of its prompt after shrinking to 40, want 40", got[0])
	}
	if got := match(x, b, 2); got[1] != 40 {
		t.Errorf("endpoint 1 keeps %d head blocks after shrinking to 40, want 40", got[1])
	}
	x.Insert(2, cat(chain(3, 50))) // a new endpoint gets the new capacity too
	if got := match(x, chain(3, 50), 3); got[2] != 40 || x.Capacity() != 40 {
		t.Errorf("new endpoint holds %d blocks (capacity %d), want 40", got[2], x.Capacity())
	}
	x.SetCapacityAll(100)
	x.Insert(0, a)
	if got := match(x, a, 2); got[0] != 60 {
		t.Errorf("after growing back: %d blocks, want 60", got[0])
	}
}

// BenchmarkGhostHits measures a report's ghost check on an endpoint whose ghost table is full
// (65,536 slots): the hashes looked up, and the pass over the table that counts the blocks
// dropped since (Index.droppedSince), which a hit costs.
func BenchmarkGhostHits(b *testing.B) {
	x := NewIndex(1 << 17)
	x.SetGhosts(true)
	for r := range 200 {
		x.Insert(0, chain(uint64(r), 1000)) // 200,000 blocks into 131,072: prompts 0-68 dropped
	}
	for _, tc := range []struct {
		name   string
		hashes []uint64
	}{{"miss", chain(9999, 1000)}, {"hit", chain(60, 1000)}} {
		b.Run(tc.name, func(b *testing.B) {
			hits := 0
			for range b.N {
				h, _, _ := x.GhostHits(0, tc.hashes, x.Tick())
				hits += h
			}
			if (hits > 0) != (tc.name == "hit") {
				b.Fatalf("%d ghost hits in %d runs", hits, b.N)
			}
		})
	}
}
