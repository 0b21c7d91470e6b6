package engine

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// BlockKeys returns the chained keys of the full blocks of toks:
// key_i = xxhash(key_{i-1} ‖ ids of block i), key_{-1} = root. Chaining
// means one matching key proves the whole prefix before it. A trailing
// partial block has no key: vLLM caches full blocks only.
func BlockKeys(root uint64, toks []uint32, blockSize int) []uint64 {
	n := len(toks) / blockSize
	keys := make([]uint64, n)
	buf := make([]byte, 8+4*blockSize)
	prev := root
	for i := range n {
		prev = blockKey(buf, prev, toks[i*blockSize:(i+1)*blockSize])
		keys[i] = prev
	}
	return keys
}

func blockKey(buf []byte, prev uint64, block []uint32) uint64 {
	buf = binary.LittleEndian.AppendUint64(buf[:0], prev)
	for _, t := range block {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	return xxhash.Sum64(buf)
}

// RootKey is the key chained into a prompt's first block: it is distinct
// for every cache salt, so salted requests share nothing with others.
func RootKey(cacheSalt string) uint64 {
	if cacheSalt == "" {
		return 0
	}
	return xxhash.Sum64String("salt\x00" + cacheSalt)
}

// blockPool models vLLM v1's BlockPool: a fixed set of KV blocks with
// reference counts, a map from block key to cached block, and a free queue
// (doubly linked, intrusive) that holds every block with no reference,
// cached or not. Allocation takes the queue's head and evicts its key;
// freeing appends at the tail. A cache hit on a free block takes it out of
// the queue. Blocks with references (pinned by running requests) are never
// in the queue and so never evicted.
type blockPool struct {
	blocks []kvBlock // index = block id; the last entry is the queue's sentinel
	free   int       // blocks in the free queue
	cached map[uint64]int32
}

type kvBlock struct {
	key        uint64
	hashed     bool
	ref        int32
	prev, next int32
}

func newBlockPool(n int) *blockPool {
	p := &blockPool{blocks: make([]kvBlock, n+1), cached: make(map[uint64]int32, n)}
	s := int32(n)
	p.blocks[s].prev, p.blocks[s].next = s, s
	for i := range n {
		p.pushTail(int32(i))
	}
	return p
}

func (p *blockPool) sentinel() int32 { return int32(len(p.blocks) - 1) }

func (p *blockPool) pushTail(id int32) {
	s := p.sentinel()
	last := p.blocks[s].prev
	p.blocks[id].prev, p.blocks[id].next = last, s
	p.blocks[last].next = id
	p.blocks[s].prev = id
	p.free++
}

func (p *blockPool) unlink(id int32) {
	b := &p.blocks[id]
	p.blocks[b.prev].next = b.next
	p.blocks[b.next].prev = b.prev
	b.prev, b.next = -1, -1
	p.free--
}

// match returns the ids of the longest run of leading keys that are cached,
// looking at no more than limit keys.
func (p *blockPool) match(keys []uint64, limit int) []int32 {
	var ids []int32
	for i, k := range keys {
		if i >= limit {
			break
		}
		id, ok := p.cached[k]
		if !ok {
			break
		}
		ids = append(ids, id)
	}
	return ids
}

// matchCount is len(match(keys, limit)) without allocating.
func (p *blockPool) matchCount(keys []uint64, limit int) int {
	n := 0
	for n < len(keys) && n < limit {
		if _, ok := p.cached[keys[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// freeAmong counts the blocks of ids that sit in the free queue.
func (p *blockPool) freeAmong(ids []int32) int {
	n := 0
	for _, id := range ids {
		if p.blocks[id].ref == 0 {
			n++
		}
	}
	return n
}

// touch takes a reference on each block (a cache hit), pulling free ones
// out of the queue so they cannot be evicted while in use.
func (p *blockPool) touch(ids []int32) {
	for _, id := range ids {
		if p.blocks[id].ref == 0 {
			p.unlink(id)
		}
		p.blocks[id].ref++
	}
}

// allocate takes n blocks from the head of the free queue (least recently
// freed first), evicting their cached keys. The caller has checked that n
// blocks are free.
func (p *blockPool) allocate(n int, dst []int32) []int32 {
	s := p.sentinel()
	for range n {
		id := p.blocks[s].next
		if id == s {
			panic("engine: block pool exhausted")
		}
		p.unlink(id)
		b := &p.blocks[id]
		if b.hashed {
			delete(p.cached, b.key)
			b.hashed = false
		}
		b.ref = 1
		dst = append(dst, id)
	}
	return dst
}

// register records that block id holds key. When another block already
// holds it (two requests computed the same block), the first stays the
// cached one and id stays anonymous.
func (p *blockPool) register(id int32, key uint64) {
	if _, dup := p.cached[key]; dup {
		return
	}
	b := &p.blocks[id]
	if b.hashed {
		delete(p.cached, b.key)
	}
	b.key, b.hashed = key, true
	p.cached[key] = id
}

// release drops a request's references. Like vLLM it frees the blocks in
// reverse order, so a finished request's tail blocks enter the queue first
// and are evicted before its head blocks, which other requests are more
// likely to share.
func (p *blockPool) release(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		p.blocks[id].ref--
		if p.blocks[id].ref == 0 {
			p.pushTail(id)
		}
	}
}

// capacity is the number of blocks.
func (p *blockPool) capacity() int { return len(p.blocks) - 1 }

// isCached reports whether key is in the cache (for tests).
func (p *blockPool) isCached(key uint64) bool {
	_, ok := p.cached[key]
	return ok
}
