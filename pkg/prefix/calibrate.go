package prefix

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/router"
	"go.uber.org/zap"
)

// The index counts blocks of rendered prompt bytes; servers count KV blocks of tokens. Each
// endpoint's capacity is a number of tokens — the KV cache its server reports
// (vllm:cache_config_info's num_gpu_blocks × block_size, or SGLang's max_total_num_tokens) less
// what running requests occupy, or, when it reports nothing, lruCapacityPerEndpoint blocks of
// configuredBlockTokens tokens — and the index holds as many of its own blocks as cover those
// tokens. How many tokens a block of bytes is depends on the tokenizer and the traffic (English
// prose ~4.5 bytes per token with Llama 3's tokenizer, code and other languages fewer), so the
// plugin learns it from the servers' usage reports (prompt_tokens against the bytes it rendered)
// and rescales the index when the ratio moves. Without usage reports it assumes
// assumedBytesPerToken.
const (
	assumedBytesPerToken = 4
	// configuredBlockTokens is the unit of lruCapacityPerEndpoint: vLLM's KV block.
	configuredBlockTokens = 16
	// reportedUsableShare is the part of a server's reported KV cache that holds reusable
	// prefixes rather than running requests' generated tokens and reserved decode blocks: the
	// same 85% that config/default.yaml's lruCapacityPerEndpoint arithmetic uses.
	reportedUsableShare = 0.85
	// calibDecay forgets old samples: the sums halve every ~2,800 requests, so a change of
	// traffic shows within a few thousand requests while one odd prompt moves nothing.
	calibDecay = 1 - 1.0/4096
	// calibMinSamples is how many reports it takes before the first rescale.
	calibMinSamples = 64
	// calibMinBlocks skips prompts of under four blocks, where the server's chat-template tokens
	// outweigh the text.
	calibMinBlocks = 4
	// calibStep is the relative change of the ratio that triggers a rescale: rescaling evicts
	// under the index's write lock, so it is not done for noise.
	calibStep = 0.02
	// The learned bytes per token stay within [1, 16]: that covers every tokenizer in use;
	// beyond that the reports are not about the prompts the picker rendered.
	calibMinBytesPerToken, calibMaxBytesPerToken = 1, 16
)

// capacities decides every endpoint's index capacity and applies it off the decision path: a
// change (a calibration step, a scrape reporting a new cache size, an endpoint joining or
// leaving) marks the plan dirty and one background goroutine, started on demand and gone when
// idle, resizes the index.
type capacities struct {
	index       *Index
	blockSize   int
	configured  int  // lruCapacityPerEndpoint
	fromMetrics bool // size endpoints from their reported KV caches
	calibrate   bool
	learn       bool // learn the capacities of endpoints that report none (evidence.go)
	maxEntries  int  // pool-wide bound on index entries

	mu             sync.Mutex
	tokens, bytes  float64 // decayed sums over usage reports
	samples        int
	bytesPerToken  float64                        // applied
	reportedTokens float64                        // for metrics: the current tokens per block estimate
	reported       map[*router.Endpoint]int64     // usable tokens from the endpoint's metrics
	live           map[*router.Endpoint]int       // live endpoints → applied capacity (0: none yet)
	learned        map[*router.Endpoint]*learning // what the evidence taught (learnCapacity)
	ghost          map[*router.Endpoint]bool      // endpoints whose ghost table is on
	defaultCap     int                            // applied default capacity

	// applied is told each endpoint's new capacity (metrics); nil: nobody listens.
	applied func(ep *router.Endpoint, blocks int)
	// log gets each endpoint's new capacity at debug level (never nil).
	log *zap.Logger
	// floored is told each endpoint's new usage floor in usable tokens (metrics), under mu.
	floored func(ep *router.Endpoint, tokens float64)

	dirty, running atomic.Bool
	idle           sync.Cond // signalled when a run ends (for tests), under mu

	// tpb is float64 bits of blockSize / bytesPerToken, kept beside bytesPerToken for the
	// decision path, which must not take mu.
	tpb atomic.Uint64
	// sizes is, by endpoint slot, the KV cache size learned for endpoints that report none
	// (learnedSize), republished by apply with the capacities it plans, for the decision path,
	// which must not take mu.
	sizes atomic.Pointer[[]learnedSize]
}

// learnedSize is one endpoint's learned KV cache size in tokens; ep tells whether the slot
// still holds the endpoint it was learned for.
type learnedSize struct {
	ep     *router.Endpoint
	tokens float64
}

