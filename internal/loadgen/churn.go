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

	"github.com/kvpick/kvpick/internal/progress"
	"github.com/kvpick/kvpick/internal/promtext"
)

// ChurnOptions configure the churn scenario.
type ChurnOptions struct {
	Concurrency int
	Conns       int
	// The run ends after Exchanges exchanges when it is positive, else after Duration.
	Duration  time.Duration
	Exchanges int64
	Interval  time.Duration // sampling period
	MinBytes  int           // prompt size range
	MaxBytes  int
	// ChunkBytes is the request body chunk size.
	ChunkBytes int
	// Bound is the index's capacity in entries (lruCapacityPerEndpoint × endpoints); 0 when
	// unknown (the leak check then starts half way through the run).
	Bound int
	// LeakThreshold: the memory check fails when, from the moment the index reaches its bound
	// to the end, the picker's live heap grows by more than this fraction of what keeping
	// every inserted entry would cost (a leaking index grows by about all of it).
	LeakThreshold float64
	// HeapProfile, when set, receives the picker's heap profile taken at the end (after the
	// forced collection), for attributing the heap per entry.
	HeapProfile string
	Seed        uint64
	Progress    io.Writer
}

// DefaultChurnOptions are the command's defaults.
func DefaultChurnOptions() ChurnOptions {
	return ChurnOptions{Concurrency: 16, Conns: 2, Duration: 60 * time.Second, Interval: time.Second,
		MinBytes: 8 << 10, MaxBytes: 32 << 10, ChunkBytes: 16 << 10, LeakThreshold: 0.25, Seed: 1}
}

// ChurnSample is one sample of the picker's memory.
type ChurnSample struct {
	T              float64      `json:"t_s"`
	Exchanges      int64        `json:"exchanges"`
	RSSBytes       promtext.Num `json:"rss_bytes"`
	HeapInuseBytes promtext.Num `json:"heap_inuse_bytes"`
	IndexEntries   promtext.Num `json:"index_entries"`
	IndexBytes     promtext.Num `json:"index_bytes"`
	RequestBlocks  promtext.Num `json:"request_blocks"`
}

func churnSample(t float64, exchanges int64, s PickerSample) ChurnSample {
	return ChurnSample{T: t, Exchanges: exchanges, RSSBytes: promtext.Num(s.RSS), HeapInuseBytes: promtext.Num(s.HeapInuse),
		IndexEntries: promtext.Num(s.IndexEntries), IndexBytes: promtext.Num(s.IndexBytes), RequestBlocks: promtext.Num(s.RequestBlocks)}
}

