package loadgen

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"text/tabwriter"

	"github.com/kvpick/kvpick/internal/promtext"
)

func fmtNum(v promtext.Num, format string) string {
	if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
		return "n/a"
	}
	return fmt.Sprintf(format, float64(v))
}

func mib(v promtext.Num) string { return fmtNum(v/(1<<20), "%.1f MiB") }

func writeErrors(w io.Writer, total int64, kinds map[string]int64, first string) {
	fmt.Fprintf(w, "errors\t%d\n", total)
	keys := make([]string, 0, len(kinds))
	for k := range kinds {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %s\t%d\n", k, kinds[k])
	}
	if first != "" {
		fmt.Fprintf(w, "  first\t%s\n", first)
	}
}

func writeEnv(w io.Writer, e Environment) {
	fmt.Fprintf(w, "machine\t%d CPUs (GOMAXPROCS %d); %s\n", e.CPUs, e.GOMAXPROCS, e.Note)
}

func writeLatency(w io.Writer, name string, l Latency) {
	fmt.Fprintf(w, "%s\tp50 %.3f ms  p90 %.3f ms  p99 %.3f ms  p99.9 %.3f ms  max %.3f ms  (mean %.3f ms, n=%d)\n",
		name, l.P50, l.P90, l.P99, l.P999, l.Max, l.Mean, l.Count)
}

// WriteText writes a readable summary.
func (r *ThroughputResult) WriteText(out io.Writer) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	o := r.Options
	fresh := "a fresh nonce in each final question"
	if o.RepeatBodies {
		fresh = "bodies repeated unchanged"
	}
	fmt.Fprintf(w, "== throughput: %d workers over %d connections, %.3g s (after %.3g s warm-up), %d-byte chat bodies (mean %d) in %d-byte chunks, %d conversations × %d questions over %d system prompts, %s\n",
		o.Concurrency, o.Conns, o.DurationS, o.WarmupS, o.BodyBytes, r.MeanBodyBytes, o.ChunkBytes, o.Conversations, o.Variants, o.SystemPrompts, fresh)
	writeEnv(w, r.Environment)
	fmt.Fprintf(w, "exchanges\t%d in %.1f s = %.0f/s\n", r.Exchanges, r.WindowS, r.ExchangesPerSec)
	fmt.Fprintf(w, "picker CPU\t%s s = %s cores busy; %s exchanges per core-second; %s µs CPU per exchange\n",
		fmtNum(r.PickerCPUSeconds, "%.1f"), fmtNum(r.PickerCores, "%.2f"), fmtNum(r.ExchangesPerCoreSecond, "%.0f"), fmtNum(r.PickerCPUPerExchangeUS, "%.0f"))
	fmt.Fprintf(w, "client CPU\t%.1f s = %.2f cores (the load generator itself)\n", r.ClientCPUSeconds, r.ClientCores)
	fmt.Fprintf(w, "machine CPU\t%s cores busy, of which %s by other processes\n", fmtNum(r.MachineBusyCores, "%.2f"), fmtNum(r.OtherCores, "%.2f"))
	writeLatency(w, "added latency", r.AddedLatency)
	fmt.Fprintf(w, "  (client-measured: first request message sent → routing answer and the whole body back)\n")
	fmt.Fprintf(w, "decision\tp50 %s µs  p99 %s µs  (kvpick_decision_duration_seconds over the window, %s decisions; bucket-interpolated)\n",
		fmtNum(r.DecisionP50US, "%.1f"), fmtNum(r.DecisionP99US, "%.1f"), fmtNum(r.DecisionCount, "%.0f"))
	fmt.Fprintf(w, "prefix\tpredicted hit ratio %s; %d endpoints used, busiest took %.1f%%\n",
		fmtNum(r.PredictedHitRatio, "%.3f"), r.Destinations, 100*r.MaxDestShare)
	fmt.Fprintf(w, "picker memory\tRSS %s, heap in use %s, index entries %s\n", mib(r.PickerRSSBytes), mib(r.PickerHeapInuse), fmtNum(r.PickerIndexEntries, "%.0f"))
	writeErrors(w, r.Errors, r.ErrorKinds, r.FirstError)
	for _, x := range r.Warnings {
		fmt.Fprintf(w, "WARNING\t%s\n", x)
	}
	if r.CPUProfile != "" {
		fmt.Fprintf(w, "cpu profile\t%s (go tool pprof -top <picker binary> %s)\n", r.CPUProfile, r.CPUProfile)
	}
	w.Flush()
}

