package replay

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/servermetrics"
	"github.com/kvpick/kvpick/internal/promtext"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// TestMetricsServersServeTheEnginesNumbers: each engine's address answers /metrics with its
// own numbers (vLLM's names) and /health with 200, and the numbers follow the engine.
func TestMetricsServersServeTheEnginesNumbers(t *testing.T) {
	clk := engine.NewVirtualClock(Epoch)
	cfgs := EngineConfigs(EngineConfig(), 2, []int{768, 1856})
	var engs []*engine.Engine
	for _, c := range cfgs {
		e, err := engine.New(c, clk)
		if err != nil {
			t.Fatal(err)
		}
		engs = append(engs, e)
	}
	eps, err := ListenEndpointsWait(2, testBase(), false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer eps.Close()
	eps.serveLive(engs, servermetrics.Options{})
	ctx := context.Background()
	scrape := func(i int) *promtext.Metrics {
		m, err := ScrapeMetrics(ctx, eps.Addrs()[i])
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for i, blocks := range []string{"768", "1856"} {
		if code, _ := get(t, "http://"+eps.Addrs()[i]+"/health"); code != 200 {
			t.Fatalf("engine %d /health: %d", i, code)
		}
		_, page := get(t, "http://"+eps.Addrs()[i]+"/metrics")
		if !strings.Contains(page, `num_gpu_blocks="`+blocks+`"`) {
			t.Fatalf("engine %d: cache_config_info does not say %s blocks:\n%s", i, blocks, page)
		}
		if m := scrape(i); m.Value("vllm:num_requests_running") != 0 || m.Value("vllm:num_requests_waiting") != 0 {
			t.Fatalf("idle engine %d reports load", i)
		}
	}
	// Load engine 1 with more requests than its batch holds: some run, the rest wait.
	prompt := make([]uint32, 200)
	for i := range prompt {
		prompt[i] = uint32(i + 1)
	}
	for range 45 {
		if _, err := engs[1].Submit(engine.Request{Prompt: prompt, MaxTokens: 50}, engine.Callbacks{}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Millisecond)
	st := engs[1].Stats()
	m := scrape(1)
	if st.Running == 0 || st.Waiting == 0 || m.Value("vllm:num_requests_running") != float64(st.Running) ||
		m.Value("vllm:num_requests_waiting") != float64(st.Waiting) || m.Value("vllm:kv_cache_usage_perc") != st.KVUsage {
		t.Fatalf("engine 1 reports running %v waiting %v kv %v; its stats %+v", m.Value("vllm:num_requests_running"),
			m.Value("vllm:num_requests_waiting"), m.Value("vllm:kv_cache_usage_perc"), st)
	}
	if m := scrape(0); m.Value("vllm:num_requests_running") != 0 {
		t.Fatal("engine 0 reports engine 1's load")
	}
	eps.detach()
	if code, _ := get(t, "http://"+eps.Addrs()[0]+"/metrics"); code != http.StatusServiceUnavailable {
		t.Fatalf("between runs /metrics answers %d, want 503", code)
	}
}

// sequentialScraper fetches one endpoint's /metrics as the picker's scraper does: one request
// at a time, the next after the previous answer was read. It records what each fetch got.
type sequentialScraper struct {
	mu    sync.Mutex
	got   []string // the page (or "503") of each fetch, in order
	stop  chan struct{}
	done  chan struct{}
	pause time.Duration
}

func startScraper(url string, pause time.Duration) *sequentialScraper {
	s := &sequentialScraper{stop: make(chan struct{}), done: make(chan struct{}), pause: pause}
	// Its own transport: one connection of its own per endpoint, as a picker's scraper keeps
	// (the default transport's pool would hand connections between scrapers).
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			resp, err := client.Get(url)
			if err == nil {
				var b strings.Builder
				buf := make([]byte, 1024)
				for {
					n, err := resp.Body.Read(buf)
					b.Write(buf[:n])
					if err != nil {
						break
					}
				}
				resp.Body.Close()
				page := b.String()
				if resp.StatusCode != 200 {
					page = "503"
				}
				s.mu.Lock()
				s.got = append(s.got, page)
				s.mu.Unlock()
			}
			time.Sleep(s.pause)
		}
	}()
	return s
}

func (s *sequentialScraper) pages() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

// TestVirtualTickWaitsUntilThePickerAppliedThePage: a tick returns only once the new page was
// fetched and the endpoint fetched again (which a sequential scraper sends only after it is
// done with the page); that second fetch is held until the next page and then refused, so a
// page is never served again after simulated time moved on; an unchanged page needs no wait.
func TestVirtualTickWaitsUntilThePickerAppliedThePage(t *testing.T) {
	eps, err := ListenEndpointsWait(1, testBase(), false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer eps.Close()
	eps.serveSnapshots(1)
	sc := startScraper("http://"+eps.Addrs()[0]+"/metrics", time.Millisecond)
	defer func() { close(sc.stop); eps.detach(); <-sc.done }()
	ss := &scrapeSync{eps: eps, first: time.Minute, each: time.Minute}
	ctx := context.Background()

	if err := ss.tick(ctx, [][]byte{[]byte("page-1\n")}); err != nil {
		t.Fatal(err)
	}
	got := eps.Fetches(0)
	pages := sc.pages()
	// The wait ended at the second fetch of page-1, which is parked: page-1 was read once.
	if n := strings.Count(strings.Join(pages, ","), "page-1"); n != 1 || ss.waited != 1 {
		t.Fatalf("after tick 1: pages %q, waited %d", pages, ss.waited)
	}
	// The parked fetch stays parked: no new answer while simulated time has not moved on.
	time.Sleep(20 * time.Millisecond)
	if eps.Fetches(0) != got || len(sc.pages()) != len(pages) {
		t.Fatalf("the scraper got more answers for an old tick: %q", sc.pages())
	}
	if err := ss.tick(ctx, [][]byte{[]byte("page-1\n")}); err != nil || ss.waited != 1 {
		t.Fatalf("an unchanged page should not wait: %v, waited %d", err, ss.waited)
	}
	if err := ss.tick(ctx, [][]byte{[]byte("page-2\n")}); err != nil {
		t.Fatal(err)
	}
	pages = sc.pages()
	// The parked fetch was refused (no publish), then page-2 read once.
	tail := strings.Join(pages[len(pages)-2:], ",")
	if tail != "503,page-2\n" || ss.waited != 2 || ss.timeouts != 0 {
		t.Fatalf("after tick 2: pages %q, waited %d", pages, ss.waited)
	}
}

// TestVirtualTickWaitsForEveryPickerReplica: with two picker replicas scraping, one replica's
// second fetch does not end the tick (it times out while the other does not scrape); once both
// scrape, a tick ends when each has fetched the page and asked again, each having read it once.
func TestVirtualTickWaitsForEveryPickerReplica(t *testing.T) {
	eps, err := ListenEndpointsWait(1, testBase(), false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer eps.Close()
	eps.serveSnapshots(2)
	url := "http://" + eps.Addrs()[0] + "/metrics"
	a := startScraper(url, time.Millisecond)
	var b *sequentialScraper
	defer func() {
		close(a.stop)
		if b != nil {
			close(b.stop)
		}
		eps.detach()
		<-a.done
		if b != nil {
			<-b.done
		}
	}()
	ss := &scrapeSync{eps: eps, first: 300 * time.Millisecond, each: time.Minute}
	ctx := context.Background()
	if err := ss.tick(ctx, [][]byte{[]byte("page-1\n")}); err != nil {
		t.Fatal(err)
	}
	if ss.timeouts != 1 || ss.waited != 0 {
		t.Fatalf("one replica of two scraping: timeouts %d, waited %d; want the tick to time out", ss.timeouts, ss.waited)
	}
	if n := strings.Count(strings.Join(a.pages(), ","), "page-1"); n != 1 {
		t.Fatalf("replica a read page-1 %d times: %q", n, a.pages())
	}
	b = startScraper(url, time.Millisecond)
	if err := ss.tick(ctx, [][]byte{[]byte("page-2\n")}); err != nil {
		t.Fatal(err)
	}
	if ss.timeouts != 1 || ss.waited != 1 {
		t.Fatalf("both replicas scraping: timeouts %d, waited %d; want the tick to end without a timeout", ss.timeouts, ss.waited)
	}
	for name, sc := range map[string]*sequentialScraper{"a": a, "b": b} {
		if n := strings.Count(strings.Join(sc.pages(), ","), "page-2"); n != 1 {
			t.Fatalf("replica %s read page-2 %d times: %q", name, n, sc.pages())
		}
	}
}

// TestVirtualTickGoesOnWithoutAScrapingPicker: a picker that never fetches does not scrape;
// the first tick notes it and the run goes on without waiting.
func TestVirtualTickGoesOnWithoutAScrapingPicker(t *testing.T) {
	eps, err := ListenEndpointsWait(2, testBase(), false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer eps.Close()
	eps.serveSnapshots(1)
	ss := &scrapeSync{eps: eps, first: 50 * time.Millisecond, each: time.Minute}
	for i := range 3 {
		if err := ss.tick(context.Background(), [][]byte{[]byte("a" + string(rune('0'+i))), []byte("b")}); err != nil {
			t.Fatal(err)
		}
	}
	if !ss.off || !strings.Contains(ss.note, "does not scrape") || ss.waited != 0 || ss.ticks != 3 {
		t.Fatalf("sync %+v", ss)
	}
}

func TestEndpointAddressesAreFixedAndMoveTogether(t *testing.T) {
	base := testBase()
	a, err := ListenEndpointsWait(3, base, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	want := []string{base.Addr(0), base.Addr(1), base.Addr(2)}
	if got := a.Addrs(); strings.Join(got, ",") != strings.Join(want, ",") || !strings.HasSuffix(want[2], ".3:8000") {
		t.Fatalf("addresses %v, want %v", got, want)
	}
	// The same addresses taken: every engine moves to the next port.
	b, err := ListenEndpointsWait(3, base, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i, addr := range b.Addrs() {
		if !strings.HasSuffix(addr, ":8001") || !strings.HasPrefix(addr, strings.TrimSuffix(want[i], "8000")) {
			t.Fatalf("second set: %v", b.Addrs())
		}
	}
	if _, err := ListenEndpointsWait(3, base, true, 0); err == nil {
		t.Fatal("fixed addresses in use: no error")
	}
}

// TestEndpointsWaitForTheirAddresses: while another run holds the addresses, the next one waits
// for them rather than moving (a move changes the picker's address-hashed tie-breaks).
func TestEndpointsWaitForTheirAddresses(t *testing.T) {
	base := testBase()
	a, err := ListenEndpointsWait(2, base, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	var releasing atomic.Bool
	go func() {
		time.Sleep(300 * time.Millisecond)
		releasing.Store(true)
		a.Close()
	}()
	b, err := ListenEndpointsWait(2, base, false, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !releasing.Load() {
		t.Fatal("got the addresses while the other run held them")
	}
	if got := b.Addrs()[0]; got != base.Addr(0) {
		t.Fatalf("moved to %s instead of waiting for %s", got, base.Addr(0))
	}
}
