package replay

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/openaiwire"
	"github.com/kvpick/kvpick/internal/engine/servermetrics"
	"github.com/kvpick/kvpick/pkg/gateway"
)

// Clock modes.
const (
	ClockReal    = "real"
	ClockVirtual = "virtual"
)

// DefaultMetricsInterval is how often, in simulated time, the model servers' metrics are
// sampled for the routers that read them: the picker's default refreshInterval and the
// Gateway API Inference Extension's --refresh-metrics-interval.
const DefaultMetricsInterval = 50 * time.Millisecond

// RunConfig is one replay of a workload with one policy on fresh engines.
type RunConfig struct {
	Workload *Workload
	Policy   string
	Engines  int
	// Engine is the engines' configuration (zero: EngineConfig()).
	Engine engine.Config
	// KVBlocks, if set, gives each engine its own num_gpu_blocks (len Engines); MaxModelLen is
	// then the smallest cache's tokens on every engine, as one deployment's replicas share it.
	KVBlocks []int
	// Clock is ClockVirtual (lockstep discrete-event simulation) or ClockReal (simulated time
	// = wall time × TimeScale).
	Clock     string
	TimeScale float64
	// Timing is TimingVLLM (default) or TimingFirstToken.
	Timing string
	// OmitCachedTokens: the engines run without --enable-prompt-tokens-details, so usage
	// reports carry no cached_tokens (prompt_tokens_details is null).
	OmitCachedTokens bool
	// MetricsFlavor is whose metric names the engines' /metrics pages use (empty: vLLM's).
	MetricsFlavor servermetrics.Flavor
	// OmitCacheConfig: the engines' /metrics pages do not report the KV cache's size.
	OmitCacheConfig bool
	// MetricsInterval is the simulated time between two metrics snapshots (0: 50 ms); for
	// kvpick, the picker's refresh interval. ScrapeOff: the picker does not scrape (its
	// refresh interval is 0), so the virtual clock does not wait for it.
	MetricsInterval time.Duration
	ScrapeOff       bool
	// Picker routes the kvpick policy; Endpoints are the engines' addresses it routes to (their
	// /metrics is what it scrapes). PickerReplicas are further active pickers over the same
	// engines: the requests' streams then go to Picker, PickerReplicas[0], ... in turn, as a
	// proxy's round-robin spreads them over the ext_proc cluster's hosts, and each replica
	// sees its share of the requests and every engine's metrics.
	Picker         *Picker
	PickerReplicas []*Picker
	Endpoints      *Endpoints
	// PeerSync, on the virtual clock, paces replicas that share their picks and commits: each
	// exchange with a replica that may have published waits until the others have applied it.
	PeerSync *PeerSync
	// Replicas is how many instances of the gie and sglang baselines run side by side, the
	// requests spread over them in turn (0 or 1: one).
	Replicas int
	// ScrapeFirstWait and ScrapeWait bound, in wall time, how long a virtual-clock metrics tick
	// waits for the picker to apply the new pages: at the first tick (a picker that never
	// fetches does not scrape) and later (0: 3 s and 10 s).
	ScrapeFirstWait, ScrapeWait time.Duration
	// Seed seeds the baselines' random tie-breaks (gie).
	Seed uint64
	// Progress, if set, is told how many requests are finished.
	Progress func(done, total int)
	// Trace, if set, is told about every step of every request's exchange, in order (tests).
	Trace func(Event)
}

// Event is a step of a request's life, for RunConfig.Trace.
type Event struct {
	Request int
	// Kind: "arrive", "submit", "first-token" and "done" (the engine), "response-headers",
	// "response-body" and "response-end" (what the picker was sent).
	Kind string
	// At is the simulated time.
	At time.Time
	// Data is the body chunk of response-body and response-end events.
	Data []byte
	// Status is the status of response-headers.
	Status int
}

// Record is what happened to one request.
type Record struct {
	// Engine is the engine that served it; -1 when it was not routed.
	Engine int
	// Status is the HTTP status the client got: 200; 500 for an injected failure; 503 when the
	// engine's queue was full; 400 when it was too long; the picker's status for an immediate
	// response; 0 when the exchange failed (Err).
	Status int
	// Rejected: the picker answered with an immediate response.
	Rejected bool
	// Err is an ext_proc client error (protocol or transport).
	Err string
	// Stream: the request asked for a streamed answer.
	Stream bool
	// Result is the engine's account (successful requests).
	Result engine.Result
	// Arrival is when the request arrived (simulated time).
	Arrival time.Time
	// Decision is the wall time of the routing decision: for kvpick the client-measured
	// ext_proc round trip (open the stream, send headers and body, get the destination).
	Decision time.Duration
}