// WriteText writes a readable summary.
func (r *StreamsResult) WriteText(out io.Writer) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	o := r.Options
	resp := "one-chunk responses"
	if o.TokensMax > 0 {
		resp = fmt.Sprintf("responses of %d–%d tokens, one ~%d-byte SSE chunk each, %.0f ms apart", o.TokensMin, o.TokensMax, o.TokenChunkBytes, o.TokenGapMS)
	}
	fmt.Fprintf(w, "== streams: %d concurrent streams over %d connections (opened %d at a time), %d-byte bodies, held %.0f s, then %s\n",
		o.Streams, o.Conns, o.OpenConcurrency, o.BodyBytes, o.HoldS, resp)
	writeEnv(w, r.Environment)
	fmt.Fprintf(w, "opened\t%d of %d in %.2f s (%.0f/s); picker CPU %s µs per routed request\n", r.Opened, o.Streams, r.OpenS, r.OpenPerSec, fmtNum(r.PickerCPUPerOpenUS, "%.0f"))
	writeLatency(w, "open latency", r.OpenLatency)
	fmt.Fprintf(w, "streamed\t%d responses, %d chunks in %.1f s (%.0f chunks/s; a stream's chunks came %.0f ms apart on average)\n",
		r.Responses, r.Chunks, r.StreamS, r.ChunksPerSec, 1000*r.MeanTokenGapS)
	fmt.Fprintf(w, "picker CPU\t%s s streaming = %s ms per streamed response, %s µs per chunk; picker %s cores, load generator %.2f, whole machine %s busy\n",
		fmtNum(r.PickerCPUStreamS, "%.1f"), fmtNum(r.PickerCPUPerResponseMS, "%.2f"), fmtNum(r.PickerCPUPerChunkUS, "%.1f"),
		fmtNum(r.PickerCoresStreaming, "%.2f"), r.ClientCoresStreaming, fmtNum(r.MachineBusyStreaming, "%.2f"))
	snap := func(name string, s StreamsSnapshot) {
		fmt.Fprintf(w, "%s\tRSS %s  heap in use %s  goroutines %s  in flight %s  open streams %s\n", name,
			mib(s.RSSBytes), mib(s.HeapInuseBytes), fmtNum(s.Goroutines, "%.0f"), fmtNum(s.Inflight, "%.0f"), fmtNum(s.OpenStreams, "%.0f"))
	}
	snap("picker before", r.Baseline)
	snap("all open", r.AllOpen)
	snap("peak (hold)", r.Peak)
	snap("peak (streaming)", r.StreamPeak)
	snap("after", r.After)
	fmt.Fprintf(w, "per open stream\t%s RSS (peak), %s live heap, %s goroutines; live heap retained after the run %s\n",
		fmtNum(r.RSSPerStreamBytes, "%.0f B"), fmtNum(r.HeapPerStreamBytes, "%.0f B"), fmtNum(r.GoroutinesPerStream, "%.2f"), mib(r.HeapRetainedBytes))
	fmt.Fprintf(w, "checks\tin-flight sum = streams: %v; back to 0 after: %v (%.2f s); goroutines back to baseline: %v; client RLIMIT_NOFILE %d\n",
		r.InflightMatches, r.ReturnedToZero, r.SettleS, r.GoroutinesReturned, r.ClientNoFile)
	writeErrors(w, r.Errors, r.ErrorKinds, r.FirstError)
	for _, x := range r.Warnings {
		fmt.Fprintf(w, "WARNING\t%s\n", x)
	}
	if r.HeapProfile != "" {
		fmt.Fprintf(w, "heap profile\t%s, with every stream open (go tool pprof -sample_index=inuse_space -top %s)\n", r.HeapProfile, r.HeapProfile)
	}
	w.Flush()
}

