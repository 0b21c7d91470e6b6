package prefix

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
)

func hashAll(blockSize, maxBlocks int, seed uint64, parts ...[]byte) []uint64 {
	h := NewHasher(blockSize, maxBlocks)
	h.Reset(seed, nil)
	for _, p := range parts {
		h.Write(p)
	}
	return slices.Clone(h.Hashes())
}

func TestHasherIgnoresHowTheRenderingIsSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	text := make([]byte, 5000)
	for i := range text {
		text[i] = byte('a' + rng.IntN(26))
	}
	whole := hashAll(64, 1000, 7, text)
	if len(whole) != 5000/64 {
		t.Fatalf("%d hashes for 5000 bytes, want %d full blocks", len(whole), 5000/64)
	}
	for trial := range 50 {
		var parts [][]byte
		for rest := text; len(rest) > 0; {
			n := min(len(rest), rng.IntN(150))
			parts = append(parts, rest[:n])
			rest = rest[n:]
		}
		if got := hashAll(64, 1000, 7, parts...); !slices.Equal(got, whole) {
			t.Fatalf("trial %d: split writes give different hashes", trial)
		}
	}
}

func TestHasherChainsBlocks(t *testing.T) {
	a := bytes.Repeat([]byte("x"), 64*4)
	b := bytes.Clone(a)
	b[0] = 'y' // differs in the first block only
	ha, hb := hashAll(64, 100, 1, a), hashAll(64, 100, 1, b)
	for i := range ha {
		if ha[i] == hb[i] {
			t.Errorf("block %d hash equal although an earlier block differs", i)
		}
	}
	c := append(bytes.Clone(a), bytes.Repeat([]byte("z"), 64)...)
	if hc := hashAll(64, 100, 1, c); !slices.Equal(hc[:4], ha) {
		t.Error("a longer prompt does not share its prefix's hashes")
	}
	if hs := hashAll(64, 100, 2, a); hs[0] == ha[0] {
		t.Error("different seeds give the same first hash")
	}
}

func TestHasherStopsAtMaxBlocks(t *testing.T) {
	got := hashAll(64, 3, 1, bytes.Repeat([]byte("q"), 64*10))
	if len(got) != 3 {
		t.Fatalf("%d hashes, want 3", len(got))
	}
}

func TestSeedSeparatesModelsAndSalts(t *testing.T) {
	seeds := map[uint64]string{}
	for _, c := range [][2]string{{"m", ""}, {"m", "s"}, {"m2", ""}, {"m", "s2"}, {"ms", ""}} {
		s := Seed(c[0], c[1])
		if prev, dup := seeds[s]; dup {
			t.Errorf("Seed%v collides with %s", c, prev)
		}
		seeds[s] = c[0] + "|" + c[1]
	}
}

func TestAffinityKeyOfShortAndLongPrompts(t *testing.T) {
	key := func(p string) uint64 {
		h := NewHasher(64, 100)
		h.Reset(1, nil)
		h.Write([]byte(p))
		return h.AffinityKey()
	}
	if key("hello") == key("hellp") {
		t.Error("short prompts that differ share an affinity key")
	}
	long := string(bytes.Repeat([]byte("a"), 64))
	if key(long+"tail one") != key(long+"another tail") {
		t.Error("prompts with the same first block have different affinity keys")
	}
	if key("") == 0 {
		t.Error("affinity key 0 (means none)")
	}
}

func BenchmarkHasher64KB(b *testing.B) {
	text := bytes.Repeat([]byte("The quick brown fox jumps over the lazy dog. "), 64<<10/45)
	h := NewHasher(64, 8192)
	var dst []uint64
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for range b.N {
		h.Reset(1, dst)
		h.Write(text)
		dst = h.Hashes()
	}
}
