package loadgen

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"runtime"

	"github.com/kvpick/kvpick/internal/promtext"
)

// PickerSample is one look at the picker process: its metrics page and, when it is local,
// /proc/<pid>/stat. Fields are NaN when their source is unavailable.
type PickerSample struct {
	CPUSeconds   float64 // user+system, from /proc when local, else process_cpu_seconds_total
	MetricCPU    float64 // process_cpu_seconds_total alone
	RSS          float64 // process_resident_memory_bytes (or /proc)
	HeapInuse    float64 // go_memstats_heap_inuse_bytes
	Goroutines   float64 // go_goroutines
	Inflight     float64 // sum of kvpick_endpoint_inflight_requests
	OpenStreams  float64 // kvpick_open_streams
	IndexEntries float64 // kvpick_prefix_index_entries
	IndexBytes   float64 // kvpick_prefix_index_bytes
	// RequestBlocks is kvpick_prefix_request_blocks_total: the prompt blocks routed so far, each
	// committed to the index when its request succeeds.
	RequestBlocks float64
	Metrics       *promtext.Metrics
}

// Sample scrapes the picker.
func (t *Target) Sample(ctx context.Context, s *promtext.Scraper) (PickerSample, error) {
	nan := math.NaN()
	ps := PickerSample{CPUSeconds: nan, MetricCPU: nan, RSS: nan, HeapInuse: nan, Goroutines: nan, Inflight: nan, OpenStreams: nan,
		IndexEntries: nan, IndexBytes: nan, RequestBlocks: nan}
	m, err := s.Scrape(ctx)
	if err != nil {
		return ps, err
	}
	ps.Metrics = m
	if m != nil {
		ps.CPUSeconds = m.Value("process_cpu_seconds_total")
		ps.MetricCPU = ps.CPUSeconds
		ps.RSS = m.Value("process_resident_memory_bytes")
		ps.HeapInuse = m.Value("go_memstats_heap_inuse_bytes")
		ps.Goroutines = m.Value("go_goroutines")
		ps.Inflight = m.Value("kvpick_endpoint_inflight_requests")
		ps.OpenStreams = m.Value("kvpick_open_streams")
		ps.IndexEntries = m.Value("kvpick_prefix_index_entries")
		ps.IndexBytes = m.Value("kvpick_prefix_index_bytes")
		ps.RequestBlocks = m.Value("kvpick_prefix_request_blocks_total")
	}
	if t.PID > 0 {
		if st, err := ReadProcStat(t.PID); err == nil {
			ps.CPUSeconds = st.CPUSeconds()
			if math.IsNaN(ps.RSS) {
				ps.RSS = float64(st.RSSBytes())
			}
		}
	}
	return ps, nil
}

// CPUBetween returns the picker's CPU seconds between two samples. When both /proc and the
// metric are available and disagree (a --picker-pid that is not the picker's), it trusts the
// metric and says so.
func CPUBetween(before, after PickerSample) (secs float64, warning string) {
	secs = after.CPUSeconds - before.CPUSeconds
	metric := after.MetricCPU - before.MetricCPU
	if !math.IsNaN(metric) && metric > 0.2 && math.Abs(secs-metric) > 0.25*metric {
		return metric, fmt.Sprintf("the picker process's /proc CPU (%.2f s) disagrees with its process_cpu_seconds_total (%.2f s): is the pid the picker's? using the metric", secs, metric)
	}
	return secs, ""
}

// Environment describes the machine a run shares with the picker.
type Environment struct {
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	PickerPID  int    `json:"picker_pid,omitempty"`
	Note       string `json:"note"`
}

// CurrentEnvironment returns the environment of a run against t.
func CurrentEnvironment(t *Target) Environment {
	e := Environment{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), PickerPID: t.PID}
	if t.PID > 0 {
		e.Note = "the load generator and the picker share this machine's CPUs: the picker's throughput is what is left by the client"
	} else {
		e.Note = "the picker runs elsewhere (or its process is unknown): CPU figures come from its process_cpu_seconds_total metric"
	}
	return e
}

func nanToZero(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}

// Latency summarises a latency histogram, in milliseconds.
type Latency struct {
	Count uint64  `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
}

// LatencyOf summarises h (nanoseconds).
func LatencyOf(h *Histogram) Latency {
	ms := func(v int64) float64 { return float64(v) / 1e6 }
	l := Latency{Count: h.Count(), P50: ms(h.Quantile(0.5)), P90: ms(h.Quantile(0.9)), P99: ms(h.Quantile(0.99)),
		P999: ms(h.Quantile(0.999)), Max: ms(h.Max())}
	if h.Count() > 0 {
		l.Mean = h.Mean() / 1e6
	}
	return l
}

// ForceGC makes the picker run a garbage collection, through /debug/pprof/heap?gc=1, so that
// the next scrape's heap figures are live memory rather than live memory plus garbage. It
// reports whether it could.
func (t *Target) ForceGC(ctx context.Context) bool {
	if t.PprofURL == "" {
		return false
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.PprofURL+"/heap?gc=1", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// SampleLive forces two collections (when it can: the second empties the sync.Pool victim
// caches the first one filled) and then scrapes.
func (t *Target) SampleLive(ctx context.Context, s *promtext.Scraper) (PickerSample, error) {
	t.ForceGC(ctx)
	t.ForceGC(ctx)
	return t.Sample(ctx, s)
}
