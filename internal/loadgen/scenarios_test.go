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
	o := DefaultStreamsOptions()
	o.Streams, o.Hold, o.OpenConcurrency = 200, 300*time.Millisecond, 50
	r, err := RunStreams(context.Background(), p.target, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.Opened != 200 {
		t.Fatalf("opened %d, errors %d: %v (%s)", r.Opened, r.Errors, r.ErrorKinds, r.FirstError)
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

func TestChurnShortRun(t *testing.T) {
	const endpoints, capacity = 4, 100
	p := startInProcess(t, endpoints, capacity)
	o := DefaultChurnOptions()
	o.Concurrency, o.Duration, o.Interval = 4, 2*time.Second, 250*time.Millisecond
	o.MinBytes, o.MaxBytes = 2<<10, 4<<10
	o.Bound = endpoints * capacity
	r, err := RunChurn(context.Background(), p.target, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.Exchanges == 0 {
		t.Fatalf("exchanges %d, errors %d: %v (%s)", r.Exchanges, r.Errors, r.ErrorKinds, r.FirstError)
	}
	if len(r.Samples) < 4 {
		t.Fatalf("%d samples", len(r.Samples))
	}
	// Unique prompts fill the small index to its bound and no further.
	if math.IsNaN(float64(r.BoundReachedS)) || r.EntriesAtEnd != promtext.Num(o.Bound) {
		t.Errorf("bound %d: reached at %v, entries at end %v", o.Bound, r.BoundReachedS, r.EntriesAtEnd)
	}
	for _, s := range r.Samples {
		if float64(s.IndexEntries) > float64(o.Bound) {
			t.Errorf("t=%.2f: %v entries over the bound %d", s.T, s.IndexEntries, o.Bound)
		}
	}
	if !(r.IndexBytesPerEntry > 0) || math.IsNaN(float64(r.HeapGrowthPerEntryLive)) || math.IsNaN(float64(r.RSSSlopeBytesPerMin)) {
		t.Errorf("per entry %v, live heap per entry %v, rss slope %v", r.IndexBytesPerEntry, r.HeapGrowthPerEntryLive, r.RSSSlopeBytesPerMin)
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
