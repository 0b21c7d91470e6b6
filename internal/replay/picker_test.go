package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/freeport"
	"github.com/kvpick/kvpick/internal/promtext"
)

var (
	pickerOnce sync.Once
	pickerBin  string
	pickerErr  error
	pickerDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if pickerDir != "" {
		os.RemoveAll(pickerDir)
	}
	os.Exit(code)
}

// picker builds the real picker binary once per test binary.
func picker(t *testing.T) string {
	t.Helper()
	pickerOnce.Do(func() {
		if pickerDir, pickerErr = os.MkdirTemp("", "replay-test-"); pickerErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		var flags []string
		if raceEnabled {
			// Reuses the dependencies the test binary was built with (a cold build of the
			// picker alone takes much longer), and checks the picker for races on the way.
			flags = append(flags, "-race")
		}
		pickerBin, pickerErr = BuildPicker(ctx, pickerDir, flags...)
	})
	if pickerErr != nil {
		t.Fatal(pickerErr)
	}
	return pickerBin
}

// testBase is a loopback range of this test's own, so that tests running at the same time in
// other processes do not collide.
func testBase() EndpointBase {
	return EndpointBase{A: byte(100 + rand.IntN(150)), B: byte(rand.IntN(200)), Port: 8000}
}

// startKVPick binds n engine addresses and starts the real picker in front of them with the
// replay's settings for clock.
func startKVPick(t *testing.T, n int, clock string, capacity int) (*Picker, *Endpoints, *PickerSetup) {
	t.Helper()
	return startKVPickAt(t, testBase(), n, clock, capacity)
}

// startKVPickAt is startKVPick on the given addresses.
func startKVPickAt(t *testing.T, base EndpointBase, n int, clock string, capacity int) (*Picker, *Endpoints, *PickerSetup) {
	t.Helper()
	bin := picker(t)
	eps, err := ListenEndpointsWait(n, base, true, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eps.Close() })
	setup, err := PickerConfig(PickerOptions{Endpoints: eps.Addrs(), Clock: clock, TimeScale: 20, CapacityBlocks: capacity})
	if err != nil {
		t.Fatal(err)
	}
	p, err := StartPicker(context.Background(), bin, setup.Config, t.TempDir(), PickerRun{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Error(err)
		}
	})
	return p, eps, setup
}

