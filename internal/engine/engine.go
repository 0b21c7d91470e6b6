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
	// MaxNumSeqs is the batch limit: at most this many requests run at once
	// (vLLM's max_num_seqs).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the token budget of one engine step (vLLM's
	// max_num_batched_tokens): running requests' tokens are scheduled
	// first, then waiting requests' prefill chunks fill the rest. It must
	// be at least MaxNumSeqs, as vLLM requires.
	MaxNumBatchedTokens int
	// MaxWaiting bounds the waiting queue: Submit fails with ErrOverloaded
	// when this many requests already wait. 0 means no bound (vLLM has
	// none).
	MaxWaiting int
	// MaxModelLen bounds prompt + output tokens (ErrTooLong beyond).
	// 0 means NumGPUBlocks × BlockSize.
	MaxModelLen int

	// StepOverhead is the fixed cost of every engine step (scheduling,
	// kernel launches): a step lasts
	//
	//	StepOverhead + prefill tokens × PrefillPerToken + decode(d)
	//
	// where decode(d) is the decode term of d decoding requests.
	StepOverhead time.Duration
	// PrefillPerToken is the GPU time to compute one prompt token that was
	// not in the prefix cache.
	PrefillPerToken time.Duration
	// DecodePerToken is the decode term of a step with one decoding
	// request: a request decoding alone gets a token every StepOverhead +
	// DecodePerToken.
	DecodePerToken time.Duration
	// DecodeBatchPenalty grows the decode term with the batch: with
	// MaxNumSeqs decoding requests it is (1 + DecodeBatchPenalty) ×
	// DecodePerToken, linear in between.
	DecodeBatchPenalty float64

	// OutputTokensMin and OutputTokensMax bound the output length chosen
	// from the prompt's hash when a request gives no max_tokens.
	OutputTokensMin, OutputTokensMax int

	// ErrorRate is the fraction of requests that Submit refuses with
	// ErrInjected (the server answers 500 before any output).
	ErrorRate float64
	// LateErrorRate is the fraction of requests that fail after producing
	// half their output (at least one token): Done reports OutcomeError
	// (a streaming server has already sent 200 and some events).
	LateErrorRate float64
	// SlowRate is the fraction of requests that run SlowFactor times
	// slower once admitted: the scheduler gives them tokens in only one
	// step in SlowFactor (their prefill chunks after the first, and their
	// decodes), so they hold their batch slot and blocks that much longer
	// without slowing the steps of others.
	SlowRate, SlowFactor float64
	// HangRate is the fraction of requests that are admitted (they take a
	// batch slot and their prompt's blocks) but never get a token; they end
	// only when cancelled.
	HangRate float64
	// Seed makes failure injection reproducible.
	Seed uint64
}