// learning is one endpoint's capacity as learned from the evidence.
type learning struct {
	tokens  float64 // usable tokens; 0: none learned yet (the applied capacity stands)
	bounded bool    // last set by a trim: other endpoints' growth does not lift it
	trimmed bool    // a trim has ever shrunk it
	// floor is the least usable tokens its scraped KV usage shows the server has, lastBound the
	// last scrape's bound (usagefloor.go); 0: none.
	floor, lastBound float64
}

// sized reports whether the evidence sizes the endpoint on its own (a learned capacity or a
// usage floor), so that apply neither gives it the default nor lets it follow the default.
func (l *learning) sized() bool { return l != nil && (l.tokens > 0 || l.floor > 0) }

func newCapacities(x *Index, p Params) *capacities {
	c := &capacities{
		index: x, blockSize: p.BlockSize, configured: p.LRUCapacityPerEndpoint,
		fromMetrics: p.CapacityFromMetrics, calibrate: p.CalibrateCapacity, maxEntries: p.MaxIndexEntries,
		learn:         p.LearnCapacity && p.EvictionEvidence,
		bytesPerToken: assumedBytesPerToken,
		reported:      map[*router.Endpoint]int64{},
		live:          map[*router.Endpoint]int{},
		learned:       map[*router.Endpoint]*learning{},
		ghost:         map[*router.Endpoint]bool{},
		log:           zap.NewNop(),
	}
	x.SetGhosts(c.learn)
	c.idle.L = &c.mu
	if !c.calibrate {
		// Without calibration the configured capacity is taken as index blocks, whatever the
		// block size: what the operator set is what the index holds.
		c.bytesPerToken = float64(p.BlockSize) / configuredBlockTokens
	}
	c.defaultCap = c.blocksLocked(c.configuredTokens())
	x.SetDefaultCapacity(c.defaultCap)
	c.tpb.Store(math.Float64bits(float64(c.blockSize) / c.bytesPerToken))
	return c
}

func (c *capacities) configuredTokens() float64 {
	return float64(c.configured) * configuredBlockTokens
}

// blocksLocked converts tokens into index blocks at the current bytes per token.
func (c *capacities) blocksLocked(tokens float64) int {
	tokensPerBlock := float64(c.blockSize) / c.bytesPerToken
	return max(1, int(math.Round(tokens/tokensPerBlock)))
}

// observe adds one usage report: a prompt of promptTokens tokens that the picker rendered into
// renderedBytes bytes.
func (c *capacities) observe(renderedBytes, promptTokens int) {
	if !c.calibrate || renderedBytes < calibMinBlocks*c.blockSize || promptTokens <= 0 {
		return
	}
	c.mu.Lock()
	c.tokens = c.tokens*calibDecay + float64(promptTokens)
	c.bytes = c.bytes*calibDecay + float64(renderedBytes)
	c.samples++
	c.reportedTokens = c.tokens / c.bytes * float64(c.blockSize)
	if c.samples < calibMinSamples {
		c.mu.Unlock()
		return
	}
	bpt := min(max(c.bytes/c.tokens, calibMinBytesPerToken), calibMaxBytesPerToken)
	changed := math.Abs(bpt/c.bytesPerToken-1) >= calibStep
	if changed {
		c.bytesPerToken = bpt
		c.tpb.Store(math.Float64bits(float64(c.blockSize) / bpt))
	}
	c.mu.Unlock()
	if changed {
		c.kick()
	}
}

// tokensPerBlock is the current estimate of server tokens per index block; it takes no lock,
// so the decision path may read it.
func (c *capacities) tokensPerBlock() float64 { return math.Float64frombits(c.tpb.Load()) }

// tokensPerBlockMetric is the learned tokens per block for metrics (0 before any report).
func (c *capacities) tokensPerBlockMetric() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reportedTokens
}

// metrics records an endpoint's reported KV cache.
func (c *capacities) metrics(ep *router.Endpoint, m *router.Metrics) {
	if !c.fromMetrics || m == nil {
		return
	}
	t := int64(float64(m.CapacityTokens()) * reportedUsableShare)
	c.mu.Lock()
	changed := false
	if _, ok := c.live[ep]; ok && t > 0 && c.reported[ep] != t {
		c.reported[ep] = t
		delete(c.learned, ep) // the server's own figure replaces what was learned
		changed = true
	}
	c.mu.Unlock()
	if changed {
		c.kick()
	}
}

// endpoints follows the pool.
func (c *capacities) endpoints(added, removed []*router.Endpoint) {
	c.mu.Lock()
	for _, e := range added {
		c.live[e] = 0
	}
	for _, e := range removed {
		delete(c.live, e)
		delete(c.reported, e)
		delete(c.learned, e)
		delete(c.ghost, e)
	}
	c.mu.Unlock()
	c.kick()
}

