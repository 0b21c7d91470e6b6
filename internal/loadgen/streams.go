package loadgen

import (
	"github.com/kvpick/kvpick/internal/promtext"

	"context"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// StreamsOptions configure the streams scenario.
type StreamsOptions struct {
	Streams         int           // streams held open at once
	Conns           int           // gRPC connections; 0: one per 2,500 streams
	OpenConcurrency int           // streams being opened at the same moment
	Hold            time.Duration // how long all streams stay open together
	BodyBytes       int           // request body size
	OpenTimeout     time.Duration // opening all the streams must not take longer
	SettleTimeout   time.Duration // after the last stream ends, how long the gauges get to return to 0
	Seed            uint64
	HeapProfile     string // when set, the picker's heap profile with every stream open is written there
	Progress        io.Writer
}

// DefaultStreamsOptions are the command's defaults.
func DefaultStreamsOptions() StreamsOptions {
	return StreamsOptions{Streams: 10000, OpenConcurrency: 1000, Hold: 10 * time.Second, BodyBytes: 2048,
		OpenTimeout: 2 * time.Minute, SettleTimeout: 10 * time.Second, Seed: 1}
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
	FinishS     float64 `json:"finish_all_s"`

	Baseline StreamsSnapshot `json:"baseline"`
	AllOpen  StreamsSnapshot `json:"all_open"` // once every stream was routed (heap: live, after a forced GC)
	Peak     StreamsSnapshot `json:"peak"`     // maxima over the hold
	After    StreamsSnapshot `json:"after"`    // once the gauges settled (heap: live, after a forced GC)

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
	res := &StreamsResult{Scenario: "streams", Environment: CurrentEnvironment(t)}
	res.Options.Streams, res.Options.Conns, res.Options.OpenConcurrency = o.Streams, o.Conns, o.OpenConcurrency
	res.Options.HoldS, res.Options.BodyBytes = o.Hold.Seconds(), o.BodyBytes
	res.ClientNoFile, _ = RaiseNoFile()

	pool := NewChatPool(o.Seed, 64, 8, 4, o.BodyBytes)
	reqs := make([]*Request, len(pool.Bodies))
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
		phase         atomic.Int32 // 0 opening, 1 holding, 2 finishing
		holdStartNS   atomic.Int64
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
	prog := StartProgress(o.Progress, "streams", func() (float64, string) {
		switch phase.Load() {
		case 0:
			return float64(opened.Load()+openFailed.Load()) / float64(o.Streams),
				fmt.Sprintf("opening %d/%d  errors %d", opened.Load(), o.Streams, openFailed.Load())
		case 1:
			el := time.Since(time.Unix(0, holdStartNS.Load()))
			return float64(el) / float64(max(o.Hold, 1)), fmt.Sprintf("holding %d streams %s/%s", opened.Load(), el.Truncate(time.Second), o.Hold)
		}
		return float64(finished.Load()+finishFailed.Load()) / float64(max(opened.Load(), 1)),
			fmt.Sprintf("finishing %d/%d  errors %d", finished.Load(), opened.Load(), finishFailed.Load())
	})

	start := time.Now()
	for i := range o.Streams {
		openWG.Add(1)
		allWG.Add(1)
		go func() {
			defer allWG.Done()
			sem <- struct{}{}
			h, err := c.Open(sctx, c.Stub(i), reqs[i%len(reqs)])
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
			openWG.Done()
			select {
			case <-release:
			case <-sctx.Done():
				h.Abort()
				return
			}
			if err := h.Finish(); err != nil {
				finishFailed.Add(1)
				fail(err)
				return
			}
			finished.Add(1)
		}()
	}
	allOpen := make(chan struct{})
	go func() { openWG.Wait(); close(allOpen) }()
	abort := func(err error) (*StreamsResult, error) {
		cancel()
		allWG.Wait()
		prog.Stop()
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
	// A forced collection here makes the heap figure the live memory of the open streams.
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
			peak.RSS = math.Max(peak.RSS, s.RSS)
			peak.HeapInuse = math.Max(peak.HeapInuse, s.HeapInuse)
			peak.Goroutines = math.Max(peak.Goroutines, s.Goroutines)
			peak.Inflight = math.Max(peak.Inflight, s.Inflight)
			peak.OpenStreams = math.Max(peak.OpenStreams, s.OpenStreams)
		}
	}
	res.Peak = snapshotOf(peak)

	phase.Store(2)
	finishStart := time.Now()
	close(release)
	allWG.Wait()
	res.FinishS = time.Since(finishStart).Seconds()
	res.FinishErrors = finishFailed.Load()
	res.Errors = res.OpenErrors + res.FinishErrors

	// The gauges drop when the picker's handlers return, just after the client sees the end.
	settleStart := time.Now()
	deadline := settleStart.Add(o.SettleTimeout)
	var after PickerSample
	for {
		after, err = t.Sample(ctx, scr)
		zero := err == nil && after.Inflight == 0 && after.OpenStreams == 0
		if zero && !res.ReturnedToZero {
			res.ReturnedToZero = true
			res.SettleS = time.Since(settleStart).Seconds()
		}
		res.GoroutinesReturned = err == nil && after.Goroutines <= base.Goroutines+20
		if (res.ReturnedToZero && res.GoroutinesReturned) || time.Now().After(deadline) || after.Metrics == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	prog.Stop()
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