// WriteText writes a readable summary, with at most about 15 rows of the sample table.
func (r *ChurnResult) WriteText(out io.Writer) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	o := r.Options
	bound := "unknown"
	if o.Bound > 0 {
		bound = strconv.Itoa(o.Bound) + " entries"
	}
	length := fmt.Sprintf("%.0f s", o.DurationS)
	if o.Exchanges > 0 {
		length = fmt.Sprintf("%d exchanges", o.Exchanges)
	}
	fmt.Fprintf(w, "== churn: %d workers over %d connections, %s of unique %d–%d byte prompts; index bound %s\n",
		o.Concurrency, o.Conns, length, o.MinBytes, o.MaxBytes, bound)
	writeEnv(w, r.Environment)
	fmt.Fprintf(w, "exchanges\t%d = %.0f/s; picker CPU %s µs per exchange\n", r.Exchanges, r.ExchangesPerSec, fmtNum(r.PickerCPUPerExchangeUS, "%.0f"))
	fmt.Fprintf(w, "CPU\tpicker %s cores, load generator %.2f cores, whole machine %s cores busy\n", fmtNum(r.PickerCores, "%.2f"), r.ClientCores, fmtNum(r.MachineBusyCores, "%.2f"))
	writeLatency(w, "added latency", r.AddedLatency)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "t (s)\texchanges\tRSS\theap in use\tindex entries\tindex bytes")
	row := func(s ChurnSample) {
		fmt.Fprintf(w, "%.1f\t%d\t%s\t%s\t%s\t%s\n", s.T, s.Exchanges, mib(s.RSSBytes), mib(s.HeapInuseBytes), fmtNum(s.IndexEntries, "%.0f"), mib(s.IndexBytes))
	}
	row(r.Baseline)
	step := max(1, (len(r.Samples)+13)/14)
	for i, s := range r.Samples {
		if i%step == step-1 || i == len(r.Samples)-1 {
			row(s)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "bound reached\tat %s s; entries at end %s, at most %s\n", fmtNum(r.BoundReachedS, "%.1f"), fmtNum(r.EntriesAtEnd, "%.0f"), fmtNum(r.MaxEntries, "%.0f"))
	fmt.Fprintf(w, "bytes per entry\tindex's own estimate (index bytes / entries) %s; live heap growth / entries %s (after the load, forced GC: heap in use %s for %s entries); sampled heap growth / entries %s (includes garbage)\n",
		fmtNum(r.IndexBytesPerEntry, "%.1f"), fmtNum(r.HeapGrowthPerEntryLive, "%.1f"), mib(r.FinalLive.HeapInuseBytes), fmtNum(r.FinalLive.IndexEntries, "%.0f"), fmtNum(r.HeapGrowthPerEntryMean, "%.1f"))
	verdict := "NOT bounded"
	if r.Bounded {
		verdict = "bounded"
	}
	fmt.Fprintf(w, "memory\t%s: live heap %s when the index reached its bound (%s entries, %d exchanges), %s at the end: %s growth while %s more blocks went in (keeping them would have cost %s): %s of that (threshold %.0f%%)\n",
		verdict, mib(r.AtBound.HeapInuseBytes), fmtNum(r.AtBound.IndexEntries, "%.0f"), r.AtBound.Exchanges, mib(r.FinalLive.HeapInuseBytes),
		mib(r.HeapGrowthBytes), fmtNum(r.BlocksInserted, "%.0f"), mib(r.LeakYardstickBytes), fmtNum(100*r.LeakRatio, "%.1f%%"), 100*r.Options.LeakThreshold)
	fmt.Fprintf(w, "RSS (second half)\tslope %s/min, range %s – %s; heap in use %s/min, index bytes %s/min\n",
		mib(r.RSSSlopeBytesPerMin), mib(r.RSSSecondHalfMinBytes), mib(r.RSSSecondHalfMaxBytes), mib(r.HeapSlopeBytesPerMin), mib(r.IndexBytesSlopePerMin))
	writeErrors(w, r.Errors, r.ErrorKinds, r.FirstError)
	for _, x := range r.Warnings {
		fmt.Fprintf(w, "WARNING\t%s\n", x)
	}
	if r.HeapProfile != "" {
		fmt.Fprintf(w, "heap profile\t%s, at the end after a forced GC (go tool pprof -sample_index=inuse_space -top %s)\n", r.HeapProfile, r.HeapProfile)
	}
	w.Flush()
}

// WriteCSV writes the samples, one a line.
func (r *ChurnResult) WriteCSV(out io.Writer) error {
	cw := csv.NewWriter(out)
	f := func(v promtext.Num) string {
		if math.IsNaN(float64(v)) {
			return ""
		}
		return strconv.FormatFloat(float64(v), 'f', -1, 64)
	}
	_ = cw.Write([]string{"t_s", "exchanges", "rss_bytes", "heap_inuse_bytes", "index_entries", "index_bytes", "request_blocks"})
	for _, s := range append([]ChurnSample{r.Baseline}, r.Samples...) {
		_ = cw.Write([]string{strconv.FormatFloat(s.T, 'f', 3, 64), strconv.FormatInt(s.Exchanges, 10), f(s.RSSBytes), f(s.HeapInuseBytes),
			f(s.IndexEntries), f(s.IndexBytes), f(s.RequestBlocks)})
	}
	cw.Flush()
	return cw.Error()
}
