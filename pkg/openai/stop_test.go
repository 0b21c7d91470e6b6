package openai

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// naiveStops is the byte-at-a-time definition the fast paths must match.
func naiveStops(b []byte) (first int, mask uint64) {
	first = -1
	for k, c := range b {
		if c == '"' || c == '\\' || c < 0x20 {
			if first < 0 {
				first = k
			}
			if k < 64 {
				mask |= 1 << k
			}
		}
	}
	return first, mask
}

// Every byte value at every position and every length up to 300, with one
// or two stop candidates: the AVX2 kernel, the word-at-a-time fallback and
// the naive loop must agree.
func TestStopSearchMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(b []byte) {
		t.Helper()
		want, wantMask := naiveStops(b)
		if got := indexStop(b); got != want {
			t.Fatalf("indexStop(%q) = %d, want %d", b, got, want)
		}
		if got := indexStopGeneric(b, 0); got != want {
			t.Fatalf("indexStopGeneric(%q) = %d, want %d", b, got, want)
		}
		if len(b) >= 64 {
			if got := stopMask64(b); got != wantMask {
				t.Fatalf("stopMask64(%q) = %#x, want %#x", b, got, wantMask)
			}
			saved := useAVX2
			useAVX2 = false
			got := stopMask64(b)
			useAVX2 = saved
			if got != wantMask {
				t.Fatalf("generic stopMask64(%q) = %#x, want %#x", b, got, wantMask)
			}
		}
	}
	for c := 0; c < 256; c++ {
		for pos := 0; pos < 70; pos++ {
			b := bytes.Repeat([]byte{'a'}, 70)
			b[pos] = byte(c)
			check(b)
		}
	}
	for n := 0; n < 300; n++ {
		for trial := 0; trial < 100; trial++ {
			b := make([]byte, n)
			for k := range b {
				b[k] = byte(0x20 + rng.IntN(0x60))
				if b[k] == '"' || b[k] == '\\' {
					b[k] = 'x'
				}
			}
			for k := rng.IntN(3); k > 0 && n > 0; k-- {
				b[rng.IntN(n)] = byte(rng.IntN(256))
			}
			check(b)
		}
	}
}
