package loadgen

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/internal/progress"
	"github.com/kvpick/kvpick/internal/promtext"
)

// StreamsOptions configure the streams scenario.
type StreamsOptions struct {
	Streams         int           // streams held open at once
	Conns           int           // gRPC connections; 0: one per 2,500 streams
	OpenConcurrency int           // streams being opened at the same moment
	Hold            time.Duration // how long all streams stay open and idle together (the model prefilling)
	BodyBytes       int           // request body size
	// Each response is streamed token by token: a number of single-token SSE chunks drawn
	// uniformly from [TokensMin, TokensMax], TokenGap apart, then the final chunk. TokensMax 0
	// plays a one-chunk response instead.
	TokensMin, TokensMax int
	TokenGap             time.Duration
	OpenTimeout          time.Duration // opening all the streams must not take longer
	StreamTimeout        time.Duration // nor streaming all the responses
	SettleTimeout        time.Duration // after the last stream ends, how long the gauges get to return to 0
	Seed                 uint64
	HeapProfile          string // when set, the picker's heap profile with every stream open is written there
	Progress             io.Writer
}

// DefaultStreamsOptions are the command's defaults: 10,000 streams, each answered with 200 to
// 500 tokens 50 ms apart (20 tokens/s, a loaded vLLM server's decode rate), which on a 2-core
// machine shared with the picker the load generator cannot keep up with: the gaps stretch and
// the run is CPU-bound, which is what measures the picker's cost per streamed response.
func DefaultStreamsOptions() StreamsOptions {
	return StreamsOptions{Streams: 10000, OpenConcurrency: 1000, Hold: 10 * time.Second, BodyBytes: 2048,
		TokensMin: 200, TokensMax: 500, TokenGap: 50 * time.Millisecond,
		OpenTimeout: 2 * time.Minute, StreamTimeout: 10 * time.Minute, SettleTimeout: 10 * time.Second, Seed: 1}
}

// StreamsSnapshot is the picker's state at one moment of the run.
type StreamsSnapshot struct {
	RSSBytes       promtext.Num `json:"rss_bytes"`
	HeapInuseBytes promtext.Num `json:"heap_inuse_bytes"`
	Goroutines     promtext.Num `json:"goroutines"`
	Inflight       promtext.Num `json:"inflight"`
	OpenStreams    promtext.Num `json:"open_streams"`
}

func snapshotOf(s PickerSample) StreamsSnapshot {
	return StreamsSnapshot{promtext.Num(s.RSS), promtext.Num(s.HeapInuse), promtext.Num(s.Goroutines), promtext.Num(s.Inflight), promtext.Num(s.OpenStreams)}
}

// maxOf keeps, field by field, the larger of p and s.
func (p *PickerSample) maxOf(s PickerSample) {
	p.RSS = math.Max(p.RSS, s.RSS)
	p.HeapInuse = math.Max(p.HeapInuse, s.HeapInuse)
	p.Goroutines = math.Max(p.Goroutines, s.Goroutines)
	p.Inflight = math.Max(p.Inflight, s.Inflight)
	p.OpenStreams = math.Max(p.OpenStreams, s.OpenStreams)
}

