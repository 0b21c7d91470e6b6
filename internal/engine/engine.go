package engine

import (
	"container/list"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"
)

// Config describes one simulated vLLM replica.
type Config struct {
	// Model is the served model name.
	Model string
	// BlockSize is the number of tokens per KV block (vLLM: 16).
	BlockSize int
	// NumGPUBlocks is the KV cache capacity in blocks.
	NumGPUBlocks int
	// MaxNumSeqs is the batch limit: at most this many requests run at once.
	MaxNumSeqs int
	// MaxWaiting bounds the waiting queue: Submit fails with ErrOverloaded
	// when this many requests already wait. 0 means no bound.
	MaxWaiting int
	// MaxModelLen bounds prompt + output tokens (ErrTooLong beyond).
	// 0 means NumGPUBlocks × BlockSize.
	MaxModelLen int

	// PrefillPerToken is the GPU time to prefill one uncached prompt token.
	PrefillPerToken time.Duration
	// PrefillOverhead is a fixed cost per prefill (one scheduler step).
	PrefillOverhead time.Duration
	// DecodePerToken is the time between output tokens with a batch of one.
	DecodePerToken time.Duration
	// DecodeBatchPenalty slows decoding as the batch fills: a full batch
	// decodes (1 + DecodeBatchPenalty) times slower than a batch of one.
	DecodeBatchPenalty float64

	// OutputTokensMin and OutputTokensMax bound the output length chosen
	// from the prompt's hash when a request gives no max_tokens.
	OutputTokensMin, OutputTokensMax int

	// ErrorRate is the fraction of requests that fail (ErrInjected) before
	// any output.
	ErrorRate float64
	// SlowRate is the fraction of requests that run SlowFactor times slower
	// (their own prefill wait and decode; they do not hold the GPU longer).
	SlowRate, SlowFactor float64
	// HangRate is the fraction of requests that are admitted but never
	// produce output; they end only when cancelled.
	HangRate float64
	// Seed makes failure injection reproducible.
	Seed uint64
}

// DefaultConfig returns a configuration that keeps a laptop demo snappy.
func DefaultConfig() Config {
	return Config{
		Model:              "meta-llama/Llama-3.1-8B-Instruct",
		BlockSize:          16,
		NumGPUBlocks:       8000,
		MaxNumSeqs:         64,
		MaxWaiting:         1000,
		PrefillPerToken:    20 * time.Microsecond,
		PrefillOverhead:    time.Millisecond,
		DecodePerToken:     2 * time.Millisecond,
		DecodeBatchPenalty: 0.5,
		OutputTokensMin:    16,
		OutputTokensMax:    64,
		SlowFactor:         4,
		Seed:               1,
	}
}

func (c *Config) validate() error {
	switch {
	case c.Model == "":
		return errors.New("engine: empty model name")
	case c.BlockSize < 1:
		return fmt.Errorf("engine: block size %d < 1", c.BlockSize)
	case c.NumGPUBlocks < 1:
		return fmt.Errorf("engine: num GPU blocks %d < 1", c.NumGPUBlocks)
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("engine: max num seqs %d < 1", c.MaxNumSeqs)
	case c.MaxWaiting < 0 || c.MaxModelLen < 0:
		return errors.New("engine: negative limit")
	case c.PrefillPerToken < 0 || c.PrefillOverhead < 0 || c.DecodePerToken < 0 || c.DecodeBatchPenalty < 0:
		return errors.New("engine: negative timing")
	case c.OutputTokensMin < 1 || c.OutputTokensMax < c.OutputTokensMin:
		return fmt.Errorf("engine: output range [%d, %d] invalid", c.OutputTokensMin, c.OutputTokensMax)
	}
	for _, r := range []float64{c.ErrorRate, c.SlowRate, c.HangRate} {
		if r < 0 || r > 1 {
			return fmt.Errorf("engine: rate %v outside [0, 1]", r)
		}
	}
	if c.SlowRate > 0 && c.SlowFactor < 1 {
		return fmt.Errorf("engine: slow factor %v < 1", c.SlowFactor)
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = c.NumGPUBlocks * c.BlockSize
	}
	return nil
}