// OK reports whether the request completed with output.
func (r *Record) OK() bool { return r.Status == 200 && r.Err == "" }

// RunResult is the raw outcome of a run.
type RunResult struct {
	Config  RunConfig
	Records []Record
	// PeakInFlight is, per engine, the most requests running or waiting at once.
	PeakInFlight []int
	Stats        []engine.Stats
	// Samples are every engine's load, taken every SamplePeriod of simulated time.
	Samples []Sample
	// Start is simulated time zero; Wall the run's wall time.
	Start time.Time
	Wall  time.Duration
	// Scrape is the virtual clock's metrics handshake with the picker (nil otherwise).
	Scrape *ScrapeStats
	// PeerSync is the virtual clock's pacing of replicas that share (nil otherwise).
	PeerSync *PeerSyncStats
}

// ScrapeStats account for the virtual clock's wait for the picker's scrapes.
type ScrapeStats struct {
	Ticks    int     `json:"ticks"`
	Waited   int     `json:"waited"`
	WallSec  float64 `json:"wallSeconds"`
	Timeouts int     `json:"timeouts"`
	Note     string  `json:"note,omitempty"`
}

// SamplePeriod is how often (simulated time) the driver samples the engines' load.
const SamplePeriod = 250 * time.Millisecond

// Sample is the engines' load at one time.
type Sample struct {
	At   time.Time
	Load []engine.Load
}

// metricsBoard is what the baselines that read model-server metrics see: every engine's
// Stats as of the last metrics tick, up to one interval stale.
type metricsBoard struct {
	at    time.Time
	stats []engine.Stats
}

type driver struct {
	cfg   RunConfig
	ctx   context.Context
	clk   engine.Clock
	engs  []*engine.Engine
	pol   policy
	dests map[string]int
	deps  [][]int
	board *metricsBoard
	sync  *scrapeSync
	// routed counts the streams opened, to spread them over the picker replicas.
	routed atomic.Uint64

	mu      sync.Mutex
	recs    []Record
	peak    []int
	samples []Sample
	done    int
	err     error
	allDone chan struct{}
}

// sample records the engines' load and schedules the next sample until every request is done.
func (d *driver) sample() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done == len(d.recs) {
		return
	}
	s := Sample{At: d.clk.Now(), Load: make([]engine.Load, len(d.engs))}
	for i, e := range d.engs {
		s.Load[i] = e.Load()
	}
	d.samples = append(d.samples, s)
	d.clk.AfterFunc(SamplePeriod, d.sample)
}

// metricsTick takes the engines' metrics snapshot: the baselines' board and, on the virtual
// clock, the pages the picker scrapes (waiting until it has applied them).
func (d *driver) metricsTick() {
	d.mu.Lock()
	if d.done == len(d.recs) || d.err != nil {
		d.mu.Unlock()
		return
	}
	now := d.clk.Now()
	d.board.at = now
	var pages [][]byte
	if d.sync != nil {
		pages = make([][]byte, len(d.engs))
	}
	for i, e := range d.engs {
		st := e.Stats()
		// An engine whose state did not change keeps its page (which would differ only in
		// the timestamp vLLM puts in lora_requests_info): no need to wait for the picker.
		if pages != nil && !reflect.DeepEqual(st, d.board.stats[i]) {
			pages[i] = servermetrics.Render(e.Config(), st, now, d.cfg.pageOptions())
		}
		d.board.stats[i] = st
	}
	d.mu.Unlock()
	if d.sync != nil {
		if err := d.sync.tick(d.ctx, pages); err != nil {
			d.mu.Lock()
			d.err = err
			d.mu.Unlock()
			return
		}
	}
	d.clk.AfterFunc(d.cfg.MetricsInterval, d.metricsTick)
}

