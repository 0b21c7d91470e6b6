package demo

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kvpick/kvpick/internal/devgateway"
	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/progress"
)

// CompareOptions configure Compare.
type CompareOptions struct {
	Workload Workload
	Sims     int            // default 4
	Sim      *engine.Config // default SimConfig()
	Log      *zap.Logger
	// Progress, if set, shows each run's progress (internal/progress: a bar redrawn in place on
	// a terminal, plain lines every few seconds elsewhere).
	Progress io.Writer
}

// Compare runs the workload through the picker, then through round-robin on fresh
// simulators (their caches start empty), and returns both results.
func Compare(ctx context.Context, o CompareOptions) (picker, roundRobin Result, err error) {
	run := func(policy devgateway.Policy) (Result, error) {
		s, err := Start(ctx, StackOptions{Policy: policy, Sims: o.Sims, Sim: o.Sim, Log: o.Log})
		if err != nil {
			return Result{}, err
		}
		defer s.Close()
		bar := progress.Count(o.Progress, fmt.Sprintf("%-11s", policy), "requests", 0)
		r := Run(ctx, s, o.Workload, bar.Update)
		bar.Stop("")
		r.Policy = string(policy)
		if err := s.Err(); err != nil {
			return r, err
		}
		return r, ctx.Err()
	}
	if picker, err = run(devgateway.PolicyPicker); err != nil {
		return picker, roundRobin, err
	}
	roundRobin, err = run(devgateway.PolicyRoundRobin)
	return picker, roundRobin, err
}

// Report writes the two results side by side.
func Report(w io.Writer, results ...Result) {
	row := func(label string, cell func(Result) string) {
		line := fmt.Sprintf("  %-26s", label)
		for _, r := range results {
			line += fmt.Sprintf("%-22s", cell(r))
		}
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	row("", func(r Result) string {
		if r.Policy == string(devgateway.PolicyPicker) {
			return "kvpick picker"
		}
		return r.Policy
	})
	row("requests per server", func(r Result) string {
		parts := make([]string, len(r.PerEndpoint))
		for i, n := range r.PerEndpoint {
			parts[i] = fmt.Sprint(n)
		}
		return strings.Join(parts, " / ")
	})
	row("prefix cache hit rate", func(r Result) string { return fmt.Sprintf("%.1f %%", 100*r.HitRate) })
	row("prompt tokens computed", func(r Result) string { return fmt.Sprintf("%.1fK", float64(r.Computed)/1000) })
	row("time to first token:", func(Result) string { return "" })
	row("  server (simulated GPU)", func(r Result) string { return r.ServerTTFT.Round(time.Millisecond).String() })
	row("  client (whole path)", func(r Result) string { return r.MeanTTFT.Round(time.Millisecond).String() })
	row("wall time", func(r Result) string { return r.Wall.Round(100 * time.Millisecond).String() })
	row("errors", func(r Result) string { return fmt.Sprintf("%d of %d", r.Errors, r.Requests) })
	for _, r := range results {
		if r.FirstError != "" {
			fmt.Fprintf(w, "  first error (%s): %s\n", r.Policy, r.FirstError)
		}
	}
	fmt.Fprintln(w, "\n  Hit rate and computed tokens are the simulators' own counters. Client times include the")
	fmt.Fprintln(w, "  gateway and picker, which share this machine's CPUs with everything else in this process.")
}