// StreamsResult is the streams scenario's report.
type StreamsResult struct {
	Scenario    string      `json:"scenario"`
	Environment Environment `json:"environment"`
	Options     struct {
		Streams         int     `json:"streams"`
		Conns           int     `json:"conns"`
		OpenConcurrency int     `json:"open_concurrency"`
		HoldS           float64 `json:"hold_s"`
		BodyBytes       int     `json:"body_bytes"`
		TokensMin       int     `json:"tokens_min"`
		TokensMax       int     `json:"tokens_max"`
		TokenGapMS      float64 `json:"token_gap_ms"`
		TokenChunkBytes int     `json:"token_chunk_bytes"`
	} `json:"options"`
	ClientNoFile uint64 `json:"client_rlimit_nofile"`
	HeapProfile  string `json:"heap_profile,omitempty"`

	Opened       int64            `json:"opened"`
	OpenErrors   int64            `json:"open_errors"`
	FinishErrors int64            `json:"finish_errors"`
	Errors       int64            `json:"errors"`
	ErrorKinds   map[string]int64 `json:"error_kinds,omitempty"`
	FirstError   string           `json:"first_error,omitempty"`

	OpenS       float64 `json:"open_all_s"` // from the first stream started to the last routed
	OpenPerSec  float64 `json:"opened_per_s"`
	OpenLatency Latency `json:"open_added_latency"` // per stream: request sent → routing answer and body back

	// The response phase: every stream streams its response at once.
	StreamS       float64 `json:"stream_all_s"` // from the release to the last stream's end
	Responses     int64   `json:"responses"`    // responses streamed whole
	Chunks        int64   `json:"chunks"`       // response chunks sent and re-emitted
	ChunksPerSec  float64 `json:"chunks_per_s"`
	MeanTokenGapS float64 `json:"mean_token_gap_s"` // achieved: a stream's response time ÷ its chunks, mean over the phase

	// The picker's CPU: opening (routing the requests) and streaming the responses, per stream,
	// per response and per chunk, with the cores it and the load generator kept busy.
	PickerCPUOpenS         promtext.Num `json:"picker_cpu_open_s"`
	PickerCPUStreamS       promtext.Num `json:"picker_cpu_stream_s"`
	PickerCPUPerOpenUS     promtext.Num `json:"picker_cpu_per_open_us"`
	PickerCPUPerResponseMS promtext.Num `json:"picker_cpu_per_response_ms"`
	PickerCPUPerChunkUS    promtext.Num `json:"picker_cpu_per_chunk_us"`
	PickerCoresStreaming   promtext.Num `json:"picker_cores_streaming"`
	ClientCoresStreaming   float64      `json:"client_cores_streaming"`
	MachineBusyStreaming   promtext.Num `json:"machine_busy_cores_streaming"`
	Warnings               []string     `json:"warnings,omitempty"`

	Baseline   StreamsSnapshot `json:"baseline"`
	AllOpen    StreamsSnapshot `json:"all_open"`    // once every stream was routed (heap: live, after a forced GC)
	Peak       StreamsSnapshot `json:"peak"`        // maxima over the hold
	StreamPeak StreamsSnapshot `json:"stream_peak"` // maxima while the responses streamed
	After      StreamsSnapshot `json:"after"`       // once the gauges settled (heap: live, after a forced GC)

	InflightMatches     bool         `json:"inflight_matches"` // in-flight sum with all open == streams opened == streams asked
	RSSPerStreamBytes   promtext.Num `json:"rss_per_stream_bytes"`
	HeapPerStreamBytes  promtext.Num `json:"heap_per_stream_bytes"`
	GoroutinesPerStream promtext.Num `json:"goroutines_per_stream"`
	// Live heap (after a forced collection) once everything ended, minus the baseline's.
	HeapRetainedBytes promtext.Num `json:"heap_retained_bytes"`

	ReturnedToZero     bool    `json:"returned_to_zero"` // in-flight and open streams back to 0
	SettleS            float64 `json:"settle_s"`
	GoroutinesReturned bool    `json:"goroutines_returned"` // within 20 of the baseline
}

