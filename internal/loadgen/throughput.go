package loadgen

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/internal/progress"
	"github.com/kvpick/kvpick/internal/promtext"
)

// ThroughputOptions configure the throughput scenario.
type ThroughputOptions struct {
	Concurrency   int           // workers, each running exchanges back to back
	Conns         int           // gRPC connections (workers are spread over them)
	Duration      time.Duration // measured window
	Warmup        time.Duration // before the window: warms the prefix index and the connections
	BodyBytes     int           // request body size
	ChunkBytes    int           // request body chunk size
	Conversations int           // distinct conversations in the body pool
	SystemPrompts int           // system prompts shared by the conversations
	Variants      int           // final questions per conversation
	// RepeatBodies sends the pool's bodies unchanged; by default each request's final question
	// carries a fresh nonce, so its last blocks are new to the index while its history matches.
	RepeatBodies bool
	Seed         uint64
	CPUProfile   string    // when set, a CPU profile of the picker taken during the window is written there
	Progress     io.Writer // progress bar; nil for none
}

// DefaultThroughputOptions are the command's defaults: about 40 s of run on a small machine.
func DefaultThroughputOptions() ThroughputOptions {
	return ThroughputOptions{Concurrency: 64, Conns: 4, Duration: 30 * time.Second, Warmup: 3 * time.Second,
		BodyBytes: 64 << 10, ChunkBytes: 16 << 10, Conversations: 256, SystemPrompts: 8, Variants: 4, Seed: 1}
}

// ThroughputResult is the throughput scenario's report.
type ThroughputResult struct {
	Scenario    string      `json:"scenario"`
	Environment Environment `json:"environment"`
	Options     struct {
		Concurrency   int     `json:"concurrency"`
		Conns         int     `json:"conns"`
		DurationS     float64 `json:"duration_s"`
		WarmupS       float64 `json:"warmup_s"`
		BodyBytes     int     `json:"body_bytes"`
		ChunkBytes    int     `json:"chunk_bytes"`
		Conversations int     `json:"conversations"`
		SystemPrompts int     `json:"system_prompts"`
		Variants      int     `json:"variants"`
		RepeatBodies  bool    `json:"repeat_bodies"`
	} `json:"options"`
	MeanBodyBytes int `json:"mean_body_bytes"`

	WindowS         float64          `json:"window_s"`
	Exchanges       int64            `json:"exchanges"`
	ExchangesPerSec float64          `json:"exchanges_per_s"`
	Errors          int64            `json:"errors"` // whole run, warm-up included
	ErrorKinds      map[string]int64 `json:"error_kinds,omitempty"`
	FirstError      string           `json:"first_error,omitempty"`

	PickerCPUSeconds       promtext.Num `json:"picker_cpu_s"`
	PickerCores            promtext.Num `json:"picker_cores"`               // CPU seconds per second of window
	ExchangesPerCoreSecond promtext.Num `json:"exchanges_per_core_s"`       // exchanges per picker CPU second
	PickerCPUPerExchangeUS promtext.Num `json:"picker_cpu_per_exchange_us"` // picker CPU per exchange
	ClientCPUSeconds       float64      `json:"client_cpu_s"`
	ClientCores            float64      `json:"client_cores"`
	// Machine-wide busy cores over the window (/proc/stat), and what neither the picker nor
	// the load generator used: other load on the machine, which skews every figure.
	MachineBusyCores promtext.Num `json:"machine_busy_cores"`
	OtherCores       promtext.Num `json:"other_cores"`

	AddedLatency       Latency      `json:"added_latency"` // client-measured
	DecisionP50US      promtext.Num `json:"decision_p50_us"`
	DecisionP99US      promtext.Num `json:"decision_p99_us"`
	DecisionCount      promtext.Num `json:"decision_count"`
	PredictedHitRatio  promtext.Num `json:"predicted_hit_ratio"` // prefix blocks predicted cached / prompt blocks, over the window
	Destinations       int          `json:"destinations"`        // distinct endpoints routed to
	MaxDestShare       float64      `json:"max_destination_share"`
	PickerRSSBytes     promtext.Num `json:"picker_rss_bytes"`
	PickerHeapInuse    promtext.Num `json:"picker_heap_inuse_bytes"`
	PickerIndexEntries promtext.Num `json:"picker_index_entries"`
	CPUProfile         string       `json:"cpu_profile,omitempty"`
	Warnings           []string     `json:"warnings,omitempty"`
}

