package loadgen

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// ClockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on every Linux
// architecture Go supports (sysconf(_SC_CLK_TCK) needs cgo to ask).
const ClockTicks = 100

// ProcStat is what a load report needs from /proc/<pid>/stat.
type ProcStat struct {
	UTime, STime uint64 // CPU time in user and kernel mode, in clock ticks
	NumThreads   int64
	RSSPages     int64 // resident set size, in pages
}

// CPUSeconds is user + system CPU time.
func (p ProcStat) CPUSeconds() float64 { return float64(p.UTime+p.STime) / ClockTicks }

// RSSBytes is the resident set size in bytes.
func (p ProcStat) RSSBytes() int64 { return p.RSSPages * int64(os.Getpagesize()) }

// ParseProcStat parses the contents of /proc/<pid>/stat. The command name (field 2) is in
// parentheses and may itself hold spaces and parentheses, so fields are counted from the last
// ')'.
func ParseProcStat(b []byte) (ProcStat, error) {
	var p ProcStat
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return p, fmt.Errorf("proc stat: no command name")
	}
	// Fields after the name start at field 3 (state).
	f := bytes.Fields(b[i+1:])
	const (
		utime   = 14 - 3
		stime   = 15 - 3
		threads = 20 - 3
		rss     = 24 - 3
	)
	if len(f) <= rss {
		return p, fmt.Errorf("proc stat: %d fields after the command name, want at least %d", len(f), rss+1)
	}
	var err error
	num := func(k int) int64 {
		v, e := strconv.ParseInt(string(f[k]), 10, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("proc stat field %d: %v", k+3, e)
		}
		return v
	}
	p.UTime = uint64(num(utime))
	p.STime = uint64(num(stime))
	p.NumThreads = num(threads)
	p.RSSPages = num(rss)
	return p, err
}

// ReadProcStat reads /proc/<pid>/stat.
func ReadProcStat(pid int) (ProcStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ProcStat{}, err
	}
	return ParseProcStat(b)
}

// SelfCPU returns this process's user + system CPU time.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// RaiseNoFile raises this process's soft RLIMIT_NOFILE to its hard limit (Go does this at start
// since 1.19; doing it again is harmless and lets the report state the limit) and returns it.
func RaiseNoFile() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			return rl.Cur, err
		}
	}
	return rl.Cur, nil
}

// SystemCPU is the machine-wide CPU time from the first line of /proc/stat, in seconds.
type SystemCPU struct {
	Busy, Total float64
}

// ParseSystemCPU parses /proc/stat's aggregate "cpu" line: busy is everything but idle and
// iowait (guest time is already inside user and nice).
func ParseSystemCPU(b []byte) (SystemCPU, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 5 || string(f[0]) != "cpu" {
		return SystemCPU{}, fmt.Errorf("/proc/stat: no aggregate cpu line")
	}
	var total, idle float64
	for i, x := range f[1:] {
		if i >= 8 { // guest and guest_nice are counted in user and nice
			break
		}
		v, err := strconv.ParseUint(string(x), 10, 64)
		if err != nil {
			return SystemCPU{}, fmt.Errorf("/proc/stat: %v", err)
		}
		total += float64(v)
		if i == 3 || i == 4 { // idle, iowait
			idle += float64(v)
		}
	}
	return SystemCPU{Busy: (total - idle) / ClockTicks, Total: total / ClockTicks}, nil
}

// ReadSystemCPU reads /proc/stat; the zero value when it cannot.
func ReadSystemCPU() SystemCPU {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return SystemCPU{}
	}
	s, _ := ParseSystemCPU(b)
	return s
}
