// Package promtext reads the Prometheus text exposition format: enough of a /metrics page for
// the load and replay tools to report what the picker measured about itself.
package promtext

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Sample is one series of a scraped metric.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Metrics is one scrape in the Prometheus text exposition format, by metric (series) name:
// a histogram h appears as h_bucket (with "le"), h_sum and h_count.
type Metrics struct {
	Series map[string][]Sample
}

// ParseMetrics reads the Prometheus text format (version 0.0.4). It keeps what a load report
// needs: every sample's name, labels and value; comments, types and timestamps are skipped.
func ParseMetrics(r io.Reader) (*Metrics, error) {
	m := &Metrics{Series: map[string][]Sample{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for ln := 1; sc.Scan(); ln++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, s, err := parseSampleLine(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %v: %q", ln, err, line)
		}
		m.Series[name] = append(m.Series[name], s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

func parseSampleLine(line string) (string, Sample, error) {
	var s Sample
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return "", s, fmt.Errorf("no value")
	}
	name := line[:i]
	rest := line[i:]
	if rest[0] == '{' {
		s.Labels = map[string]string{}
		j := 1
		for {
			for j < len(rest) && (rest[j] == ' ' || rest[j] == ',') {
				j++
			}
			if j >= len(rest) {
				return "", s, fmt.Errorf("unterminated labels")
			}
			if rest[j] == '}' {
				j++
				break
			}
			eq := strings.IndexByte(rest[j:], '=')
			if eq < 0 {
				return "", s, fmt.Errorf("label without '='")
			}
			key := strings.TrimSpace(rest[j : j+eq])
			j += eq + 1
			if j >= len(rest) || rest[j] != '"' {
				return "", s, fmt.Errorf("label %s: value not quoted", key)
			}
			j++
			var val strings.Builder
			for ; j < len(rest) && rest[j] != '"'; j++ {
				c := rest[j]
				if c == '\\' && j+1 < len(rest) {
					j++
					switch rest[j] {
					case 'n':
						c = '\n'
					default:
						c = rest[j]
					}
				}
				val.WriteByte(c)
			}
			if j >= len(rest) {
				return "", s, fmt.Errorf("label %s: unterminated value", key)
			}
			j++ // closing quote
			s.Labels[key] = val.String()
		}
		rest = rest[j:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return "", s, fmt.Errorf("no value")
	}
	v, err := parseFloat(fields[0])
	if err != nil {
		return "", s, err
	}
	s.Value = v
	return name, s, nil
}

func parseFloat(s string) (float64, error) {
	switch s {
	case "+Inf", "Inf":
		return math.Inf(1), nil
	case "-Inf":
		return math.Inf(-1), nil
	case "NaN":
		return math.NaN(), nil
	}
	return strconv.ParseFloat(s, 64)
}

// Has reports whether the scrape holds a series named name.
func (m *Metrics) Has(name string) bool { return m != nil && len(m.Series[name]) > 0 }

// Sum returns the sum of the named metric over all its series (0 when absent).
func (m *Metrics) Sum(name string) float64 {
	if m == nil {
		return 0
	}
	var sum float64
	for _, s := range m.Series[name] {
		sum += s.Value
	}
	return sum
}

// Value returns the named metric's value, summed over its series, or NaN when absent: for
// reports that must tell "0" from "not exported".
func (m *Metrics) Value(name string) float64 {
	if !m.Has(name) {
		return math.NaN()
	}
	return m.Sum(name)
}

// Bucket is one cumulative histogram bucket: Count observations were ≤ UpperBound.
type Bucket struct {
	UpperBound float64
	Count      float64
}

// Histogram returns the cumulative buckets of histogram name (the name without _bucket),
// summed over its series, sorted by upper bound; nil when absent.
func (m *Metrics) Histogram(name string) []Bucket {
	if m == nil {
		return nil
	}
	byLE := map[float64]float64{}
	for _, s := range m.Series[name+"_bucket"] {
		le, err := parseFloat(s.Labels["le"])
		if err != nil {
			continue
		}
		byLE[le] += s.Value
	}
	if len(byLE) == 0 {
		return nil
	}
	out := make([]Bucket, 0, len(byLE))
	for le, c := range byLE {
		out = append(out, Bucket{UpperBound: le, Count: c})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UpperBound < out[j].UpperBound })
	return out
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
	resp, err := s.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", s.URL, resp.Status)
	}
	return ParseMetrics(resp.Body)
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