// kick schedules a run of apply; at most one runs at a time, and a change during a run causes
// another.
func (c *capacities) kick() {
	c.dirty.Store(true)
	if c.running.CompareAndSwap(false, true) {
		go c.run()
	}
}

func (c *capacities) run() {
	for {
		for c.dirty.Swap(false) {
			c.apply()
		}
		c.running.Store(false)
		// A kick between the last Swap and the Store found running set and left: take over.
		if !c.dirty.Load() || !c.running.CompareAndSwap(false, true) {
			break
		}
	}
	c.mu.Lock()
	c.idle.Broadcast()
	c.mu.Unlock()
}

// settle waits until no change is pending (for tests).
func (c *capacities) settle() {
	c.mu.Lock()
	for c.running.Load() || c.dirty.Load() {
		c.idle.Wait()
	}
	c.mu.Unlock()
}

// plan is one endpoint's new capacity and what it came from (for the debug line): "reported",
// "learned", "floor" or "default".
type plan struct {
	ep     *router.Endpoint
	cap    int
	source string
}

// apply computes every live endpoint's capacity and resizes those that changed. The sum over
// the pool is bounded by maxEntries: when the endpoints' own capacities add up to more, all
// are scaled down alike.
func (c *capacities) apply() {
	c.mu.Lock()
	want := make([]plan, 0, len(c.live))
	sum := 0
	defCap := min(c.blocksLocked(c.configuredTokens()), c.poolLevelLocked())
	var sizes []learnedSize
	for e := range c.live {
		n, source := defCap, "default"
		if t := c.reported[e]; t > 0 {
			n, source = c.blocksLocked(float64(t)), "reported"
		} else if l := c.learned[e]; l.sized() {
			if l.tokens > 0 {
				n, source = c.blocksLocked(l.tokens), "learned"
			} else {
				// Nothing learned yet, but the scraped usage shows at least this much: its own
				// server's evidence, within 3% of the usable cache once the server has been
				// busy (docs/benchmarks.md, "Floors and the running count"), where the
				// configured figure is a guess. Capacity-x10, tuning seeds 1-24, with ghost hits
				// counted once: shared-prefix TTFT p90 −40%, multi-turn p90 −6%, p99 −7%
				// ("Ghost hits count each block once").
				if f := max(learnMinBlocks, c.blocksLocked(l.floor)); f < n {
					n, source = f, "floor"
				}
			}
			// The index holds reportedUsableShare of a reported size (the rest holds running
			// requests' tokens), so what was learned for it is that share of the whole cache;
			// the usage floor bounds it from below.
			if e.Slot >= len(sizes) {
				sizes = append(sizes, make([]learnedSize, e.Slot+1-len(sizes))...)
			}
			sizes[e.Slot] = learnedSize{e, max(l.tokens, l.floor) / reportedUsableShare}
		}
		want = append(want, plan{e, n, source})
		sum += n
	}
	c.sizes.Store(&sizes)
	scale := 1.0
	if c.maxEntries > 0 && sum > c.maxEntries {
		scale = float64(c.maxEntries) / float64(sum)
	}
	c.defaultCap = max(1, int(float64(defCap)*scale))
	if c.maxEntries > 0 {
		c.defaultCap = min(c.defaultCap, c.maxEntries)
	}
	var changed []plan
	type ghostSwitch struct {
		ep *router.Endpoint
		on bool
	}
	var ghosts []ghostSwitch
	keep := map[int]bool{}
	for _, p := range want {
		p.cap = max(1, int(float64(p.cap)*scale))
		if c.reported[p.ep] > 0 || c.learned[p.ep].sized() {
			keep[p.ep.Slot] = true
		}
		if on := c.learn && c.reported[p.ep] == 0; on != c.ghost[p.ep] {
			c.ghost[p.ep] = on
			ghosts = append(ghosts, ghostSwitch{p.ep, on})
		}
		if c.live[p.ep] != p.cap {
			c.live[p.ep] = p.cap
			changed = append(changed, p)
		}
	}
	defaultCap := c.defaultCap
	c.mu.Unlock()
	// Endpoints sized by the default (and any the plan does not know) follow the default;
	// those sized by their own reports get theirs.
	c.index.ResizeDefault(defaultCap, func(slot int) bool { return keep[slot] })
	for _, p := range changed {
		if keep[p.ep.Slot] && !p.ep.Removed() {
			c.index.SetCapacity(p.ep.Slot, p.cap)
		}
	}
	for _, g := range ghosts {
		if !g.ep.Removed() {
			c.index.SetGhost(g.ep.Slot, g.on)
		}
	}
	debug := c.log.Core().Enabled(zap.DebugLevel)
	var lines [][]zap.Field
	if c.applied != nil || debug {
		// Under mu, for live endpoints only: the plugin forgets a removed endpoint's series
		// after it left live, so a late run cannot bring the series back.
		c.mu.Lock()
		for _, p := range changed {
			if _, live := c.live[p.ep]; !live {
				continue
			}
			if c.applied != nil {
				c.applied(p.ep, p.cap)
			}
			if debug {
				lines = append(lines, c.capacityFieldsLocked(p))
			}
		}
		c.mu.Unlock()
	}
	// Logged without mu, which the response path takes.
	for _, f := range lines {
		c.log.Debug("prefix index capacity", f...)
	}
}

