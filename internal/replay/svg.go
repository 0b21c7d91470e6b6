package replay

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

var policyColors = map[string]string{
	RoundRobin:  "#9a9a9a",
	LeastLoaded: "#e0a030",
	Precise:     "#3f9a62",
	GIE:         "#a04db0",
	SGLang:      "#c8553d",
	KVPick:      "#3568c8",
}

var extraColors = []string{"#2a9db0", "#7a6a4f", "#5d5d9e", "#9e5d7a"}

// WriteSVG writes the report's charts into dir, per scenario ("<scenario>-" prefixed when
// there are several): hit-ratio.svg (prefix-cache hit ratio per workload and policy) and
// ttft.svg (TTFT p50, p90 and p99 per workload and policy, log scale). With several seeds
// every bar is the median over them.
func (r *Report) WriteSVG(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var scenarios []string
	for _, a := range r.Aggregates {
		if !slices.Contains(scenarios, a.Scenario) {
			scenarios = append(scenarios, a.Scenario)
		}
	}
	var files []string
	for _, sc := range scenarios {
		var groups, series []string
		idx := map[[2]string]*Aggregate{}
		for _, a := range r.Aggregates {
			if a.Scenario != sc {
				continue
			}
			if !slices.Contains(groups, a.Workload) {
				groups = append(groups, a.Workload)
			}
			if !slices.Contains(series, a.Policy) {
				series = append(series, a.Policy)
			}
			idx[[2]string{a.Workload, a.Policy}] = a
		}
		get := func(f func(*Aggregate) float64) [][]float64 {
			out := make([][]float64, len(groups))
			for g, w := range groups {
				out[g] = make([]float64, len(series))
				for k, p := range series {
					out[g][k] = math.NaN()
					if a := idx[[2]string{w, p}]; a != nil {
						out[g][k] = f(a)
					}
				}
			}
			return out
		}
		sub := fmt.Sprintf("scenario %s; %d engines, %s clock, seeds %s", sc, r.Params.Engines, r.Params.Clock, seedList(r.Params.Seeds))
		if len(r.Params.Seeds) > 1 {
			sub += " (medians)"
		}
		hit := barChart{
			title: "Prefix-cache hit ratio (cached / prompt tokens, measured by the engines)", subtitle: sub,
			yLabel: "hit ratio (%)", groups: groups, series: series,
			layers: []layer{{values: get(func(a *Aggregate) float64 { return 100 * float64(a.HitRatio.Median) }), opacity: 1}},
			labels: true, yMax: 100, ticks: []float64{0, 20, 40, 60, 80, 100},
			tickFmt: func(v float64) string { return fmt.Sprintf("%.0f", v) },
		}
		ttft := barChart{
			title: "Time to first token (simulated): p50 solid, p90 and p99 lighter behind", subtitle: sub + "; log scale",
			yLabel: "TTFT (ms)", groups: groups, series: series,
			layers: []layer{
				{values: get(func(a *Aggregate) float64 { return 1000 * float64(a.TTFT.P99.Median) }), opacity: 0.2, name: "p99"},
				{values: get(func(a *Aggregate) float64 { return 1000 * float64(a.TTFT.P90.Median) }), opacity: 0.45, name: "p90"},
				{values: get(func(a *Aggregate) float64 { return 1000 * float64(a.TTFT.P50.Median) }), opacity: 1, name: "p50"},
			},
			log: true, tickFmt: fmtMillis,
		}
		prefix := ""
		if len(scenarios) > 1 {
			prefix = sc + "-"
		}
		for _, c := range []struct {
			name  string
			chart *barChart
		}{{"hit-ratio.svg", &hit}, {"ttft.svg", &ttft}} {
			p := filepath.Join(dir, prefix+c.name)
			if err := os.WriteFile(p, []byte(c.chart.render()), 0o644); err != nil {
				return nil, err
			}
			files = append(files, p)
		}
	}
	return files, nil
}

func seedList(seeds []uint64) string {
	parts := make([]string, len(seeds))
	for i, s := range seeds {
		parts[i] = fmt.Sprint(s)
	}
	return strings.Join(parts, ",")
}

func fmtMillis(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", v/1000)
	case v >= 1:
		return fmt.Sprintf("%gms", v)
	}
	return fmt.Sprintf("%gµs", v*1000)
}

// barChart is a grouped bar chart: one group per workload, one bar per policy, each bar drawn
// as layers from the back (the largest values, lightest) to the front.
type barChart struct {
	title, subtitle, yLabel string
	groups, series          []string
	layers                  []layer
	labels                  bool // print the front layer's value above its bar
	log                     bool
	yMax                    float64
	ticks                   []float64
	tickFmt                 func(float64) string
}

// layer is one value per group and series, drawn with an opacity.
type layer struct {
	values  [][]float64 // [group][series]
	opacity float64
	name    string
}

// textWidth estimates the width of text in pixels at a font size (Helvetica averages a little
// over half the size per character; bold and capitals are wider, so this errs large).
func textWidth(s string, size float64) float64 { return 0.6 * size * float64(len([]rune(s))) }