// Errors returned by Submit; no callback follows them.
var (
	ErrInjected    = errors.New("engine: injected failure")
	ErrOverloaded  = errors.New("engine: waiting queue full")
	ErrTooLong     = errors.New("engine: prompt plus output exceeds the model length or the KV cache")
	ErrEmptyPrompt = errors.New("engine: empty prompt")
)

// Outcome is how a request ended; the first three are vLLM's finish
// reasons.
type Outcome string

// Outcomes counted in Stats.Outcomes.
const (
	OutcomeStop       Outcome = "stop"       // finished at the length the engine chose
	OutcomeLength     Outcome = "length"     // finished at max_tokens
	OutcomeAbort      Outcome = "abort"      // cancelled by the caller
	OutcomeError      Outcome = "error"      // injected failure (ErrInjected)
	OutcomeOverloaded Outcome = "overloaded" // refused: waiting queue full
	OutcomeInvalid    Outcome = "invalid"    // refused: empty or too long
)

// AllOutcomes lists every Outcome, for exporting zero counters.
var AllOutcomes = []Outcome{OutcomeStop, OutcomeLength, OutcomeAbort, OutcomeError, OutcomeOverloaded, OutcomeInvalid}

// Request is one generation request.
type Request struct {
	// ID names the request in results; Submit assigns one when empty.
	ID string
	// Prompt is the prompt's token ids (after any chat template).
	Prompt []uint32
	// MaxTokens, when > 0, is the exact output length (vLLM stops at the
	// limit: finish reason "length"). When 0 the engine picks a length in
	// [OutputTokensMin, OutputTokensMax] from the prompt's hash ("stop").
	MaxTokens int
	// CacheSalt isolates the request's cached blocks (vLLM's cache_salt).
	CacheSalt string
}

// Result describes a request. Times are model times on the engine's clock
// (when a real clock's timers fire late, results still show the model's
// schedule).
type Result struct {
	ID      string
	Outcome Outcome // empty until Done

	PromptTokens int
	// CachedTokens is the prefix-cache hit: leading cached blocks × block
	// size (the server's usage.prompt_tokens_details.cached_tokens).
	CachedTokens int
	// PlannedTokens is the output length the engine chose.
	PlannedTokens int
	// CompletionTokens is the number of output tokens produced (by Done).
	CompletionTokens int

	Arrival      time.Time // Submit
	Admitted     time.Time // got a batch slot and its KV blocks
	PrefillStart time.Time // the GPU began its prefill
	FirstToken   time.Time // first output token
	End          time.Time // last output token, or cancellation

	// InterTokenLatency is the time between output tokens.
	InterTokenLatency time.Duration
	// OutputSeed determines the output text: see Text.
	OutputSeed uint64

	Slow, Hung bool
}

// QueueWait is the time from arrival to the start of prefill (batch slot,
// KV blocks and the GPU's prefill queue).
func (r Result) QueueWait() time.Duration {
	if r.PrefillStart.IsZero() {
		return 0
	}
	return r.PrefillStart.Sub(r.Arrival)
}

// TTFT is the time to first token (0 when no token came).
func (r Result) TTFT() time.Duration {
	if r.FirstToken.IsZero() {
		return 0
	}
	return r.FirstToken.Sub(r.Arrival)
}

// Latency is the time from arrival to end.
func (r Result) Latency() time.Duration {
	if r.End.IsZero() {
		return 0
	}
	return r.End.Sub(r.Arrival)
}

// TokenTime is when output token i (0-based) is produced.
func (r Result) TokenTime(i int) time.Time {
	return r.FirstToken.Add(time.Duration(i) * r.InterTokenLatency)
}

// Text is the text of output tokens [from, to). It re-tokenizes to the
// same token ids the engine cached.
func (r Result) Text(from, to int) string { return OutputText(r.OutputSeed, from, to) }

