package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// subBits sets the histogram's precision: 2^subBits buckets per power of two, so a recorded
// value is reported within 1/2^(subBits+1) (under 0.8 %) of itself.
const (
	subBits  = 6
	subCount = 1 << subBits
)

// Histogram is a log-linear histogram of non-negative integer values (durations in
// nanoseconds here), in the manner of HdrHistogram: exact below 2^subBits, then 2^subBits
// equal-width buckets per power of two. Its memory is bounded (a few thousand counters at most)
// whatever the number of values. The zero value is ready to use; it is not safe for concurrent
// use (give each worker its own and Merge them).
type Histogram struct {
	counts   []uint64
	n        uint64
	sum      float64
	min, max int64
}

// bucketOf returns v's bucket index.
func bucketOf(v int64) int {
	if v < subCount {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - 1 - subBits
	return (shift+1)*subCount + int(uint64(v)>>uint(shift)) - subCount
}

// bucketRange returns the smallest value of bucket i and its width.
func bucketRange(i int) (low, width int64) {
	if i < subCount {
		return int64(i), 1
	}
	shift := i/subCount - 1
	return int64(i%subCount+subCount) << uint(shift), int64(1) << uint(shift)
}

// Record adds one value; negative values count as 0.
func (h *Histogram) Record(v int64) {
	if v < 0 {
		v = 0
	}
	i := bucketOf(v)
	if i >= len(h.counts) {
		n := max(i+1, 2*len(h.counts), 16*subCount)
		c := make([]uint64, n)
		copy(c, h.counts)
		h.counts = c
	}
	h.counts[i]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

// RecordDuration adds one duration, in nanoseconds.
func (h *Histogram) RecordDuration(d time.Duration) { h.Record(int64(d)) }

// Merge adds o's values to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	if len(o.counts) > len(h.counts) {
		c := make([]uint64, len(o.counts))
		copy(c, h.counts)
		h.counts = c
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// Count is the number of values recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Min and Max are the exact extremes (0 when empty).
func (h *Histogram) Min() int64 { return h.min }

// Max is the largest value recorded.
func (h *Histogram) Max() int64 { return h.max }

// Mean is the exact mean (NaN when empty).
func (h *Histogram) Mean() float64 {
	if h.n == 0 {
		return math.NaN()
	}
	return h.sum / float64(h.n)
}

// Quantile returns the value at quantile q in [0,1]: the value of rank ceil(q·n) (the smallest
// value for q=0), as its bucket's midpoint clamped to the exact minimum and maximum. It returns
// 0 when the histogram is empty.
func (h *Histogram) Quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank == 0 {
		return h.min
	}
	if rank >= h.n {
		return h.max
	}
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			low, w := bucketRange(i)
			return min(max(low+(w-1)/2, h.min), h.max)
		}
	}
	return h.max
}

// QuantileDuration is Quantile for durations.
func (h *Histogram) QuantileDuration(q float64) time.Duration { return time.Duration(h.Quantile(q)) }
