package loadgen

import "testing"

func TestDirtyPool(t *testing.T) {
	var p dirtyPool
	for _, size := range []int{0, 1, 256, 257, 4096, 62000, 65536, 65537, 1 << 20, 1<<20 + 1} {
		b := p.Get(size)
		if len(*b) != size {
			t.Fatalf("Get(%d): len %d", size, len(*b))
		}
		if size > 0 && size <= 1<<20 && (cap(*b) < size || cap(*b) > max(2*size, 256)) {
			t.Fatalf("Get(%d): cap %d", size, cap(*b))
		}
		p.Put(b)
		again := p.Get(size)
		if len(*again) != size || cap(*again) < size {
			t.Fatalf("Get(%d) after Put: len %d cap %d", size, len(*again), cap(*again))
		}
	}
	// A buffer whose capacity is not a tier size goes to the tier it fills.
	odd := make([]byte, 10, 5000)
	p.Put(&odd)
	if b := p.Get(4096); cap(*b) < 4096 {
		t.Fatalf("cap %d", cap(*b))
	}
}
