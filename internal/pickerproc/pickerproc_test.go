package pickerproc

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// staticConfig is a pool whose one server does not exist, so health checks are off.
const staticConfig = `pool: {endpoints: ["10.0.0.1:8000"], healthCheck: {interval: 0s}}`

// build builds the real picker into a test's directory, with -race when the tests run with it
// (that reuses the race-built dependencies and checks the picker too).
func build(t *testing.T) string {
	t.Helper()
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var flags []string
	if raceBuilt() {
		flags = append(flags, "-race")
	}
	bin, err := Build(ctx, root, t.TempDir(), flags...)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func raceBuilt() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// script writes an executable shell script (exec keeps one process to kill).
func script(t *testing.T, body string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "fake-picker")
	if err := os.WriteFile(f, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestStart(t *testing.T) {
	built := build(t)
	picker := func(*testing.T) string { return built }
	for _, tc := range []struct {
		name    string
		bin     func(t *testing.T) string
		config  string
		ctx     func() (context.Context, context.CancelFunc)
		wantErr []string // substrings of Start's error; nil: Start succeeds
		isErr   error    // errors.Is target, when set
		check   func(t *testing.T, p *Process, dir, logFile string)
	}{{
		name: "serves on loopback and stops on SIGTERM", bin: picker, config: staticConfig,
		check: func(t *testing.T, p *Process, dir, logFile string) {
			if p.PID <= 0 {
				t.Errorf("PID %d", p.PID)
			}
			for name, a := range map[string]string{"ext_proc": p.GRPCAddr, "health": p.HealthAddr, "metrics": p.MetricsAddr} {
				host, port, err := net.SplitHostPort(a)
				if err != nil || host != "127.0.0.1" || port == "0" {
					t.Errorf("%s address %q (%v)", name, a, err)
					continue
				}
				c, err := net.DialTimeout("tcp", a, 2*time.Second)
				if err != nil {
					t.Errorf("%s: %v", name, err)
					continue
				}
				c.Close()
			}
			if !strings.Contains(p.Logs(), `"msg":"picker serving"`) {
				t.Errorf("Logs has no serving line:\n%s", p.Logs())
			}
			if n := p.LogCounts()["info"]; n < 1 {
				t.Errorf("LogCounts %v", p.LogCounts())
			}
			if err := p.Stop(); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			select {
			case <-p.Exited():
			default:
				t.Fatal("Exited not closed after Stop")
			}
			if !strings.Contains(p.Logs(), "shutting down") {
				t.Errorf("no drain in the log after SIGTERM:\n%s", p.Logs())
			}
			if b, err := os.ReadFile(logFile); err != nil || !strings.Contains(string(b), `"msg":"picker serving"`) {
				t.Errorf("LogFile: %v\n%s", err, b)
			}
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Errorf("left in Dir: %v", left)
			}
		},
	}, {
		name: "a killed picker's Stop reports it", bin: picker, config: staticConfig,
		check: func(t *testing.T, p *Process, _, _ string) {
			p.Kill()
			err := p.Stop()
			if err == nil || !strings.Contains(err.Error(), "signal: killed") || !strings.Contains(err.Error(), "picker serving") {
				t.Fatalf("Stop after Kill: %v", err)
			}
		},
	}, {
		name: "bad config fails with the log", bin: picker, config: `plugins: [{name: no-such-plugin}]`,
		wantErr: []string{"picker exited at start", `unknown plugin "no-such-plugin"`},
	}, {
		name: "binary that exits at once", bin: func(*testing.T) string { return "/bin/false" },
		wantErr: []string{"picker exited at start (exit status 1)"},
	}, {
		name: "missing binary", bin: func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope") },
		wantErr: []string{"no such file"},
	}, {
		name: "ctx done while waiting for the serving line",
		bin:  func(t *testing.T) string { return script(t, "echo not serving yet >&2; exec sleep 60") },
		ctx: func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 300*time.Millisecond)
		},
		// The log tail comes with the error: it says what the picker was doing.
		wantErr: []string{"context deadline exceeded", "not serving yet"}, isErr: context.DeadlineExceeded,
	}, {
		name: "ctx already canceled", bin: func(*testing.T) string { return "/bin/true" },
		ctx: func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		},
		wantErr: []string{"context canceled"}, isErr: context.Canceled,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if tc.ctx != nil {
				ctx, cancel = tc.ctx()
			}
			defer cancel()
			dir := t.TempDir()
			logFile := filepath.Join(t.TempDir(), "picker.log")
			o := Options{Bin: tc.bin(t), Dir: dir, LogFile: logFile}
			if tc.config != "" {
				o.Config = []byte(tc.config)
			}
			p, err := Start(ctx, o)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				defer p.Kill()
				tc.check(t, p, dir, logFile)
				return
			}
			if err == nil {
				p.Kill()
				t.Fatal("Start succeeded")
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not say %q:\n%v", s, err)
				}
			}
			if tc.isErr != nil && !errors.Is(err, tc.isErr) {
				t.Errorf("error is not %v: %v", tc.isErr, err)
			}
			// A picker that exits is noticed by its exit, not by the start timeout.
			if strings.Contains(err.Error(), "within 30 s") {
				t.Errorf("the failure was found by the start timeout: %v", err)
			}
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Errorf("left in Dir: %v", left)
			}
		})
	}
}

func TestDeclares(t *testing.T) {
	for _, tc := range []struct {
		gomod string
		want  bool
	}{
		{"module github.com/kvpick/kvpick\n\ngo 1.26\n", true},
		{"// comment\nmodule \"github.com/kvpick/kvpick\"\r\n", true},
		{"module github.com/kvpick/kvpick/tools\n", false},
		{"module example.com/other\nrequire github.com/kvpick/kvpick v1.0.0\n", false},
	} {
		if got := declares([]byte(tc.gomod), module); got != tc.want {
			t.Errorf("declares(%q) = %v", tc.gomod, got)
		}
	}
}