// ChurnResult is the churn scenario's report.
type ChurnResult struct {
	Scenario    string      `json:"scenario"`
	Environment Environment `json:"environment"`
	Options     struct {
		Concurrency   int     `json:"concurrency"`
		Conns         int     `json:"conns"`
		DurationS     float64 `json:"duration_s"`
		Exchanges     int64   `json:"exchanges"`
		MinBytes      int     `json:"min_prompt_bytes"`
		MaxBytes      int     `json:"max_prompt_bytes"`
		Bound         int     `json:"bound_entries"`
		LeakThreshold float64 `json:"leak_threshold"`
	} `json:"options"`

	Exchanges       int64            `json:"exchanges"`
	ExchangesPerSec float64          `json:"exchanges_per_s"`
	Errors          int64            `json:"errors"`
	ErrorKinds      map[string]int64 `json:"error_kinds,omitempty"`
	FirstError      string           `json:"first_error,omitempty"`
	AddedLatency    Latency          `json:"added_latency"`

	Baseline ChurnSample   `json:"baseline"` // before the first request (after a forced GC)
	Samples  []ChurnSample `json:"samples"`

	BoundReachedS      promtext.Num `json:"bound_reached_s"` // first sample with entries ≥ 99 % of the bound
	EntriesAtEnd       promtext.Num `json:"entries_at_end"`
	MaxEntries         promtext.Num `json:"max_entries"`           // the most entries any sample saw
	IndexBytesPerEntry promtext.Num `json:"index_bytes_per_entry"` // index bytes / entries, mean over samples at the bound
	// Heap growth per entry over the baseline (taken after a forced collection): Live from a
	// scrape after the load stopped and a collection was forced (the index's true cost plus
	// the picker's steady-state buffers); Mean over the samples at the bound, which also count
	// garbage not yet collected.
	HeapGrowthPerEntryLive promtext.Num `json:"heap_growth_per_entry_live"`
	HeapGrowthPerEntryMean promtext.Num `json:"heap_growth_per_entry_sampled_mean"`
	HeapProfile            string       `json:"heap_profile,omitempty"`
	Warnings               []string     `json:"warnings,omitempty"`

	// The memory check. AtBound is taken (after a forced collection) when the index first
	// reaches its bound, FinalLive at the end: every entry inserted in between evicts one, so
	// the live heap should not grow; had the index kept them, it would have grown by the blocks
	// inserted × the bytes per entry (LeakYardstickBytes). LeakRatio is the growth over that.
	AtBound            ChurnSample  `json:"at_bound_live"`
	FinalLive          ChurnSample  `json:"final_live"`
	HeapGrowthBytes    promtext.Num `json:"heap_growth_after_bound_bytes"`
	BlocksInserted     promtext.Num `json:"blocks_inserted_after_bound"`
	LeakYardstickBytes promtext.Num `json:"leak_yardstick_bytes"`
	LeakRatio          promtext.Num `json:"leak_ratio"`
	Bounded            bool         `json:"memory_bounded"`

	// RSS over the second half of the run, for information: the runtime returns freed memory to
	// the system lazily, so RSS lags the heap.
	RSSSlopeBytesPerMin   promtext.Num `json:"rss_slope_second_half_bytes_per_min"`
	HeapSlopeBytesPerMin  promtext.Num `json:"heap_inuse_slope_second_half_bytes_per_min"`
	IndexBytesSlopePerMin promtext.Num `json:"index_bytes_slope_second_half_per_min"`
	RSSSecondHalfMinBytes promtext.Num `json:"rss_second_half_min_bytes"`
	RSSSecondHalfMaxBytes promtext.Num `json:"rss_second_half_max_bytes"`

	PickerCPUSeconds       promtext.Num `json:"picker_cpu_s"`
	PickerCPUPerExchangeUS promtext.Num `json:"picker_cpu_per_exchange_us"`
	PickerCores            promtext.Num `json:"picker_cores"`
	ClientCores            float64      `json:"client_cores"`
	MachineBusyCores       promtext.Num `json:"machine_busy_cores"`
}

// RunChurn runs the churn scenario against t.
func RunChurn(ctx context.Context, t *Target, o ChurnOptions) (*ChurnResult, error) {
	res := &ChurnResult{Scenario: "churn", Environment: CurrentEnvironment(t)}
	res.Options.Concurrency, res.Options.Conns, res.Options.DurationS, res.Options.Exchanges = o.Concurrency, o.Conns, o.Duration.Seconds(), o.Exchanges
	res.Options.MinBytes, res.Options.MaxBytes, res.Options.Bound, res.Options.LeakThreshold = o.MinBytes, o.MaxBytes, o.Bound, o.LeakThreshold
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Exchanges > 0 {
		res.Options.DurationS = 0
	}
	gen := NewUniquePrompts(o.Seed, o.MinBytes, o.MaxBytes)
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
	res.Baseline = churnSample(0, 0, base)

	var (
		issued, done, failed atomic.Int64
		stop                 atomic.Bool
		wg                   sync.WaitGroup
		// Exchanges hold pause for reading; the live sample at the bound takes it for writing,
		// so that it sees the picker between exchanges, as the final one does.
		pause sync.RWMutex
	)
	stats := make([]workerStats, o.Concurrency)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	clientBefore, sysBefore := SelfCPU(), ReadSystemCPU()
	start := time.Now()
	for w := range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws := &stats[w]
			rng := rand.New(rand.NewPCG(o.Seed, 1000+uint64(w)))
			var buf []byte
			req := NewRequest(nil, o.ChunkBytes, fmt.Sprintf("loadgen-churn-%d", w))
			for !stop.Load() && wctx.Err() == nil && (o.Exchanges <= 0 || issued.Add(1) <= o.Exchanges) {
				// The previous exchange is over, so its messages are no longer read: reuse them.
				buf = gen.Next(rng, buf)
				req.SetBody(buf)
				pause.RLock()
				added, _, err := c.Exchange(wctx, w, req)
				pause.RUnlock()
				if err != nil {
					if wctx.Err() != nil {
						return
					}
					failed.Add(1)
					ws.fail(err)
					time.Sleep(10 * time.Millisecond) // a dead picker must not spin the workers
					continue
				}
				done.Add(1)
				ws.exchanges++
				ws.lat.RecordDuration(added)
			}
		}()
	}
	workersDone := make(chan struct{})
	go func() { wg.Wait(); close(workersDone) }()
	var last atomic.Pointer[ChurnSample]
	prog := progress.Start(o.Progress, "churn", func() (float64, string) {
		st := fmt.Sprintf("%d exchanges  errors %d", done.Load(), failed.Load())
		if s := last.Load(); s != nil {
			st += fmt.Sprintf("  rss %.1f MiB  heap %.1f MiB  entries %.0f", float64(s.RSSBytes)/(1<<20), float64(s.HeapInuseBytes)/(1<<20), float64(s.IndexEntries))
		}
		if o.Exchanges > 0 {
			return float64(done.Load()) / float64(o.Exchanges), st
		}
		return float64(time.Since(start)) / float64(o.Duration), st
	})
	// The leak check starts once the index is full (or half way when its bound is unknown).
	atBound := func(s PickerSample, el time.Duration) bool {
		switch {
		case o.Bound > 0:
			return s.IndexEntries >= 0.99*float64(o.Bound)
		case o.Exchanges > 0:
			return done.Load() >= o.Exchanges/2
		}
		return el >= o.Duration/2
	}
	haveAtBound := false
	tick := time.NewTicker(o.Interval)
	var runErr error
	var lastSample PickerSample
