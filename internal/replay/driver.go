package replay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/internal/engine"
)

// Clock modes.
const (
	ClockReal    = "real"
	ClockVirtual = "virtual"
)

// RunConfig is one replay of a workload with one policy on fresh engines.
type RunConfig struct {
	Workload *Workload
	Policy   string
	Engines  int
	// Engine is the engines' configuration (zero: EngineConfig()).
	Engine engine.Config
	// Clock is ClockVirtual (lockstep discrete-event simulation) or ClockReal (simulated time
	// = wall time × TimeScale).
	Clock     string
	TimeScale float64
	// Picker routes the kvpick policy.
	Picker *Picker
	// Progress, if set, is told how many requests are finished.
	Progress func(done, total int)
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
}

// SamplePeriod is how often (simulated time) the driver samples the engines' load.
const SamplePeriod = 250 * time.Millisecond

// Sample is the engines' load at one time.
type Sample struct {
	At   time.Time
	Load []engine.Load
}

type driver struct {
	cfg   RunConfig
	ctx   context.Context
	clk   engine.Clock
	engs  []*engine.Engine
	pol   policy
	dests map[string]int
	deps  [][]int

	mu      sync.Mutex
	recs    []Record
	peak    []int
	samples []Sample
	done    int
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
	wl := cfg.Workload
	d := &driver{cfg: cfg, ctx: ctx, dests: map[string]int{}, allDone: make(chan struct{})}
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
	for i := range cfg.Engines {
		e, err := engine.New(cfg.Engine, d.clk)
		if err != nil {
			return nil, err
		}
		d.engs = append(d.engs, e)
		d.dests[EndpointAddr(i)] = i
	}
	if cfg.Policy == KVPick {
		if cfg.Picker == nil {
			return nil, errors.New("the kvpick policy needs a picker")
		}
	} else if d.pol = newPolicy(cfg.Policy, d.engs, cfg.Engine); d.pol == nil {
		return nil, fmt.Errorf("unknown policy %q (have %s)", cfg.Policy, strings.Join(Policies(), ", "))
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
	return res, nil
}

// flight is one request in flight: its ext_proc stream (kvpick) and how far its response got.
type flight struct {
	d    *driver
	r    *Request
	rec  Record
	x    *dataplane.Exchange
	dest string

	mu          sync.Mutex
	headersSent bool // response headers handed to the picker
	ended       bool // the exchange is over (closed or cancelled)
	finished    bool // the engine reported Done
}

var (
	requestHeaders = []dataplane.Header{{Key: "content-type", Value: "application/json"}, {Key: "user-agent", Value: "kvpick-replay"}}
	sseHeaders     = []dataplane.Header{{Key: "content-type", Value: "text/event-stream"}, {Key: "cache-control", Value: "no-cache"}}
	jsonHeaders    = []dataplane.Header{{Key: "content-type", Value: "application/json"}}
)

func (d *driver) arrive(r *Request) {
	f := &flight{d: d, r: r, rec: Record{Engine: -1, Arrival: d.clk.Now()}}
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
		f.dest = EndpointAddr(e)
	}
	f.rec.Engine = e
	if r.Fail {
		d.mu.Unlock()
		f.fail(500, "injected failure")
		return
	}
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
	switch {
	case err == nil:
	case errors.Is(err, engine.ErrOverloaded):
		f.fail(503, err.Error())
	case errors.Is(err, engine.ErrInjected):
		f.fail(500, err.Error())
	default:
		f.fail(400, err.Error())
	}
}

// route asks the picker, as the proxy would, where the request goes. It reports false when the
// request ended there (the picker answered it, or the exchange failed).
func (f *flight) route() (int, bool) {
	d, r := f.d, f.r
	t0 := time.Now()
	x, err := d.cfg.Picker.Client.Open(d.ctx, dataplane.FullDuplex())
	if err != nil {
		f.rec.Err = "open: " + err.Error()
		d.finish(f)
		return 0, false
	}
	hs := append(append([]dataplane.Header(nil), requestHeaders...),
		dataplane.Header{Key: "content-length", Value: strconv.Itoa(len(r.Body))},
		dataplane.Header{Key: "x-request-id", Value: "replay-" + strconv.Itoa(r.ID)})
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
	return e, true
}

// fail answers the request with an error status before any output, as a model server does.
func (f *flight) fail(status int, msg string) {
	f.rec.Status = status
	if f.x != nil {
		f.mu.Lock()
		f.sendHeaders(status, jsonHeaders)
		f.endResponse(fmt.Appendf(nil, `{"error":{"message":%q,"type":"server_error","code":%d}}`, msg, status))
		f.mu.Unlock()
	}
	f.d.finish(f)
}

// sendHeaders hands the response headers to the picker, with the served endpoint.
func (f *flight) sendHeaders(status int, headers []dataplane.Header) {
	if f.headersSent || f.ended {
		return
	}
	f.headersSent = true
	if _, im, err := f.x.ResponseHeaders(status, headers, f.dest, false); err != nil {
		f.abort("response headers: " + err.Error())
	} else if im != nil {
		f.abort(fmt.Sprintf("the picker answered the response headers with %d", im.Status))
	}
}

// sendBody hands a response body chunk to the picker.
func (f *flight) sendBody(chunk []byte) {
	if f.ended {
		return
	}
	if err := f.x.ResponseBody(chunk, false); err != nil {
		f.abort("response body: " + err.Error())
	}
}

// endResponse sends the last chunk, reads what the picker forwards downstream to the end, and
// closes the stream (the picker then counts the request as no longer in flight).
func (f *flight) endResponse(last []byte) {
	if f.ended {
		return
	}
	f.ended = true
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

func sseChunk(id int, content string) []byte {
	return fmt.Appendf(nil, "data: {\"id\":\"chatcmpl-%d\",\"object\":\"chat.completion.chunk\",\"model\":%q,"+
		"\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", id, Model, content)
}

// onFirstToken: the response starts (status 200, the first token's chunk).
func (f *flight) onFirstToken(res engine.Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.finished {
		return // Done overtook it (real clock)
	}
	if f.x != nil {
		f.sendHeaders(200, sseHeaders)
		f.sendBody(sseChunk(f.r.ID, res.Text(0, 1)))
	}
	if f.d.pol != nil {
		f.d.mu.Lock()
		f.d.pol.firstToken(f.rec.Engine, f.r, res)
		f.d.mu.Unlock()
	}
}

// onDone: the rest of the output, the usage chunk, the end of the stream.
func (f *flight) onDone(res engine.Result) {
	f.mu.Lock()
	f.finished = true
	f.rec.Result = res
	f.rec.Status = 200
	if res.Outcome != engine.OutcomeStop && res.Outcome != engine.OutcomeLength {
		f.rec.Status = 500
	}
	if f.x != nil {
		if !f.headersSent {
			f.sendHeaders(200, sseHeaders)
			f.sendBody(sseChunk(f.r.ID, res.Text(0, 1)))
		}
		f.sendBody(sseChunk(f.r.ID, res.Text(1, res.CompletionTokens)))
		f.endResponse(fmt.Appendf(nil, "data: {\"id\":\"chatcmpl-%d\",\"object\":\"chat.completion.chunk\","+
			"\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":%q}],\"usage\":{\"prompt_tokens\":%d,"+
			"\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\ndata: [DONE]\n\n",
			f.r.ID, res.Outcome, res.PromptTokens, res.CompletionTokens, res.CachedTokens))
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
