package loadgen

import (
	"github.com/kvpick/kvpick/internal/promtext"

	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestThroughputShortRun(t *testing.T) {
	p := startInProcess(t, 8, 0)
	p.target.PID = os.Getpid() // CPU from /proc: the test process holds the picker
	o := DefaultThroughputOptions()
	o.Concurrency, o.Conns, o.Duration, o.Warmup = 8, 2, 2*time.Second, 300*time.Millisecond
	o.BodyBytes, o.Conversations, o.SystemPrompts = 16<<10, 16, 4
	o.CPUProfile = filepath.Join(t.TempDir(), "cpu.prof")
	var progress bytes.Buffer
	o.Progress = &progress
	r, err := RunThroughput(context.Background(), p.target, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.Exchanges == 0 {
		t.Fatalf("exchanges %d, errors %d: %v (%s)", r.Exchanges, r.Errors, r.ErrorKinds, r.FirstError)
	}
	if r.AddedLatency.Count != uint64(r.Exchanges) || r.AddedLatency.P50 <= 0 || r.AddedLatency.P99 < r.AddedLatency.P50 {
		t.Errorf("added latency %+v", r.AddedLatency)
	}
	if math.IsNaN(float64(r.DecisionP50US)) || r.DecisionP99US < r.DecisionP50US || float64(r.DecisionCount) < float64(r.Exchanges) {
		t.Errorf("decision p50 %v p99 %v over %v decisions", r.DecisionP50US, r.DecisionP99US, r.DecisionCount)
	}
	if !(r.PickerCPUSeconds > 0) || !(r.ExchangesPerCoreSecond > 0) {
		t.Errorf("picker CPU %v s, %v exchanges per core-second", r.PickerCPUSeconds, r.ExchangesPerCoreSecond)
	}
	// Conversations repeat and share system prompts: the index matches.
	if !(r.PredictedHitRatio > 0.5) {
		t.Errorf("predicted hit ratio %v: the body pool should make prefixes match", r.PredictedHitRatio)
	}
	if fi, err := os.Stat(o.CPUProfile); err != nil || fi.Size() == 0 {
		t.Errorf("cpu profile: %v", err)
	}
	if !strings.Contains(progress.String(), "throughput") {
		t.Errorf("no progress written: %q", progress.String())
	}
	p.settled(t)
	checkReport(t, r, r.WriteText)
}

func TestStreamsShortRun(t *testing.T) {
	p := startInProcess(t, 8, 0)
	p.target.PID = os.Getpid() // CPU from /proc: the test process holds the picker
	o := DefaultStreamsOptions()
	o.Streams, o.Hold, o.OpenConcurrency = 200, 300*time.Millisecond, 50
	o.TokensMin, o.TokensMax, o.TokenGap = 20, 40, time.Millisecond
	o.SettleTimeout = time.Minute // how long the gauges may take to return to 0: a bound, not a requirement
	r, err := RunStreams(context.Background(), p.target, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.Opened != 200 || r.Responses != 200 {
		t.Fatalf("opened %d, responses %d, errors %d: %v (%s)", r.Opened, r.Responses, r.Errors, r.ErrorKinds, r.FirstError)
	}
	// Every response was streamed whole: between 20 and 40 tokens and the end, each chunk back.
	if r.Chunks < 200*21 || r.Chunks > 200*41 {
		t.Errorf("%d chunks for 200 responses of 20-40 tokens", r.Chunks)
	}
	if !(r.PickerCPUStreamS > 0) || !(r.PickerCPUPerResponseMS > 0) || !(r.PickerCPUPerChunkUS > 0) ||
		math.Abs(float64(r.PickerCPUPerResponseMS)*1e3/float64(r.PickerCPUPerChunkUS)-float64(r.Chunks)/200) > 1e-6*float64(r.Chunks) {
		t.Errorf("picker CPU %v s: %v ms per response, %v µs per chunk", r.PickerCPUStreamS, r.PickerCPUPerResponseMS, r.PickerCPUPerChunkUS)
	}
	if r.Options.TokenChunkBytes < 100 || r.Options.TokenChunkBytes > 250 {
		t.Errorf("token chunks of %d bytes: want SSE events of one token, 100-250 bytes", r.Options.TokenChunkBytes)
	}
	if !r.InflightMatches || r.AllOpen.Inflight != 200 || r.AllOpen.OpenStreams != 200 {
		t.Errorf("with all open: in flight %v, open streams %v", r.AllOpen.Inflight, r.AllOpen.OpenStreams)
	}
	if !r.ReturnedToZero || r.After.Inflight != 0 || r.After.OpenStreams != 0 {
		t.Errorf("after: in flight %v, open streams %v", r.After.Inflight, r.After.OpenStreams)
	}
	if r.OpenLatency.Count != 200 || r.Options.Conns != 1 {
		t.Errorf("open latency count %d, conns %d", r.OpenLatency.Count, r.Options.Conns)
	}
	p.settled(t)
	checkReport(t, r, r.WriteText)
}

// churn runs the churn scenario for 800 exchanges of 4-8 KB unique prompts (about 70,000
// blocks) against an in-process picker of 4 endpoints whose index holds capacity blocks each,
// and checks what holds either way.
func churn(t *testing.T, capacity, bound int) *ChurnResult {
	t.Helper()
	const endpoints = 4
	p := startInProcess(t, endpoints, capacity)
	o := DefaultChurnOptions()
	o.Concurrency, o.Exchanges, o.Interval = 4, 800, 50*time.Millisecond
	o.MinBytes, o.MaxBytes = 4<<10, 8<<10
	o.Bound = bound
	r, err := RunChurn(context.Background(), p.target, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.Exchanges != o.Exchanges {
		t.Fatalf("exchanges %d, errors %d: %v (%s)", r.Exchanges, r.Errors, r.ErrorKinds, r.FirstError)
	}
	if len(r.Samples) < 2 || math.IsNaN(float64(r.LeakRatio)) || !(r.BlocksInserted > 0) {
		t.Fatalf("%d samples; leak ratio %v over %v blocks inserted after the bound", len(r.Samples), r.LeakRatio, r.BlocksInserted)
	}
	var csv bytes.Buffer
	if err := r.WriteCSV(&csv); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(csv.String(), "\n"); lines != len(r.Samples)+2 {
		t.Errorf("csv has %d lines for %d samples", lines, len(r.Samples))
	}
	p.settled(t)
	checkReport(t, r, r.WriteText)
	return r
}

// TestChurnKeepsMemoryBounded: unique prompts fill a small index to its bound and no further,
// and from then on the live heap does not grow with the entries inserted.
func TestChurnKeepsMemoryBounded(t *testing.T) {
	const bound = 4 * 2000
	r := churn(t, 2000, bound)
	if math.IsNaN(float64(r.BoundReachedS)) || r.EntriesAtEnd != promtext.Num(bound) || r.MaxEntries > promtext.Num(bound) {
		t.Errorf("bound %d: reached at %v, entries at end %v, at most %v", bound, r.BoundReachedS, r.EntriesAtEnd, r.MaxEntries)
	}
	if !r.Bounded {
		t.Errorf("live heap grew %.0f KiB while %v blocks went in: %.0f%% of keeping them", float64(r.HeapGrowthBytes)/1024,
			r.BlocksInserted, 100*float64(r.LeakRatio))
	}
	if !(r.IndexBytesPerEntry > 0) || math.IsNaN(float64(r.HeapGrowthPerEntryLive)) {
		t.Errorf("per entry %v, live heap per entry %v", r.IndexBytesPerEntry, r.HeapGrowthPerEntryLive)
	}
}

// TestChurnCheckFailsWhenTheIndexKeepsEverything is the same run against an index large enough
// never to evict, told the bound of the first: to the check, an index that keeps every entry
// is an index that leaks, and it must say so.
func TestChurnCheckFailsWhenTheIndexKeepsEverything(t *testing.T) {
	const bound = 4 * 2000
	r := churn(t, 100_000, bound)
	if r.MaxEntries <= promtext.Num(bound) {
		t.Fatalf("the index stayed within %d entries (%v): it should have kept every block", bound, r.MaxEntries)
	}
	if r.Bounded || r.LeakRatio < 0.5 {
		t.Errorf("a growing index passed the memory check: heap grew %.0f KiB for %v blocks inserted, %.0f%% of keeping them",
			float64(r.HeapGrowthBytes)/1024, r.BlocksInserted, 100*float64(r.LeakRatio))
	}
}

// checkReport renders the text report and the JSON of r.
func checkReport(t *testing.T, r any, text func(w io.Writer)) {
	t.Helper()
	var b bytes.Buffer
	text(&b)
	if !strings.Contains(b.String(), "errors") {
		t.Errorf("text report lacks the errors line:\n%s", b.String())
	}
	if _, err := json.Marshal(r); err != nil {
		t.Errorf("json: %v", err)
	}
	t.Logf("\n%s", b.String())
}