func (c *barChart) render() string {
	const (
		barW, gap, groupPad = 22.0, 2.0, 34.0
		left, right, top    = 78.0, 24.0, 86.0
		plotH, bottom       = 300.0, 64.0
	)
	ns := float64(len(c.series))
	groupW := ns*(barW+gap) - gap + groupPad
	plotW := math.Max(groupW*float64(len(c.groups)), 360)
	// The title, subtitle and legend start at the plot's left edge: the picture is wide enough
	// for the longest of them, however few workloads there are.
	legendW := 0.0
	for _, s := range c.series {
		legendW += 28 + 7*float64(len(s))
	}
	if len(c.layers) > 1 {
		legendW += 16 + textWidth(c.layerLegend(), 12)
	}
	plotW = math.Max(plotW, math.Max(legendW, math.Max(textWidth(c.title, 15), textWidth(c.subtitle, 12))))
	width, height := left+plotW+right, top+plotH+bottom

	// The y scale.
	lo, hi := 0.0, c.yMax
	if c.log {
		mn, mx := math.Inf(1), 0.0
		for _, l := range c.layers {
			for _, row := range l.values {
				for _, v := range row {
					if v > 0 && !math.IsNaN(v) {
						mn, mx = math.Min(mn, v), math.Max(mx, v)
					}
				}
			}
		}
		if mx == 0 {
			mn, mx = 1, 10
		}
		lo = math.Pow(10, math.Floor(math.Log10(mn)))
		hi = math.Pow(10, math.Ceil(math.Log10(mx)))
		if hi <= lo {
			hi = lo * 10
		}
		c.ticks = nil
		for t := lo; t <= hi*1.0001; t *= 10 {
			c.ticks = append(c.ticks, t)
		}
	} else if hi == 0 {
		for _, l := range c.layers {
			for _, row := range l.values {
				for _, v := range row {
					if !math.IsNaN(v) {
						hi = math.Max(hi, v)
					}
				}
			}
		}
		if hi == 0 {
			hi = 1
		}
	}
	y := func(v float64) float64 {
		var f float64
		if c.log {
			if v <= lo {
				return top + plotH
			}
			f = math.Log10(v/lo) / math.Log10(hi/lo)
		} else {
			f = v / hi
		}
		f = math.Max(0, math.Min(1, f))
		return top + plotH*(1-f)
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", left, esc(c.title))
	fmt.Fprintf(&b, `<text x="%.0f" y="42" fill="#555">%s</text>`+"\n", left, esc(c.subtitle))

	// Legend.
	lx := left
	for k, s := range c.series {
		fmt.Fprintf(&b, `<rect x="%.0f" y="56" width="12" height="12" fill="%s"/>`, lx, c.color(k))
		fmt.Fprintf(&b, `<text x="%.0f" y="66">%s</text>`+"\n", lx+16, esc(s))
		lx += 28 + 7*float64(len(s))
	}
	if len(c.layers) > 1 {
		fmt.Fprintf(&b, `<rect x="%.0f" y="56" width="12" height="12" fill="#888" fill-opacity="0.35"/>`, lx)
		fmt.Fprintf(&b, `<text x="%.0f" y="66">%s</text>`+"\n", lx+16, esc(c.layerLegend()))
	}

	// Axes and grid.
	for _, t := range c.ticks {
		ty := y(t)
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#e3e3e3"/>`, left, left+plotW, ty, ty)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end" fill="#333">%s</text>`+"\n", left-6, ty+4, esc(c.tickFmt(t)))
	}
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="#333"/>`, left, left+plotW, top+plotH, top+plotH)
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="#333"/>`+"\n", left, left, top, top+plotH)
	fmt.Fprintf(&b, `<text transform="translate(18 %.0f) rotate(-90)" text-anchor="middle" fill="#333">%s</text>`+"\n",
		top+plotH/2, esc(c.yLabel))

	// Bars.
	for g, name := range c.groups {
		gx := left + groupPad/2 + float64(g)*groupW
		for k := range c.series {
			x := gx + float64(k)*(barW+gap)
			for li, l := range c.layers {
				v := l.values[g][k]
				if math.IsNaN(v) {
					continue
				}
				what := esc(name) + " " + esc(c.series[k])
				if l.name != "" {
					what += " " + esc(l.name)
				}
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.0f" height="%.1f" fill="%s" fill-opacity="%g"><title>%s: %s</title></rect>`+"\n",
					x, y(v), barW, top+plotH-y(v), c.color(k), l.opacity, what, esc(c.tickFmt(v)))
				if c.labels && li == len(c.layers)-1 {
					fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10" fill="#222">%.0f</text>`+"\n",
						x+barW/2, y(v)-3, v)
				}
			}
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#222">%s</text>`+"\n",
			gx+(groupW-groupPad)/2, top+plotH+18, esc(name))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" fill="#333">workload</text>`+"\n", left+plotW/2, top+plotH+44)
	b.WriteString("</svg>\n")
	return b.String()
}

// layerLegend names the layers, front first.
func (c *barChart) layerLegend() string {
	var behind []string
	for i := len(c.layers) - 2; i >= 0; i-- {
		behind = append(behind, c.layers[i].name)
	}
	return c.layers[len(c.layers)-1].name + " solid, " + strings.Join(behind, " and ") + " lighter"
}

func (c *barChart) color(k int) string {
	if col, ok := policyColors[c.series[k]]; ok {
		return col
	}
	return extraColors[k%len(extraColors)]
}

func esc(s string) string { return html.EscapeString(s) }
