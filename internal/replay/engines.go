package replay

import (
	"fmt"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
)

// Model is the model name every generated request names and every simulated engine serves.
const Model = "meta-llama/Llama-3.1-8B-Instruct"

// EngineConfig is the simulated model server of the benchmark: Llama-3.1-8B on one H100 in its
// timing, with the KV cache, the batch and the step's token budget scaled down by about 6× so
// that a workload of a few thousand requests puts the cache under the pressure a real one of
// tens of thousands would (docs/replay.md, "Engines"):
//
//   - a step costs 2 ms (scheduling, launches) + 60 µs per prompt token computed (~16,700
//     tokens/s, the H100 prefill rate the replay has always used) + a decode term;
//   - the decode term is 5 ms with one decoding request, so a request decoding alone gets a
//     token every 2 + 5 = 7 ms (~140 tokens/s), and 5 × (1 + 1.4) = 12 ms with a full batch of
//     40, a token every 14 ms: a step reads the 16 GB of weights (4.8 ms at 3.35 TB/s) whatever
//     the batch and each sequence its KV (~0.08 ms for 2,000 tokens of context), so 40 make it
//     ~1.5× longer; 2× leaves room for kernel inefficiency. (The serial-prefill model used 3×
//     but let prefill and decode run side by side for free.)
//   - 4,096 KV blocks of 16 tokens (65,536 tokens; an 80 GB H100 holds ~25,000 blocks of this
//     model: × 0.164) and at most 40 running requests (vLLM's max_num_seqs 256 × 0.164 ≈ 42),
//     1,000 waiting;
//   - a budget of 2,048 tokens per step: vLLM's API server defaults to 8,192 on an H100
//     (2,048 on smaller GPUs); 8,192 × 0.164 ≈ 1,340, rounded up to the smaller default, so a
//     3,000-5,000-token prompt takes two or three steps, as a 20,000-token one would at 8,192.
func EngineConfig() engine.Config {
	c := engine.DefaultConfig()
	c.Model = Model
	c.BlockSize = 16
	c.NumGPUBlocks = 4096
	c.MaxNumSeqs = 40
	c.MaxNumBatchedTokens = 2048
	c.MaxWaiting = 1000
	c.StepOverhead = 2 * time.Millisecond
	c.PrefillPerToken = 60 * time.Microsecond
	c.DecodePerToken = 5 * time.Millisecond
	c.DecodeBatchPenalty = 1.4
	c.OutputTokensMin = 32
	c.OutputTokensMax = 384
	c.Seed = 1
	return c
}

// EndpointAddr is the address the picker knows simulated engine i by.
func EndpointAddr(i int) string {
	return fmt.Sprintf("10.77.%d.%d:8000", i/250, i%250+1)
}

// Epoch is simulated time zero.
var Epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// ScaledClock is real time sped up: simulated time runs Scale times faster than the wall clock.
// Timers fire on their own goroutines (time.AfterFunc), so the picker sees real concurrency.
type ScaledClock struct {
	Scale float64
	start time.Time // simulated
	wall  time.Time
}

// NewScaledClock returns a clock that reads start now and runs scale times faster than real time.
func NewScaledClock(start time.Time, scale float64) *ScaledClock {
	return &ScaledClock{Scale: scale, start: start, wall: time.Now()}
}

// Now returns the simulated time.
func (c *ScaledClock) Now() time.Time {
	return c.start.Add(time.Duration(float64(time.Since(c.wall)) * c.Scale))
}

// AfterFunc calls f after d of simulated time.
func (c *ScaledClock) AfterFunc(d time.Duration, f func()) engine.Timer {
	if d < 0 {
		d = 0
	}
	return time.AfterFunc(time.Duration(float64(d)/c.Scale), f)
}

// WallOf returns how much wall time d of simulated time takes.
func (c *ScaledClock) WallOf(d time.Duration) time.Duration {
	return time.Duration(float64(d) / c.Scale)
}