loop:
	for {
		finished := false
		select {
		case <-ctx.Done():
			runErr = ctx.Err()
			break loop
		case <-tick.C:
		case <-workersDone:
			finished = true
		}
		el := time.Since(start)
		s, err := t.Sample(ctx, scr)
		if err != nil {
			runErr = fmt.Errorf("scrape at %s: %w", el.Truncate(time.Second), err)
			break
		}
		lastSample = s
		cs := churnSample(el.Seconds(), done.Load(), s)
		res.Samples = append(res.Samples, cs)
		last.Store(&cs)
		if !haveAtBound && atBound(s, el) {
			haveAtBound = true
			pause.Lock()
			if live, err := t.SampleLive(ctx, scr); err == nil {
				res.AtBound = churnSample(time.Since(start).Seconds(), done.Load(), live)
			}
			pause.Unlock()
		}
		if finished || (o.Exchanges <= 0 && el >= o.Duration) {
			break
		}
	}
	tick.Stop()
	stop.Store(true)
	elapsed := time.Since(start)
	clientAfter, sysAfter := SelfCPU(), ReadSystemCPU()
	wg.Wait()
	prog.Stop("")
	if runErr != nil {
		return nil, runErr
	}
	cpu, warn := CPUBetween(base, lastSample)
	res.PickerCPUSeconds = promtext.Num(cpu)
	if warn != "" {
		res.Warnings = append(res.Warnings, warn)
	}
	// With the load stopped and a collection forced, heap in use is the index plus the
	// picker's fixed costs.
	var final *PickerSample
	if fs, err := t.SampleLive(ctx, scr); err == nil && fs.Metrics != nil {
		final = &fs
		res.FinalLive = churnSample(time.Since(start).Seconds(), done.Load(), fs)
	}
	if o.HeapProfile != "" && t.PprofURL != "" {
		if err := fetchProfile(ctx, t.PprofURL+"/heap", o.HeapProfile); err != nil {
			return nil, fmt.Errorf("heap profile: %w", err)
		}
		res.HeapProfile = o.HeapProfile
	}

	all := mergeWorkers(stats)
	res.Exchanges, res.Errors, res.ErrorKinds, res.FirstError = all.exchanges, all.errorCount(), all.errors, all.firstError
	lat := all.lat
	res.ExchangesPerSec = float64(res.Exchanges) / elapsed.Seconds()
	res.AddedLatency = LatencyOf(&lat)
	res.PickerCPUPerExchangeUS = promtext.Num(cpu / float64(res.Exchanges) * 1e6)
	res.PickerCores = promtext.Num(cpu / elapsed.Seconds())
	res.ClientCores = (clientAfter - clientBefore).Seconds() / elapsed.Seconds()
	res.MachineBusyCores = promtext.Num(math.NaN())
	if sysAfter.Total > sysBefore.Total {
		res.MachineBusyCores = promtext.Num((sysAfter.Busy - sysBefore.Busy) / elapsed.Seconds())
	}
	res.analyze(base, final, haveAtBound)
	return res, nil
}

