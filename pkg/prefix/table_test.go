package prefix

import (
	"math/rand/v2"
	"testing"
)

// TestTableAgreesWithMap runs random puts and deletes against a Go map, including long churn at a
// fixed bound (the per-endpoint case) and growth then shrinkage (the reverse-map case).
func TestTableAgreesWithMap(t *testing.T) {
	for _, bound := range []int{0, 300} {
		rng := rand.New(rand.NewPCG(5, uint64(bound)))
		tb := newTable[uint32](bound)
		ref := map[uint64]uint32{}
		keys := make([]uint64, 0, 2000)
		for step := range 200_000 {
			grow := step < 100_000
			switch {
			case len(ref) > 0 && (rng.IntN(2) == 0 || (bound > 0 && len(ref) >= bound) || (!grow && rng.IntN(10) < 7)):
				j := rng.IntN(len(keys))
				k := keys[j]
				keys[j] = keys[len(keys)-1]
				keys = keys[:len(keys)-1]
				tb.del(k)
				delete(ref, k)
			default:
				k := rng.Uint64() | 1
				if rng.IntN(8) == 0 {
					k = k&0xfff | 1 // clustered keys: long probe runs
				}
				if _, ok := ref[k]; !ok {
					keys = append(keys, k)
				}
				v := uint32(step)
				tb.put(k, v)
				ref[k] = v
			}
			if tb.n != len(ref) {
				t.Fatalf("bound %d step %d: table has %d entries, map %d", bound, step, tb.n, len(ref))
			}
			if step%997 == 0 {
				for k, v := range ref {
					if got, ok := tb.get(k); !ok || got != v {
						t.Fatalf("bound %d step %d: get(%x) = %v, %v; want %v", bound, step, k, got, ok, v)
					}
				}
				if _, ok := tb.get(rng.Uint64() | 1<<63); ok && len(ref) == 0 {
					t.Fatal("found a key in an empty table")
				}
			}
			if bound > 0 && len(tb.slots) > slotsFor(bound) {
				t.Fatalf("bounded table grew to %d slots, limit %d", len(tb.slots), slotsFor(bound))
			}
		}
		if bound == 0 && len(tb.slots) > minSlots*16*2 && tb.n*8 < len(tb.slots)/2 {
			t.Fatalf("unbounded table did not shrink: %d slots for %d entries", len(tb.slots), tb.n)
		}
	}
}

// TestTablePlacementIsKeyed: keys a client can craft to share their high bits (the bits an
// unkeyed multiply-shift placement reads) must not share a probe run: with the per-process
// key, the longest displacement stays what random keys give.
func TestTablePlacementIsKeyed(t *testing.T) {
	tb := newTable[uint32](0)
	for i := range uint64(4000) {
		tb.put(0xabcdef12_00000000|i<<1|1, uint32(i))
	}
	longest := 0
	for i := range tb.slots {
		if tb.slots[i].k != 0 {
			longest = max(longest, tb.dist(i))
		}
	}
	if longest > 64 {
		t.Fatalf("keys sharing their high 32 bits are displaced by up to %d slots: placement is predictable", longest)
	}
}
