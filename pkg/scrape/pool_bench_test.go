package scrape

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/pool"
	"github.com/kvpick/kvpick/pkg/router"
)

// The benchmark's metric servers run in a child process (this test binary again, with
// serveEnv set), so that the parent's CPU time is the scraper's alone.
const serveEnv = "KVPICK_SCRAPE_BENCH_SERVE"

func TestMain(m *testing.M) {
	if spec := os.Getenv(serveEnv); spec != "" {
		serveMetricPages(spec)
		return
	}
	os.Exit(m.Run())
}

// serveMetricPages serves spec = "count:kind": count loopback ports, each serving the pages of
// a loaded server, kind vllm (loadedPages, ~50 KB) or sglang (~6 KB, 64 pages of random
// numbers), the whole page whatever the query; vllm-filtered answers a request that names
// series (name[]=...) as prometheus_client does, with the scraper's families of the page
// (~1.5 KB). It prints the addresses and exits when stdin closes.
func serveMetricPages(spec string) {
	n, kind, _ := strings.Cut(spec, ":")
	count, err := strconv.Atoi(n)
	if err != nil {
		panic(err)
	}
	var mu sync.Mutex // guards lp and the SGLang pages' index
	lp := newLoadedPages(1, 1)
	sc, err := newSchema(config.ModelServerMetrics{Engine: "auto"})
	if err != nil {
		panic(err)
	}
	var names []string
	for _, f := range sc.families {
		names = append(names, f.name)
	}
	filtered := lp.filtered(names)
	var sglang [][]byte
	for range 64 {
		sglang = append(sglang, SGLangPage(lp.rnd.IntN(8), 16+lp.rnd.IntN(48), lp.rnd.Float64(), 500000))
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf, _ := bufs.Get().(*[]byte)
		if buf == nil {
			buf = new([]byte)
		}
		defer bufs.Put(buf)
		mu.Lock()
		switch {
		case kind == "sglang":
			*buf = append((*buf)[:0], sglang[lp.rnd.IntN(len(sglang))]...)
		case kind == "vllm-filtered" && r.URL.RawQuery != "":
			*buf = filtered.next(*buf)
		default:
			*buf = lp.next(*buf)
		}
		mu.Unlock()
		p := *buf
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(p)))
		_, _ = w.Write(p)
	})
	var addrs []string
	for range count {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		addrs = append(addrs, l.Addr().String())
		go func() { _ = http.Serve(l, h) }()
	}
	fmt.Println(strings.Join(addrs, " "))
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin
}

// BenchmarkScrapePool256 scrapes 256 endpoints every 50 ms, with the default configuration's
// filter (pool.metrics.filterFamilies), and reports the scraper's CPU as a share of one core
// (%core) and per scrape. vllm-filtered: each endpoint answers the filtered request as
// prometheus_client does, with the ~1.5 KB page of a loaded vLLM server's families (a new KV
// usage on every scrape, queue counts in small ranges); vllm: the same server ignoring the
// filter, its whole ~50 KB page; sglang: a ~6 KB SGLang page, whole. One iteration is one
// 50 ms interval: run it with -benchtime=200x (10 s).
func BenchmarkScrapePool256(b *testing.B) {
	for _, kind := range []string{"vllm-filtered", "vllm", "sglang"} {
		b.Run(kind, func(b *testing.B) { benchmarkScrapePool(b, 256, kind) })
	}
}

// startPageServers starts serveMetricPages(count:kind) in a child process and returns the
// addresses; the child exits when the benchmark ends.
func startPageServers(b *testing.B, count int, kind string) []string {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), serveEnv+"="+strconv.Itoa(count)+":"+kind)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	return strings.Fields(line)
}

func benchCfg(interval time.Duration) config.ModelServerMetrics {
	return config.ModelServerMetrics{Path: "/metrics", RefreshInterval: config.Duration(interval),
		Timeout: config.Duration(250 * time.Millisecond), StalenessThreshold: config.Duration(500 * time.Millisecond),
		MaxBodyBytes: 1 << 20, Engine: "auto", FilterFamilies: true}
}

// BenchmarkScrapeOne is one endpoint's scrapes back to back, in the benchmark's goroutine: the
// cost of a scrape without the pool's scheduling and timers (cpu-ns/op, allocations).
func BenchmarkScrapeOne(b *testing.B) {
	for _, kind := range []string{"vllm-filtered", "vllm"} {
		b.Run(kind, func(b *testing.B) {
			addrs := startPageServers(b, 1, kind)
			s, err := New(benchCfg(time.Second), Options{Log: zap.NewNop()})
			if err != nil {
				b.Fatal(err)
			}
			ep := router.NewEndpoint(addrs[0], 0)
			l := &loop{ep: ep, rd: newReader(s.schema), choice: newChoice(s.paths), conn: newConn(addrs[0], s.paths)}
			defer l.conn.close()
			ctx := context.Background()
			for range 10 { // connection open, buffers grown, the request settled
				s.scrapeOnce(ctx, l)
			}
			b.ReportAllocs()
			defer cpuPerOp(b)()
			for b.Loop() {
				s.scrapeOnce(ctx, l)
			}
			if l.counts[resultOK].Load() < uint64(b.N) {
				b.Fatalf("%d ok scrapes of %d", l.counts[resultOK].Load(), b.N+10)
			}
			b.ReportMetric(float64(l.pageBytes.Load()), "page-bytes")
		})
	}
}

func benchmarkScrapePool(b *testing.B, endpoints int, kind string) {
	interval := 50 * time.Millisecond
	addrs := startPageServers(b, endpoints, kind)

	p := pool.New()
	s, err := New(benchCfg(interval), Options{Pool: p, Log: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	p.Listen(s)
	p.Set(addrs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	time.Sleep(time.Second) // connections open, buffers grown
	scrapes := func() (ok, all uint64) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, l := range s.loops {
			for r := range numResults {
				n := l.counts[r].Load()
				all += n
				if r == resultOK {
					ok += n
				}
			}
		}
		return ok, all
	}
	ok0, all0 := scrapes()
	cpu0, t0 := processCPU(b), time.Now()
	b.ResetTimer()
	time.Sleep(time.Duration(b.N) * interval)
	b.StopTimer()
	cpu, wall := processCPU(b)-cpu0, time.Since(t0)
	ok, all := scrapes()
	ok, all = ok-ok0, all-all0
	var pageBytes int64
	s.mu.Lock()
	for _, l := range s.loops {
		pageBytes += l.pageBytes.Load()
	}
	n := len(s.loops)
	s.mu.Unlock()
	if all == 0 {
		b.Fatal("no scrape")
	}
	// On a machine too busy for the metric servers to keep up, scrapes time out and fewer are
	// made: cpu-us/scrape still holds, and target-%core is it at 256 endpoints every 50 ms.
	b.ReportMetric(100*float64(ok)/float64(all), "ok%")
	b.ReportMetric(cpu.Seconds()/float64(all)*float64(endpoints)*float64(time.Second/interval)*100, "target-%core")
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "%core")
	b.ReportMetric(float64(cpu.Microseconds())/float64(all), "cpu-us/scrape")
	b.ReportMetric(float64(all)/wall.Seconds(), "scrapes/s")
	b.ReportMetric(float64(pageBytes)/float64(n), "page-bytes")
	b.ReportMetric(0, "ns/op")
}
