package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistogramQuantilesMatchExactOnes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h Histogram
	vals := make([]int64, 100000)
	for i := range vals {
		// Log-normal around 1 ms with a long tail, like request latencies.
		vals[i] = int64(math.Exp(r.NormFloat64()*1.2) * 1e6)
		h.Record(vals[i])
	}
	slices.Sort(vals)
	for _, q := range []float64{0, 0.01, 0.5, 0.9, 0.99, 0.999, 1} {
		rank := int(math.Ceil(q * float64(len(vals))))
		exact := vals[max(rank-1, 0)]
		got := h.Quantile(q)
		if rel := math.Abs(float64(got-exact)) / float64(exact); rel > 1.0/128 {
			t.Errorf("q=%v: got %d, exact %d (%.2f%% off)", q, got, exact, 100*rel)
		}
	}
	if h.Count() != uint64(len(vals)) || h.Min() != vals[0] || h.Max() != vals[len(vals)-1] {
		t.Errorf("count/min/max = %d/%d/%d, want %d/%d/%d", h.Count(), h.Min(), h.Max(), len(vals), vals[0], vals[len(vals)-1])
	}
	var sum float64
	for _, v := range vals {
		sum += float64(v)
	}
	if m := h.Mean(); math.Abs(m-sum/float64(len(vals))) > 1e-6*m {
		t.Errorf("mean %v, want %v", m, sum/float64(len(vals)))
	}
}

func TestHistogramSmallValuesAreExact(t *testing.T) {
	var h Histogram
	for v := range int64(64) {
		h.Record(v)
	}
	if got := h.Quantile(0.5); got != 31 {
		t.Errorf("median of 0..63 = %d, want 31", got)
	}
	for i := range 64 {
		low, w := bucketRange(i)
		if low != int64(i) || w != 1 {
			t.Fatalf("bucket %d = [%d, +%d)", i, low, w)
		}
	}
}

func TestHistogramBucketsCoverEveryValue(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		v := int64(r.Uint64() >> (2 + r.IntN(62))) // below 2^62: low+w must not overflow
		low, w := bucketRange(bucketOf(v))
		if v < low || v >= low+w {
			t.Fatalf("value %d in bucket %d = [%d, %d)", v, bucketOf(v), low, low+w)
		}
		if v >= subCount && float64(w)/float64(low) > 1.0/subCount {
			t.Fatalf("bucket of %d too wide: %d at %d", v, w, low)
		}
	}
}

func TestHistogramMergeAndEdges(t *testing.T) {
	var a, b, all Histogram
	for i := range 1000 {
		d := time.Duration(i) * time.Microsecond
		all.RecordDuration(d)
		if i%2 == 0 {
			a.RecordDuration(d)
		} else {
			b.RecordDuration(d)
		}
	}
	a.Merge(&b)
	a.Merge(&Histogram{})
	for _, q := range []float64{0, 0.5, 0.99, 1} {
		if a.Quantile(q) != all.Quantile(q) {
			t.Errorf("q=%v: merged %d, direct %d", q, a.Quantile(q), all.Quantile(q))
		}
	}
	if a.Count() != all.Count() || a.Min() != 0 || a.Max() != all.Max() {
		t.Errorf("merged count/min/max %d/%d/%d", a.Count(), a.Min(), a.Max())
	}
	var empty Histogram
	if empty.Quantile(0.5) != 0 || !math.IsNaN(empty.Mean()) {
		t.Error("empty histogram: want quantile 0 and NaN mean")
	}
	var neg Histogram
	neg.Record(-5)
	if neg.Max() != 0 || neg.Quantile(1) != 0 {
		t.Error("negative values must count as 0")
	}
	l := LatencyOf(&all)
	if l.Count != 1000 || math.Abs(l.P50-0.4995) > 0.01 || l.Max != 0.999 {
		t.Errorf("LatencyOf = %+v", l)
	}
}

func TestSlope(t *testing.T) {
	xs := []float64{0, 1, 2, 3, 4}
	ys := []float64{10, 12, 14, 16, 18}
	if s := Slope(xs, ys); math.Abs(s-2) > 1e-12 {
		t.Errorf("slope %v, want 2", s)
	}
	if !math.IsNaN(Slope([]float64{1, 1}, []float64{1, 2})) || !math.IsNaN(Slope(nil, nil)) {
		t.Error("degenerate inputs: want NaN")
	}
}