// capacityFieldsLocked describes one endpoint's new index capacity and what it came from, for
// a debug line: with the routed lines of the same log it shows when a capacity went wrong
// (docs/benchmarks.md, "Growth lifts up to the floor", was diagnosed that way).
func (c *capacities) capacityFieldsLocked(p plan) []zap.Field {
	var learned, floor float64
	bounded := false
	if l := c.learned[p.ep]; l != nil && c.reported[p.ep] == 0 {
		learned, floor, bounded = l.tokens, l.floor, l.bounded
	}
	return []zap.Field{
		zap.String("endpoint", p.ep.Addr), zap.Int("blocks", p.cap), zap.String("source", p.source),
		zap.Int64("reported_tokens", c.reported[p.ep]), zap.Float64("learned_tokens", math.Round(learned)),
		zap.Float64("usage_floor_tokens", math.Round(floor)), zap.Bool("bounded", bounded),
	}
}

// poolLevelLocked is, in index blocks, the largest capacity learned for the pool's endpoints
// that report no cache size, once at least half of them (and two) have learned one; otherwise
// no limit. Endpoints without evidence of their own then take it in place of the configured
// figure when it is smaller: half the pool shown smaller than configured shows the figure wrong
// for the rest as well (one pool, one model, alike servers), and until its own first trim an
// endpoint promises what its server dropped long ago. The largest, not the mean: an early trim
// can bound one endpoint far below its size. Half, not one or two: following the first two
// learned endpoints cost capacity-x10's shared-prefix 28% of p90 on the tuning seeds.
func (c *capacities) poolLevelLocked() int {
	if !c.learn {
		return math.MaxInt
	}
	unreported, learned, largest := 0, 0, 0.0
	for e := range c.live {
		if c.reported[e] > 0 {
			continue
		}
		unreported++
		if l := c.learned[e]; l != nil && l.tokens > 0 {
			learned++
			largest = max(largest, l.tokens)
		}
	}
	if learned < max(2, (unreported+1)/2) {
		return math.MaxInt
	}
	return c.blocksLocked(largest)
}

// learnedTokens returns the KV cache size, in tokens, learned for ep from its server's
// cached_tokens reports and scraped KV usage (learnCapacity), or 0 when ep reports its own size
// or no evidence has touched it yet. Lock-free: it reads what apply last published.
func (c *capacities) learnedTokens(ep *router.Endpoint) float64 {
	p := c.sizes.Load()
	if p == nil || ep.Slot >= len(*p) || (*p)[ep.Slot].ep != ep {
		return 0
	}
	return (*p)[ep.Slot].tokens
}

// Learned capacities stay within [learnMinBlocks index blocks, learnMaxFactor ×
// lruCapacityPerEndpoint]: a few prompts' worth at least, so that one odd report cannot empty
// an endpoint, and at most a factor that covers a configured figure off by an order of
// magnitude and more (the pool-wide bound applies on top).
const (
	learnMinBlocks = 64
	learnMaxFactor = 64
)

// shrink lowers ep's learned capacity to kept index blocks: its server evicted a block that
// the index had used no earlier than every entry it kept, so it keeps no more than those; after
// a large miss (its server lost most of what the index predicted, evidence.go) to largeMissCut
// of them, since it then holds less than the trim kept. The endpoint is then bounded: other
// endpoints' growth no longer lifts it.
func (c *capacities) shrink(ep *router.Endpoint, kept int, largeMiss bool) {
	if !c.learn {
		return
	}
	share := 1.0
	if largeMiss {
		share = largeMissCut
	}
	c.mu.Lock()
	least := 0.0
	if l := c.learned[ep]; l != nil {
		least = l.floor * usageFloorIndexShare
	}
	changed := c.learnLocked(ep, func(cur, tpb float64) float64 {
		// Never below what the scraped usage shows the server holds (usagefloor.go).
		return max(min(cur, float64(max(kept, learnMinBlocks))*tpb)*share, least)
	})
	if l := c.learned[ep]; l != nil {
		l.bounded = l.bounded || changed
		l.trimmed = true
	}
	c.mu.Unlock()
	if changed {
		c.kick()
	}
}

