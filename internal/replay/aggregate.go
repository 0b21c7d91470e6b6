package replay

import (
	"math"
	"slices"
)

// Spread is a metric over seeds: its median and its worst value (the largest for latencies and
// ratios of latencies, the smallest for hit ratios).
type Spread struct {
	Median Num `json:"median"`
	Worst  Num `json:"worst"`
}

// LatencySpread is a latency's percentiles over seeds.
type LatencySpread struct {
	P50 Spread `json:"p50"`
	P90 Spread `json:"p90"`
	P99 Spread `json:"p99"`
}

// Aggregate is one scenario × workload × policy over every seed it ran with.
type Aggregate struct {
	Scenario string   `json:"scenario"`
	Workload string   `json:"workload"`
	Policy   string   `json:"policy"`
	Seeds    []uint64 `json:"seeds"`

	HitRatio          Spread        `json:"hitRatio"`
	PredictedHitRatio Spread        `json:"predictedHitRatio"`
	TTFT              LatencySpread `json:"ttft"`
	QueueWait         LatencySpread `json:"queueWait"`
	OutputTokPerSec   Spread        `json:"outputTokensPerSecond"`
	PeakImbalance     Spread        `json:"peakImbalance"`
	Errors            Spread        `json:"errors"`

	// Versus compares with each reference policy (RatioBaselines) run on the same workload and
	// seed: the ratio of this policy's number to the reference's, per seed, then its median and
	// worst over seeds (hit ratio: the smallest; TTFT: the largest). Absent when the reference
	// did not run.
	Versus map[string]*Ratios `json:"versus,omitempty"`
}

// Ratios are this policy's numbers over a reference's.
type Ratios struct {
	HitRatio Spread        `json:"hitRatio"`
	TTFT     LatencySpread `json:"ttft"`
}

// RatioBaselines are the policies every other is compared with.
func RatioBaselines() []string { return []string{Precise, LeastLoaded, GIE, SGLang} }

// Aggregates summarises per-seed results: one Aggregate per scenario × workload × policy, in the
// order the results first appear. A scenario with BaselinesFrom takes its references from that
// scenario.
func Aggregates(results []*Summary, scenarios []Scenario) []*Aggregate {
	type key struct{ scenario, workload, policy string }
	type seedKey struct {
		scenario, workload, policy string
		seed                       uint64
	}
	bySeed := map[seedKey]*Summary{}
	groups := map[key][]*Summary{}
	var order []key
	for _, s := range results {
		k := key{s.Scenario, s.Workload, s.Policy}
		if groups[k] == nil {
			order = append(order, k)
		}
		groups[k] = append(groups[k], s)
		bySeed[seedKey{s.Scenario, s.Workload, s.Policy, s.Seed}] = s
	}
	refScenario := map[string]string{}
	for _, sc := range scenarios {
		refScenario[sc.Name] = sc.Name
		if sc.BaselinesFrom != "" {
			refScenario[sc.Name] = sc.BaselinesFrom
		}
	}
	var out []*Aggregate
	for _, k := range order {
		ss := groups[k]
		a := &Aggregate{Scenario: k.scenario, Workload: k.workload, Policy: k.policy}
		for _, s := range ss {
			a.Seeds = append(a.Seeds, s.Seed)
		}
		a.HitRatio = spreadOf(ss, func(s *Summary) float64 { return s.HitRatio }, false)
		a.PredictedHitRatio = spreadOf(ss, func(s *Summary) float64 { return float64(s.PredictedHitRatio) }, false)
		a.TTFT = latencySpread(ss, func(s *Summary) Quantiles { return s.TTFT })
		a.QueueWait = latencySpread(ss, func(s *Summary) Quantiles { return s.QueueWait })
		a.OutputTokPerSec = spreadOf(ss, func(s *Summary) float64 { return s.OutputTokPerSec }, false)
		a.PeakImbalance = spreadOf(ss, func(s *Summary) float64 { return s.PeakImbalance }, true)
		a.Errors = spreadOf(ss, func(s *Summary) float64 { return float64(s.Errors) }, true)
		ref := refScenario[k.scenario]
		if ref == "" {
			ref = k.scenario
		}
		for _, b := range RatioBaselines() {
			if b == k.policy {
				continue
			}
			var hit, p50, p90, p99 []float64
			for _, s := range ss {
				r := bySeed[seedKey{ref, k.workload, b, s.Seed}]
				if r == nil {
					continue
				}
				hit = append(hit, s.HitRatio/r.HitRatio)
				p50 = append(p50, float64(s.TTFT.P50)/float64(r.TTFT.P50))
				p90 = append(p90, float64(s.TTFT.P90)/float64(r.TTFT.P90))
				p99 = append(p99, float64(s.TTFT.P99)/float64(r.TTFT.P99))
			}
			if len(hit) == 0 {
				continue
			}
			if a.Versus == nil {
				a.Versus = map[string]*Ratios{}
			}
			a.Versus[b] = &Ratios{HitRatio: spread(hit, false),
				TTFT: LatencySpread{P50: spread(p50, true), P90: spread(p90, true), P99: spread(p99, true)}}
		}
		out = append(out, a)
	}
	return out
}

func spreadOf(ss []*Summary, f func(*Summary) float64, worstIsMax bool) Spread {
	v := make([]float64, 0, len(ss))
	for _, s := range ss {
		v = append(v, f(s))
	}
	return spread(v, worstIsMax)
}

func latencySpread(ss []*Summary, f func(*Summary) Quantiles) LatencySpread {
	return LatencySpread{
		P50: spreadOf(ss, func(s *Summary) float64 { return float64(f(s).P50) }, true),
		P90: spreadOf(ss, func(s *Summary) float64 { return float64(f(s).P90) }, true),
		P99: spreadOf(ss, func(s *Summary) float64 { return float64(f(s).P99) }, true),
	}
}

// spread is the median (the mean of the two middle values for an even count) and the worst of
// the values that were measured (NaN: not measured; no values: NaN).
func spread(values []float64, worstIsMax bool) Spread {
	v := make([]float64, 0, len(values))
	for _, x := range values {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return Spread{Num(math.NaN()), Num(math.NaN())}
	}
	slices.Sort(v)
	n := len(v)
	med := v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	worst := v[0]
	if worstIsMax {
		worst = v[n-1]
	}
	return Spread{Num(med), Num(worst)}
}
