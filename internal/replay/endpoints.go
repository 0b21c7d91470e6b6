package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/servermetrics"
)

// The simulated engines face the picker as model servers do: each has an address of its own on
// the loopback network (every 127/8 address is local on Linux) with an HTTP server answering
// GET /metrics (vLLM's Prometheus page) and GET /health, and the picker routes to those
// addresses. The OpenAI API itself is not served over HTTP: the driver hands each request to
// its engine in process and plays the response to the picker over ext_proc, as the proxy would.

// EndpointBase places the engines' addresses: engine i listens on 127.A.(B+i/250).(i%250+1)
// at Port. Fixed addresses (rather than ephemeral ports) keep a virtual run reproducible: the
// picker breaks ties by hashing endpoint addresses.
type EndpointBase struct {
	A, B byte
	Port int
}

// DefaultEndpointBase is 127.77.0.1:8000, 127.77.0.2:8000, ...
var DefaultEndpointBase = EndpointBase{A: 77, B: 0, Port: 8000}

// Addr returns engine i's host:port.
func (b EndpointBase) Addr(i int) string {
	return net.JoinHostPort(fmt.Sprintf("127.%d.%d.%d", b.A, int(b.B)+i/250, i%250+1), strconv.Itoa(b.Port))
}

// List returns the addresses of n engines.
func (b EndpointBase) List(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = b.Addr(i)
	}
	return out
}

// portTries is how many ports ListenEndpoints tries, from the base's up, when another process
// (another replay on the same machine) holds the addresses.
const portTries = 64

// Endpoints are the HTTP faces of a run's engines.
type Endpoints struct {
	base EndpointBase
	eps  []*endpoint
	srvs []*http.Server
	wg   sync.WaitGroup
}

// AddressWait is how long a replay waits for its engines' addresses when another process holds
// them (another replay's run, which ends within a minute) before it moves to the next port:
// runs on the same addresses are reproducible, on others the picker's address-hashed ties go
// differently.
const AddressWait = 90 * time.Second

// ListenEndpoints binds n engine addresses from base, waiting up to AddressWait while another
// process holds them. Then, unless fixedPort, every engine moves to the next free port (all
// engines share one port, so a run alone on the machine always gets the same addresses).
func ListenEndpoints(n int, base EndpointBase, fixedPort bool) (*Endpoints, error) {
	return ListenEndpointsWait(n, base, fixedPort, AddressWait)
}