type workerStats struct {
	lat        Histogram
	exchanges  int64
	errors     map[string]int64
	firstError string
	dests      map[string]int64
}

// mergeWorkers adds up the workers' statistics; the first error is the first worker's that has one.
func mergeWorkers(stats []workerStats) workerStats {
	var all workerStats
	for i := range stats {
		ws := &stats[i]
		all.lat.Merge(&ws.lat)
		all.exchanges += ws.exchanges
		for k, v := range ws.errors {
			if all.errors == nil {
				all.errors = map[string]int64{}
			}
			all.errors[k] += v
		}
		if all.firstError == "" {
			all.firstError = ws.firstError
		}
		for k, v := range ws.dests {
			if all.dests == nil {
				all.dests = map[string]int64{}
			}
			all.dests[k] += v
		}
	}
	return all
}

// errorCount is the number of failed exchanges.
func (w *workerStats) errorCount() int64 {
	var n int64
	for _, v := range w.errors {
		n += v
	}
	return n
}

func (w *workerStats) fail(err error) {
	if w.errors == nil {
		w.errors = map[string]int64{}
	}
	w.errors[ErrorKey(err)]++
	if w.firstError == "" {
		w.firstError = err.Error()
	}
}

// RunThroughput runs the throughput scenario against t.
func RunThroughput(ctx context.Context, t *Target, o ThroughputOptions) (*ThroughputResult, error) {
	res := &ThroughputResult{Scenario: "throughput", Environment: CurrentEnvironment(t)}
	res.Options.Concurrency, res.Options.Conns = o.Concurrency, o.Conns
	res.Options.DurationS, res.Options.WarmupS = o.Duration.Seconds(), o.Warmup.Seconds()
	res.Options.BodyBytes, res.Options.ChunkBytes = o.BodyBytes, o.ChunkBytes
	res.Options.Conversations, res.Options.SystemPrompts, res.Options.Variants = o.Conversations, o.SystemPrompts, o.Variants
	res.Options.RepeatBodies = o.RepeatBodies

	pool := NewChatPool(o.Seed, o.Conversations, o.SystemPrompts, o.Variants, o.BodyBytes)
	reqs := make([]*dataplane.Prepared, len(pool.Bodies))
	for i, b := range pool.Bodies {
		reqs[i] = NewRequest(b, o.ChunkBytes, fmt.Sprintf("loadgen-%d", i))
	}
	res.MeanBodyBytes = pool.Bytes / len(pool.Bodies)

	c, err := Dial(t.GRPCAddr, o.Conns, t.Endpoints)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	scr := promtext.NewScraper(t.MetricsURL)

	const (
		phaseWarmup = iota
		phaseMeasure
		phaseStop
	)
	var phase atomic.Int32
	var done, failed atomic.Int64
	stats := make([]workerStats, o.Concurrency)
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for w := range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws := &stats[w]
			ws.dests = map[string]int64{}
			rng := rand.New(rand.NewPCG(o.Seed, uint64(w)+1))
			var stamped dataplane.Prepared
			for phase.Load() != phaseStop && wctx.Err() == nil {
				i := rng.IntN(len(reqs))
				req := reqs[i]
				if !o.RepeatBodies {
					req = StampNonce(req, &stamped, pool.NonceAt[i], rng.Uint64())
				}
				added, dest, err := c.Exchange(wctx, w, req)
				if err != nil {
					if wctx.Err() != nil {
						return
					}
					failed.Add(1)
					ws.fail(err)
					time.Sleep(10 * time.Millisecond) // a dead picker must not spin the workers
					continue
				}
				if phase.Load() != phaseMeasure {
					continue
				}
				done.Add(1)
				ws.exchanges++
				ws.lat.RecordDuration(added)
				ws.dests[dest]++
			}
		}()
	}

	start := time.Now()
	var windowStartNS atomic.Int64 // read by the progress bar
	prog := progress.Start(o.Progress, "throughput", func() (float64, string) {
		el := time.Since(start)
		f := float64(el) / float64(o.Warmup+o.Duration)
		what := "measuring"
		rate := 0.0
		if phase.Load() == phaseWarmup {
			what = "warming up"
		} else if ws := windowStartNS.Load(); ws != 0 {
			rate = float64(done.Load()) / time.Since(time.Unix(0, ws)).Seconds()
		}
		return f, fmt.Sprintf("%s  %d exchanges  %.0f/s  errors %d", what, done.Load(), rate, failed.Load())
	})
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(o.Warmup); err != nil {
		prog.Stop("")
		return nil, err
	}
	before, err := t.Sample(ctx, scr)
	if err != nil {
		prog.Stop("")
		return nil, fmt.Errorf("scrape before the window: %w", err)
	}
	clientBefore := SelfCPU()
	sysBefore := ReadSystemCPU()
	windowStart := time.Now()
	windowStartNS.Store(windowStart.UnixNano())
	phase.Store(phaseMeasure)

	var profErr error
	var profWG sync.WaitGroup
	if o.CPUProfile != "" && t.PprofURL != "" {
		profWG.Add(1)
		go func() {
			defer profWG.Done()
			secs := max(1, int(o.Duration.Seconds())-2)
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return
			}
			profErr = fetchProfile(ctx, fmt.Sprintf("%s/profile?seconds=%d", t.PprofURL, secs), o.CPUProfile)
		}()
		res.CPUProfile = o.CPUProfile
	}

	err = sleep(o.Duration)
	phase.Store(phaseStop)
	window := time.Since(windowStart)
	clientAfter := SelfCPU()
	sysAfter := ReadSystemCPU()
	after, serr := t.Sample(ctx, scr)
	wg.Wait()
	profWG.Wait()
	prog.Stop("")
	if err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, fmt.Errorf("scrape after the window: %w", serr)
	}
	if profErr != nil {
		return nil, fmt.Errorf("cpu profile: %w", profErr)
	}

	all := mergeWorkers(stats)
	res.Exchanges, res.Errors, res.ErrorKinds, res.FirstError = all.exchanges, all.errorCount(), all.errors, all.firstError
	lat, dests := all.lat, all.dests
	res.WindowS = window.Seconds()
	res.ExchangesPerSec = float64(res.Exchanges) / res.WindowS
	res.AddedLatency = LatencyOf(&lat)
	res.Destinations = len(dests)
	for _, v := range dests {
		res.MaxDestShare = max(res.MaxDestShare, float64(v)/float64(max(res.Exchanges, 1)))
	}
	cpu, warn := CPUBetween(before, after)
	if warn != "" {
		res.Warnings = append(res.Warnings, warn)
	}
	res.PickerCPUSeconds = promtext.Num(cpu)
	res.PickerCores = promtext.Num(cpu / res.WindowS)
	res.ExchangesPerCoreSecond = promtext.Num(float64(res.Exchanges) / cpu)
	res.PickerCPUPerExchangeUS = promtext.Num(cpu / float64(res.Exchanges) * 1e6)
	res.ClientCPUSeconds = (clientAfter - clientBefore).Seconds()
	res.ClientCores = res.ClientCPUSeconds / res.WindowS
	res.MachineBusyCores, res.OtherCores = promtext.Num(math.NaN()), promtext.Num(math.NaN())
	if sysAfter.Total > sysBefore.Total {
		busy := (sysAfter.Busy - sysBefore.Busy) / res.WindowS
		res.MachineBusyCores = promtext.Num(busy)
		if t.PID > 0 {
			res.OtherCores = promtext.Num(max(0, busy-float64(res.PickerCores)-res.ClientCores))
		}
	}

	nan := promtext.Num(math.NaN())
	res.DecisionP50US, res.DecisionP99US, res.DecisionCount, res.PredictedHitRatio = nan, nan, nan, nan
	if after.Metrics != nil {
		d := promtext.SubBuckets(after.Metrics.Histogram("kvpick_decision_duration_seconds"), before.Metrics.Histogram("kvpick_decision_duration_seconds"))
		if len(d) > 0 {
			res.DecisionP50US = promtext.Num(promtext.BucketQuantile(0.5, d) * 1e6)
			res.DecisionP99US = promtext.Num(promtext.BucketQuantile(0.99, d) * 1e6)
			res.DecisionCount = promtext.Num(d[len(d)-1].Count)
		}
		hit := after.Metrics.Value("kvpick_prefix_predicted_hit_blocks_total") - before.Metrics.Value("kvpick_prefix_predicted_hit_blocks_total")
		all := after.Metrics.Value("kvpick_prefix_request_blocks_total") - before.Metrics.Value("kvpick_prefix_request_blocks_total")
		if all > 0 {
			res.PredictedHitRatio = promtext.Num(hit / all)
		}
	}
	res.PickerRSSBytes, res.PickerHeapInuse, res.PickerIndexEntries = promtext.Num(after.RSS), promtext.Num(after.HeapInuse), promtext.Num(after.IndexEntries)
	return res, nil
}

func fetchProfile(ctx context.Context, url, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