// Callbacks receive a request's progress. They run without engine locks
// held: on the clock's goroutine (a RealClock timer, or the VirtualClock
// driver), or inside Handle.Cancel. Either may be nil.
type Callbacks struct {
	// FirstToken fires when the prompt is processed and the first token is
	// out; the Result's FirstToken, InterTokenLatency and PlannedTokens
	// give the whole output schedule, which a streaming server paces by.
	FirstToken func(Result)
	// Done fires exactly once for every accepted request, when its last
	// token is out or when it is cancelled (Outcome says which).
	Done func(Result)
}

// Histogram is a snapshot of a histogram: Counts[i] observations fell at or
// below Bounds[i] (and above the previous bound); Counts[len(Bounds)] above
// the last bound.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    float64
}

// TTFTBuckets are vLLM's bucket bounds (seconds) for
// vllm:time_to_first_token_seconds.
var TTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
	2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

func (h *Histogram) observe(v float64) {
	i := 0
	for i < len(h.Bounds) && v > h.Bounds[i] {
		i++
	}
	h.Counts[i]++
	h.Count++
	h.Sum += v
}

// Stats is a snapshot of the counters a vLLM replica exports.
type Stats struct {
	Running, Waiting int
	// KVUsage is the fraction of blocks referenced by running requests
	// (vllm:kv_cache_usage_perc, 0..1); cached but unreferenced blocks
	// count as free, as in vLLM.
	KVUsage      float64
	NumGPUBlocks int
	BlockSize    int
	// CachedBlocks is how many blocks hold a cached key.
	CachedBlocks int
	// PrefixCacheQueries and PrefixCacheHits are in tokens, counted once
	// per admitted request (vllm:prefix_cache_queries/hits).
	PrefixCacheQueries, PrefixCacheHits uint64
	// PromptTokens and GenerationTokens count tokens of admitted requests
	// and produced output.
	PromptTokens, GenerationTokens uint64
	// Outcomes counts requests by how they ended, including refusals.
	Outcomes map[Outcome]uint64
	TTFT     Histogram
}

// Engine simulates one vLLM replica: a FIFO waiting queue, a batch of at
// most MaxNumSeqs running requests, a paged KV cache with prefix caching,
// and the timing model described in the package doc. It is safe for
// concurrent use.
type Engine struct {
	cfg   Config
	clock Clock

	mu       sync.Mutex
	pool     *blockPool
	waiting  list.List // of *request
	running  int
	laneFree time.Time // when the GPU's prefill queue drains
	rng      *rand.Rand
	nextID   uint64

	queries, hits, promptToks, genToks uint64
	outcomes                           map[Outcome]uint64
	ttft                               Histogram
}

// New returns an engine on clock (RealClock{} for real time, a
// *VirtualClock for simulation).
func New(cfg Config, clock Clock) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if clock == nil {
		return nil, errors.New("engine: nil clock")
	}
	e := &Engine{
		cfg:      cfg,
		clock:    clock,
		pool:     newBlockPool(cfg.NumGPUBlocks),
		rng:      rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed5eed5eed5eed)),
		outcomes: make(map[Outcome]uint64, len(AllOutcomes)),
		ttft: Histogram{
			Bounds: TTFTBuckets,
			Counts: make([]uint64, len(TTFTBuckets)+1),
		},
	}
	e.waiting.Init()
	return e, nil
}

// Config returns the engine's configuration (with defaults filled in).
func (e *Engine) Config() Config { return e.cfg }

// Clock returns the engine's clock.
func (e *Engine) Clock() Clock { return e.clock }

type reqState uint8

const (
	stWaiting reqState = iota
	stPrefill
	stDecode
	stHung
	stDone
)

type request struct {
	state   reqState
	elem    *list.Element
	timer   Timer
	prompt  []uint32
	root    uint64
	keys    []uint64 // keys of the prompt's full blocks
	n       int      // planned output tokens
	reason  Outcome  // stop or length
	slow    float64
	blocks  []int32 // physical block of each logical block
	prefill time.Duration
	res     Result
	cb      Callbacks
}

