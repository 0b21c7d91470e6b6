package scrape

import (
	"syscall"
	"testing"
	"time"
)

// processCPU is the CPU time (user + system) this process has used. The machine the benchmarks
// run on is shared, so wall-clock ns/op overstates the cost when other processes compete;
// CPU time per operation does not.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuPerOp reports the process's CPU time per iteration as the metric cpu-ns/op; call it
// before the loop and defer the function it returns.
func cpuPerOp(b *testing.B) func() {
	start := processCPU(b)
	return func() {
		b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
	}
}
