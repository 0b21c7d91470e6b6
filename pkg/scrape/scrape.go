// Package scrape reads every pool endpoint's Prometheus metrics page (vLLM, SGLang, or the
// names a pool configures) on its own loop and publishes the result on the endpoint
// (router.Endpoint.SetMetrics), where scorers and filters read it without waiting.
//
// Each endpoint has one goroutine that scrapes, waits for the interval, and scrapes again: at
// most one scrape per endpoint is in flight, a slow or dead server delays only its own loop, and
// the loops start at random phases so that a large pool is not scraped in one burst. Each loop
// keeps one keep-alive connection to its server (conn). A failed scrape leaves the last good
// metrics in place; they stop being trusted by themselves when their StaleAt passes.
package scrape

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/router"
)

// Observer learns every metrics update (router.Pipeline's MetricsUpdated fans it out to the
// plugins that want it). It is called on the endpoint's scrape loop, after SetMetrics: in order
// for one endpoint, concurrently across endpoints.
type Observer interface {
	MetricsUpdated(ep *router.Endpoint, m *router.Metrics)
}

// Options are a Scraper's dependencies.
type Options struct {
	// Pool is where Run finds the endpoints that exist when it starts; later changes arrive
	// through EndpointsChanged (register the Scraper with the pool's Listen).
	Pool router.Endpoints
	Log  *zap.Logger
	// Registerer receives the scraper's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Observer, when set, is told about every published scrape.
	Observer Observer
}

// Scraper scrapes the metrics of every endpoint of a pool.
type Scraper struct {
	cfg      config.ModelServerMetrics
	schema   *schema
	paths    [numVariants]string // request targets (request.go)
	pool     router.Endpoints
	log      *zap.Logger
	observer Observer
	duration prometheus.Histogram
	// wrapConn, set by tests before Run, wraps every loop's connections.
	wrapConn func(net.Conn) net.Conn

	mu      sync.Mutex
	ran     bool
	ctx     context.Context // Run's, while it runs; nil before and once it stops
	loops   map[*router.Endpoint]*loop
	running sync.WaitGroup
}

var _ router.PoolListener = (*Scraper)(nil)

