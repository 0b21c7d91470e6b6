package prefix

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/kvpick/kvpick/pkg/openai"
)

// The index counts blocks of rendered prompt bytes; servers count KV blocks of tokens.
// lruCapacityPerEndpoint is given in blocks of blockSize/assumedBytesPerToken tokens (16 for 64
// bytes: one vLLM KV block), and the index holds as many of its own blocks as cover the same
// number of tokens. How many tokens a block of bytes is depends on the tokenizer and the
// traffic (English prose ~4.5 bytes per token with Llama 3's tokenizer, code and other
// languages fewer), so the plugin learns it from the servers' usage reports (prompt_tokens
// against the bytes it rendered) and rescales the index's capacity when the ratio moves.
// Without usage reports it keeps assuming assumedBytesPerToken.
const (
	assumedBytesPerToken = 4
	// calibDecay forgets old samples: the sums halve every ~2,800 requests, so a change of
	// traffic shows within a few thousand requests while one odd prompt moves nothing.
	calibDecay = 1 - 1.0/4096
	// calibMinSamples is how many reports it takes before the first rescale.
	calibMinSamples = 64
	// calibMinBlocks skips prompts of under four blocks, where the server's chat-template tokens
	// outweigh the text.
	calibMinBlocks = 4
	// calibStep is the relative change of the factor that triggers a rescale: rescaling evicts
	// under the index's write lock, so it is not done for noise.
	calibStep = 0.02
	// The factor stays within [1/4, 4]: 1 to 16 bytes per token covers every tokenizer in use;
	// beyond that the reports are not about the prompts the picker rendered.
	calibMinFactor, calibMaxFactor = 0.25, 4
)

// calibration learns tokens per rendered byte from usage reports.
type calibration struct {
	mu             sync.Mutex
	tokens, bytes  float64 // decayed sums over reports
	samples        int
	factor         float64 // applied: index capacity = configured × factor
	configured     int
	apply          func(capacity int)
	reportedTokens float64 // for metrics: the current tokens per block estimate
}

func newCalibration(configured int, apply func(int)) *calibration {
	return &calibration{factor: 1, configured: configured, apply: apply}
}

// observe adds one report: a prompt of promptTokens tokens that the picker rendered into
// renderedBytes bytes. blockSize converts the estimate for metrics.
func (c *calibration) observe(renderedBytes, promptTokens, blockSize int) {
	if renderedBytes < calibMinBlocks*blockSize || promptTokens <= 0 {
		return
	}
	c.mu.Lock()
	c.tokens = c.tokens*calibDecay + float64(promptTokens)
	c.bytes = c.bytes*calibDecay + float64(renderedBytes)
	c.samples++
	c.reportedTokens = c.tokens / c.bytes * float64(blockSize)
	if c.samples < calibMinSamples {
		c.mu.Unlock()
		return
	}
	// Capacity in the index's blocks = configured × (tokens per configured block) / (tokens per
	// index block) = configured × (blockSize/assumed) / (blockSize × tokens/bytes).
	f := c.bytes / (assumedBytesPerToken * c.tokens)
	f = min(max(f, calibMinFactor), calibMaxFactor)
	if math.Abs(f/c.factor-1) < calibStep {
		c.mu.Unlock()
		return
	}
	c.factor = f
	capacity := max(1, int(math.Round(float64(c.configured)*f)))
	// Applied under c.mu so that two rescales cannot land out of order.
	c.apply(capacity)
	c.mu.Unlock()
}

// tokensPerBlock returns the current estimate of server tokens per index block (0 before any
// report, or when calibration is off).
func (c *calibration) tokensPerBlock() float64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reportedTokens
}

// usage calibrates the index's capacity from the server's prompt_tokens for a prompt the picker
// rendered whole (Plugin.Usage also counts the report for the metrics).
func (pl *Plugin) usage(st *state, u openai.Usage) {
	if pl.calib == nil || st.truncated || st.rendered == 0 {
		return
	}
	pl.calib.observe(st.rendered, u.PromptTokens, pl.p.BlockSize)
}

// reuseRate is an exponentially weighted mean of the share of each scored prompt that some
// endpoint held (weight 1/256 per request: it follows a change of traffic within a few hundred
// requests). Updated lock-free; concurrent updates may drop a sample, which a mean of hundreds
// does not notice.
type reuseRate struct{ bits atomic.Uint64 }

const reuseAlpha = 1.0 / 256

// observe adds one request's share and returns the new mean.
func (r *reuseRate) observe(share float64) float64 {
	old := math.Float64frombits(r.bits.Load())
	v := old + reuseAlpha*(share-old)
	r.bits.Store(math.Float64bits(v))
	return v
}

func (r *reuseRate) value() float64 { return math.Float64frombits(r.bits.Load()) }
