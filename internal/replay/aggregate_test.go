package replay

import (
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func summary(scenario, workload, policy string, seed uint64, hit, p50, p90, p99 float64) *Summary {
	return &Summary{Scenario: scenario, Workload: workload, Policy: policy, Seed: seed, HitRatio: hit,
		TTFT: Quantiles{P50: Num(p50), P90: Num(p90), P99: Num(p99)}, PredictedHitRatio: Num(math.NaN())}
}

// TestAggregatesOverSeeds: medians and worst values over seeds, and ratios to the references
// on the same seeds, taken from another scenario when the scenario says so.
func TestAggregatesOverSeeds(t *testing.T) {
	var rs []*Summary
	// kvpick's p90 over three seeds: 0.1, 0.3, 0.2 → median 0.2, worst 0.3; precise's 0.1, 0.1,
	// 0.4 → ratios 1, 3, 0.5 → median 1, worst 3.
	for i, v := range []struct{ kv, pr, hitKV, hitPr float64 }{{0.1, 0.1, 0.8, 0.8}, {0.3, 0.1, 0.6, 0.9}, {0.2, 0.4, 0.9, 0.9}} {
		seed := uint64(i + 1)
		rs = append(rs, summary("s", "w", Precise, seed, v.hitPr, v.pr/2, v.pr, 2*v.pr), summary("s", "w", KVPick, seed, v.hitKV, v.kv/2, v.kv, 2*v.kv))
		rs = append(rs, summary("x10", "w", KVPick, seed, v.hitKV, v.kv, v.kv, v.kv))
	}
	aggs := Aggregates(rs, []Scenario{{Name: "s"}, {Name: "x10", BaselinesFrom: "s"}})
	if len(aggs) != 3 {
		t.Fatalf("%d aggregates", len(aggs))
	}
	kv := aggs[1]
	if kv.Policy != KVPick || len(kv.Seeds) != 3 || kv.TTFT.P90.Median != 0.2 || kv.TTFT.P90.Worst != 0.3 ||
		kv.HitRatio.Median != 0.8 || kv.HitRatio.Worst != 0.6 {
		t.Fatalf("kvpick: %+v", kv)
	}
	v := kv.Versus[Precise]
	if v == nil || math.Abs(float64(v.TTFT.P90.Median)-1) > 1e-9 || math.Abs(float64(v.TTFT.P90.Worst)-3) > 1e-9 {
		t.Fatalf("versus precise: %+v", v)
	}
	// hit ratios 1, 0.6/0.9, 1: worst is the smallest.
	if math.Abs(float64(v.HitRatio.Worst)-2.0/3) > 1e-9 {
		t.Fatalf("hit ratio versus precise: %+v", v.HitRatio)
	}
	if kv.Versus[GIE] != nil || aggs[0].Versus[Precise] != nil {
		t.Fatal("a reference that did not run, or a policy against itself")
	}
	if x := aggs[2]; x.Scenario != "x10" || x.Versus[Precise] == nil || math.Abs(float64(x.Versus[Precise].TTFT.P50.Worst)-6) > 1e-9 {
		t.Fatalf("x10 against s's precise: %+v", x.Versus[Precise])
	}
	// Two seeds: the median is the mean of the middle two.
	if s := spread([]float64{1, 4}, true); s.Median != 2.5 || s.Worst != 4 {
		t.Fatalf("spread %+v", s)
	}
	if s := spread([]float64{math.NaN()}, true); !math.IsNaN(float64(s.Median)) {
		t.Fatalf("spread of nothing measured %+v", s)
	}
}

func TestParseKVBlocks(t *testing.T) {
	got, err := ParseKVBlocks("768-1856", 8)
	if err != nil {
		t.Fatal(err)
	}
	// Evenly spaced from 768 to 1,856: steps of 155.4, rounded.
	want := map[int]bool{768: true, 923: true, 1079: true, 1234: true, 1390: true, 1545: true, 1701: true, 1856: true}
	for _, b := range got {
		if !want[b] {
			t.Fatalf("%v: %d is not one of the evenly spaced sizes", got, b)
		}
		delete(want, b)
	}
	if len(want) != 0 || got[0] == 768 {
		t.Fatalf("%v: missing %v, or engine 0 got the smallest", got, want)
	}
	again, _ := ParseKVBlocks("768-1856", 8)
	for i := range got {
		if got[i] != again[i] {
			t.Fatalf("two parses differ: %v %v", got, again)
		}
	}
	if g, _ := ParseKVBlocks("2048", 3); len(g) != 3 || g[0] != 2048 || g[2] != 2048 {
		t.Fatalf("one size: %v", g)
	}
	if g, _ := ParseKVBlocks("1,2,3", 3); g[0] != 1 || g[1] != 2 || g[2] != 3 {
		t.Fatalf("list: %v", g)
	}
	if g, err := ParseKVBlocks("", 3); g != nil || err != nil {
		t.Fatalf("empty: %v %v", g, err)
	}
	for _, bad := range []string{"1,2", "10-5", "abc", "0", "-5", "1.5"} {
		if _, err := ParseKVBlocks(bad, 3); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestEngineConfigsShareTheSmallestMaxModelLen(t *testing.T) {
	cfgs := EngineConfigs(EngineConfig(), 3, []int{768, 1856, 1000})
	for i, want := range []int{768, 1856, 1000} {
		if cfgs[i].NumGPUBlocks != want || cfgs[i].MaxModelLen != 768*16 {
			t.Fatalf("engine %d: %d blocks, max model len %d", i, cfgs[i].NumGPUBlocks, cfgs[i].MaxModelLen)
		}
	}
	if same := EngineConfigs(EngineConfig(), 2, nil); same[0] != same[1] || same[0].NumGPUBlocks != EngineConfig().NumGPUBlocks {
		t.Fatal("without sizes every engine is the engine model")
	}
}

// TestSVGFitsItsTitleWithOneWorkload: one workload makes a narrow plot; the picture still
// holds the title, subtitle and legend (bold 15 px Helvetica is ~8 px a character).
func TestSVGFitsItsTitleWithOneWorkload(t *testing.T) {
	rep := &Report{Params: ReportParams{Engines: 8, Seeds: []uint64{1}, Clock: ClockVirtual}}
	for _, p := range PolicyNames() {
		rep.Results = append(rep.Results, summary("default", "hot-prefix", p, 1, 0.5, 0.01, 0.05, 0.2))
	}
	rep.Aggregates = Aggregates(rep.Results, []Scenario{{Name: "default"}})
	dir := t.TempDir()
	files, err := rep.WriteSVG(dir)
	if err != nil || len(files) != 2 {
		t.Fatal(files, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "ttft.svg"))
	if err != nil {
		t.Fatal(err)
	}
	svg := string(b)
	width, _ := strconv.Atoi(regexp.MustCompile(`<svg [^>]*width="(\d+)"`).FindStringSubmatch(svg)[1])
	title := regexp.MustCompile(`font-weight="bold">([^<]*)<`).FindStringSubmatch(svg)[1]
	if float64(width) < 78+8*float64(len(title)) {
		t.Fatalf("width %d for a %d-character title", width, len(title))
	}
	for _, want := range []string{"p99", "p90", "gie", "sglang"} {
		if !strings.Contains(svg, want) {
			t.Fatalf("ttft.svg lacks %q", want)
		}
	}
}

// TestSmallCachesScaleTheLoadWithTheCaches: 768-1,856 blocks evenly spread average 1,312, so
// the small-caches scenario runs every workload at 1,312 / 4,096 = 0.3203 of its requests and
// rate: shared-prefix 1,600 → 513 requests (512.5 rounded), 28.8 → 9.225 req/s.
func TestSmallCachesScaleTheLoadWithTheCaches(t *testing.T) {
	o := &Options{Engines: 8}
	var small Scenario
	for _, sc := range StandardScenarios() {
		if sc.Name == "small-caches" {
			small = sc
		}
	}
	k, err := o.size("shared-prefix", small, EngineConfig())
	if err != nil {
		t.Fatal(err)
	}
	if k.requests != 513 || math.Abs(k.rate-9.225) > 1e-9 {
		t.Fatalf("small caches: %d requests at %v/s, want 513 at 9.225", k.requests, k.rate)
	}
	// small-caches-busy: the default load × 0.55 on the same caches, 1,600 → 880 requests,
	// 28.8 → 15.84 req/s.
	busy := StandardScenarios()[len(StandardScenarios())-1]
	if k, err := o.size("shared-prefix", busy, EngineConfig()); err != nil || busy.Name != "small-caches-busy" ||
		k.requests != 880 || math.Abs(k.rate-15.84) > 1e-9 {
		t.Fatalf("%s: %d requests at %v/s (%v), want 880 at 15.84", busy.Name, k.requests, k.rate, err)
	}
	// The heavy suite: × 0.7 and × 0.85 on the same caches, 1,120 and 1,360 requests at 20.16
	// and 24.48 req/s.
	for i, want := range []struct {
		name     string
		requests int
		rate     float64
	}{{"small-caches-heavy", 1120, 20.16}, {"small-caches-overload", 1360, 24.48}} {
		sc := HeavyScenarios()[i]
		if k, err := o.size("shared-prefix", sc, EngineConfig()); err != nil || sc.Name != want.name || sc.KVBlocks != SmallCaches ||
			k.requests != want.requests || math.Abs(k.rate-want.rate) > 1e-9 {
			t.Fatalf("%s: %d requests at %v/s (%v), want %s: %d at %v", sc.Name, k.requests, k.rate, err, want.name, want.requests, want.rate)
		}
	}
	if k, _ := o.size("shared-prefix", DefaultScenario(), EngineConfig()); k.requests != 0 || k.rate != 0 {
		t.Fatalf("default scenario: %+v, want the workload's own defaults (0)", k)
	}
}