// TestEndToEndAgainstThePicker runs a small sharing workload through the real picker binary in
// lockstep, with every baseline, and checks the report.
func TestEndToEndAgainstThePicker(t *testing.T) {
	bin := picker(t)
	rep, err := Benchmark(context.Background(), Options{
		Workloads: []string{"shared-prefix"}, Policies: []string{RoundRobin, Precise, GIE, SGLang, KVPick},
		Seeds: []uint64{1}, Engines: 4, Requests: 480, Clock: ClockVirtual, PickerBin: bin,
	})
	if err != nil {
		t.Fatal(err)
	}
	setup := rep.Pickers["default"]
	if len(rep.Results) != 5 || setup == nil || setup.Config.Pool.HealthCheck.Interval != 0 || len(setup.Config.Pool.Endpoints) != 4 {
		t.Fatalf("report: %d results, picker setup %+v", len(rep.Results), setup)
	}
	rr, kv := rep.Results[0], rep.Results[4]
	for _, s := range rep.Results {
		if s.Completed != 480 || s.Errors != 0 || s.TTFT.P50 <= 0 || s.TTFT.P99 < s.TTFT.P50 || s.OutputTokPerSec <= 0 ||
			s.ReqPerSec <= 0 || s.RequestImbalance < 1 || s.Util <= 0 || s.Util > 1 || s.Scenario != "default" || s.Seed != 1 {
			t.Fatalf("%s: insane numbers %+v", s.Policy, s)
		}
		// 80% streamed by default: 384 of 480 give or take the draw.
		if s.Streamed < 330 || s.Streamed > 440 {
			t.Errorf("%s: %d of 480 requests streamed, want ~80%%", s.Policy, s.Streamed)
		}
	}
	if kv.HitRatio < rr.HitRatio+0.2 {
		t.Errorf("kvpick hit %.2f; round-robin %.2f: no affinity", kv.HitRatio, rr.HitRatio)
	}
	if kv.Scrape == nil || kv.Scrape.Waited == 0 || kv.Scrape.Note != "" {
		t.Errorf("the virtual clock did not wait for the picker's scrapes: %+v", kv.Scrape)
	}
	if p := float64(kv.PredictedHitRatio); !(p > 0.3 && p <= 1) {
		t.Fatalf("predicted hit ratio %v", p)
	}
	if d := float64(kv.Decision.P50); !(d > 0) || !(kv.Decision.P99 >= kv.Decision.P50) {
		t.Fatalf("decision latency %+v", kv.Decision)
	}
	if r := float64(kv.RoundTrip.P50); !(r > 0) || kv.RoundTrip.P99 < kv.RoundTrip.P50 {
		t.Fatalf("round trip %+v", kv.RoundTrip)
	}
	if rss := float64(kv.PickerRSSBytes); !(rss > 1<<20 && rss < 1<<30) {
		t.Fatalf("picker RSS %v", rss)
	}
	if !math.IsNaN(float64(rr.Decision.P50)) {
		t.Fatalf("round-robin has a picker decision latency")
	}
	if len(rep.Aggregates) != 5 || rep.Aggregates[4].Versus[Precise] == nil || rep.Aggregates[4].Versus[GIE] == nil ||
		rep.Aggregates[4].Versus[LeastLoaded] != nil {
		t.Fatalf("aggregates: %d, kvpick's references %v", len(rep.Aggregates), rep.Aggregates[4].Versus)
	}

	var out strings.Builder
	rep.WriteHeader(&out)
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteSummary(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kvpick", "shared-prefix", "sglang", "gie", "pool.healthCheck.interval = 0s (was 2s)",
		"pool.metrics.refreshInterval = 1ms (was 50ms)", "xprecise p50/p90/p99"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	dir := t.TempDir()
	if err := rep.WriteJSON(filepath.Join(dir, "r.json")); err != nil {
		t.Fatal(err)
	}
	var back Report
	b, _ := os.ReadFile(filepath.Join(dir, "r.json"))
	if err := json.Unmarshal(b, &back); err != nil || len(back.Results) != 5 || back.Results[4].HitRatio != kv.HitRatio {
		t.Fatalf("JSON round trip: %v", err)
	}
	files, err := rep.WriteSVG(dir)
	if err != nil || len(files) != 2 {
		t.Fatal(err)
	}
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if !strings.HasPrefix(string(b), "<svg") || !strings.Contains(string(b), "kvpick") || !strings.Contains(string(b), "shared-prefix") {
			t.Fatalf("%s is not a labelled SVG", f)
		}
	}
}

// TestVirtualRunsWithThePickerRepeat: with the scrape handshake, the real picker routes on the
// same metrics at the same simulated instants in two runs, so two virtual runs on the same
// addresses (the picker breaks ties by hashing them) route every request alike and measure the
// same numbers.
func TestVirtualRunsWithThePickerRepeat(t *testing.T) {
	w := generate(t, "multi-turn", Spec{Seed: 5, Engines: 3, Requests: 120})
	base := testBase()
	var runs [][]Record
	for range 2 {
		p, eps, _ := startKVPickAt(t, base, 3, ClockVirtual, 0)
		res, err := Run(context.Background(), RunConfig{Workload: w, Policy: KVPick, Engines: 3, Clock: ClockVirtual, Picker: p, Endpoints: eps})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Stop(); err != nil {
			t.Fatal(err)
		}
		eps.Close()
		if res.Scrape == nil || res.Scrape.Waited == 0 {
			t.Fatalf("no scrape handshake: %+v", res.Scrape)
		}
		runs = append(runs, res.Records)
	}
	for i := range runs[0] {
		a, b := runs[0][i], runs[1][i]
		if a.Engine != b.Engine || a.Status != b.Status || a.Result.TTFT() != b.Result.TTFT() || a.Result.CachedTokens != b.Result.CachedTokens {
			t.Fatalf("request %d: engine %d/%d, TTFT %v/%v, cached %d/%d", i, a.Engine, b.Engine, a.Result.TTFT(), b.Result.TTFT(),
				a.Result.CachedTokens, b.Result.CachedTokens)
		}
	}
}