// Handle refers to an accepted request.
type Handle struct {
	e *Engine
	r *request
}

// ID returns the request's id.
func (h *Handle) ID() string { return h.r.res.ID }

// Cancel aborts the request if it has not ended (the client went away):
// it leaves the queue or frees its batch slot and unpins its blocks, and
// Done fires with OutcomeAbort. Cancelling an ended request does nothing.
func (h *Handle) Cancel() {
	e, r := h.e, h.r
	e.mu.Lock()
	var res Result
	switch r.state {
	case stDone:
		e.mu.Unlock()
		return
	case stWaiting:
		e.waiting.Remove(r.elem)
		r.elem = nil
		r.state = stDone
		r.res.Outcome = OutcomeAbort
		r.res.End = e.clock.Now()
		e.outcomes[OutcomeAbort]++
		res = r.res
	default:
		if r.timer != nil {
			r.timer.Stop()
			r.timer = nil
		}
		now := e.clock.Now()
		if r.state == stPrefill && r.res.PrefillStart.Add(r.prefill).Equal(e.laneFree) {
			// Last in the prefill queue: give back the GPU time it had
			// not used.
			e.laneFree = maxTime(r.res.PrefillStart, now)
		}
		produced := 0
		if r.state == stDecode {
			produced = 1
			if r.res.InterTokenLatency > 0 {
				produced += int(now.Sub(r.res.FirstToken) / r.res.InterTokenLatency)
			}
			produced = max(1, min(produced, r.n-1))
		}
		res = e.finishLocked(r, OutcomeAbort, produced, now)
	}
	cb := r.cb.Done
	e.mu.Unlock()
	if cb != nil {
		cb(res)
	}
}

// Submit queues a request. It fails at once, with no callback, with
// ErrEmptyPrompt or ErrTooLong (HTTP 400), ErrInjected (an injected
// failure, HTTP 500) or ErrOverloaded (HTTP 503). Otherwise the request
// waits for a batch slot and KV blocks in FIFO order, and cb reports its
// progress.
func (e *Engine) Submit(req Request, cb Callbacks) (*Handle, error) {
	bs := e.cfg.BlockSize
	now := e.clock.Now()
	r := &request{prompt: req.Prompt, cb: cb}
	var ph uint64
	if len(req.Prompt) > 0 {
		ph = hashTokens(e.cfg.Seed, req.Prompt)
		r.root = RootKey(req.CacheSalt)
		r.keys = BlockKeys(r.root, req.Prompt, bs)
	}
	r.n, r.reason = req.MaxTokens, OutcomeLength
	if r.n <= 0 {
		span := uint64(e.cfg.OutputTokensMax - e.cfg.OutputTokensMin + 1)
		r.n, r.reason = e.cfg.OutputTokensMin+int(ph%span), OutcomeStop
	}
	total := len(req.Prompt) + r.n

	e.mu.Lock()
	defer e.mu.Unlock()
	// Draw the same numbers for every submission, so outcomes depend only
	// on the seed and the order of submissions.
	fail, hang, slow := e.rng.Float64(), e.rng.Float64(), e.rng.Float64()
	switch {
	case len(req.Prompt) == 0:
		e.outcomes[OutcomeInvalid]++
		return nil, ErrEmptyPrompt
	case total > e.cfg.MaxModelLen || (total+bs-1)/bs > e.cfg.NumGPUBlocks:
		e.outcomes[OutcomeInvalid]++
		return nil, fmt.Errorf("%w: %d prompt + %d output tokens, limit %d", ErrTooLong, len(req.Prompt), r.n,
			min(e.cfg.MaxModelLen, e.cfg.NumGPUBlocks*bs))
	case fail < e.cfg.ErrorRate:
		e.outcomes[OutcomeError]++
		return nil, ErrInjected
	case e.cfg.MaxWaiting > 0 && e.waiting.Len() >= e.cfg.MaxWaiting:
		e.outcomes[OutcomeOverloaded]++
		return nil, ErrOverloaded
	}
	r.slow = 1
	if slow < e.cfg.SlowRate {
		r.slow = e.cfg.SlowFactor
		r.res.Slow = true
	}
	r.res.Hung = hang < e.cfg.HangRate
	r.res.ID = req.ID
	if r.res.ID == "" {
		r.res.ID = "req-" + strconv.FormatUint(e.nextID, 10)
	}
	e.nextID++
	r.res.PromptTokens = len(req.Prompt)
	r.res.PlannedTokens = r.n
	r.res.OutputSeed = mix64(ph, 1)
	r.res.Arrival = now
	r.elem = e.waiting.PushBack(r)
	e.scheduleLocked(now)
	return &Handle{e: e, r: r}, nil
}