// ListenEndpointsWait is ListenEndpoints waiting at most wait for the addresses.
func ListenEndpointsWait(n int, base EndpointBase, fixedPort bool, wait time.Duration) (*Endpoints, error) {
	if n < 1 {
		return nil, errors.New("at least one endpoint")
	}
	deadline := time.Now().Add(wait)
	for {
		lns, err := listenAll(base, n)
		if err == nil {
			return serve(base, lns), nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("simulated engines' addresses: %w", err)
		}
		if time.Now().After(deadline) {
			if fixedPort {
				return nil, fmt.Errorf("simulated engines' addresses: %w", err)
			}
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	var lastErr error
	for k := 1; k < portTries; k++ {
		b := base
		b.Port += k
		lns, err := listenAll(b, n)
		if err == nil {
			return serve(b, lns), nil
		}
		lastErr = err
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, fmt.Errorf("simulated engines' addresses: %w", lastErr)
}

func listenAll(b EndpointBase, n int) ([]net.Listener, error) {
	lns := make([]net.Listener, 0, n)
	for i := range n {
		ln, err := net.Listen("tcp", b.Addr(i))
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, err
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

func serve(b EndpointBase, lns []net.Listener) *Endpoints {
	s := &Endpoints{base: b}
	for _, ln := range lns {
		ep := &endpoint{}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /metrics", ep.metrics)
		mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		s.eps = append(s.eps, ep)
		s.srvs = append(s.srvs, srv)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = srv.Serve(ln)
		}()
	}
	return s
}

// Addrs returns the engines' addresses, in engine order.
func (s *Endpoints) Addrs() []string { return s.base.List(len(s.eps)) }

// Len is the number of engines.
func (s *Endpoints) Len() int { return len(s.eps) }

// Close stops the servers.
func (s *Endpoints) Close() error {
	s.detach()
	var errs []error
	for _, srv := range s.srvs {
		errs = append(errs, srv.Close())
	}
	s.wg.Wait()
	return errors.Join(errs...)
}

// Fetches returns how many times /metrics of engine i was fetched.
func (s *Endpoints) Fetches(i int) uint64 {
	ep := s.eps[i]
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.total
}

// serveLive makes every endpoint render its engine's state at each GET (real clock), with
// the servers' metric names (flavor).
func (s *Endpoints) serveLive(engs []*engine.Engine, opts servermetrics.Options) {
	for i, ep := range s.eps {
		ep.mu.Lock()
		ep.reset()
		ep.eng, ep.opts = engs[i], opts
		ep.mu.Unlock()
	}
}

// serveSnapshots makes the endpoints serve what publish gives them (virtual clock), to readers
// picker replicas, each scraping every endpoint.
func (s *Endpoints) serveSnapshots(readers int) {
	for _, ep := range s.eps {
		ep.mu.Lock()
		ep.reset()
		ep.readers = readers
		ep.mu.Unlock()
	}
}

// detach leaves every endpoint answering 503 until the next run.
func (s *Endpoints) detach() { s.serveSnapshots(1) }

// publish makes page the snapshot endpoint i serves. When it differs from the one served so
// far, it returns a channel closed once every picker replica has applied it: each fetched the
// page, then fetched the endpoint once more on the same connection (a picker scrapes each
// endpoint sequentially on one keep-alive connection, so its second request means it is done
// with the first answer). That second request is parked until the next page is published,
// then answered 503, which the picker counts as a failed scrape and publishes nothing from:
// the picker marks which of its picks a page reflects by the time it sent the request, so a
// page of the last tick served again later in simulated time would pass for newer than it is.
func (s *Endpoints) publish(i int, page []byte) <-chan struct{} {
	ep := s.eps[i]
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.snap != nil && bytes.Equal(ep.snap, page) {
		return nil
	}
	ep.snap, ep.done = page, 0
	clear(ep.fetched)
	ep.release()
	ep.waiter = make(chan struct{})
	return ep.waiter
}

// endpoint is one engine's HTTP face.
type endpoint struct {
	mu      sync.Mutex
	eng     *engine.Engine // live mode
	opts    servermetrics.Options
	snap    []byte         // snapshot mode: the page served
	fetched map[string]int // GETs that came for the current snapshot, per connection
	done    int            // connections that fetched the current snapshot twice
	readers int            // picker replicas: the waiter closes when this many are done
	waiter  chan struct{}  // closed once readers connections fetched the current snapshot twice
	next    chan struct{}  // closed when the snapshot changes: parked GETs answer 503
	total   uint64
}

// reset forgets the engine and the snapshot, releasing parked requests. Called with mu held.
func (ep *endpoint) reset() {
	ep.eng, ep.snap, ep.waiter, ep.done = nil, nil, nil, 0
	clear(ep.fetched)
	ep.release()
}

func (ep *endpoint) release() {
	if ep.next != nil {
		close(ep.next)
	}
	ep.next = make(chan struct{})
}

func (ep *endpoint) metrics(w http.ResponseWriter, r *http.Request) {
	ep.mu.Lock()
	ep.total++
	eng, opts, page := ep.eng, ep.opts, ep.snap
	var park chan struct{}
	if page != nil {
		// Counted per connection (a picker's scraper keeps one per endpoint, also across a
		// 503): with several picker replicas, one replica's second fetch says nothing about
		// the others.
		if ep.fetched == nil {
			ep.fetched = map[string]int{}
		}
		ep.fetched[r.RemoteAddr]++
		if n := ep.fetched[r.RemoteAddr]; n >= 2 {
			if n == 2 {
				ep.done++
			}
			if ep.waiter != nil && ep.done >= max(1, ep.readers) {
				close(ep.waiter)
				ep.waiter = nil
			}
			park = ep.next
		}
	}
	ep.mu.Unlock()
	if park != nil {
		select {
		case <-park:
		case <-r.Context().Done():
			return
		}
		http.Error(w, "no newer metrics: the simulation has not reached the next metrics tick", http.StatusServiceUnavailable)
		return
	}
	if eng != nil {
		var b bytes.Buffer
		_ = servermetrics.Write(&b, eng, opts)
		page = b.Bytes()
	}
	if page == nil {
		http.Error(w, "no engine behind this address between runs", http.StatusServiceUnavailable)
		return
	}
	// A request that names series (name[]=..., as the picker's scraper sends) gets only
	// those, as from prometheus_client's own application: one request per scrape whatever
	// the flavor, which the handshake above counts on.
	servermetrics.ExpositionFiltered.WriteAnswer(w, r, page)
}

// scrapeSync is the virtual clock's handshake with the picker's scraper: at every metrics tick
// the driver publishes each engine's page and, before simulated time moves on, waits until the
// picker has applied every page that changed. Between two ticks the picker therefore routes on
// exactly the state of the last tick, whatever the wall time the ext_proc exchanges took.
type scrapeSync struct {
	eps *Endpoints
	// first bounds the wait at the first tick: a picker that never fetches does not scrape
	// (an older build, or scraping switched off), and the run goes on without waiting.
	first, each time.Duration

	ticks, waited int
	wall          time.Duration
	timeouts      int
	off           bool
	started       bool
	note          string
}

// tick publishes pages (one per engine; nil: unchanged since the last tick) and waits as
// described on scrapeSync.
func (ss *scrapeSync) tick(ctx context.Context, pages [][]byte) error {
	ss.ticks++
	var waits []<-chan struct{}
	for i, p := range pages {
		if p == nil {
			continue
		}
		if ch := ss.eps.publish(i, p); ch != nil {
			waits = append(waits, ch)
		}
	}
	if ss.off || len(waits) == 0 {
		return nil
	}
	limit := ss.each
	if !ss.started {
		limit = ss.first
	}
	t0 := time.Now()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for _, ch := range waits {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			if !ss.started && ss.totalFetches() == 0 {
				ss.off = true
				ss.note = fmt.Sprintf("the picker never fetched /metrics within %v: it does not scrape the model servers; "+
					"the run went on without waiting for scrapes", limit)
				return nil
			}
			ss.timeouts++
			ss.wall += time.Since(t0)
			return nil
		}
	}
	ss.started = true
	ss.waited++
	ss.wall += time.Since(t0)
	return nil
}

func (ss *scrapeSync) totalFetches() uint64 {
	var n uint64
	for i := range ss.eps.Len() {
		n += ss.eps.Fetches(i)
	}
	return n
}
