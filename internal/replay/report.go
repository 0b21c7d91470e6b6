package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
)

// WriteHeader describes the run: pool, seeds, clock, scenarios, workloads and exactly what the
// replay changed in the picker's configuration.
func (r *Report) WriteHeader(w io.Writer) {
	p := r.Params
	fmt.Fprintf(w, "%d engines, seeds %s, %s clock", p.Engines, seedList(p.Seeds), p.Clock)
	if p.Clock == ClockReal {
		fmt.Fprintf(w, " x%g", p.TimeScale)
	}
	fmt.Fprintf(w, ", metrics every %s (simulated), %.0fs wall\n", p.MetricsInterval, r.Elapsed)
	fmt.Fprintln(w, "scenarios:")
	for _, sc := range r.Scenarios {
		fmt.Fprintf(w, "  %-14s %s (timing %s, %.0f%% streamed, %.0f%% of streams with usage, cached_tokens %s)\n",
			sc.Name, sc.About, sc.Timing, 100*sc.Streaming.Fraction, 100*sc.Streaming.UsageFraction, onOff(!sc.OmitCachedTokens))
	}
	fmt.Fprintln(w, "workloads:")
	seen := map[string]bool{}
	for _, wl := range r.Workload {
		if seen[wl.Name] {
			continue
		}
		seen[wl.Name] = true
		fmt.Fprintf(w, "  %-14s %5d requests at %5.1f req/s: %s\n", wl.Name, wl.Requests, wl.Rate, wl.About)
	}
	if len(r.Pickers) == 0 {
		return
	}
	fmt.Fprintf(w, "kvpick: the picker binary with its default configuration (config/default.yaml)%s,\n", pickerFile(p.PickerConfig))
	fmt.Fprintln(w, "  overridden by the replay:")
	printed := map[string]bool{}
	for _, sc := range r.Scenarios {
		st := r.Pickers[sc.Name]
		if st == nil {
			continue
		}
		for _, o := range st.Overrides {
			line := o.String()
			if o.Key == "pool.endpoints" {
				line = fmt.Sprintf("%s = %d loopback addresses (%s, ...): %s", o.Key, p.Engines, firstEndpoint(o.Value), o.Why)
			}
			if printed[line] {
				continue
			}
			printed[line] = true
			if o.Key == "plugins."+prefixScorer+"."+capacityKey {
				line = "[" + sc.Name + "] " + line
			}
			fmt.Fprintln(w, "   ", line)
		}
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func pickerFile(f string) string {
	if f == "" {
		return ""
	}
	return " under " + f
}

func firstEndpoint(list string) string {
	first, _, _ := strings.Cut(strings.TrimPrefix(list, "["), ",")
	return strings.TrimSuffix(first, "]")
}

// WriteTable writes the per-run results as an aligned text table, one row per scenario ×
// workload × seed × policy (the scenario and seed columns only when there are several).
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	scenarios, seeds := r.distinct()
	var cols []string
	if scenarios > 1 {
		cols = append(cols, "scenario")
	}
	cols = append(cols, "workload")
	if seeds > 1 {
		cols = append(cols, "seed")
	}
	cols = append(cols, "policy", "hit%", "pred%", "TTFT p50", "p90", "p99", "wait p90", "out tok/s", "req/s",
		"req imb", "peak imb", "util", "decide p50", "p99", "rtt p50", "p99", "rss MB", "errors")
	fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t")
	prevSc, prevW := "", ""
	for _, s := range r.Results {
		var row []string
		if scenarios > 1 {
			name := s.Scenario
			if name == prevSc {
				name = ""
			}
			row = append(row, name)
		}
		name := s.Workload
		if name == prevW && s.Scenario == prevSc {
			name = ""
		}
		prevSc, prevW = s.Scenario, s.Workload
		row = append(row, name)
		if seeds > 1 {
			row = append(row, fmt.Sprint(s.Seed))
		}
		row = append(row, s.Policy,
			pct(s.HitRatio), pct(float64(s.PredictedHitRatio)),
			dur(s.TTFT.P50), dur(s.TTFT.P90), dur(s.TTFT.P99), dur(s.QueueWait.P90),
			fmt.Sprintf("%.0f", s.OutputTokPerSec), fmt.Sprintf("%.1f", s.ReqPerSec),
			fmt.Sprintf("%.2f", s.RequestImbalance), fmt.Sprintf("%.2f", s.PeakImbalance),
			fmt.Sprintf("%.0f%%", 100*s.Util),
			micros(s.Decision.P50), micros(s.Decision.P99),
			micros(s.RoundTrip.P50), micros(s.RoundTrip.P99),
			mb(s.PickerRSSBytes), errs(s),
		)
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	return tw.Flush()
}

func (r *Report) distinct() (scenarios, seeds int) {
	sc, sd := map[string]bool{}, map[uint64]bool{}
	for _, s := range r.Results {
		sc[s.Scenario], sd[s.Seed] = true, true
	}
	return len(sc), len(sd)
}

// WriteSummary writes the results over seeds, one row per scenario × workload × policy: the
// median of each number (the worst over seeds in brackets when there are several), and the
// TTFT p50/p90/p99 ratios to each reference policy on the same seeds (medians; the worst p90
// ratio in brackets).
func (r *Report) WriteSummary(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	cols := []string{"scenario", "workload", "policy", "seeds", "hit%", "TTFT p50", "p90", "p99"}
	for _, b := range RatioBaselines() {
		cols = append(cols, "x"+b+" p50/p90/p99")
	}
	fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t")
	prevSc, prevW := "", ""
	for _, a := range r.Aggregates {
		sc, wl := a.Scenario, a.Workload
		if sc == prevSc {
			sc = ""
			if wl == prevW {
				wl = ""
			}
		}
		prevSc, prevW = a.Scenario, a.Workload
		many := len(a.Seeds) > 1
		row := []string{sc, wl, a.Policy, fmt.Sprint(len(a.Seeds)),
			spreadCell(a.HitRatio, many, func(n Num) string { return pct(float64(n)) }),
			spreadCell(a.TTFT.P50, many, dur), spreadCell(a.TTFT.P90, many, dur), spreadCell(a.TTFT.P99, many, dur)}
		for _, b := range RatioBaselines() {
			v := a.Versus[b]
			if v == nil {
				row = append(row, "-")
				continue
			}
			cell := fmt.Sprintf("%s/%s/%s", ratio(v.TTFT.P50.Median), ratio(v.TTFT.P90.Median), ratio(v.TTFT.P99.Median))
			if many {
				cell += " [" + ratio(v.TTFT.P90.Worst) + "]"
			}
			row = append(row, cell)
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	return tw.Flush()
}

func spreadCell(s Spread, many bool, f func(Num) string) string {
	c := f(s.Median)
	if many {
		c += " [" + f(s.Worst) + "]"
	}
	return c
}

func ratio(n Num) string {
	if math.IsNaN(float64(n)) {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(n))
}

// WriteLegend explains the tables' columns.
func WriteLegend(w io.Writer) {
	fmt.Fprint(w, `hit% engines' prefix-cache hit (cached/prompt tokens); pred% the picker's own predicted hit;
TTFT simulated time to first token (queue + prefill, as the engine measures it); wait p90 queue
wait before prefill; out tok/s, req/s simulated throughput; req imb, peak imb max/mean of
requests per engine and of peak requests in flight per engine; util busiest engine resource
(prefill queue or batch slots) over the arrival window; decide the picker's decision time
(its /metrics); rtt the ext_proc round trip measured by the client (wall time); rss the
picker's resident memory; errors failed requests (kinds in the JSON). Summary: medians over
seeds, [worst]; xP p50/p90/p99 = this policy's TTFT percentiles / policy P's on the same
seeds (below 1 is better), [worst p90 ratio].
`)
}

func pct(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.1f", 100*v)
}

func dur(n Num) string {
	v := float64(n)
	switch {
	case math.IsNaN(v):
		return "-"
	case v >= 10:
		return fmt.Sprintf("%.1fs", v)
	case v >= 1:
		return fmt.Sprintf("%.2fs", v)
	}
	return fmt.Sprintf("%.0fms", v*1000)
}

func micros(n Num) string {
	v := float64(n)
	if math.IsNaN(v) {
		return "-"
	}
	us := v * 1e6
	if us < 10 {
		return fmt.Sprintf("%.1fµs", us)
	}
	if us >= 10000 {
		return fmt.Sprintf("%.1fms", us/1000)
	}
	return fmt.Sprintf("%.0fµs", us)
}

func mb(n Num) string {
	if math.IsNaN(float64(n)) {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(n)/(1<<20))
}

func errs(s *Summary) string {
	if s.Errors == 0 {
		return "0"
	}
	kinds := make([]string, 0, len(s.ErrorsByKind))
	for k, v := range s.ErrorsByKind {
		kinds = append(kinds, fmt.Sprintf("%s:%d", k, v))
	}
	sort.Strings(kinds)
	return fmt.Sprintf("%d (%s)", s.Errors, strings.Join(kinds, ","))
}

// WriteJSON writes the report to path as indented JSON.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