// scheduleLocked admits waiting requests in FIFO order while the batch has
// room and the head's blocks fit (like vLLM, a head that does not fit
// blocks the queue).
func (e *Engine) scheduleLocked(now time.Time) {
	bs := e.cfg.BlockSize
	for e.waiting.Len() > 0 && e.running < e.cfg.MaxNumSeqs {
		r := e.waiting.Front().Value.(*request)
		p := len(r.prompt)
		// vLLM always recomputes the last prompt token, so at most
		// (p-1)/bs blocks can hit.
		hitIDs := e.pool.match(r.keys, (p-1)/bs)
		need := (p+r.n+bs-1)/bs - len(hitIDs)
		if need > e.pool.free-e.pool.freeAmong(hitIDs) {
			return
		}
		e.waiting.Remove(r.elem)
		r.elem = nil
		e.pool.touch(hitIDs)
		r.blocks = e.pool.allocate(need, append(make([]int32, 0, len(hitIDs)+need), hitIDs...))
		// Register the prompt's full blocks now, as vLLM's scheduler does
		// when it schedules them: a later request can hit them at once.
		for i := len(hitIDs); i < len(r.keys); i++ {
			e.pool.register(r.blocks[i], r.keys[i])
		}
		cached := len(hitIDs) * bs
		e.queries += uint64(p)
		e.hits += uint64(cached)
		e.promptToks += uint64(p)
		e.running++
		r.res.CachedTokens = cached
		r.res.Admitted = now
		if r.res.Hung {
			r.state = stHung
			continue
		}
		r.state = stPrefill
		// The GPU prefills one request after another: a prompt's uncached
		// tokens delay every prefill queued behind it.
		start := maxTime(now, e.laneFree)
		r.prefill = e.cfg.PrefillOverhead + time.Duration(p-cached)*e.cfg.PrefillPerToken
		e.laneFree = start.Add(r.prefill)
		r.res.PrefillStart = start
		first := start.Add(scale(r.prefill, r.slow))
		r.res.FirstToken = first
		r.timer = e.clock.AfterFunc(first.Sub(now), func() { e.onFirstToken(r) })
	}
}

func (e *Engine) onFirstToken(r *request) {
	e.mu.Lock()
	if r.state != stPrefill {
		e.mu.Unlock()
		return
	}
	r.state = stDecode
	// The inter-token latency is fixed at the first token, from the batch
	// size then.
	fill := 0.0
	if e.cfg.MaxNumSeqs > 1 {
		fill = float64(e.running-1) / float64(e.cfg.MaxNumSeqs-1)
	}
	itl := scale(e.cfg.DecodePerToken, r.slow*(1+e.cfg.DecodeBatchPenalty*fill))
	r.res.InterTokenLatency = itl
	e.ttft.observe(r.res.TTFT().Seconds())
	end := r.res.TokenTime(r.n - 1)
	r.timer = e.clock.AfterFunc(end.Sub(e.clock.Now()), func() { e.onDone(r) })
	res := r.res
	cb := r.cb.FirstToken
	e.mu.Unlock()
	if cb != nil {
		cb(res)
	}
}

