// Package promtext reads a Prometheus /metrics page for the load and replay tools: the page is
// parsed by prometheus/common's expfmt, and this package answers the questions a report asks of
// it — a metric's value or sum over its series, a histogram's buckets, a quantile over a window
// between two scrapes.
package promtext

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one scrape, by metric family.
type Metrics struct {
	families map[string]*dto.MetricFamily
}

// ParseMetrics reads the Prometheus text exposition format (what client_golang and vLLM serve).
func ParseMetrics(r io.Reader) (*Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	return &Metrics{families: fams}, nil
}

// samples returns the values of the series named name: a counter's, gauge's or untyped metric's
// own series, or a histogram's or summary's name_sum and name_count series (name_bucket: every
// bucket's cumulative count). nil when the page has no such series.
func (m *Metrics) samples(name string) []float64 {
	if m == nil {
		return nil
	}
	var out []float64
	if f := m.families[name]; f != nil {
		for _, s := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out = append(out, s.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				out = append(out, s.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				out = append(out, s.GetUntyped().GetValue())
			}
		}
		return out
	}
	for _, suffix := range []string{"_sum", "_count", "_bucket"} {
		base, ok := strings.CutSuffix(name, suffix)
		f := m.families[base]
		if !ok || f == nil {
			continue
		}
		for _, s := range f.GetMetric() {
			switch {
			case s.Histogram != nil && suffix == "_sum":
				out = append(out, s.GetHistogram().GetSampleSum())
			case s.Histogram != nil && suffix == "_count":
				out = append(out, sampleCount(s.GetHistogram()))
			case s.Histogram != nil:
				for _, b := range buckets(s.GetHistogram()) {
					out = append(out, b.Count)
				}
			case s.Summary != nil && suffix == "_sum":
				out = append(out, s.GetSummary().GetSampleSum())
			case s.Summary != nil && suffix == "_count":
				out = append(out, float64(s.GetSummary().GetSampleCount()))
			}
		}
	}
	return out
}

// Has reports whether the scrape holds a series named name.
func (m *Metrics) Has(name string) bool { return len(m.samples(name)) > 0 }

// Sum returns the sum of the named metric over all its series (0 when absent).
func (m *Metrics) Sum(name string) float64 {
	var sum float64
	for _, v := range m.samples(name) {
		sum += v
	}
	return sum
}

// Value returns the named metric's value, summed over its series, or NaN when absent: for
// reports that must tell "0" from "not exported".
func (m *Metrics) Value(name string) float64 {
	vs := m.samples(name)
	if len(vs) == 0 {
		return math.NaN()
	}
	var sum float64
	for _, v := range vs {
		sum += v
	}
	return sum
}

// Bucket is one cumulative histogram bucket: Count observations were ≤ UpperBound.
type Bucket struct {
	UpperBound float64
	Count      float64
}

// Histogram returns the cumulative buckets of histogram name, summed over its series, sorted by
// upper bound and ending with +Inf; nil when the page has no such histogram.
func (m *Metrics) Histogram(name string) []Bucket {
	if m == nil {
		return nil
	}
	f := m.families[name]
	if f == nil || f.GetType() != dto.MetricType_HISTOGRAM || len(f.GetMetric()) == 0 {
		return nil
	}
	byLE := map[float64]float64{}
	for _, s := range f.GetMetric() {
		for _, b := range buckets(s.GetHistogram()) {
			byLE[b.UpperBound] += b.Count
		}
	}
	out := make([]Bucket, 0, len(byLE))
	for le, c := range byLE {
		out = append(out, Bucket{UpperBound: le, Count: c})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UpperBound < out[j].UpperBound })
	return out
}

// buckets returns one series' cumulative buckets as the page gave them, with an le="+Inf" bucket
// (the sample count) when the page left it out. Counts may be integers or floats.
func buckets(h *dto.Histogram) []Bucket {
	out := make([]Bucket, 0, len(h.GetBucket())+1)
	for _, b := range h.GetBucket() {
		c := float64(b.GetCumulativeCount())
		if b.CumulativeCountFloat != nil {
			c = b.GetCumulativeCountFloat()
		}
		out = append(out, Bucket{UpperBound: b.GetUpperBound(), Count: c})
	}
	if len(out) == 0 || !math.IsInf(out[len(out)-1].UpperBound, 1) {
		out = append(out, Bucket{UpperBound: math.Inf(1), Count: sampleCount(h)})
	}
	return out
}

func sampleCount(h *dto.Histogram) float64 {
	if h.SampleCountFloat != nil {
		return h.GetSampleCountFloat()
	}
	return float64(h.GetSampleCount())
}

// SubBuckets returns after − before bucket by bucket: the observations made between two
// scrapes of the same histogram. Buckets missing from before count as 0.
func SubBuckets(after, before []Bucket) []Bucket {
	prev := map[float64]float64{}
	for _, b := range before {
		prev[b.UpperBound] = b.Count
	}
	out := make([]Bucket, len(after))
	for i, b := range after {
		out[i] = Bucket{UpperBound: b.UpperBound, Count: b.Count - prev[b.UpperBound]}
	}
	return out
}

// BucketQuantile estimates quantile q from cumulative buckets the way PromQL's
// histogram_quantile does: find the bucket holding rank q·total and interpolate linearly
// within it (the first bucket's lower bound is 0); a rank in the +Inf bucket returns the
// largest finite upper bound. NaN when there are no observations.
func BucketQuantile(q float64, buckets []Bucket) float64 {
	if len(buckets) == 0 {
		return math.NaN()
	}
	total := buckets[len(buckets)-1].Count
	if total <= 0 {
		return math.NaN()
	}
	q = min(max(q, 0), 1)
	rank := q * total
	prevBound, prevCount := 0.0, 0.0
	for i, b := range buckets {
		if b.Count >= rank && b.Count > prevCount {
			if math.IsInf(b.UpperBound, 1) {
				if i == 0 {
					return math.NaN()
				}
				return buckets[i-1].UpperBound
			}
			if i == 0 && b.UpperBound <= 0 {
				return b.UpperBound
			}
			return prevBound + (b.UpperBound-prevBound)*(rank-prevCount)/(b.Count-prevCount)
		}
		prevBound, prevCount = b.UpperBound, b.Count
	}
	return buckets[len(buckets)-1].UpperBound
}

// Scraper fetches a /metrics page.
type Scraper struct {
	URL    string // e.g. http://127.0.0.1:9090/metrics
	Client *http.Client
}

// NewScraper returns a scraper for url with a short timeout; url "" makes a scraper whose
// scrapes return (nil, nil), for pickers whose metrics are not reachable.
func NewScraper(url string) *Scraper {
	return &Scraper{URL: url, Client: &http.Client{Timeout: 10 * time.Second}}
}

// Scrape fetches and parses the page.
func (s *Scraper) Scrape(ctx context.Context) (*Metrics, error) {
	if s == nil || s.URL == "" {
		return nil, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return nil, err
	}
	// The text format: client_golang would otherwise answer in protobuf only if asked.
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := s.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", s.URL, resp.Status)
	}
	m, err := ParseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", s.URL, err)
	}
	return m, nil
}

// Num is a value read from a metrics page, NaN when the page did not have it; it is written to
// JSON as null then, so reports tell "0" from "not measured".
type Num float64

// MarshalJSON implements json.Marshaler.
func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 64), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (n *Num) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = Num(math.NaN())
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	*n = Num(f)
	return err
}
