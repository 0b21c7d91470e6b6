package prefix

import (
	"github.com/cespare/xxhash/v2"
	"github.com/zeebo/xxh3"
)

// Seed is the hash chain's starting value: xxhash(model ‖ 0x00 ‖ cacheSalt). Different models,
// or tenants that salt their cache, never share blocks.
func Seed(model, cacheSalt string) uint64 {
	var d xxhash.Digest
	d.Reset()
	d.WriteString(model)
	d.Write([]byte{0})
	d.WriteString(cacheSalt)
	return d.Sum64()
}

// Hasher turns the canonical rendering of a prompt into chained block hashes:
// h_i = fmix64(h_{i-1}·φ ⊕ xxh3(block_i)), h_{-1} = Seed, where fmix64 is MurmurHash3's
// 64-bit finalizer. Because every hash depends on all blocks before it, one hash identifies a
// whole prefix. Each block is hashed on its own with XXH3 (xxHash's 64-bit successor: a 64-byte
// block takes four 64×64→128-bit multiplies where xxhash64 takes ~30, so 64 KB hash in ~10 µs
// against ~17 µs with xxhash64 here; docs/benchmarks.md "Decision path") and chained with a
// few multiplies; the block hashes do not depend on each other, so the CPU overlaps them. Only
// full blocks are hashed, as only full blocks are cached by vLLM. It implements openai.Sink;
// written bytes are consumed without being copied, except the few bytes of a block that
// straddles two writes. The hashes live only in this process (replicas do not exchange them),
// so the function can change between releases.
type Hasher struct {
	blockSize int
	maxBlocks int
	prev      uint64
	buf       []byte // the partial block straddling writes
	hashes    []uint64
	tail      xxhash.Digest // hash of everything written, for the affinity key of short prompts
	written   int
}

// NewHasher returns a hasher for blocks of blockSize bytes that stops after maxBlocks blocks.
func NewHasher(blockSize, maxBlocks int) *Hasher {
	return &Hasher{blockSize: blockSize, maxBlocks: maxBlocks, buf: make([]byte, 0, blockSize)}
}

// Reset starts a new prompt; hashes are appended to dst[:0] (pass the previous result to reuse it).
func (h *Hasher) Reset(seed uint64, dst []uint64) {
	h.prev = seed
	h.buf = h.buf[:0]
	h.hashes = dst[:0]
	h.tail.ResetWithSeed(seed)
	h.written = 0
}

// Write consumes the next bytes of the rendering.
func (h *Hasher) Write(p []byte) {
	if len(h.hashes) >= h.maxBlocks {
		return
	}
	if h.written < h.blockSize {
		// Short prompts have no full block; keep their bytes for AffinityKey.
		n := min(len(p), h.blockSize-h.written)
		h.tail.Write(p[:n])
	}
	h.written += len(p)
	if len(h.buf) > 0 {
		n := min(len(p), h.blockSize-len(h.buf))
		h.buf = append(h.buf, p[:n]...)
		p = p[n:]
		if len(h.buf) < h.blockSize {
			return
		}
		h.block(h.buf)
		h.buf = h.buf[:0]
	}
	for len(p) >= h.blockSize && len(h.hashes) < h.maxBlocks {
		h.block(p[:h.blockSize])
		p = p[h.blockSize:]
	}
	if len(h.hashes) < h.maxBlocks {
		h.buf = append(h.buf, p...)
	}
}

func (h *Hasher) block(b []byte) {
	h.prev = fmix64(h.prev*0x9e3779b97f4a7c15 ^ xxh3.Hash(b))
	if h.prev == 0 {
		h.prev = 1 // 0 marks an empty slot in the index's tables
	}
	h.hashes = append(h.hashes, h.prev)
}

// fmix64 is MurmurHash3's finalizer: every input bit affects every output bit.
func fmix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// Written returns the bytes rendered so far, and whether the prompt was cut at maxBlocks (then
// the count stops there).
func (h *Hasher) Written() (n int, truncated bool) { return h.written, len(h.hashes) >= h.maxBlocks }

// Hashes returns the block hashes so far; the slice is owned by the caller after Reset.
func (h *Hasher) Hashes() []uint64 { return h.hashes }

// AffinityKey identifies the prompt's beginning: the first block's hash, or for a prompt shorter
// than a block, the hash of all of it. Never 0.
func (h *Hasher) AffinityKey() uint64 {
	k := h.tail.Sum64()
	if len(h.hashes) > 0 {
		k = h.hashes[0]
	}
	if k == 0 {
		k = 1
	}
	return k
}
