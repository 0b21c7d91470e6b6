package prefix

import (
	"testing"
	"time"

	"github.com/kvpick/kvpick/pkg/router"
)

func TestCommonPrefix(t *testing.T) {
	a := chain(1, 10)
	tests := []struct {
		name string
		b    []uint64
		want int
	}{
		{"identical", a, 10},
		{"longer", cat(a, chain(2, 5)), 10},
		{"shorter", a[:4], 4},
		{"diverges after 6", cat(a[:6], chain(3, 4)), 6},
		{"only first shared", cat(a[:1], chain(4, 9)), 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := commonPrefix(a, tc.b); got != tc.want {
				t.Fatalf("commonPrefix = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestPendingMatchesLiveRecordsOnly(t *testing.T) {
	now := time.Unix(1000, 0)
	p := newPendingSet(10 * time.Second)
	e0, e1, e2 := router.NewEndpoint("10.0.0.1:8000", 0), router.NewEndpoint("10.0.0.2:8000", 1), router.NewEndpoint("10.0.0.3:8000", 2)
	base := chain(1, 8)
	r0 := &pendingRecord{hashes: base, ep: e0}
	r1 := &pendingRecord{hashes: base[:3], ep: e1}
	r2 := &pendingRecord{hashes: base, ep: e2}
	p.add(r0, now)
	p.add(r1, now)
	p.add(r2, now.Add(-20*time.Second)) // already expired
	lens := make([]int32, 3)
	p.match(cat(base, chain(9, 2)), now, lens, nil, nil, 0)
	if lens[0] != 8 || lens[1] != 3 || lens[2] != 0 {
		t.Fatalf("lens = %v, want [8 3 0]", lens)
	}
	p.remove(r0)
	e1.MarkRemoved()
	clear(lens)
	p.match(base, now, lens, nil, nil, 0)
	if lens[0] != 0 || lens[1] != 0 {
		t.Fatalf("after remove/endpoint removal lens = %v, want zeros", lens)
	}
	p.remove(r1)
	p.remove(r2)
	p.remove(r2) // twice is harmless
	if n := p.len(); n != 0 {
		t.Fatalf("%d records left", n)
	}
}

// TestPendingWorkIsBounded: a burst of thousands of in-flight requests on one prefix keeps at
// most pendingPerEndpoint records per endpoint, and expired records are dropped when a match
// meets them instead of being skipped forever.
func TestPendingWorkIsBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	p := newPendingSet(10 * time.Second)
	eps := twoEndpoints()
	shared := chain(1, 50)
	var recs []*pendingRecord
	for i := range 2000 {
		r := &pendingRecord{hashes: cat(shared, chain(uint64(100+i), 5)), ep: eps[i%2]}
		p.add(r, now.Add(time.Duration(i)*time.Millisecond))
		recs = append(recs, r)
	}
	if n := p.len(); n != 2*pendingPerEndpoint {
		t.Fatalf("%d records kept for 2000 picks on one prefix over 2 endpoints, want %d", n, 2*pendingPerEndpoint)
	}
	lens := make([]int32, 2)
	p.match(cat(shared, chain(1999+100, 5)), now.Add(2*time.Second), lens, nil, nil, 0)
	if lens[1] != 55 || lens[0] != 50 {
		t.Fatalf("lens %v: the newest records must still match (55 on the endpoint of the last one, 50 elsewhere)", lens)
	}
	clear(lens)
	p.match(shared, now.Add(time.Hour), lens, nil, nil, 0)
	if n := p.len(); n != 0 || lens[0] != 0 || lens[1] != 0 {
		t.Fatalf("after expiry: %d records left, lens %v", n, lens)
	}
	for _, r := range recs {
		p.remove(r) // dropped records: removing them again is harmless
	}
}

// TestARecordPastItsPrefillIsCachedNotInFlight: a request that does not stream stays pending
// until its answer ends, long after its prompt entered the cache; once the endpoint's prefills
// are known over through its pick, its record says "cached" (prefilled) instead of "being
// computed" (counts), so followers do not take its prefix for one many requests wait on.
func TestARecordPastItsPrefillIsCachedNotInFlight(t *testing.T) {
	now := time.Unix(1000, 0)
	p := newPendingSet(10 * time.Second)
	e0, e1 := router.NewEndpoint("10.0.0.1:8000", 0), router.NewEndpoint("10.0.0.2:8000", 1)
	base := chain(1, 8)
	p.add(&pendingRecord{hashes: base, ep: e0, seq: 4}, now)
	p.add(&pendingRecord{hashes: base[:6], ep: e1, seq: 2}, now)
	p.add(&pendingRecord{hashes: base[:5], ep: e1}, now) // no pick number: never counts as prefilled
	e0.SetPrefilledThrough(3)                            // pick 4 is still prefilling
	e1.SetPrefilledThrough(2)                            // pick 2 is past it
	lens, counts, prefilled := make([]int32, 2), make([]int32, 2), make([]int32, 2)
	p.match(base, now, lens, counts, prefilled, 1)
	if want := []int32{8, 6}; lens[0] != want[0] || lens[1] != want[1] {
		t.Errorf("lens %v, want %v", lens, want)
	}
	if want := []int32{1, 1}; counts[0] != want[0] || counts[1] != want[1] {
		t.Errorf("in-flight counts %v, want %v", counts, want)
	}
	if want := []int32{0, 6}; prefilled[0] != want[0] || prefilled[1] != want[1] {
		t.Errorf("prefilled %v, want %v", prefilled, want)
	}
}
