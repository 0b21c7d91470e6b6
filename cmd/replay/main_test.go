package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvpick/kvpick/internal/replay"
)

func TestBadFlagsNameTheProblem(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--clock", "fast"}, "--clock"},
		{[]string{"--time-scale", "0"}, "--time-scale"},
		{[]string{"--error-rate", "2"}, "--error-rate"},
		{[]string{"--engines", "0"}, "--engines"},
		{[]string{"--policies", ""}, "--policies"},
		{[]string{"--policies", "random", "--clock", "virtual"}, `unknown policy "random"`},
		{[]string{"--workloads", "chatty", "--clock", "virtual"}, `unknown workload "chatty"`},
		{[]string{"--trace", "/nonexistent/trace.jsonl", "--clock", "virtual"}, "/nonexistent/trace.jsonl"},
		{[]string{"--picker-config", "/nonexistent.yaml", "--workloads", "hot-prefix", "--requests", "10"}, "/nonexistent.yaml"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--response-timing", "headers-first"}, "--response-timing"},
		{[]string{"--stream-fraction", "1.5"}, "--stream-fraction"},
		{[]string{"--kv-blocks", "900-100"}, "--kv-blocks"},
		{[]string{"--seeds", "6-1"}, "--seeds"},
		{[]string{"--suite", "everything"}, "--suite"},
		{[]string{"--suite", "standard", "--kv-blocks", "1000"}, "--kv-blocks"},
		{[]string{"--suite", "heavy", "--load-scale", "0.5"}, "--load-scale"},
		{[]string{"--picker-capacity-factor", "-1"}, "--picker-capacity-factor"},
		{[]string{"--load-scale", "-0.5"}, "--load-scale"},
		{[]string{"--picker-log-level", "verbose"}, "--picker-log-level"},
		{[]string{"--picker-log-level", "warn"}, "--picker-log-level"},
		{[]string{"--picker-log", "logs", "--picker-addr", "127.0.0.1:9002"}, "--picker-log"},
		{[]string{"--picker-log", "/dev/null/logs", "--clock", "virtual", "--workloads", "hot-prefix", "--requests", "5", "--policies", "round-robin"}, "--picker-log"},
		{[]string{"--records", "/nonexistent/dir/records.jsonl", "--clock", "virtual", "--workloads", "hot-prefix", "--requests", "5", "--policies", "round-robin"}, "--records"},
	} {
		var out, errb bytes.Buffer
		err := run(tc.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error()+errb.String(), tc.want) {
			t.Errorf("run(%q) = %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
}

func TestPrintEndpoints(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"--print-endpoints", "--engines", "3"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != "127.77.0.1:8000,127.77.0.2:8000,127.77.0.3:8000" {
		t.Fatalf("got %q", got)
	}
}

// TestTinyRun runs the in-process policies on a small trace and a generated workload and checks
// the table, the JSON and the charts.
func TestTinyRun(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.jsonl")
	var lines []string
	for i := range 20 {
		lines = append(lines, fmt.Sprintf(`{"timestamp": %.2f, "body": {"model": "m", "max_tokens": 8, "messages": [`+
			`{"role": "system", "content": "You answer questions about the weather, with long explanations of the physics behind it."}, `+
			`{"role": "user", "content": "question %d"}]}}`, 1+0.1*float64(i), i))
	}
	if err := os.WriteFile(trace, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	args := []string{"--clock", "virtual", "--engines", "2", "--requests", "30", "--workloads", "hot-prefix", "--trace", trace,
		"--policies", "round-robin,precise", "--json", filepath.Join(dir, "r.json"), "--svg", filepath.Join(dir, "svg"),
		"--records", filepath.Join(dir, "records.jsonl")}
	if err := run(args, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for _, want := range []string{"hot-prefix", "trace", "round-robin", "precise", "TTFT p50", "wait p90", "xprecise p50/p90/p99", "wrote"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(errb.String(), "default/hot-prefix/1/precise") {
		t.Fatalf("no progress on stderr: %q", errb.String())
	}
	var rep struct {
		Params  map[string]any   `json:"params"`
		Results []map[string]any `json:"results"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "r.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 4 || rep.Params["clock"] != "virtual" || rep.Results[2]["workload"] != "trace" || rep.Results[2]["completed"] != 20.0 {
		t.Fatalf("JSON: %d results, params %v, %v", len(rep.Results), rep.Params, rep.Results)
	}
	// One line per request of each of the 4 runs (30 generated + 20 traced requests, two
	// policies), each served with a TTFT, on one of the 2 engines; hot-prefix shares its prefix.
	rb, err := os.ReadFile(filepath.Join(dir, "records.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	cached := 0
	for i, line := range strings.Split(strings.TrimSpace(string(rb)), "\n") {
		var r replay.RequestRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("record %d: %v: %s", i, err, line)
		}
		runs[r.Workload+"/"+r.Policy]++
		if r.Status != 200 || r.Engine < 0 || r.Engine > 1 || r.TTFT <= 0 || r.Latency < r.TTFT || r.PromptTokens <= 0 || r.Seed != 1 {
			t.Fatalf("record %d: %+v", i, r)
		}
		cached += r.CachedTokens
	}
	if len(runs) != 4 || runs["hot-prefix/precise"] != 30 || runs["trace/round-robin"] != 20 || cached == 0 {
		t.Fatalf("records per run %v, %d cached tokens in all", runs, cached)
	}
	for _, f := range []string{"hit-ratio.svg", "ttft.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, "svg", f))
		if err != nil || !bytes.HasPrefix(b, []byte("<svg")) {
			t.Fatalf("%s: %v", f, err)
		}
	}
}

func TestParseSeeds(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"1-6", "[1 2 3 4 5 6]"},
		{"101-112", "[101 102 103 104 105 106 107 108 109 110 111 112]"},
		{"1,4,9", "[1 4 9]"},
		{"1-3,7,2", "[1 2 3 7]"},
		{" 5 ", "[5]"},
	} {
		got, err := parseSeeds(tc.in)
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("parseSeeds(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "1-x", "-2"} {
		if _, err := parseSeeds(bad); err == nil {
			t.Errorf("parseSeeds(%q): no error", bad)
		}
	}
}

// TestSeedsAndAMixedScenario: two seeds of a mixed run give per-seed rows and a summary.
func TestSeedsAndAMixedScenario(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	args := []string{"--clock", "virtual", "--engines", "2", "--requests", "40", "--workloads", "hot-prefix", "--seeds", "3-4",
		"--policies", "least-loaded,gie,sglang", "--stream-fraction", "0.5", "--kv-blocks", "768-1856", "--quiet",
		"--json", filepath.Join(dir, "r.json")}
	if err := run(args, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	var rep struct {
		Results    []map[string]any `json:"results"`
		Aggregates []struct {
			Policy string         `json:"policy"`
			Seeds  []int          `json:"seeds"`
			Versus map[string]any `json:"versus"`
		} `json:"aggregates"`
		Scenarios []map[string]any `json:"scenarios"`
	}
	b, _ := os.ReadFile(filepath.Join(dir, "r.json"))
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 6 || len(rep.Aggregates) != 3 || len(rep.Aggregates[1].Seeds) != 2 ||
		rep.Aggregates[1].Versus["least-loaded"] == nil || rep.Scenarios[0]["name"] != "custom" || rep.Scenarios[0]["kvBlocks"] != "768-1856" {
		t.Fatalf("report: %s", b[:min(len(b), 600)])
	}
	for _, want := range []string{"seed", "custom", "50% streamed", "[", "xleast-loaded"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
}
