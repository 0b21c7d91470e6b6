package loadgen

import (
	"os"
	"runtime"
	"testing"
)

func TestParseProcStat(t *testing.T) {
	// The command name holds spaces and parentheses: fields count from the last ')'.
	line := "4242 (my (odd) proc) S 1 4242 4242 0 -1 4194560 1234 0 5 0 1500 250 0 0 20 0 17 0 12345 1073741824 5120 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
	p, err := ParseProcStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if p.UTime != 1500 || p.STime != 250 || p.NumThreads != 17 || p.RSSPages != 5120 {
		t.Fatalf("parsed %+v", p)
	}
	if got := p.CPUSeconds(); got != 17.5 {
		t.Errorf("cpu seconds %v, want 17.5", got)
	}
	if got := p.RSSBytes(); got != 5120*int64(os.Getpagesize()) {
		t.Errorf("rss %d", got)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 x 12 13 14 15 16 17 18 19 20 21 22"} {
		if _, err := ParseProcStat([]byte(bad)); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

func TestParseSystemCPU(t *testing.T) {
	s, err := ParseSystemCPU([]byte("cpu  100 5 50 1000 20 3 2 0 40 0\ncpu0 50 2 25 500 10 1 1 0 20 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	// total = 100+5+50+1000+20+3+2+0 (guest is inside user) = 1180 ticks; idle+iowait 1020.
	if s.Total != 11.8 || s.Busy != 1.6 {
		t.Errorf("parsed %+v", s)
	}
	if _, err := ParseSystemCPU([]byte("intr 1 2 3\n")); err == nil {
		t.Error("want an error without the cpu line")
	}
}

func TestReadProcStatSelf(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc is Linux's")
	}
	p, err := ReadProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.NumThreads < 1 || p.RSSPages <= 0 {
		t.Errorf("own stat %+v", p)
	}
	if ReadSystemCPU().Total <= 0 {
		t.Error("no system CPU time")
	}
	if n, err := RaiseNoFile(); err != nil || n == 0 {
		t.Errorf("RaiseNoFile = %d, %v", n, err)
	}
}