// New returns a scraper for cfg (already validated by config.Validate). Run starts it.
func New(cfg config.ModelServerMetrics, o Options) (*Scraper, error) {
	sc, err := newSchema(cfg)
	if err != nil {
		return nil, err
	}
	log := o.Log
	if log == nil {
		log = zap.NewNop()
	}
	var names []string
	for _, f := range sc.families {
		names = append(names, f.name)
	}
	s := &Scraper{
		cfg:      cfg,
		schema:   sc,
		paths:    requestPaths(cfg.Path, cfg.FilterFamilies, names),
		pool:     o.Pool,
		log:      log.With(zap.String("component", "metrics-scraper")),
		observer: o.Observer,
		loops:    map[*router.Endpoint]*loop{},
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvpick_model_server_scrape_duration_seconds",
			Help:    "Time to scrape one endpoint's metrics page: request, body and parse.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5},
		}),
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{s.duration, (*collector)(s)} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("model-server metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Enabled reports whether scraping is configured (refreshInterval > 0).
func (s *Scraper) Enabled() bool { return s.cfg.RefreshInterval > 0 }

// Run scrapes every endpoint until ctx ends, then waits for every loop to stop. It returns at
// once when scraping is disabled.
func (s *Scraper) Run(ctx context.Context) {
	if !s.Enabled() {
		return
	}
	s.mu.Lock()
	if s.ran {
		s.mu.Unlock()
		panic("scrape: Run called twice")
	}
	s.ran, s.ctx = true, ctx
	if s.pool != nil {
		for _, ep := range s.pool.Snapshot() {
			if _, ok := s.loops[ep]; !ok && !ep.Removed() {
				s.loops[ep] = &loop{ep: ep}
			}
		}
	}
	for _, l := range s.loops {
		s.startLocked(l)
	}
	s.mu.Unlock()

	<-ctx.Done()
	s.mu.Lock()
	s.ctx = nil // no loop starts from here on, so the wait below is final
	s.mu.Unlock()
	s.running.Wait()
}

// EndpointsChanged implements router.PoolListener: added endpoints get a loop, removed ones
// lose theirs. The pool calls it under its lock, so it only starts and cancels goroutines.
func (s *Scraper) EndpointsChanged(added, removed []*router.Endpoint) {
	if !s.Enabled() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ep := range removed {
		if l, ok := s.loops[ep]; ok {
			if l.cancel != nil {
				l.cancel()
			}
			delete(s.loops, ep)
		}
	}
	for _, ep := range added {
		if _, ok := s.loops[ep]; ok || ep.Removed() {
			continue
		}
		l := &loop{ep: ep}
		s.loops[ep] = l
		if s.ctx != nil {
			s.startLocked(l)
		}
	}
}

func (s *Scraper) startLocked(l *loop) {
	if l.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	l.cancel = cancel
	l.rd = newReader(s.schema)
	l.choice = newChoice(s.paths)
	l.conn = newConn(l.ep.Addr, s.paths)
	l.conn.wrap = s.wrapConn
	s.running.Add(1)
	go func() {
		defer s.running.Done()
		defer cancel()
		defer l.conn.close() // the endpoint left or the picker stops
		s.loop(ctx, l)
	}()
}

// loop is one endpoint's scrape loop and what the collector reports about it.
type loop struct {
	ep     *router.Endpoint
	cancel context.CancelFunc // set when the goroutine starts
	rd     *reader
	conn   *conn
	choice choice // touched only by the loop's goroutine

	counts    [numResults]atomic.Uint64
	pageBytes atomic.Int64 // the size of the last page read

	// Log state, touched only by the loop's goroutine.
	prev         result // the last scrape's result
	logged       result // the result last logged (ok until a line says otherwise)
	loggedAt     time.Time
	changes      int // results that differed from the one before, since the last log line
	failures     int // scrapes that did not publish since the last one that did
	engine       string
	truncation   bool
	loggedFilter answer // how the server answered the filter, as last logged (logRequest)
}

func (s *Scraper) loop(ctx context.Context, l *loop) {
	interval := s.cfg.RefreshInterval.D()
	// A random phase spreads the loops of a large pool over the interval.
	t := time.NewTimer(rand.N(interval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		s.scrapeOnce(ctx, l)
		if ctx.Err() != nil {
			return
		}
		// The next scrape starts one interval after this one started, or at once when this one
		// took longer: never two at a time, never a backlog.
		t.Reset(max(0, interval-time.Since(start)))
	}
}

// scrapeOnce scrapes l's endpoint once and publishes what it read. It sends the loop's chosen
// request and, when the answer holds none of the families but another request may (see
// variant), that one at once, all within one timeout.
func (s *Scraper) scrapeOnce(ctx context.Context, l *loop) {
	start := time.Now()
	deadline := start.Add(s.cfg.Timeout.D())
	saved := l.choice
	var (
		rd    reading
		res   result
		err   error
		picks int64
		ans   answer
	)
	v := l.choice.use
	for {
		// Taken before the request leaves: picks after this are requests the page cannot show.
		picks = l.ep.Picks()
		rd, res, err = s.fetch(ctx, l, v, deadline)
		if ctx.Err() != nil {
			return // the endpoint left the pool or the picker is stopping: nothing to record
		}
		ans = classifyAnswer(res, l.conn.status, rd)
		next, again := l.choice.after(v, ans, time.Now())
		if !again {
			break
		}
		v = next
	}
	if ans == answerNone && v != saved.use {
		// No request found the families: nothing was learnt about the requests (the server
		// reports none yet, or its page moved), so the cheapest stays in use.
		l.choice = saved
	}
	now := time.Now()
	s.duration.Observe(now.Sub(start).Seconds())
	l.counts[res].Add(1)

	failed := l.failures
	if res.publishes() {
		m := rd.m
		m.ScrapedAt = now
		m.StaleAt = now.Add(s.cfg.StalenessThreshold.D())
		m.PicksAtScrape = picks
		l.ep.SetMetrics(&m)
		if s.observer != nil {
			s.observer.MetricsUpdated(l.ep, &m)
		}
		l.failures = 0
	} else {
		l.failures++
	}
	s.logRequest(l, v, ans)
	s.logState(l, res, rd, err, failed, now)
}

// fetch sends variant v's request and reads the page of a 200 answer.
func (s *Scraper) fetch(ctx context.Context, l *loop, v variant, deadline time.Time) (reading, result, error) {
	buf := getBuf()
	defer putBuf(buf)
	res, err := l.conn.get(ctx, deadline, v, s.cfg.MaxBodyBytes, buf)
	if err != nil {
		return reading{}, res, err
	}
	l.pageBytes.Store(int64(len(*buf)))
	rd := l.rd.read(*buf)
	return rd, rd.result, nil
}

// Body buffers are pooled: few scrapes are in flight at once, so a few buffers serve hundreds
// of endpoints.
var bufs sync.Pool

func getBuf() *[]byte {
	if p, _ := bufs.Get().(*[]byte); p != nil {
		return p
	}
	return new([]byte)
}

func putBuf(p *[]byte) {
	if p == nil || cap(*p) > 4<<20 {
		return // do not keep a giant page's buffer
	}
	*p = (*p)[:0]
	bufs.Put(p)
}

// logRequest logs how the server answers the filtered request when that changes: rarely, since
// a request given up on is not tried again for filterRetry.
func (s *Scraper) logRequest(l *loop, v variant, a answer) {
	if l.choice.paths[variantFiltered] == "" || a == answerFailed || a == answerNone {
		return
	}
	kind := a // answerFiltered or answerWhole: the server filters, or ignores the filter
	if v == variantWhole {
		kind = answerNone // the filter was given up on
	}
	if kind == l.loggedFilter {
		return
	}
	first := l.loggedFilter == answerFailed
	l.loggedFilter = kind
	if first && kind == answerFiltered && v == variantFiltered {
		return // as configured: nothing to say
	}
	fields := []zap.Field{zap.String("endpoint", l.ep.Addr), zap.String("request", l.choice.paths[v]),
		zap.Int64("page_bytes", l.pageBytes.Load())}
	switch kind {
	case answerNone:
		s.log.Info("model server metrics: asking for the whole page (the filtered request got no family)",
			append(fields, zap.Duration("filter_retry", filterRetry))...)
	case answerFiltered:
		s.log.Info("model server metrics: the server sends only the families asked for", fields...)
	default:
		s.log.Info("model server metrics: the server ignores the name[] filter and sends the whole page", fields...)
	}
}

// logEvery rate-limits one endpoint's log lines: a state (ok, timeout, ...) is logged when it
// changes, at most once per logEvery; changes in between are counted in the next line.
const logEvery = 10 * time.Second

// logState logs l's result when it changed; failed is the count of scrapes before this one
// that did not publish.
func (s *Scraper) logState(l *loop, res result, rd reading, err error, failed int, now time.Time) {
	if res.publishes() && rd.engine != "" && rd.engine != l.engine {
		l.engine = rd.engine
		s.log.Info("model server metrics detected", zap.String("endpoint", l.ep.Addr), zap.String("engine", rd.engine))
	}
	if rd.truncated != "" && !l.truncation {
		l.truncation = true
		s.log.Warn("metric families with more series than the scraper reads; the rest is ignored",
			zap.String("endpoint", l.ep.Addr), zap.String("families", strings.TrimSpace(rd.truncated)), zap.Int("max_series", maxSeriesPerFamily))
	}
	if res != l.prev {
		l.prev = res
		l.changes++
	}
	if res == l.logged || (!l.loggedAt.IsZero() && now.Sub(l.loggedAt) < logEvery) {
		return
	}
	fields := []zap.Field{zap.String("endpoint", l.ep.Addr), zap.String("result", res.String()),
		zap.Int("state_changes", l.changes)}
	switch {
	case res == resultOK:
		s.log.Info("model server metrics scraped again", append(fields, zap.Int("failed_scrapes", failed))...)
	case res.publishes():
		s.log.Warn("model server metrics incomplete: the picker falls back to its own accounting for what is missing",
			append(fields, zap.String("detail", rd.detail))...)
	default:
		if err != nil {
			fields = append(fields, zap.Error(err))
		}
		if rd.detail != "" {
			fields = append(fields, zap.String("detail", rd.detail))
		}
		s.log.Warn("model server metrics scrape failed: keeping the last good metrics until they go stale, then the picker's own accounting",
			append(fields, zap.Duration("stale_after", s.cfg.StalenessThreshold.D()))...)
	}
	l.logged, l.loggedAt, l.changes = res, now, 0
}
