package replay

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestCalibrate is a tool, not a test: it prints how the default workloads load the pool at
// several rates, to choose the default rates (docs/replay.md, "Workloads"). It runs only when
// REPLAY_CALIBRATE names workloads:
//
//	REPLAY_CALIBRATE=shared-prefix,agent REPLAY_POLICIES=round-robin,precise \
//	REPLAY_RATES=0.8,1,1.2 REPLAY_SEEDS=1,2,3 go test -run TestCalibrate -v ./internal/replay
//
// Rates are multiples of each workload's default; numbers are averaged over the seeds.
func TestCalibrate(t *testing.T) {
	names := list(os.Getenv("REPLAY_CALIBRATE"), "")
	if len(names) == 0 {
		t.Skip("set REPLAY_CALIBRATE to run")
	}
	policies := list(os.Getenv("REPLAY_POLICIES"), RoundRobin)
	rates := list(os.Getenv("REPLAY_RATES"), "1")
	seeds := list(os.Getenv("REPLAY_SEEDS"), "1")
	for _, name := range names {
		_, base, err := DefaultSize(name, 8)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range rates {
			mult, _ := strconv.ParseFloat(m, 64)
			for _, pol := range policies {
				var hit, p50, p90, p99, util float64
				for _, sd := range seeds {
					seed, _ := strconv.ParseUint(sd, 10, 64)
					w, err := Generate(name, Spec{Seed: seed, Engines: 8, Rate: base * mult})
					if err != nil {
						t.Fatal(err)
					}
					res, err := Run(context.Background(), RunConfig{Workload: w, Policy: pol, Engines: 8, Clock: ClockVirtual})
					if err != nil {
						t.Fatal(err)
					}
					s := Summarize(res)
					hit += s.HitRatio
					p50 += float64(s.TTFT.P50)
					p90 += float64(s.TTFT.P90)
					p99 += float64(s.TTFT.P99)
					util += s.Util
				}
				n := float64(len(seeds))
				fmt.Printf("%-14s %-13s rate %6.1f/s  hit %5.1f%%  TTFT p50 %6.0fms p90 %6.0fms p99 %6.0fms  util %3.0f%%\n",
					name, pol, base*mult, 100*hit/n, 1000*p50/n, 1000*p90/n, 1000*p99/n, 100*util/n)
			}
		}
	}
}

func list(s, def string) []string {
	if s == "" {
		s = def
	}
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}