// grow raises ep's learned capacity by blocks, and to at least atLeast blocks: its server held
// that many blocks the index had dropped for want of room, and so holds at least atLeast. The
// servers of one pool serve one model, mostly on alike hardware, so the configured figure is
// usually wrong for all of them alike: endpoints that no trim has bounded are lifted to
// atLeast too. Learning each server's size alone is slow, because evidence comes only from the
// requests routed there, and the index routes a prompt where it remembers it: a capacity
// learned too small keeps prompts away from where the server still holds them. Alike is not
// equal, though: an endpoint whose scraped usage gave it a floor (usagefloor.go) is lifted only
// up to that floor, its own server's evidence, since lifting a small server to a large one's
// size made the index promise history it had dropped and call it "not full" while it preempted
// (capacity-x0.1, held-out seeds 101-112: shared-prefix TTFT p90 −34%, multi-turn p99 −25%;
// capacity-x10 multi-turn p90 +4% there, −2% on 201-212; docs/benchmarks.md, "Growth lifts up
// to the floor"). Its own growth is not bounded so.
func (c *capacities) grow(ep *router.Endpoint, blocks, atLeast int) {
	if !c.learn {
		return
	}
	c.mu.Lock()
	changed := c.learnLocked(ep, func(cur, tpb float64) float64 {
		// No doubling: it found a capacity far too small faster while ghost hits were rare
		// (evidence.go), and overshoots now that every hit is seen (capacity-x0.1 tuning
		// seeds: multi-turn p90 1.14 → 0.99, agent 1.13 → 1.09 against doubling).
		return max(cur+float64(blocks)*tpb, float64(atLeast)*tpb)
	})
	if l := c.learned[ep]; l != nil {
		l.bounded = false
	}
	for e := range c.live {
		if l := c.learned[e]; e != ep && (l == nil || !l.bounded) {
			changed = c.learnLocked(e, func(cur, tpb float64) float64 {
				lift := float64(atLeast) * tpb
				if l != nil && l.floor > 0 {
					lift = min(lift, l.floor)
				}
				return max(cur, lift)
			}) || changed
		}
	}
	c.mu.Unlock()
	if changed {
		c.kick()
	}
}

// learnLocked sets ep's learned capacity (in tokens) to f(current, tokens per index block),
// within the bounds, unless its server reports its own; it reports a change. A live endpoint
// without a report has its learning record afterwards, changed or not.
func (c *capacities) learnLocked(ep *router.Endpoint, f func(cur, tpb float64) float64) bool {
	if _, live := c.live[ep]; !live || c.reported[ep] > 0 {
		return false
	}
	l := c.learningLocked(ep)
	tpb := float64(c.blockSize) / c.bytesPerToken
	t := min(max(f(c.currentLocked(ep, l), tpb), learnMinBlocks*tpb), c.configuredTokens()*learnMaxFactor)
	if t == l.tokens {
		return false
	}
	l.tokens = t
	return true
}

// learningLocked returns ep's learning record, made if it has none.
func (c *capacities) learningLocked(ep *router.Endpoint) *learning {
	l := c.learned[ep]
	if l == nil {
		l = &learning{}
		c.learned[ep] = l
	}
	return l
}

// currentLocked is ep's capacity in usable tokens: what was learned (l.tokens), else the
// capacity applied to it, else the default.
func (c *capacities) currentLocked(ep *router.Endpoint, l *learning) float64 {
	if l.tokens > 0 {
		return l.tokens
	}
	applied := c.live[ep]
	if applied == 0 {
		applied = c.defaultCap
	}
	return float64(applied) * float64(c.blockSize) / c.bytesPerToken
}

// usage calibrates the index's capacity from the server's prompt_tokens for a prompt the picker
// rendered whole, and takes the server's cached_tokens as evidence of what it still holds
// (Plugin.Usage also counts the report for the metrics).
func (pl *Plugin) usage(st *state, served *router.Endpoint, u openai.Usage) {
	if !st.truncated && st.rendered > 0 {
		pl.caps.observe(st.rendered, u.PromptTokens)
	}
	pl.evidence(st, served, u)
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
