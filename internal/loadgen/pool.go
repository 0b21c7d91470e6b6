package loadgen

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// dirtyPool is a gRPC buffer pool in power-of-two tiers from 256 B to 1 MiB that does not zero
// the buffers it hands out. gRPC overwrites every byte it reads from a pooled buffer (frames are
// read into it, messages marshalled or copied over it), so zeroing is pure cost — and grpc-go's
// default pool both zeroes a buffer's whole capacity on each Get and jumps from a 32 KiB tier to
// a 1 MiB one, so that each ~62,000-byte body chunk the picker re-emits would cost the client a
// 1 MiB clear. Larger buffers are allocated and left to the collector.
type dirtyPool struct {
	tiers [maxTier - minTier + 1]sync.Pool
}

const (
	minTier = 8
	maxTier = 20
)

var _ mem.BufferPool = (*dirtyPool)(nil)

func tierOf(size int) int {
	if size <= 1<<minTier {
		return minTier
	}
	return bits.Len(uint(size - 1))
}

func (p *dirtyPool) Get(size int) *[]byte {
	t := tierOf(size)
	if t > maxTier {
		b := make([]byte, size)
		return &b
	}
	if b, ok := p.tiers[t-minTier].Get().(*[]byte); ok {
		*b = (*b)[:size]
		return b
	}
	b := make([]byte, size, 1<<t)
	return &b
}

func (p *dirtyPool) Put(b *[]byte) {
	c := cap(*b)
	if c < 1<<minTier || c > 1<<maxTier {
		return
	}
	// Largest tier the capacity fills.
	t := bits.Len(uint(c)) - 1
	*b = (*b)[:0]
	p.tiers[t-minTier].Put(b)
}