// DefaultConfig returns a configuration that keeps a laptop demo snappy: a
// token every 3 ms decoding alone, 20 µs per prompt token.
func DefaultConfig() Config {
	return Config{
		Model:               "meta-llama/Llama-3.1-8B-Instruct",
		BlockSize:           16,
		NumGPUBlocks:        8000,
		MaxNumSeqs:          64,
		MaxNumBatchedTokens: 2048,
		MaxWaiting:          1000,
		StepOverhead:        time.Millisecond,
		PrefillPerToken:     20 * time.Microsecond,
		DecodePerToken:      2 * time.Millisecond,
		DecodeBatchPenalty:  0.5,
		OutputTokensMin:     16,
		OutputTokensMax:     64,
		SlowFactor:          4,
		Seed:                1,
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
	case c.MaxNumBatchedTokens < c.MaxNumSeqs:
		return fmt.Errorf("engine: max num batched tokens %d < max num seqs %d", c.MaxNumBatchedTokens, c.MaxNumSeqs)
	case c.MaxWaiting < 0 || c.MaxModelLen < 0:
		return errors.New("engine: negative limit")
	case c.StepOverhead < 0 || c.PrefillPerToken < 0 || c.DecodePerToken < 0 || c.DecodeBatchPenalty < 0:
		return errors.New("engine: negative timing")
	case c.StepOverhead+c.PrefillPerToken <= 0 || c.StepOverhead+c.DecodePerToken <= 0:
		// A step must take time, or a virtual clock would never advance.
		return errors.New("engine: steps must take time (step overhead, prefill or decode per token)")
	case c.OutputTokensMin < 1 || c.OutputTokensMax < c.OutputTokensMin:
		return fmt.Errorf("engine: output range [%d, %d] invalid", c.OutputTokensMin, c.OutputTokensMax)
	}
	for _, r := range []float64{c.ErrorRate, c.LateErrorRate, c.SlowRate, c.HangRate} {
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
	OutcomeError      Outcome = "error"      // failed: refused by injection (ErrInjected) or after some output (LateErrorRate)
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

// Result describes a request. Times are model times on the engine's clock:
// token times are the ends of the engine steps that produced them.
type Result struct {
	ID      string
	Outcome Outcome // empty until Done

	PromptTokens int
	// CachedTokens is the prefix-cache hit when the request was first
	// scheduled: leading cached blocks × block size (the server's
	// usage.prompt_tokens_details.cached_tokens).
	CachedTokens int
	// PlannedTokens is the output length the engine chose.
	PlannedTokens int
	// CompletionTokens is the number of output tokens produced so far
	// (all of them by Done).
	CompletionTokens int
	// Preemptions counts the times the request lost its KV blocks and went
	// back to the waiting queue.
	Preemptions int

	Arrival time.Time // Submit
	// Admitted is when the request was first scheduled (its first prefill
	// chunk, or its admission if it hangs); PrefillStart is the same time,
	// kept under the name that says what starts then.
	Admitted     time.Time
	PrefillStart time.Time
	FirstToken   time.Time // end of the step that produced the first token
	LastToken    time.Time // end of the step that produced the latest token
	End          time.Time // last output token, failure, or cancellation

	// OutputSeed determines the output text: see Text.
	OutputSeed uint64

	Slow, Hung bool
}

// QueueWait is the time from arrival to the first scheduled prefill chunk
// (vLLM's request_queue_time).
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

// Text is the text of output tokens [from, to). It re-tokenizes to the
// same token ids the engine cached.
func (r Result) Text(from, to int) string { return OutputText(r.OutputSeed, from, to) }

// Callbacks receive a request's progress, in order (FirstToken, Token for
// every token, Done), each with a copy of the request's Result at that
// moment. They run without engine locks held, on the goroutine delivering
// the engine's events (the clock's, or the one calling Handle.Cancel); they
// must not block. Any may be nil.
type Callbacks struct {
	// FirstToken fires at the end of the step that completes the prompt's
	// prefill: the first output token is out.
	FirstToken func(Result)
	// Token fires for every output token i (0-based) as the step that
	// produced it ends; res.CompletionTokens is i+1. A streaming server
	// writes its events from it.
	Token func(res Result, i int)
	// Done fires exactly once for every accepted request, when its last
	// token is out, when it fails, or when it is cancelled (Outcome says
	// which).
	Done func(Result)
}

// Engine simulates one vLLM V1 replica: a FIFO waiting queue, a batch of at
// most MaxNumSeqs running requests scheduled step by step under a token
// budget (chunked prefill), a paged KV cache with prefix caching and
// preemption, and the timing model described in the package doc. It is safe
// for concurrent use.
type Engine struct {
	cfg   Config
	clock Clock

	mu      sync.Mutex
	pool    *blockPool
	waiting list.List  // of *request, FIFO; preempted requests go back to the front
	running []*request // in admission order (vLLM's running list)
	rng     *rand.Rand
	nextID  uint64

	// The step loop: busy while a step is planned or in flight (its timer
	// is pending); step holds the requests it scheduled.
	busy     bool
	inFlight bool
	stepEnd  time.Time
	step     []*request
	// pendingPrefill is Σ request.pend: prompt tokens not yet computed of
	// waiting and prefilling requests.
	pendingPrefill int

	// outbox holds callbacks to run once the lock is released; delivering
	// is set while one goroutine runs them, so they run in order.
	outbox, spare []event
	delivering    bool

	keyBuf []byte
	tokBuf []uint32

	queries, hits, promptToks, genToks, preemptions uint64
	outcomes                                        map[Outcome]uint64
	hist                                            histograms
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
		hist:     newHistograms(cfg.MaxModelLen),
		keyBuf:   make([]byte, 0, 8+4*cfg.BlockSize),
		tokBuf:   make([]uint32, 0, cfg.BlockSize),
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
	stRunning
	stDone
)

type request struct {
	state  reqState
	elem   *list.Element // in waiting
	prompt []uint32
	root   uint64
	// keys are the chained keys of the request's full blocks known so far:
	// the prompt's at Submit, extended over the output as it is computed.
	keys   []uint64
	n      int     // planned output tokens
	reason Outcome // stop or length

	produced int // output tokens produced
	computed int // tokens whose KV is computed or scheduled (vLLM's num_computed_tokens)
	sched    int // tokens scheduled in the step in flight
	blocks   []int32
	nreg     int // leading blocks registered in the prefix cache
	pend     int // this request's share of Engine.pendingPrefill
	admitted bool

	hung    bool
	slowInc float64 // credit per step (1/SlowFactor) of a slow request; 0 if not slow
	credit  float64
	failAt  int // fail once this many tokens are out (LateErrorRate); 0: never

	res Result
	cb  Callbacks
}

// numTokens is the request's token count so far: prompt and output.
func (r *request) numTokens() int { return len(r.prompt) + r.produced }

// Handle refers to an accepted request.
type Handle struct {
	e *Engine
	r *request
}

// ID returns the request's id.
func (h *Handle) ID() string { return h.r.res.ID }

// Cancel aborts the request if it has not ended (the client went away), as
// vLLM aborts a request whose client disconnected: it leaves the waiting
// queue or the batch at once, its blocks are freed (the full ones it
// computed stay cached), and Done fires with OutcomeAbort — inside Cancel,
// or soon after on the goroutine delivering the engine's events if one is
// busy. Cancelling an ended request does nothing.
func (h *Handle) Cancel() {
	e, r := h.e, h.r
	e.mu.Lock()
	switch r.state {
	case stDone:
		e.mu.Unlock()
		return
	case stWaiting:
		e.waiting.Remove(r.elem)
		r.elem = nil
	case stRunning:
		for i, x := range e.running {
			if x == r {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
		// A step in flight that scheduled it runs on; its outputs for it
		// are dropped (state is stDone by then).
	}
	e.finishLocked(r, OutcomeAbort, e.clock.Now())
	e.kickLocked()
	e.deliverUnlock()
}

// Submit queues a request. It fails at once, with no callback, with
// ErrEmptyPrompt or ErrTooLong (HTTP 400), ErrInjected (an injected
// failure, HTTP 500) or ErrOverloaded (HTTP 503). Otherwise the request
// waits in FIFO order until a step schedules its first prefill chunk, and
// cb reports its progress. Submit never runs a step itself: the engine
// picks the request up in its next step, or in one that starts as soon as
// the clock runs its events if it was idle.
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
	// Draw the same numbers for every submission, so outcomes depend only
	// on the seed and the order of submissions.
	fail, hang, slow, late := e.rng.Float64(), e.rng.Float64(), e.rng.Float64(), e.rng.Float64()
	var err error
	switch {
	case len(req.Prompt) == 0:
		e.outcomes[OutcomeInvalid]++
		err = ErrEmptyPrompt
	case total > e.cfg.MaxModelLen || (total+bs-1)/bs > e.cfg.NumGPUBlocks:
		e.outcomes[OutcomeInvalid]++
		err = fmt.Errorf("%w: %d prompt + %d output tokens, limit %d", ErrTooLong, len(req.Prompt), r.n,
			min(e.cfg.MaxModelLen, e.cfg.NumGPUBlocks*bs))
	case fail < e.cfg.ErrorRate:
		e.outcomes[OutcomeError]++
		err = ErrInjected
	case e.cfg.MaxWaiting > 0 && e.waiting.Len() >= e.cfg.MaxWaiting:
		e.outcomes[OutcomeOverloaded]++
		err = ErrOverloaded
	}
	if err != nil {
		e.mu.Unlock()
		return nil, err
	}
	if slow < e.cfg.SlowRate && e.cfg.SlowFactor > 1 {
		r.slowInc = 1 / e.cfg.SlowFactor
		r.res.Slow = true
	}
	r.hung = hang < e.cfg.HangRate
	r.res.Hung = r.hung
	if late < e.cfg.LateErrorRate && !r.hung {
		r.failAt = (r.n + 1) / 2
	}
	r.res.ID = req.ID
	if r.res.ID == "" {
		r.res.ID = "req-" + strconv.FormatUint(e.nextID, 10)
	}
	e.nextID++
	r.res.PromptTokens = len(req.Prompt)
	r.res.PlannedTokens = r.n
	r.res.OutputSeed = mix64(ph, 1)
	r.res.Arrival = now
	// Until it is scheduled, its uncached prompt is estimated from the
	// cache as it is now.
	p := len(req.Prompt)
	e.setPend(r, p-e.pool.matchCount(r.keys, (p-1)/bs)*bs)
	r.elem = e.waiting.PushBack(r)
	e.kickLocked()
	e.mu.Unlock()
	return &Handle{e: e, r: r}, nil
}

// CachedPrefixTokens returns how many of req's prompt tokens would hit the
// cache if it were scheduled now, without changing anything: an oracle for
// comparing a router's estimate with the truth.
func (e *Engine) CachedPrefixTokens(req Request) int {
	p := len(req.Prompt)
	if p == 0 {
		return 0
	}
	keys := BlockKeys(RootKey(req.CacheSalt), req.Prompt, e.cfg.BlockSize)
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pool.matchCount(keys, (p-1)/e.cfg.BlockSize) * e.cfg.BlockSize
}

// Load is what a router in process reads of an engine on every decision:
// the scheduler's state as vLLM's /metrics shows it, and what an exact
// oracle needs besides.
type Load struct {
	// Running counts requests in the batch (prefilling or decoding);
	// Waiting those not yet scheduled, or preempted.
	Running, Waiting int
	// KVUsage is the fraction of KV blocks referenced by running requests.
	KVUsage float64
	// FreeBlocks counts blocks a new request can take: free ones and cached
	// ones no running request references.
	FreeBlocks int
	// PendingPrefillTokens is the prompt work queued: tokens of waiting and
	// partially prefilled requests not yet scheduled. A waiting request
	// counts its prompt minus the prefix hit it had at Submit (or, if
	// preempted, at its preemption); once scheduled, minus its real hit.
	PendingPrefillTokens int
	// Decoding counts running requests past their prefill (each takes one
	// token of every step's budget).
	Decoding int
	// StepEnd is when the step in flight ends; zero when the engine is
	// idle.
	StepEnd time.Time
}

// Load returns the engine's current load without allocating.
func (e *Engine) Load() Load {
	e.mu.Lock()
	defer e.mu.Unlock()
	capacity := e.pool.capacity()
	l := Load{Running: len(e.running), Waiting: e.waiting.Len(),
		KVUsage:              float64(capacity-e.pool.free) / float64(capacity),
		FreeBlocks:           e.pool.free,
		PendingPrefillTokens: e.pendingPrefill}
	for _, r := range e.running {
		if r.produced > 0 {
			l.Decoding++
		}
	}
	if e.inFlight {
		l.StepEnd = e.stepEnd
	}
	return l
}

// RunningRemaining appends to dst, for every running request that will
// finish (hung ones never do), the output tokens it has yet to produce: an
// oracle for when batch slots free up.
func (e *Engine) RunningRemaining(dst []int) []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.running {
		if !r.hung {
			dst = append(dst, r.n-r.produced)
		}
	}
	return dst
}

// kickLocked starts the step loop if it is idle. The first step runs from
// a clock event, not here, so that requests submitted at the same instant
// share it and callers may hold their own locks.
func (e *Engine) kickLocked() {
	if e.busy {
		return
	}
	e.busy = true
	e.clock.AfterFunc(0, e.onStep)
}

// setPend sets r's share of the pending prefill.
func (e *Engine) setPend(r *request, v int) {
	e.pendingPrefill += v - r.pend
	r.pend = v
}

type evKind uint8

const (
	evFirst evKind = iota
	evToken
	evDone
)

type event struct {
	kind evKind
	i    int
	cb   *Callbacks
	res  Result
}

// emitLocked queues r's callback of kind with a copy of its result.
func (e *Engine) emitLocked(kind evKind, r *request, i int) {
	switch {
	case kind == evFirst && r.cb.FirstToken == nil,
		kind == evToken && r.cb.Token == nil,
		kind == evDone && r.cb.Done == nil:
		return
	}
	e.outbox = append(e.outbox, event{kind: kind, i: i, cb: &r.cb, res: r.res})
}

// deliverUnlock releases e.mu and runs the queued callbacks, unless another
// goroutine is running them already (it will run these too, in order).
// Callbacks may call back into the engine.
func (e *Engine) deliverUnlock() {
	if e.delivering || len(e.outbox) == 0 {
		e.mu.Unlock()
		return
	}
	e.delivering = true
	for len(e.outbox) > 0 {
		batch := e.outbox
		e.outbox = e.spare[:0]
		e.mu.Unlock()
		for i := range batch {
			ev := &batch[i]
			switch ev.kind {
			case evFirst:
				ev.cb.FirstToken(ev.res)
			case evToken:
				ev.cb.Token(ev.res, ev.i)
			case evDone:
				ev.cb.Done(ev.res)
			}
			*ev = event{}
		}
		e.mu.Lock()
		e.spare = batch[:0]
	}
	e.delivering = false
	e.mu.Unlock()
}