// affinityWorkload: group 0, 40 requests sharing a 1,000-token system prompt, one every 0.5 s,
// among unique background requests with long answers that keep the engines' loads uneven.
func affinityWorkload(t *testing.T, failGroup bool) *Workload {
	t.Helper()
	ans, err := newAnswerer(EngineConfig())
	if err != nil {
		t.Fatal(err)
	}
	g := &gen{spec: Spec{Seed: 1, Engine: EngineConfig()}, rng: newRand(1, "affinity"), errs: newRand(1, "affinity/errors"),
		streams: newRand(1, "affinity/stream"), mix: DefaultStreaming, ans: ans, w: &Workload{Name: "affinity"}}
	system := text(newRand(1, "affinity/system"), 1000)
	bg := g.poisson(200, 8)
	k := 0
	for i := range 40 {
		at := time.Duration(i) * 500 * time.Millisecond
		for ; k < len(bg) && bg[k] < at; k++ {
			msgs := []chatMessage{{Role: "user", Content: fmt.Sprintf("[%d] ", k) + text(g.rng, 200)}}
			if _, err := g.add(msgs, nil, 400, bg[k], -1, 0, -1); err != nil {
				t.Fatal(err)
			}
		}
		msgs := []chatMessage{{Role: "system", Content: system}, {Role: "user", Content: fmt.Sprintf("question %d: %s", i, text(g.rng, 30))}}
		id, err := g.add(msgs, nil, 50, at, -1, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		g.w.Requests[id].Fail = failGroup
	}
	return g.w
}

// TestFailedRequestsCreateNoAffinity: when every request of a group fails (500 before any
// output), the picker learns nothing from them, so the group's later requests do not stick to
// the endpoints that failed them; when they succeed, they do.
func TestFailedRequestsCreateNoAffinity(t *testing.T) {
	ctx := context.Background()
	run := func(fail bool) (share float64, predictedHits float64) {
		p, eps, _ := startKVPick(t, 4, ClockVirtual, 0)
		w := affinityWorkload(t, fail)
		res, err := Run(ctx, RunConfig{Workload: w, Policy: KVPick, Engines: 4, Clock: ClockVirtual, Picker: p, Endpoints: eps})
		if err != nil {
			t.Fatal(err)
		}
		counts := make([]int, 4)
		n := 0
		for i, r := range w.Requests {
			rec := res.Records[i]
			if r.Group != 0 {
				if !rec.OK() {
					t.Fatalf("background request %d failed: %+v", i, rec)
				}
				continue
			}
			if want := 200; fail {
				want = 500
				if rec.Status != want || rec.Err != "" {
					t.Fatalf("group request %d: status %d err %q, want %d", i, rec.Status, rec.Err, want)
				}
			} else if rec.Status != want {
				t.Fatalf("group request %d: status %d", i, rec.Status)
			}
			counts[rec.Engine]++
			n++
		}
		sc, err := ScrapeMetrics(ctx, p.MetricsAddr)
		if err != nil {
			t.Fatal(err)
		}
		hits, _ := value(sc, "kvpick_prefix_predicted_hit_blocks_total")
		// The share on the two engines that got most of them: the picker lets a prefix that
		// several requests wait for spread to a second engine.
		sorted := slices.Clone(counts)
		slices.Sort(sorted)
		top := sorted[len(sorted)-1] + sorted[len(sorted)-2]
		t.Logf("fail=%v: group requests per engine %v, predicted hit blocks %v", fail, counts, hits)
		return float64(top) / float64(n), hits
	}
	okShare, okHits := run(false)
	failShare, failHits := run(true)
	// 4 engines: without affinity two engines get about half; with it nearly all.
	if okShare < 0.85 || okHits == 0 {
		t.Fatalf("control: successful requests of a group should stick (share %.2f, predicted hits %v)", okShare, okHits)
	}
	if failHits != 0 {
		t.Fatalf("failed requests created %v predicted hit blocks", failHits)
	}
	// Where the failing group's requests go is then decided by load and, between endpoints that
	// score alike (frequent here: failed requests leave no load behind), by the rendezvous hash
	// of the prompt's first block — a concentration that replicas agree on, not affinity: the
	// picker predicted no hit for any of them (above).
	t.Logf("share of the group on its two busiest engines: %.0f%% failing, %.0f%% succeeding", 100*failShare, 100*okShare)
}

// TestRealClockAgainstThePicker exercises the default mode: concurrent streams, live metrics.
func TestRealClockAgainstThePicker(t *testing.T) {
	bin := picker(t)
	rep, err := Benchmark(context.Background(), Options{
		Workloads: []string{"multi-turn"}, Policies: []string{KVPick}, Seeds: []uint64{2}, Engines: 3, Requests: 90, Rate: 30,
		ErrorRate: 0.1, Clock: ClockReal, TimeScale: 20, PickerBin: bin,
		Scenarios: []Scenario{{Name: "mixed", Timing: TimingVLLM, Streaming: StreamMix{Fraction: 0.5, UsageFraction: 0.5}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Results[0]
	if s.Completed+s.ErrorsByKind["injected"] != 90 || s.ErrorsByKind["injected"] == 0 || s.HitRatio < 0.3 || s.RoundTrip.P50 <= 0 {
		t.Fatalf("real clock: %+v", s)
	}
	if st := rep.Pickers["mixed"]; st == nil || st.Config.Pool.Metrics.RefreshInterval.D() != 50*time.Millisecond/20 {
		t.Fatalf("real clock at x20: the picker's refresh interval should be 50ms/20: %+v", st)
	}
}

func TestPickerConfigOverridesOnlyTheReplaySettings(t *testing.T) {
	def := config.Default()
	defCapacity, _ := pluginParam(def, prefixScorer, capacityKey)
	keys := func(st *PickerSetup) []string {
		var k []string
		for _, o := range st.Overrides {
			k = append(k, o.Key+"="+o.Value)
		}
		return k
	}
	for _, tc := range []struct {
		name     string
		o        PickerOptions
		want     []string
		capacity string
	}{
		{"virtual clock", PickerOptions{Endpoints: []string{"127.0.0.1:1", "127.0.0.1:2"}, Clock: ClockVirtual},
			[]string{"pool.endpoints=[127.0.0.1:1,127.0.0.1:2]", "pool.healthCheck.interval=0s",
				"pool.metrics.refreshInterval=1ms", "pool.metrics.stalenessThreshold=1h0m0s"}, defCapacity},
		// 50 ms and 500 ms of simulated time at 10x: 5 ms and 50 ms of wall time.
		{"real clock", PickerOptions{Endpoints: []string{"127.0.0.1:1"}, Clock: ClockReal, TimeScale: 10},
			[]string{"pool.endpoints=[127.0.0.1:1]", "pool.healthCheck.interval=0s",
				"pool.metrics.refreshInterval=5ms", "pool.metrics.stalenessThreshold=50ms"}, defCapacity},
		{"mis-sized capacity", PickerOptions{Endpoints: []string{"127.0.0.1:1"}, Clock: ClockVirtual, CapacityBlocks: 13120},
			[]string{"pool.endpoints=[127.0.0.1:1]", "pool.healthCheck.interval=0s",
				"pool.metrics.refreshInterval=1ms", "pool.metrics.stalenessThreshold=1h0m0s",
				"plugins.prefix-scorer.lruCapacityPerEndpoint=13120"}, "13120"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := PickerConfig(tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if got := keys(st); !slices.Equal(got, tc.want) {
				t.Fatalf("overrides %q, want %q", got, tc.want)
			}
			if got, _ := pluginParam(st.Config, prefixScorer, capacityKey); got != tc.capacity {
				t.Fatalf("capacity %s, want %s", got, tc.capacity)
			}
			// Everything else is the default configuration.
			c := *st.Config
			c.Pool.Endpoints, c.Pool.HealthCheck.Interval, c.Pool.Metrics = def.Pool.Endpoints, def.Pool.HealthCheck.Interval, def.Pool.Metrics
			c.Plugins = def.Plugins
			a, _ := json.Marshal(c)
			b, _ := json.Marshal(def)
			if string(a) != string(b) {
				t.Fatalf("more than the overrides changed:\n%s\n%s", a, b)
			}
		})
	}
	own := filepath.Join(t.TempDir(), "picker.yaml")
	if err := os.WriteFile(own, []byte("plugins:\n- name: prefix-scorer\n  parameters: {lruCapacityPerEndpoint: 1234}\n- name: max-score-picker\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := PickerConfig(PickerOptions{File: own, Endpoints: []string{"127.0.0.1:1"}, Clock: ClockVirtual})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := pluginParam(st.Config, prefixScorer, capacityKey); got != "1234" || len(st.Config.Plugins) != 2 {
		t.Fatalf("the user's file: capacity %s, %d plugins", got, len(st.Config.Plugins))
	}
}

// TestUsageReportsReachThePicker: the usage a response ends with reaches the real picker over
// ext_proc, in every shape the servers send it: every non-streamed body, the streams that ask
// for it. With cached_tokens on, the picker's measured hit ratio (the servers' cached_tokens
// over the prompts that reported them) is the engines' own; with it off (vLLM's default) the
// picker sees no cached_tokens at all.
func TestUsageReportsReachThePicker(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mix     StreamMix
		omit    bool
		withAll bool // every response carries a usage report
	}{
		{"streams with usage", StreamMix{Fraction: 1, UsageFraction: 1}, false, true},
		{"non-streamed", StreamMix{Fraction: 0}, false, true},
		{"streams without usage", StreamMix{Fraction: 1, UsageFraction: 0}, false, false},
		{"cached_tokens off", StreamMix{Fraction: 0.5, UsageFraction: 1}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mix := tc.mix
			w := generate(t, "shared-prefix", Spec{Seed: 1, Engines: 3, Requests: 150, Streaming: &mix})
			s, m, _ := runAndScrapeKVPick(t, RunConfig{Workload: w, Engines: 3, OmitCachedTokens: tc.omit})
			cached := m.Sum("kvpick_prefix_server_cached_tokens_total")
			prompts := m.Sum("kvpick_prefix_server_prompt_with_cached_tokens_total")
			switch {
			case tc.omit || !tc.withAll:
				if prompts != 0 || cached != 0 {
					t.Fatalf("the picker counted %v cached of %v prompt tokens it was never told about", cached, prompts)
				}
			default:
				if prompts != float64(s.PromptTokens) || cached != float64(s.CachedTokens) {
					t.Fatalf("picker: %v cached of %v prompt tokens; engines: %d of %d", cached, prompts, s.CachedTokens, s.PromptTokens)
				}
			}
		})
	}
}

// runAndScrapeKVPick runs cfg's workload through a picker the replay starts in front of
// cfg.Engines engines on the virtual clock, and returns the run's summary, the picker's metrics
// at the end and the engines.
func runAndScrapeKVPick(t *testing.T, cfg RunConfig) (*Summary, *promtext.Metrics, *Endpoints) {
	t.Helper()
	ctx := context.Background()
	p, eps, _ := startKVPick(t, cfg.Engines, ClockVirtual, 0)
	cfg.Policy, cfg.Clock, cfg.Picker, cfg.Endpoints = KVPick, ClockVirtual, p, eps
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ScrapeMetrics(ctx, p.MetricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	return Summarize(res), m, eps
}

// TestServerHitSharesReachThePicker: the engines' prefix-cache counters, scraped over HTTP as
// vLLM serves them, reach the prefix plugin, which exports per endpoint the share of looked-up
// tokens the server found beside the share its picks were predicted to find.
func TestServerHitSharesReachThePicker(t *testing.T) {
	w := generate(t, "shared-prefix", Spec{Seed: 1, Engines: 3, Requests: 300})
	s, m, eps := runAndScrapeKVPick(t, RunConfig{Workload: w, Engines: 3})
	const server, predicted = "kvpick_prefix_endpoint_server_hit_share", "kvpick_prefix_endpoint_predicted_hit_share"
	if !m.Has(server) || !m.Has(predicted) {
		t.Fatalf("no hit shares exported (server %v, predicted %v)", m.Has(server), m.Has(predicted))
	}
	// Over the last window of each engine against the engines' whole run: shared system prompts
	// are found cached at about the same rate throughout once warm.
	n := float64(len(eps.Addrs()))
	engines := float64(s.CachedTokens) / float64(s.PromptTokens)
	srv, pred := m.Sum(server)/n, m.Sum(predicted)/n
	if srv <= 0 || srv > 1 || math.Abs(srv-engines) > 0.2 {
		t.Fatalf("mean server hit share %.3f, the engines found %.3f of their prompts cached", srv, engines)
	}
	// Logged: the three numbers say how tight the bound is (seed 1: 0.996, 0.998, 0.932).
	t.Logf("server %.3f, predicted %.3f, engines %.3f", srv, pred, engines)
	if pred <= 0 || pred > 1 {
		t.Fatalf("mean predicted hit share %.3f", pred)
	}
}

// TestRealClockPickerScrapesLiveMetrics: on the real clock the picker scrapes every engine's
// address, which answers with the engine's state at that moment.
func TestRealClockPickerScrapesLiveMetrics(t *testing.T) {
	p, eps, setup := startKVPick(t, 2, ClockReal, 0)
	if setup.Config.Pool.Metrics.RefreshInterval.D() != 50*time.Millisecond/20 {
		t.Fatalf("refresh interval %v at x20", setup.Config.Pool.Metrics.RefreshInterval.D())
	}
	w := generate(t, "hot-prefix", Spec{Seed: 1, Engines: 2, Requests: 40, Rate: 20})
	before := []uint64{eps.Fetches(0), eps.Fetches(1)}
	res, err := Run(context.Background(), RunConfig{Workload: w, Policy: KVPick, Engines: 2, Clock: ClockReal, TimeScale: 20,
		Picker: p, Endpoints: eps})
	if err != nil {
		t.Fatal(err)
	}
	if s := Summarize(res); s.Completed != 40 {
		t.Fatalf("%d of 40 completed: %v", s.Completed, s.ErrorsByKind)
	}
	// ~2 s of arrivals and answers at x20 is ~100 ms of wall time or more: dozens of 2.5 ms
	// scrape intervals.
	for i := range 2 {
		if got := eps.Fetches(i) - before[i]; got < 5 {
			t.Fatalf("engine %d's metrics were fetched %d times during the run", i, got)
		}
	}
	if res.Scrape != nil {
		t.Fatal("a real-clock run waited for scrapes")
	}
}

// TestPickerConfigStartsFromThePickerBinarysDefaults: a picker binary built from another commit
// than the replay runs with its own defaults (its --print-default-config), the user's file and
// the replay's settings layered on them; defaults this replay cannot read are an error, not a
// silent fallback to the replay's own.
func TestPickerConfigStartsFromThePickerBinarysDefaults(t *testing.T) {
	const from, to = "  - name: inflight-scorer\n    weight: 1\n", "  - name: inflight-scorer\n    weight: 3\n"
	def := string(config.DefaultYAML())
	if !strings.Contains(def, from) {
		t.Fatalf("config/default.yaml no longer lists %q: update the test", from)
	}
	binDefaults := []byte(strings.Replace(def, from, to, 1))
	weight := func(c *config.Config, name string) float64 {
		for _, p := range c.Plugins {
			if p.Name == name && p.Weight != nil {
				return *p.Weight
			}
		}
		return -1
	}
	own := filepath.Join(t.TempDir(), "picker.yaml")
	if err := os.WriteFile(own, []byte("extProc:\n  fallbacks: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		file          string
		defaults      []byte
		wantWeight    float64
		wantFallbacks int
	}{
		{"the replay's own defaults when the binary's are not known", "", nil, 1, 0},
		{"the binary's defaults", "", binDefaults, 3, 0},
		{"the user's file on top of the binary's defaults", own, binDefaults, 3, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := PickerConfig(PickerOptions{File: tc.file, Defaults: tc.defaults, Endpoints: []string{"127.0.0.1:1"}, Clock: ClockVirtual})
			if err != nil {
				t.Fatal(err)
			}
			if w := weight(st.Config, "inflight-scorer"); w != tc.wantWeight {
				t.Fatalf("inflight-scorer weight %v, want %v", w, tc.wantWeight)
			}
			if f := st.Config.ExtProc.Fallbacks; f != tc.wantFallbacks {
				t.Fatalf("fallbacks %d, want %d", f, tc.wantFallbacks)
			}
			if got := st.Config.Pool.Endpoints; len(got) != 1 || got[0] != "127.0.0.1:1" {
				t.Fatalf("endpoints %v: the replay's settings apply on any defaults", got)
			}
		})
	}
	_, err := PickerConfig(PickerOptions{Defaults: []byte("fromTheFuture: true\n"), Endpoints: []string{"127.0.0.1:1"}, Clock: ClockVirtual})
	if err == nil || !strings.Contains(err.Error(), "the picker binary's default configuration") {
		t.Fatalf("unreadable binary defaults: err %v", err)
	}
}

// TestPickerLogHasEveryDecisionByRecordID: with PickerLogDir and PickerLogLevel "debug", each
// run's picker log lands in its own file, with one "routed" line per request whose request_id
// "replay-N" names record N and whose endpoint is the engine record N was served by.
func TestPickerLogHasEveryDecisionByRecordID(t *testing.T) {
	bin := picker(t)
	dir := t.TempDir()
	var records bytes.Buffer
	_, err := Benchmark(context.Background(), Options{
		Workloads: []string{"hot-prefix"}, Policies: []string{KVPick}, Seeds: []uint64{3}, Engines: 3, Requests: 40,
		Clock: ClockVirtual, PickerBin: bin, PickerLogDir: dir, PickerLogLevel: "debug", Records: &records,
	})
	if err != nil {
		t.Fatal(err)
	}
	engineOf := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(records.String()), "\n") {
		var r RequestRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		engineOf[fmt.Sprintf("replay-%d", r.ID)] = DefaultEndpointBase.Addr(r.Engine)
	}
	b, err := os.ReadFile(filepath.Join(dir, "default-hot-prefix-seed3.log"))
	if err != nil {
		t.Fatal(err)
	}
	routed := 0
	for _, line := range strings.Split(string(b), "\n") {
		var l struct {
			Msg        string            `json:"msg"`
			RequestID  string            `json:"request_id"`
			Endpoint   string            `json:"endpoint"`
			Candidates []json.RawMessage `json:"candidates"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "routed" {
			continue
		}
		routed++
		if want, ok := engineOf[l.RequestID]; !ok || l.Endpoint != want || len(l.Candidates) != 3 {
			t.Fatalf("routed %s to %s with %d candidates; its record says %q", l.RequestID, l.Endpoint, len(l.Candidates), want)
		}
	}
	if routed != 40 || len(engineOf) != 40 {
		t.Fatalf("%d routed lines, %d records; want 40 of each", routed, len(engineOf))
	}
}

// TestPickerReplicasShareTheRequests: with two active replicas in front of the same engines,
// the streams alternate between them (each routes and answers half of the requests, all of
// which complete), every metrics tick waits for both replicas' scrapes without timing out, and
// the run's picker figures add both replicas' counts.
func TestPickerReplicasShareTheRequests(t *testing.T) {
	ctx := context.Background()
	p, eps, setup := startKVPick(t, 3, ClockVirtual, 0)
	q, err := StartPicker(ctx, picker(t), setup.Config, t.TempDir(), PickerRun{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := q.Stop(); err != nil {
			t.Error(err)
		}
	})
	rc := RunConfig{Workload: generate(t, "shared-prefix", Spec{Seed: 3, Engines: 3, Requests: 101}), Policy: KVPick,
		Engines: 3, Clock: ClockVirtual, Picker: p, PickerReplicas: []*Picker{q}, Endpoints: eps}
	before, err := scrapePickers(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res.Records {
		if !r.OK() {
			t.Fatalf("request %d: status %d, err %q", i, r.Status, r.Err)
		}
	}
	if res.Scrape == nil || res.Scrape.Waited == 0 || res.Scrape.Timeouts != 0 {
		t.Fatalf("scrape handshake with two replicas: %+v", res.Scrape)
	}
	after, err := scrapePickers(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	var routed []float64
	for k := range after {
		routed = append(routed, after[k].Sum("kvpick_requests_total")-before[k].Sum("kvpick_requests_total"))
	}
	if len(routed) != 2 || routed[0] != 51 || routed[1] != 50 {
		t.Fatalf("requests per replica %v, want [51 50]", routed)
	}
	var s Summary
	addPickerMetrics(&s, before, after)
	var hits, blocks float64
	for k := range after {
		hits += after[k].Sum("kvpick_prefix_predicted_hit_blocks_total") - before[k].Sum("kvpick_prefix_predicted_hit_blocks_total")
		blocks += after[k].Sum("kvpick_prefix_request_blocks_total") - before[k].Sum("kvpick_prefix_request_blocks_total")
	}
	if blocks == 0 || float64(s.PredictedHitRatio) != hits/blocks || math.IsNaN(float64(s.Decision.Mean)) {
		t.Fatalf("merged figures: predicted hit %v (want %v / %v), decision mean %v", s.PredictedHitRatio, hits, blocks, s.Decision.Mean)
	}
}

// startReplicas starts a picker replica with cfg on each metrics address; stop stops them.
func startReplicas(t *testing.T, bin string, cfg *config.Config, metricsAddrs []string) (ps []*Picker, stop func()) {
	t.Helper()
	stop = func() {
		for _, p := range ps {
			if err := p.Stop(); err != nil {
				t.Error(err)
			}
		}
	}
	for _, a := range metricsAddrs {
		p, err := StartPicker(context.Background(), bin, cfg, t.TempDir(), PickerRun{Args: []string{"--metrics-bind-address=" + a}})
		if err != nil {
			stop()
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps, stop
}

// TestPickerReplicasShareTheirCommits: two replicas listing both their metrics addresses as
// peers each take every pick and every commit of the other (one of each per request the other
// routed, all served), and none of their own back.
func TestPickerReplicasShareTheirCommits(t *testing.T) {
	ctx := context.Background()
	bin := picker(t)
	eps, err := ListenEndpointsWait(3, testBase(), true, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eps.Close() })
	ports, err := freeport.Loopback(2)
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])}
	setup, err := PickerConfig(PickerOptions{Endpoints: eps.Addrs(), Clock: ClockVirtual, Peers: addrs})
	if err != nil {
		t.Fatal(err)
	}
	ps, stop := startReplicas(t, bin, setup.Config, addrs)
	t.Cleanup(stop)
	res, err := Run(ctx, RunConfig{Workload: generate(t, "shared-prefix", Spec{Seed: 4, Engines: 3, Requests: 101}), Policy: KVPick,
		Engines: 3, Clock: ClockVirtual, Picker: ps[0], PickerReplicas: ps[1:], Endpoints: eps})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res.Records {
		if !r.OK() {
			t.Fatalf("request %d: status %d, err %q", i, r.Status, r.Err)
		}
	}
	// Replica 0 routed requests 0, 2, ..., 100 (51), replica 1 the other 50: commits then
	// picks applied by each.
	want := []float64{50, 51, 50, 51}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got []float64
		for _, name := range []string{"kvpick_peer_commits_applied_total", "kvpick_peer_picks_applied_total"} {
			for _, p := range ps {
				m, err := ScrapeMetrics(ctx, p.MetricsAddr)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, m.Sum(name))
			}
		}
		if slices.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("peer commits then picks applied per replica %v, want %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPacedReplicasRepeat: on the virtual clock, replicas that share through a PeerSync are
// paced to it — every pick and commit applied by the other replica before the simulation goes
// on — so two runs of the same workload route every request alike and time it alike.
func TestPacedReplicasRepeat(t *testing.T) {
	ctx := context.Background()
	bin := picker(t)
	wl := generate(t, "shared-prefix", Spec{Seed: 4, Engines: 3, Requests: 101})
	base := testBase() // the same engine addresses in both runs: ties break by address
	run := func() (*RunResult, PeerSyncStats) {
		eps, err := ListenEndpointsWait(3, base, true, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer eps.Close()
		ports, err := freeport.Loopback(2)
		if err != nil {
			t.Fatal(err)
		}
		real := []string{fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])}
		ps, err := NewPeerSync(real, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer ps.Close()
		setup, err := PickerConfig(PickerOptions{Endpoints: eps.Addrs(), Clock: ClockVirtual, Peers: ps.Addrs()})
		if err != nil {
			t.Fatal(err)
		}
		// Stopped with the run: this run's pickers must not scrape the next run's engines.
		ps2, stop := startReplicas(t, bin, setup.Config, real)
		defer stop()
		res, err := Run(ctx, RunConfig{Workload: wl, Policy: KVPick, Engines: 3, Clock: ClockVirtual, Picker: ps2[0],
			PickerReplicas: ps2[1:], Endpoints: eps, PeerSync: ps})
		if err != nil {
			t.Fatal(err)
		}
		return res, ps.Stats()
	}
	a, sa := run()
	b, sb := run()
	for i := range a.Records {
		ra, rb := a.Records[i], b.Records[i]
		if !ra.OK() || !rb.OK() {
			t.Fatalf("request %d: %+v / %+v", i, ra, rb)
		}
		if ra.Engine != rb.Engine || ra.Result != rb.Result {
			t.Fatalf("request %d: engine %d, %+v in one run; engine %d, %+v in the other", i, ra.Engine, ra.Result, rb.Engine, rb.Result)
		}
	}
	if sa.Waited == 0 || sa.Timeouts != 0 || sb.Timeouts != 0 || a.PeerSync == nil {
		t.Fatalf("pacing stats %+v, %+v: want waits and no timeouts", sa, sb)
	}
}