func (e *Engine) onDone(r *request) {
	e.mu.Lock()
	if r.state != stDecode {
		e.mu.Unlock()
		return
	}
	r.timer = nil
	res := e.finishLocked(r, r.reason, r.n, r.res.TokenTime(r.n-1))
	cb := r.cb.Done
	e.mu.Unlock()
	if cb != nil {
		cb(res)
	}
}

// finishLocked ends a running request that produced `produced` tokens: it
// caches the full blocks whose KV was computed (the prompt and all output
// but the last token, which is sampled but never fed back), releases the
// blocks tail first and lets waiting requests in.
func (e *Engine) finishLocked(r *request, outcome Outcome, produced int, end time.Time) Result {
	bs := e.cfg.BlockSize
	p := len(r.prompt)
	if computed := p + produced - 1; produced > 0 && computed/bs > len(r.keys) {
		first := len(r.keys)
		prev := r.root
		if first > 0 {
			prev = r.keys[first-1]
		}
		toks := make([]uint32, 0, bs)
		buf := make([]byte, 0, 8+4*bs)
		for b := first; b < computed/bs; b++ {
			toks = toks[:0]
			for i := b * bs; i < (b+1)*bs; i++ {
				if i < p {
					toks = append(toks, r.prompt[i])
				} else {
					toks = append(toks, TokenID(OutputPiece(r.res.OutputSeed, i-p)))
				}
			}
			prev = blockKey(buf, prev, toks)
			e.pool.register(r.blocks[b], prev)
		}
	}
	e.pool.release(r.blocks)
	r.blocks = nil
	r.state = stDone
	e.running--
	e.genToks += uint64(produced)
	e.outcomes[outcome]++
	r.res.Outcome = outcome
	r.res.CompletionTokens = produced
	r.res.End = end
	e.scheduleLocked(e.clock.Now())
	return r.res
}

// CachedPrefixTokens returns how many of req's prompt tokens would hit the
// cache if it were admitted now, without changing anything: an oracle for
// comparing a router's estimate with the truth.
func (e *Engine) CachedPrefixTokens(req Request) int {
	p := len(req.Prompt)
	if p == 0 {
		return 0
	}
	keys := BlockKeys(RootKey(req.CacheSalt), req.Prompt, e.cfg.BlockSize)
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.pool.match(keys, (p-1)/e.cfg.BlockSize)) * e.cfg.BlockSize
}

// Load is the part of Stats a router reads on every decision.
type Load struct {
	Running, Waiting int
	KVUsage          float64
}

// Load returns the engine's current load without allocating, for routers
// in a replay that consult every engine on every request.
func (e *Engine) Load() Load {
	e.mu.Lock()
	defer e.mu.Unlock()
	capacity := e.pool.capacity()
	return Load{Running: e.running, Waiting: e.waiting.Len(),
		KVUsage: float64(capacity-e.pool.free) / float64(capacity)}
}

// Stats returns a snapshot of the engine's counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	capacity := e.pool.capacity()
	s := Stats{
		Running:            e.running,
		Waiting:            e.waiting.Len(),
		KVUsage:            float64(capacity-e.pool.free) / float64(capacity),
		NumGPUBlocks:       capacity,
		BlockSize:          e.cfg.BlockSize,
		CachedBlocks:       len(e.pool.cached),
		PrefixCacheQueries: e.queries,
		PrefixCacheHits:    e.hits,
		PromptTokens:       e.promptToks,
		GenerationTokens:   e.genToks,
		Outcomes:           make(map[Outcome]uint64, len(AllOutcomes)),
		TTFT: Histogram{
			Bounds: e.ttft.Bounds,
			Counts: append([]uint64(nil), e.ttft.Counts...),
			Count:  e.ttft.Count,
			Sum:    e.ttft.Sum,
		},
	}
	for _, o := range AllOutcomes {
		s.Outcomes[o] = e.outcomes[o]
	}
	return s
}

func scale(d time.Duration, f float64) time.Duration {
	if f == 1 {
		return d
	}
	return time.Duration(float64(d) * f)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