// RunStreams runs the streams scenario against t.
func RunStreams(ctx context.Context, t *Target, o StreamsOptions) (*StreamsResult, error) {
	if o.Conns <= 0 {
		o.Conns = max(1, (o.Streams+2499)/2500)
	}
	o.OpenConcurrency = max(o.OpenConcurrency, 1)
	o.TokensMin = min(max(o.TokensMin, 0), o.TokensMax)
	res := &StreamsResult{Scenario: "streams", Environment: CurrentEnvironment(t)}
	res.Options.Streams, res.Options.Conns, res.Options.OpenConcurrency = o.Streams, o.Conns, o.OpenConcurrency
	res.Options.HoldS, res.Options.BodyBytes = o.Hold.Seconds(), o.BodyBytes
	res.Options.TokensMin, res.Options.TokensMax, res.Options.TokenGapMS = o.TokensMin, o.TokensMax, float64(o.TokenGap)/1e6
	if o.TokensMax > 0 {
		res.Options.TokenChunkBytes = TokenChunkBytes()
	}
	res.ClientNoFile, _ = RaiseNoFile()

	pool := NewChatPool(o.Seed, 64, 8, 4, o.BodyBytes)
	reqs := make([]*dataplane.Prepared, len(pool.Bodies))
	for i, b := range pool.Bodies {
		reqs[i] = NewRequest(b, 16<<10, fmt.Sprintf("loadgen-stream-%d", i))
	}
	c, err := Dial(t.GRPCAddr, o.Conns, t.Endpoints)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	scr := promtext.NewScraper(t.MetricsURL)
	base, err := t.SampleLive(ctx, scr)
	if err != nil {
		return nil, fmt.Errorf("baseline scrape: %w", err)
	}
	res.Baseline = snapshotOf(base)

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		openWG, allWG sync.WaitGroup
		mu            sync.Mutex
		lat           Histogram
		opened        atomic.Int64
		openFailed    atomic.Int64
		finished      atomic.Int64
		finishFailed  atomic.Int64
		chunks        atomic.Int64
		chunksTotal   atomic.Int64 // chunks the responses will have
		gapSum        atomic.Int64 // Σ over finished streams of response time ÷ chunks, in ns
		phase         atomic.Int32 // 0 opening, 1 holding, 2 streaming
		holdStartNS   atomic.Int64
		streamStartNS atomic.Int64
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if res.ErrorKinds == nil {
			res.ErrorKinds = map[string]int64{}
		}
		res.ErrorKinds[ErrorKey(err)]++
		if res.FirstError == "" {
			res.FirstError = err.Error()
		}
	}
	release := make(chan struct{})
	sem := make(chan struct{}, o.OpenConcurrency)
	prog := progress.Start(o.Progress, "streams", func() (float64, string) {
		switch phase.Load() {
		case 0:
			return float64(opened.Load()+openFailed.Load()) / float64(o.Streams),
				fmt.Sprintf("opening %d/%d  errors %d", opened.Load(), o.Streams, openFailed.Load())
		case 1:
			el := time.Since(time.Unix(0, holdStartNS.Load()))
			return float64(el) / float64(max(o.Hold, 1)), fmt.Sprintf("holding %d streams %s/%s", opened.Load(), el.Truncate(time.Second), o.Hold)
		}
		el := time.Since(time.Unix(0, streamStartNS.Load())).Seconds()
		return float64(chunks.Load()) / float64(max(chunksTotal.Load(), 1)),
			fmt.Sprintf("streaming %d chunks (%.0f/s)  %d/%d responses done  errors %d",
				chunks.Load(), float64(chunks.Load())/max(el, 1e-3), finished.Load(), opened.Load(), finishFailed.Load())
	})

	start := time.Now()
	for i := range o.Streams {
		openWG.Add(1)
		allWG.Add(1)
		go func() {
			defer allWG.Done()
			sem <- struct{}{}
			h, err := c.Open(sctx, i, reqs[i%len(reqs)])
			<-sem
			if err != nil {
				openFailed.Add(1)
				fail(err)
				openWG.Done()
				return
			}
			mu.Lock()
			lat.RecordDuration(h.Added)
			mu.Unlock()
			opened.Add(1)
			tok := Tokens{Gap: o.TokenGap, Stop: sctx.Done(), Sent: &chunks}
			rng := rand.New(rand.NewPCG(o.Seed, uint64(i)))
			if o.TokensMax > 0 {
				tok.N = o.TokensMin + rng.IntN(o.TokensMax-o.TokensMin+1)
				chunksTotal.Add(int64(tok.N) + 1)
			} else {
				chunksTotal.Add(1)
			}
			openWG.Done()
			select {
			case <-release:
			case <-sctx.Done():
				h.Abort()
				return
			}
			if tok.N > 0 && o.TokenGap > 0 {
				// Streams start their responses at random moments within one gap, as
				// generations do, rather than in step.
				select {
				case <-time.After(time.Duration(rng.Int64N(int64(o.TokenGap)))):
				case <-sctx.Done():
				}
			}
			began := time.Now()
			if err := h.Stream(tok); err != nil {
				finishFailed.Add(1)
				fail(err)
				return
			}
			gapSum.Add(int64(time.Since(began)) / int64(tok.N+1))
			finished.Add(1)
		}()
	}
	allOpen := make(chan struct{})
	go func() { openWG.Wait(); close(allOpen) }()
	abort := func(err error) (*StreamsResult, error) {
		cancel()
		allWG.Wait()
		prog.Stop("FAILED")
		return nil, err
	}
	select {
	case <-allOpen:
	case <-time.After(o.OpenTimeout):
		return abort(fmt.Errorf("opening %d streams took over %s (%d opened, %d failed)", o.Streams, o.OpenTimeout, opened.Load(), openFailed.Load()))
	case <-ctx.Done():
		return abort(ctx.Err())
	}
	res.OpenS = time.Since(start).Seconds()
	res.Opened, res.OpenErrors = opened.Load(), openFailed.Load()
	res.OpenPerSec = float64(res.Opened) / res.OpenS
	res.OpenLatency = LatencyOf(&lat)

	holdStart := time.Now()
	holdStartNS.Store(holdStart.UnixNano())
	phase.Store(1)
	// A scrape before the forced collection ends the open phase's CPU; the collection then
	// makes the heap figure the live memory of the open streams.
	opensDone, err := t.Sample(ctx, scr)
	if err != nil {
		return abort(fmt.Errorf("scrape with all streams open: %w", err))
	}
	s, err := t.SampleLive(ctx, scr)
	if err != nil {
		return abort(fmt.Errorf("scrape with all streams open: %w", err))
	}
	res.AllOpen = snapshotOf(s)
	if o.HeapProfile != "" && t.PprofURL != "" {
		if err := fetchProfile(ctx, t.PprofURL+"/heap", o.HeapProfile); err != nil {
			return abort(fmt.Errorf("heap profile: %w", err))
		}
		res.HeapProfile = o.HeapProfile
	}
	peak := s
	for time.Since(holdStart) < o.Hold {
		select {
		case <-ctx.Done():
			return abort(ctx.Err())
		case <-time.After(min(time.Second, o.Hold-time.Since(holdStart))):
		}
		if s, err := t.Sample(ctx, scr); err == nil {
			peak.maxOf(s)
		}
	}
	res.Peak = snapshotOf(peak)

	// Stream every response at once, sampling the picker once a second.
	before, err := t.Sample(ctx, scr)
	if err != nil {
		return abort(fmt.Errorf("scrape before streaming: %w", err))
	}
	clientBefore, sysBefore := SelfCPU(), ReadSystemCPU()
	streamStart := time.Now()
	streamStartNS.Store(streamStart.UnixNano())
	phase.Store(2)
	close(release)
	streamed := make(chan struct{})
	go func() { allWG.Wait(); close(streamed) }()
	streamPeak := before
	deadline := time.After(o.StreamTimeout)
	tick := time.NewTicker(time.Second)
