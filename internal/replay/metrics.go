package replay

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/kvpick/kvpick/internal/promtext"
)

// Percentile returns the p-th percentile (0 < p <= 100) of values by the nearest-rank method:
// the smallest value with at least p % of the values at or below it. NaN for no values. values
// is sorted in place.
func Percentile(values []float64, p float64) float64 {
	if len(values) == 0 {
		return math.NaN()
	}
	if !slices.IsSorted(values) {
		slices.Sort(values)
	}
	rank := int(math.Ceil(p / 100 * float64(len(values))))
	rank = max(1, min(len(values), rank))
	return values[rank-1]
}

// Imbalance is max/mean of counts: 1 is perfectly even, len(counts) is everything on one. An
// all-zero (or empty) input is even: 1.
func Imbalance(counts []int) float64 {
	if len(counts) == 0 {
		return 1
	}
	sum, mx := 0, 0
	for _, c := range counts {
		sum += c
		mx = max(mx, c)
	}
	if sum == 0 {
		return 1
	}
	return float64(mx) / (float64(sum) / float64(len(counts)))
}

// Num is a value that may be unmeasured (NaN, written to JSON as null).
type Num = promtext.Num

// Quantiles are latency percentiles in seconds.
type Quantiles struct {
	P50  Num `json:"p50"`
	P90  Num `json:"p90"`
	P99  Num `json:"p99"`
	Mean Num `json:"mean"`
}

var noQuantiles = Quantiles{Num(math.NaN()), Num(math.NaN()), Num(math.NaN()), Num(math.NaN())}

func quantiles(v []float64) Quantiles {
	if len(v) == 0 {
		return noQuantiles
	}
	slices.Sort(v)
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return Quantiles{Num(Percentile(v, 50)), Num(Percentile(v, 90)), Num(Percentile(v, 99)), Num(sum / float64(len(v)))}
}

// Summary is the report of one workload × policy run. Times are simulated seconds unless
// named wall.
type Summary struct {
	Scenario string `json:"scenario"`
	Workload string `json:"workload"`
	Seed     uint64 `json:"seed"`
	Policy   string `json:"policy"`

	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	// Streamed is how many requests asked for a streamed answer.
	Streamed int `json:"streamed"`
	Errors   int `json:"errors"`
	// ErrorsByKind: "injected" (500 by --error-rate), "overloaded" (503, engine queue full),
	// "invalid" (400, too long), "picker-NNN" (the picker's immediate response), "exchange"
	// (ext_proc client or protocol error).
	ErrorsByKind map[string]int `json:"errorsByKind"`
	// ErrorSamples are up to five distinct exchange error messages.
	ErrorSamples []string `json:"errorSamples,omitempty"`

	PromptTokens int64 `json:"promptTokens"`
	CachedTokens int64 `json:"cachedTokens"`
	// HitRatio is the engines' prefix-cache hit over successful requests: cached / prompt tokens.
	HitRatio float64 `json:"hitRatio"`
	// PredictedHitRatio is the picker's own estimate (kvpick_prefix_predicted_hit_blocks_total /
	// kvpick_prefix_request_blocks_total); NaN for other policies.
	PredictedHitRatio Num `json:"predictedHitRatio"`

	TTFT      Quantiles `json:"ttft"`
	QueueWait Quantiles `json:"queueWait"`
	Latency   Quantiles `json:"latency"`

	// Duration is from the first arrival to the last response's end.
	Duration        float64 `json:"duration"`
	OutputTokPerSec float64 `json:"outputTokensPerSecond"`
	ReqPerSec       float64 `json:"requestsPerSecond"`

	RequestsPerEngine []int   `json:"requestsPerEngine"`
	PeakInFlight      []int   `json:"peakInFlight"`
	RequestImbalance  float64 `json:"requestImbalance"`
	PeakImbalance     float64 `json:"peakImbalance"`
	// PrefillUtil is the fraction of the arrival window the engines spent prefilling (per
	// engine, the union of its requests' prefill intervals);
	// BatchUtil the mean over the window of each engine's fuller resource, batch slots
	// (running / MaxNumSeqs) or KV blocks held by running requests (vllm:kv_cache_usage_perc).
	// Util is the larger of the two: how busy the pool was.
	PrefillUtil float64 `json:"prefillUtilization"`
	BatchUtil   float64 `json:"batchUtilization"`
	Util        float64 `json:"utilization"`
	// MeanWaiting is the mean number of requests waiting per engine over the window.
	MeanWaiting float64 `json:"meanWaiting"`
	// Preemptions is how many times the engines took a running request's KV blocks back
	// (vllm:num_preemptions), summed over engines.
	Preemptions uint64 `json:"preemptions"`

	// Decision is the routing decision's latency: for kvpick the picker's
	// kvpick_decision_duration_seconds histogram (NaN when its /metrics is not known).
	Decision Quantiles `json:"decision"`
	// RoundTrip is the client-measured wall time of the routing step: for kvpick the ext_proc
	// exchange up to the destination, for in-process policies the call.
	RoundTrip Quantiles `json:"roundTrip"`
	// PickerRSSBytes is the picker's resident memory at the end of the run.
	PickerRSSBytes Num `json:"pickerRSSBytes"`

	WallSeconds float64 `json:"wallSeconds"`
	// Scrape is the virtual clock's wait for the picker's metrics scrapes (kvpick only).
	Scrape *ScrapeStats `json:"scrape,omitempty"`
	// PeerSync: the virtual clock's pacing of picker replicas that share (--share-commits).
	PeerSync *PeerSyncStats `json:"peerSync,omitempty"`
	// Endpoint is the first engine's address (kvpick only): the picker breaks ties by hashing
	// addresses, so runs on other ports are not comparable request for request.
	Endpoint string `json:"endpoint,omitempty"`
}