// Run replays cfg.Workload with cfg.Policy on fresh engines.
func Run(ctx context.Context, cfg RunConfig) (*RunResult, error) {
	if cfg.Engines < 1 {
		return nil, errors.New("at least one engine")
	}
	if cfg.Engine.Model == "" {
		cfg.Engine = EngineConfig()
	}
	if cfg.TimeScale <= 0 {
		cfg.TimeScale = 10
	}
	if cfg.MetricsInterval <= 0 {
		cfg.MetricsInterval = DefaultMetricsInterval
	}
	switch cfg.Timing {
	case "":
		cfg.Timing = TimingVLLM
	case TimingVLLM, TimingFirstToken:
	default:
		return nil, fmt.Errorf("response timing %q: want %s", cfg.Timing, strings.Join(ResponseTimings(), " or "))
	}
	if cfg.KVBlocks != nil && len(cfg.KVBlocks) != cfg.Engines {
		return nil, fmt.Errorf("%d KV cache sizes for %d engines", len(cfg.KVBlocks), cfg.Engines)
	}
	wl := cfg.Workload
	d := &driver{cfg: cfg, ctx: ctx, dests: map[string]int{}, allDone: make(chan struct{}),
		board: &metricsBoard{stats: make([]engine.Stats, cfg.Engines)}}
	var vclk *engine.VirtualClock
	switch cfg.Clock {
	case ClockVirtual:
		vclk = engine.NewVirtualClock(Epoch)
		d.clk = vclk
	case ClockReal, "":
		d.clk = NewScaledClock(Epoch, cfg.TimeScale)
	default:
		return nil, fmt.Errorf("clock %q: want real or virtual", cfg.Clock)
	}
	for _, ecfg := range EngineConfigs(cfg.Engine, cfg.Engines, cfg.KVBlocks) {
		e, err := engine.New(ecfg, d.clk)
		if err != nil {
			return nil, err
		}
		d.engs = append(d.engs, e)
	}
	if cfg.Policy == KVPick {
		if cfg.Picker == nil || cfg.Endpoints == nil {
			return nil, errors.New("the kvpick policy needs a picker and the engines' endpoints")
		}
		if cfg.Endpoints.Len() != cfg.Engines {
			return nil, fmt.Errorf("%d endpoints for %d engines", cfg.Endpoints.Len(), cfg.Engines)
		}
		for i, a := range cfg.Endpoints.Addrs() {
			d.dests[a] = i
		}
		if vclk != nil && !cfg.ScrapeOff {
			cfg.Endpoints.serveSnapshots(1 + len(cfg.PickerReplicas))
			d.sync = &scrapeSync{eps: cfg.Endpoints, first: cfg.ScrapeFirstWait, each: cfg.ScrapeWait}
			if d.sync.first <= 0 {
				d.sync.first = 3 * time.Second
			}
			if d.sync.each <= 0 {
				d.sync.each = 10 * time.Second
			}
		} else {
			cfg.Endpoints.serveLive(d.engs, cfg.pageOptions())
		}
		defer cfg.Endpoints.detach()
	} else if d.pol = newBaseline(cfg.Policy, d.engs, cfg.Engine, d.board, cfg.Seed, cfg.Replicas); d.pol == nil {
		return nil, fmt.Errorf("unknown policy %q (have %s)", cfg.Policy, strings.Join(PolicyNames(), ", "))
	}
	n := len(wl.Requests)
	d.recs = make([]Record, n)
	d.peak = make([]int, cfg.Engines)
	d.deps = make([][]int, n)
	for i := range wl.Requests {
		r := &wl.Requests[i]
		if r.After >= 0 {
			if r.After >= i {
				return nil, fmt.Errorf("request %d follows request %d, which comes after it", i, r.After)
			}
			d.deps[r.After] = append(d.deps[r.After], i)
		}
	}
	if n == 0 {
		return &RunResult{Config: cfg, PeakInFlight: d.peak, Start: Epoch}, nil
	}

	wall := time.Now()
	d.clk.AfterFunc(0, d.metricsTick)
	d.clk.AfterFunc(0, d.sample)
	elapsed := d.clk.Now().Sub(Epoch)
	for i := range wl.Requests {
		r := &wl.Requests[i]
		if r.After < 0 {
			d.clk.AfterFunc(r.At-elapsed, func() { d.arrive(r) })
		}
	}
	if vclk != nil {
		vclk.RunUntilIdle()
		if d.err != nil {
			return nil, d.err
		}
		if d.done < n {
			return nil, fmt.Errorf("the simulation ran dry with %d of %d requests unfinished", n-d.done, n)
		}
	} else {
		select {
		case <-d.allDone:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	d.mu.Lock()
	res := &RunResult{Config: cfg, Records: d.recs, PeakInFlight: d.peak, Samples: d.samples, Start: Epoch, Wall: time.Since(wall)}
	d.mu.Unlock()
	for _, e := range d.engs {
		res.Stats = append(res.Stats, e.Stats())
	}
	if ss := d.sync; ss != nil {
		res.Scrape = &ScrapeStats{Ticks: ss.ticks, Waited: ss.waited, WallSec: ss.wall.Seconds(), Timeouts: ss.timeouts, Note: ss.note}
	}
	if ps := cfg.PeerSync; ps != nil {
		st := ps.Stats()
		res.PeerSync = &st
	}
	return res, nil
}

// EngineConfigs returns the configurations of n engines: base, with its own num_gpu_blocks
// each when kvBlocks is set. The replicas of one deployment share max_model_len, and vLLM
// refuses to start when one sequence of that length does not fit the cache, so it is then the
// smallest cache's tokens (unless base sets a smaller one).
func EngineConfigs(base engine.Config, n int, kvBlocks []int) []engine.Config {
	out := make([]engine.Config, n)
	for i := range out {
		out[i] = base
	}
	if len(kvBlocks) != n {
		return out
	}
	limit := slices.Min(kvBlocks) * base.BlockSize
	for i, b := range kvBlocks {
		out[i].NumGPUBlocks = b
		if out[i].MaxModelLen == 0 || out[i].MaxModelLen > limit {
			out[i].MaxModelLen = limit
		}
	}
	return out
}

// flight is one request in flight: its ext_proc stream (kvpick) and how far its response got.
type flight struct {
	d    *driver
	r    *Request
	rec  Record
	x    *dataplane.Exchange
	dest string
	resp *responder
	// replica is the picker replica routing it (0: Picker, k: PickerReplicas[k-1]).
	replica int

	mu          sync.Mutex
	bodySent    bool // a response body chunk handed to the picker
	headersSent bool // response headers handed to the picker
	firstSent   bool // a stream's first event handed to the picker
	ended       bool // the exchange is over (closed or cancelled)
	finished    bool // the engine reported Done
}

var (
	requestHeaders = []dataplane.Header{{Key: "content-type", Value: "application/json"}, {Key: "user-agent", Value: "kvpick-replay"}}
	sseHeaders     = []dataplane.Header{{Key: "content-type", Value: "text/event-stream; charset=utf-8"}, {Key: "cache-control", Value: "no-cache"}}
	jsonHeaders    = []dataplane.Header{{Key: "content-type", Value: "application/json"}}
)

func (d *driver) trace(r *Request, kind string, data []byte, status int) {
	if d.cfg.Trace != nil {
		d.cfg.Trace(Event{Request: r.ID, Kind: kind, At: d.clk.Now(), Data: data, Status: status})
	}
}

func (d *driver) arrive(r *Request) {
	f := &flight{d: d, r: r, rec: Record{Engine: -1, Arrival: d.clk.Now(), Stream: r.Stream}}
	f.resp = newResponder(r, f.rec.Arrival.Unix(), !d.cfg.OmitCachedTokens)
	d.trace(r, "arrive", nil, 0)
	e := -1
	if d.pol == nil {
		var ok bool
		if e, ok = f.route(); !ok {
			return
		}
	}

	d.mu.Lock()
	now := d.clk.Now()
	if d.pol != nil {
		t0 := time.Now()
		e = d.pol.pick(r, now)
		f.rec.Decision = time.Since(t0)
	}
	f.rec.Engine = e
	if r.Fail {
		d.mu.Unlock()
		f.fail(500, "injected failure")
		return
	}
	// The engine's callbacks for this request wait until its response has started.
	f.mu.Lock()
	_, err := d.engs[e].Submit(engine.Request{ID: strconv.Itoa(r.ID), Prompt: r.Prompt, MaxTokens: r.MaxTokens, CacheSalt: r.CacheSalt},
		engine.Callbacks{FirstToken: f.onFirstToken, Done: f.onDone})
	if err == nil {
		if d.pol != nil {
			d.pol.submitted(e, r, now)
		}
		l := d.engs[e].Load()
		d.peak[e] = max(d.peak[e], l.Running+l.Waiting)
	}
	d.mu.Unlock()
	if err != nil {
		f.mu.Unlock()
		switch {
		case errors.Is(err, engine.ErrOverloaded):
			f.fail(503, err.Error())
		case errors.Is(err, engine.ErrInjected):
			f.fail(500, err.Error())
		default:
			f.fail(400, err.Error())
		}
		return
	}
	d.trace(r, "submit", nil, 0)
	// vLLM's handler returns its StreamingResponse as soon as the request is queued: the
	// status and headers of a stream reach the proxy before any prefill.
	if f.x != nil && r.Stream && d.cfg.Timing == TimingVLLM {
		f.sendHeaders(200, sseHeaders)
	}
	f.mu.Unlock()
}

// route asks the picker, as the proxy would, where the request goes. It reports false when the
// request ended there (the picker answered it, or the exchange failed).
func (f *flight) route() (int, bool) {
	d, r := f.d, f.r
	t0 := time.Now()
	p := d.cfg.Picker
	if n := len(d.cfg.PickerReplicas); n > 0 {
		// In arrival order, as a proxy's round-robin: a conversation's turns land on
		// replicas independently of each other.
		if k := (d.routed.Add(1) - 1) % uint64(n+1); k > 0 {
			p = d.cfg.PickerReplicas[k-1]
			f.replica = int(k)
		}
	}
	x, err := p.Client.Open(d.ctx, dataplane.FullDuplex())
	if err != nil {
		f.rec.Err = "open: " + err.Error()
		d.finish(f)
		return 0, false
	}
	hs := append(append([]dataplane.Header(nil), requestHeaders...),
		dataplane.Header{Key: "content-length", Value: strconv.Itoa(len(r.Body))},
		dataplane.Header{Key: gateway.RequestIDHeader, Value: "replay-" + strconv.Itoa(r.ID)})
	routed, err := x.Request(&dataplane.HTTPRequest{Method: "POST", Path: r.Path, Authority: "kvpick-replay",
		Headers: hs, Body: r.Body})
	f.rec.Decision = time.Since(t0)
	if err != nil {
		x.Cancel()
		f.rec.Err = "request: " + err.Error()
		d.finish(f)
		return 0, false
	}
	if routed.Immediate != nil {
		f.rec.Status, f.rec.Rejected = routed.Immediate.Status, true
		if err := x.Close(); err != nil {
			f.rec.Err = "close: " + err.Error()
		}
		d.finish(f)
		return 0, false
	}
	// With extProc.fallbacks the header is "primary,fallback,...": the proxy tries the first.
	dest, _, _ := strings.Cut(routed.Destination, ",")
	e, ok := d.dests[dest]
	if !ok {
		x.Cancel()
		f.rec.Err = fmt.Sprintf("the picker chose %q, not a simulated engine", routed.Destination)
		d.finish(f)
		return 0, false
	}
	f.x, f.dest = x, dest
	f.settle() // the pick
	return e, true
}

// settle waits until the other picker replicas have applied what this flight's replica
// published (PeerSync); a failure ends the run.
func (f *flight) settle() {
	d := f.d
	if d.cfg.PeerSync == nil {
		return
	}
	if err := d.cfg.PeerSync.Settle(d.ctx, f.replica); err != nil {
		d.mu.Lock()
		if d.err == nil {
			d.err = fmt.Errorf("peer sync: %w", err)
		}
		d.mu.Unlock()
	}
}

// fail answers the request with an error status before any output, as a model server does.
func (f *flight) fail(status int, msg string) {
	f.rec.Status = status
	if f.x != nil {
		f.mu.Lock()
		body := openaiwire.ErrorBody(status, msg)
		f.sendHeaders(status, withLength(jsonHeaders, len(body)))
		f.endResponse(body)
		f.mu.Unlock()
	}
	f.d.finish(f)
}

func withLength(hs []dataplane.Header, n int) []dataplane.Header {
	return append(slices.Clip(hs), dataplane.Header{Key: "content-length", Value: strconv.Itoa(n)})
}

// sendHeaders hands the response headers to the picker, with the served endpoint.
func (f *flight) sendHeaders(status int, headers []dataplane.Header) {
	if f.headersSent || f.ended {
		return
	}
	f.headersSent = true
	f.d.trace(f.r, "response-headers", nil, status)
	if _, im, err := f.x.ResponseHeaders(status, headers, f.dest, false); err != nil {
		f.abort("response headers: " + err.Error())
	} else if im != nil {
		f.abort(fmt.Sprintf("the picker answered the response headers with %d", im.Status))
	}
	f.settle() // a commit (an answer that does not stream) or a drop (a failure)
}

// sendBody hands a response body chunk to the picker and reads what it passes on: the client
// reads as it goes, and on the virtual clock the next event must not overtake the picker's
// handling of this chunk (its first body byte ends the request's prefill in its estimate).
func (f *flight) sendBody(chunk []byte) {
	if f.ended {
		return
	}
	f.d.trace(f.r, "response-body", chunk, 0)
	if err := f.x.ResponseBody(chunk, false); err != nil {
		f.abort("response body: " + err.Error())
		return
	}
	for got := 0; got < len(chunk); {
		b, eos, err := f.x.NextResponseBody(f.d.ctx)
		if err != nil {
			f.abort("response body: " + err.Error())
			return
		}
		got += len(b)
		if eos {
			f.abort("the picker ended the response body early")
			return
		}
	}
	if !f.bodySent {
		f.bodySent = true
		f.settle() // a stream's commit, at its first byte
	}
}

// endResponse sends the last chunk, reads what the picker forwards downstream to the end, and
// closes the stream (the picker then counts the request as no longer in flight).
func (f *flight) endResponse(last []byte) {
	if f.ended {
		return
	}
	f.ended = true
	f.d.trace(f.r, "response-end", last, 0)
	x := f.x
	if err := x.ResponseBody(last, true); err != nil {
		f.abort("response body: " + err.Error())
		return
	}
	for {
		_, eos, err := x.NextResponseBody(f.d.ctx)
		if err != nil {
			f.abort("response body: " + err.Error())
			return
		}
		if eos {
			break
		}
	}
	if err := x.Close(); err != nil && f.rec.Err == "" {
		f.rec.Err = "close: " + err.Error()
	}
}

func (f *flight) abort(msg string) {
	if f.rec.Err == "" {
		f.rec.Err = msg
	}
	f.ended = true
	f.x.Cancel()
}

// onFirstToken: a stream's first events (vLLM's role event and the first token's text).
func (f *flight) onFirstToken(res engine.Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.finished {
		return // Done overtook it (real clock)
	}
	f.d.trace(f.r, "first-token", nil, 0)
	if f.x != nil {
		switch {
		case f.r.Stream:
			f.sendHeaders(200, sseHeaders) // already sent with vLLM's timing
			f.sendBody(f.resp.first(res))
			f.firstSent = true
		case f.d.cfg.Timing == TimingFirstToken:
			f.sendHeaders(200, jsonHeaders)
		}
	}
	if f.d.pol != nil {
		f.d.mu.Lock()
		f.d.pol.firstToken(f.rec.Engine, f.r, res)
		f.d.mu.Unlock()
	}
}

// onDone: the rest of a stream (its usage event if asked for), or a whole non-streamed body.
func (f *flight) onDone(res engine.Result) {
	f.mu.Lock()
	f.finished = true
	f.rec.Result = res
	f.rec.Status = 200
	ok := res.Outcome == engine.OutcomeStop || res.Outcome == engine.OutcomeLength
	if !ok {
		f.rec.Status = 500
	}
	f.d.trace(f.r, "done", nil, 0)
	if f.x != nil {
		switch {
		case f.r.Stream && ok:
			f.sendHeaders(200, sseHeaders)
			from := 0
			if f.firstSent {
				from = 1
			}
			f.endResponse(f.resp.rest(res, from, f.r.IncludeUsage))
		case f.r.Stream:
			f.sendHeaders(200, sseHeaders)
			f.endResponse(openaiwire.StreamError(nil, "generation failed: "+string(res.Outcome)))
		case ok:
			body := f.resp.Whole(res)
			f.sendHeaders(200, withLength(jsonHeaders, len(body)))
			f.endResponse(body)
		default:
			body := openaiwire.ErrorBody(500, "generation failed: "+string(res.Outcome))
			f.sendHeaders(500, withLength(jsonHeaders, len(body)))
			f.endResponse(body)
		}
	}
	if f.d.pol != nil {
		f.d.mu.Lock()
		f.d.pol.done(f.rec.Engine, f.r, res)
		f.d.mu.Unlock()
	}
	f.mu.Unlock()
	f.d.finish(f)
}

// finish records a finished request and lets the requests that follow it arrive.
func (d *driver) finish(f *flight) {
	d.mu.Lock()
	d.recs[f.r.ID] = f.rec
	d.done++
	done, total := d.done, len(d.recs)
	for _, i := range d.deps[f.r.ID] {
		r := &d.cfg.Workload.Requests[i]
		d.clk.AfterFunc(r.Think, func() { d.arrive(r) })
	}
	if done == total {
		close(d.allDone)
	}
	d.mu.Unlock()
	if d.cfg.Progress != nil {
		d.cfg.Progress(done, total)
	}
}

// pageOptions is how the engines render their /metrics pages.
func (c *RunConfig) pageOptions() servermetrics.Options {
	return servermetrics.Options{Flavor: c.MetricsFlavor, Started: Epoch, OmitCacheConfig: c.OmitCacheConfig}
}
