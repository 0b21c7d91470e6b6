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

// WriteTable writes the report as an aligned text table, one row per workload × policy.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	cols := []string{"workload", "policy", "hit%", "pred%", "TTFT p50", "p90", "p99", "out tok/s", "req/s",
		"req imb", "peak imb", "util", "decide p50", "p99", "rtt p50", "p99", "rss MB", "errors"}
	fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t")
	prev := ""
	for _, s := range r.Results {
		name := s.Workload
		if name == prev {
			name = ""
		}
		prev = s.Workload
		row := []string{
			name, s.Policy,
			pct(s.HitRatio), pct(float64(s.PredictedHitRatio)),
			dur(s.TTFT.P50), dur(s.TTFT.P90), dur(s.TTFT.P99),
			fmt.Sprintf("%.0f", s.OutputTokPerSec), fmt.Sprintf("%.1f", s.ReqPerSec),
			fmt.Sprintf("%.2f", s.RequestImbalance), fmt.Sprintf("%.2f", s.PeakImbalance),
			fmt.Sprintf("%.0f%%", 100*s.Util),
			micros(s.Decision.P50), micros(s.Decision.P99),
			micros(s.RoundTrip.P50), micros(s.RoundTrip.P99),
			mb(s.PickerRSSBytes), errs(s),
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	return tw.Flush()
}

// WriteLegend explains the table's columns.
func WriteLegend(w io.Writer) {
	fmt.Fprint(w, `hit% engines' prefix-cache hit (cached/prompt tokens); pred% the picker's own predicted hit;
TTFT simulated time to first token; out tok/s, req/s simulated throughput; req imb, peak imb max/mean
of requests per engine and of peak requests in flight per engine; util busiest engine resource
(prefill queue or batch slots) over the arrival window; decide the picker's decision time
(its /metrics); rtt the ext_proc round trip measured by the client (wall time, µs); rss the
picker's resident memory; errors failed requests (kinds in the JSON).
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