wait:
	for {
		select {
		case <-streamed:
			break wait
		case <-deadline:
			tick.Stop()
			return abort(fmt.Errorf("streaming the responses took over %s (%d of %d done)", o.StreamTimeout, finished.Load(), res.Opened))
		case <-ctx.Done():
			tick.Stop()
			return abort(ctx.Err())
		case <-tick.C:
			if s, err := t.Sample(ctx, scr); err == nil {
				streamPeak.maxOf(s)
			}
		}
	}
	tick.Stop()
	window := time.Since(streamStart)
	clientAfter, sysAfter := SelfCPU(), ReadSystemCPU()
	after, err := t.Sample(ctx, scr)
	if err != nil {
		return abort(fmt.Errorf("scrape after streaming: %w", err))
	}
	res.StreamPeak = snapshotOf(streamPeak)
	res.StreamS = window.Seconds()
	res.Responses, res.Chunks = finished.Load(), chunks.Load()
	res.ChunksPerSec = float64(res.Chunks) / res.StreamS
	if res.Responses > 0 {
		res.MeanTokenGapS = float64(gapSum.Load()) / float64(res.Responses) / 1e9
	}
	res.FinishErrors = finishFailed.Load()
	res.Errors = res.OpenErrors + res.FinishErrors

	nan := promtext.Num(math.NaN())
	res.PickerCPUOpenS, res.PickerCPUStreamS, res.PickerCPUPerOpenUS = nan, nan, nan
	res.PickerCPUPerResponseMS, res.PickerCPUPerChunkUS, res.PickerCoresStreaming, res.MachineBusyStreaming = nan, nan, nan, nan
	openCPU, warn := CPUBetween(base, opensDone)
	if warn != "" {
		res.Warnings = append(res.Warnings, warn)
	}
	streamCPU, warn := CPUBetween(before, after)
	if warn != "" {
		res.Warnings = append(res.Warnings, warn)
	}
	if !math.IsNaN(openCPU) && res.Opened > 0 {
		res.PickerCPUOpenS = promtext.Num(openCPU)
		res.PickerCPUPerOpenUS = promtext.Num(openCPU / float64(res.Opened) * 1e6)
	}
	if !math.IsNaN(streamCPU) && res.Responses > 0 {
		res.PickerCPUStreamS = promtext.Num(streamCPU)
		res.PickerCPUPerResponseMS = promtext.Num(streamCPU / float64(res.Responses) * 1e3)
		res.PickerCPUPerChunkUS = promtext.Num(streamCPU / float64(res.Chunks) * 1e6)
		res.PickerCoresStreaming = promtext.Num(streamCPU / res.StreamS)
	}
	res.ClientCoresStreaming = (clientAfter - clientBefore).Seconds() / res.StreamS
	if sysAfter.Total > sysBefore.Total {
		res.MachineBusyStreaming = promtext.Num((sysAfter.Busy - sysBefore.Busy) / res.StreamS)
	}

	// The gauges drop when the picker's handlers return, just after the client sees the end.
	settleStart := time.Now()
	settleBy := settleStart.Add(o.SettleTimeout)
	for {
		after, err = t.Sample(ctx, scr)
		zero := err == nil && after.Inflight == 0 && after.OpenStreams == 0
		if zero && !res.ReturnedToZero {
			res.ReturnedToZero = true
			res.SettleS = time.Since(settleStart).Seconds()
		}
		res.GoroutinesReturned = err == nil && after.Goroutines <= base.Goroutines+20
		if (res.ReturnedToZero && res.GoroutinesReturned) || time.Now().After(settleBy) || after.Metrics == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	prog.Stop("")
	if after.Metrics != nil {
		if live, err := t.SampleLive(ctx, scr); err == nil {
			after = live
		}
	}
	res.After = snapshotOf(after)
	res.HeapRetainedBytes = promtext.Num(after.HeapInuse - base.HeapInuse)

	n := float64(res.Opened)
	res.InflightMatches = float64(res.AllOpen.Inflight) == n && res.Opened == int64(o.Streams)
	res.RSSPerStreamBytes = promtext.Num((peak.RSS - base.RSS) / n)
	res.HeapPerStreamBytes = promtext.Num((s.HeapInuse - base.HeapInuse) / n)
	res.GoroutinesPerStream = promtext.Num((peak.Goroutines - base.Goroutines) / n)
	return res, nil
}
