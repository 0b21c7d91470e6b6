package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/loadgen"
	"github.com/kvpick/kvpick/pkg/runner"
)

// startPicker runs a whole picker process's worth (runner.Run) in the test, plaintext, on free
// ports, and returns its ext_proc and metrics addresses.
func startPicker(t *testing.T, lruCapacity int) (grpcAddr, metricsAddr string) {
	t.Helper()
	y, err := loadgen.PickerConfig(lruCapacity)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(y)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pool.Endpoints = loadgen.FakeEndpoints(4)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan [2]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- runner.Run(ctx, runner.Options{
			GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
			Config: cfg, Log: zap.NewNop(),
			Ready: func(g, _, m net.Addr) { ready <- [2]string{g.String(), m.String()} },
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("picker did not stop")
		}
	})
	select {
	case a := <-ready:
		return a[0], a[1]
	case err := <-done:
		t.Fatalf("picker: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("picker not ready")
	}
	return "", ""
}

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	t.Logf("loadgen %s → %d\n%s%s", strings.Join(args, " "), code, out.String(), errb.String())
	return code, out.String(), errb.String()
}

func TestScenariosAgainstARunningPicker(t *testing.T) {
	g, m := startPicker(t, 100)
	common := []string{"--picker-addr", g, "--metrics-addr", m, "--quiet"}
	for name, args := range map[string][]string{
		"throughput": {"--duration", "1s", "--warmup", "200ms", "--concurrency", "4", "--body-bytes", "8192", "--conversations", "8"},
		"streams":    {"--streams", "200", "--hold", "200ms", "--tokens-min", "10", "--tokens-max", "20", "--token-gap", "1ms", "--settle-timeout", "1m"},
		"churn": {"--exchanges", "400", "--interval", "50ms", "--concurrency", "2", "--min-bytes", "4096", "--max-bytes", "8192",
			"--bound", "400", "--csv", "CSV"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			jsonFile := filepath.Join(dir, "out.json")
			for i, a := range args {
				if a == "CSV" {
					args[i] = filepath.Join(dir, "samples.csv")
				}
			}
			code, out, _ := runCLI(t, append(append([]string{name}, common...), append(args, "--json", jsonFile)...)...)
			if code != 0 || !strings.Contains(out, "PASS") {
				t.Fatalf("exit %d", code)
			}
			b, err := os.ReadFile(jsonFile)
			if err != nil {
				t.Fatal(err)
			}
			var rep struct {
				Scenario string `json:"scenario"`
				Errors   int64  `json:"errors"`
			}
			if err := json.Unmarshal(b, &rep); err != nil || rep.Scenario != name || rep.Errors != 0 {
				t.Fatalf("json report: %+v, %v", rep, err)
			}
			if name == "churn" {
				if b, err := os.ReadFile(filepath.Join(dir, "samples.csv")); err != nil || !strings.HasPrefix(string(b), "t_s,") {
					t.Fatalf("csv: %v", err)
				}
			}
		})
	}
}

func TestUsage(t *testing.T) {
	if code, _, errs := runCLI(t); code != exitError || !strings.Contains(errs, "usage") {
		t.Errorf("no arguments: exit %d", code)
	}
	if code, _, _ := runCLI(t, "--help"); code != 0 {
		t.Errorf("--help: exit %d", code)
	}
	if code, _, errs := runCLI(t, "bogus"); code != exitError || !strings.Contains(errs, "unknown scenario") {
		t.Errorf("unknown scenario: exit %d", code)
	}
	if code, _, _ := runCLI(t, "throughput", "-h"); code != 0 {
		t.Errorf("scenario -h: exit %d", code)
	}
	if code, _, _ := runCLI(t, "throughput", "--nope"); code != exitError {
		t.Errorf("bad flag: exit %d", code)
	}
	if code, _, errs := runCLI(t, "throughput", "--picker-addr", "127.0.0.1:1", "--concurrency", "0"); code != exitError || !strings.Contains(errs, "--concurrency") {
		t.Errorf("zero concurrency: exit %d", code)
	}
	// Bad flags are refused before any picker is built.
	if code, _, errs := runCLI(t, "streams", "--tokens-min", "9", "--tokens-max", "3"); code != exitError || !strings.Contains(errs, "--tokens-min") || strings.Contains(errs, "building") {
		t.Errorf("tokens min above max: exit %d", code)
	}
}

// TestStartsItsOwnPicker builds cmd/extproc and runs a tiny scenario against it, as the command
// does by default.
func TestStartsItsOwnPicker(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/extproc")
	}
	log := filepath.Join(t.TempDir(), "picker.log")
	code, out, errs := runCLI(t, "streams", "--streams", "100", "--hold", "100ms", "--tokens-min", "5", "--tokens-max", "10", "--token-gap", "1ms",
		"--endpoints", "4", "--quiet", "--picker-log", log)
	if code != 0 || !strings.Contains(out, "PASS") || !strings.Contains(errs, "picker pid") {
		t.Fatalf("exit %d", code)
	}
	if b, err := os.ReadFile(log); err != nil || !strings.Contains(string(b), "picker serving") {
		t.Fatalf("picker log: %v", err)
	}
}