// Summarize computes the report of a run.
func Summarize(res *RunResult) *Summary {
	cfg := res.Config
	s := &Summary{
		Workload: cfg.Workload.Name, Policy: cfg.Policy, Requests: len(res.Records),
		ErrorsByKind:      map[string]int{},
		RequestsPerEngine: make([]int, cfg.Engines),
		PeakInFlight:      res.PeakInFlight,
		PredictedHitRatio: Num(math.NaN()),
		Decision:          noQuantiles,
		PickerRSSBytes:    Num(math.NaN()),
		WallSeconds:       res.Wall.Seconds(),
		Scrape:            res.Scrape,
		PeerSync:          res.PeerSync,
	}
	var ttft, wait, lat, rt []float64
	var first, last, lastArrival time.Time
	var outTok int64
	for i := range res.Records {
		r := &res.Records[i]
		if first.IsZero() || r.Arrival.Before(first) {
			first = r.Arrival
		}
		if r.Arrival.After(lastArrival) {
			lastArrival = r.Arrival
		}
		if r.Engine >= 0 {
			s.RequestsPerEngine[r.Engine]++
		}
		if r.Stream {
			s.Streamed++
		}
		if r.Decision > 0 || r.Engine >= 0 {
			rt = append(rt, r.Decision.Seconds())
		}
		if !r.OK() {
			s.Errors++
			s.ErrorsByKind[errorKind(r)]++
			if r.Err != "" && len(s.ErrorSamples) < 5 && !slices.Contains(s.ErrorSamples, r.Err) {
				s.ErrorSamples = append(s.ErrorSamples, r.Err)
			}
			continue
		}
		s.Completed++
		res := r.Result
		s.PromptTokens += int64(res.PromptTokens)
		s.CachedTokens += int64(res.CachedTokens)
		outTok += int64(res.CompletionTokens)
		ttft = append(ttft, res.TTFT().Seconds())
		wait = append(wait, res.QueueWait().Seconds())
		lat = append(lat, res.Latency().Seconds())
		if res.End.After(last) {
			last = res.End
		}
	}
	if s.PromptTokens > 0 {
		s.HitRatio = float64(s.CachedTokens) / float64(s.PromptTokens)
	}
	s.TTFT, s.QueueWait, s.Latency, s.RoundTrip = quantiles(ttft), quantiles(wait), quantiles(lat), quantiles(rt)
	if last.After(first) {
		s.Duration = last.Sub(first).Seconds()
		s.OutputTokPerSec = float64(outTok) / s.Duration
		s.ReqPerSec = float64(s.Completed) / s.Duration
	}
	s.RequestImbalance = Imbalance(s.RequestsPerEngine)
	s.PeakImbalance = Imbalance(s.PeakInFlight)
	s.PrefillUtil = prefillUtilization(res, first, lastArrival)
	s.BatchUtil, s.MeanWaiting = batchUtilization(res, first, lastArrival)
	s.Util = math.Max(s.PrefillUtil, s.BatchUtil)
	for _, st := range res.Stats {
		s.Preemptions += st.Preemptions
	}
	return s
}

func errorKind(r *Record) string {
	switch {
	case r.Err != "":
		return "exchange"
	case r.Rejected:
		return "picker-" + strconv.Itoa(r.Status)
	case r.Status == 500:
		return "injected"
	case r.Status == 503:
		return "overloaded"
	case r.Status == 400:
		return "invalid"
	}
	return "status-" + strconv.Itoa(r.Status)
}

// prefillUtilization returns the fraction of [from, to] the engines spent prefilling: per
// engine, the union of its requests' prefill intervals (first scheduling to first token). With
// chunked prefill several requests prefill in the same steps, so their intervals overlap and
// are counted once.
func prefillUtilization(res *RunResult, from, to time.Time) float64 {
	window := to.Sub(from)
	if window <= 0 || res.Config.Engines == 0 {
		return 0
	}
	type span struct{ a, b time.Time }
	per := make([][]span, res.Config.Engines)
	for i := range res.Records {
		r := &res.Records[i]
		if !r.OK() || r.Result.Slow || r.Engine < 0 || r.Engine >= len(per) {
			continue
		}
		a, b := r.Result.PrefillStart, r.Result.FirstToken
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		if b.After(a) {
			per[r.Engine] = append(per[r.Engine], span{a, b})
		}
	}
	var busy time.Duration
	for _, spans := range per {
		slices.SortFunc(spans, func(x, y span) int { return x.a.Compare(y.a) })
		var end time.Time
		for _, s := range spans {
			if s.a.After(end) {
				busy += s.b.Sub(s.a)
				end = s.b
			} else if s.b.After(end) {
				busy += s.b.Sub(end)
				end = s.b
			}
		}
	}
	return busy.Seconds() / (float64(res.Config.Engines) * window.Seconds())
}

// batchUtilization averages, over the samples in [from, to] and the engines, the fuller of
// batch slots and KV blocks, and the number of requests waiting.
func batchUtilization(res *RunResult, from, to time.Time) (util, waiting float64) {
	maxSeqs := float64(max(1, res.Config.Engine.MaxNumSeqs))
	n := 0
	for _, s := range res.Samples {
		if s.At.Before(from) || s.At.After(to) {
			continue
		}
		for _, l := range s.Load {
			util += math.Max(float64(l.Running)/maxSeqs, l.KVUsage)
			waiting += float64(l.Waiting)
			n++
		}
	}
	if n == 0 {
		return 0, 0
	}
	return util / float64(n), waiting / float64(n)
}