// analyze derives the per-entry costs and the memory verdict from the samples.
func (res *ChurnResult) analyze(base PickerSample, final *PickerSample, haveAtBound bool) {
	nan := promtext.Num(math.NaN())
	res.BoundReachedS, res.EntriesAtEnd, res.MaxEntries, res.IndexBytesPerEntry = nan, nan, nan, nan
	res.HeapGrowthPerEntryLive, res.HeapGrowthPerEntryMean = nan, nan
	res.HeapGrowthBytes, res.BlocksInserted, res.LeakYardstickBytes, res.LeakRatio = nan, nan, nan, nan
	res.RSSSlopeBytesPerMin, res.HeapSlopeBytesPerMin, res.IndexBytesSlopePerMin = nan, nan, nan
	res.RSSSecondHalfMinBytes, res.RSSSecondHalfMaxBytes = nan, nan
	if final != nil && final.IndexEntries > 0 {
		res.HeapGrowthPerEntryLive = promtext.Num((final.HeapInuse - base.HeapInuse) / final.IndexEntries)
	}
	ss := res.Samples
	if len(ss) == 0 {
		return
	}
	res.EntriesAtEnd = ss[len(ss)-1].IndexEntries
	maxEntries := math.Inf(-1)
	for _, s := range ss {
		maxEntries = math.Max(maxEntries, float64(s.IndexEntries))
	}
	res.MaxEntries = promtext.Num(maxEntries)
	// At the bound: samples from the first at ≥ 99 % of it (or, with no bound given, the
	// second half of the run).
	from := len(ss) / 2
	if res.Options.Bound > 0 {
		from = -1
		for i, s := range ss {
			if float64(s.IndexEntries) >= 0.99*float64(res.Options.Bound) {
				from = i
				res.BoundReachedS = promtext.Num(s.T)
				break
			}
		}
	}
	if from >= 0 {
		var perEntry, heapMean float64
		n := 0
		for _, s := range ss[from:] {
			e := float64(s.IndexEntries)
			if e <= 0 {
				continue
			}
			perEntry += float64(s.IndexBytes) / e
			heapMean += (float64(s.HeapInuseBytes) - base.HeapInuse) / e
			n++
		}
		if n > 0 {
			res.IndexBytesPerEntry = promtext.Num(perEntry / float64(n))
			res.HeapGrowthPerEntryMean = promtext.Num(heapMean / float64(n))
		}
	}
	// The leak check.
	if haveAtBound && final != nil && final.IndexEntries > 0 {
		res.HeapGrowthBytes = promtext.Num(final.HeapInuse - float64(res.AtBound.HeapInuseBytes))
		res.BlocksInserted = promtext.Num(final.RequestBlocks - float64(res.AtBound.RequestBlocks))
		res.LeakYardstickBytes = res.BlocksInserted * promtext.Num(final.IndexBytes/final.IndexEntries)
		if res.LeakYardstickBytes > 0 {
			res.LeakRatio = res.HeapGrowthBytes / res.LeakYardstickBytes
			res.Bounded = float64(res.LeakRatio) <= res.Options.LeakThreshold
		}
	}
	half := ss[len(ss)/2:]
	if len(half) >= 3 {
		slope := func(f func(ChurnSample) promtext.Num) promtext.Num {
			xs, ys := make([]float64, len(half)), make([]float64, len(half))
			for i, s := range half {
				xs[i], ys[i] = s.T, float64(f(s))
			}
			return promtext.Num(Slope(xs, ys) * 60)
		}
		res.RSSSlopeBytesPerMin = slope(func(s ChurnSample) promtext.Num { return s.RSSBytes })
		res.HeapSlopeBytesPerMin = slope(func(s ChurnSample) promtext.Num { return s.HeapInuseBytes })
		res.IndexBytesSlopePerMin = slope(func(s ChurnSample) promtext.Num { return s.IndexBytes })
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, s := range half {
			lo, hi = math.Min(lo, float64(s.RSSBytes)), math.Max(hi, float64(s.RSSBytes))
		}
		res.RSSSecondHalfMinBytes, res.RSSSecondHalfMaxBytes = promtext.Num(lo), promtext.Num(hi)
	}
}

// Slope is the least-squares slope of ys over xs (NaN with fewer than two distinct xs or any
// NaN).
func Slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if len(xs) < 2 || len(xs) != len(ys) {
		return math.NaN()
	}
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx, my = mx/n, my/n
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx == 0 {
		return math.NaN()
	}
	return sxy / sxx
}
