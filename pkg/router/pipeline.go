package router

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvpick/kvpick/pkg/openai"
)

// Endpoints is the pool as the pipeline sees it. Snapshot must be cheap and its result must not
// be modified; the pool may change between two calls.
type Endpoints interface {
	Snapshot() []*Endpoint
	Lookup(addr string) *Endpoint
}

// WeightedScorer is a scorer and its weight in the sum.
type WeightedScorer struct {
	Scorer Scorer
	Weight float64
}

// Pipeline runs filter → score → pick for each request and fans the request's later life
// (response headers, stream end) out to the plugins that want it.
type Pipeline struct {
	pool      Endpoints
	preparers []Preparer
	filters   []Filter
	scorers   []WeightedScorer
	picker    Picker
	picked    []PickObserver
	responses []ResponseObserver
	usages    []UsageObserver
	firsts    []FirstByteObserver
	metrics   []MetricsObserver
	dones     []DoneObserver
	fallbacks int
	scratch   sync.Pool
}

// Config assembles a pipeline. Plugins is every plugin instance; each is wired into every
// stage whose interface it implements. Filters run in the order given.
type Config struct {
	Pool    Endpoints
	Plugins []Plugin
	// Weights gives each scorer's weight by plugin name; a scorer without weight gets 1.
	Weights map[string]float64
	// Fallbacks is how many further endpoints to list after the pick, best first, as the
	// proxy's retry fallbacks (0: a single address, which every data plane understands).
	Fallbacks int
}

// New validates cfg and builds the pipeline.
func New(cfg Config) (*Pipeline, error) {
	if cfg.Pool == nil {
		return nil, fmt.Errorf("pipeline: no endpoint pool")
	}
	p := &Pipeline{pool: cfg.Pool, fallbacks: cfg.Fallbacks}
	for _, pl := range cfg.Plugins {
		if x, ok := pl.(Preparer); ok {
			p.preparers = append(p.preparers, x)
		}
		if x, ok := pl.(Filter); ok {
			p.filters = append(p.filters, x)
		}
		if x, ok := pl.(Scorer); ok {
			w, ok := cfg.Weights[pl.Name()]
			if !ok {
				w = 1
			}
			if w < 0 {
				return nil, fmt.Errorf("pipeline: scorer %q has negative weight %v", pl.Name(), w)
			}
			p.scorers = append(p.scorers, WeightedScorer{x, w})
		}
		if x, ok := pl.(Picker); ok {
			if p.picker != nil {
				return nil, fmt.Errorf("pipeline: two pickers, %q and %q", p.picker.Name(), pl.Name())
			}
			p.picker = x
		}
		if x, ok := pl.(PickObserver); ok {
			p.picked = append(p.picked, x)
		}
		if x, ok := pl.(ResponseObserver); ok {
			p.responses = append(p.responses, x)
		}
		if x, ok := pl.(UsageObserver); ok {
			p.usages = append(p.usages, x)
		}
		if x, ok := pl.(FirstByteObserver); ok {
			p.firsts = append(p.firsts, x)
		}
		if x, ok := pl.(MetricsObserver); ok {
			p.metrics = append(p.metrics, x)
		}
		if x, ok := pl.(DoneObserver); ok {
			p.dones = append(p.dones, x)
		}
	}
	if p.picker == nil {
		return nil, fmt.Errorf("pipeline: no picker configured")
	}
	if cfg.Fallbacks < 0 {
		return nil, fmt.Errorf("pipeline: negative fallbacks %d", cfg.Fallbacks)
	}
	return p, nil
}

type scratch struct {
	eps    []*Endpoint
	scores []float64
	tmp    []float64
}

// Decision is the outcome of Schedule: the endpoint to use and, when configured, fallbacks.
type Decision struct {
	Endpoint  *Endpoint
	Fallbacks []*Endpoint
}

// Schedule picks an endpoint for req and counts the request in flight there. Every successful
// Schedule must be followed by exactly one Done.
func (p *Pipeline) Schedule(ctx context.Context, req *Request) (Decision, error) {
	if req.Now.IsZero() {
		req.Now = time.Now()
	}
	for _, x := range p.preparers {
		x.Prepare(ctx, req)
	}
	ex := req.Explain
	if ex != nil {
		ex.reset()
	}
	s, _ := p.scratch.Get().(*scratch)
	if s == nil {
		s = &scratch{}
	}
	defer p.scratch.Put(s)

	eps := append(s.eps[:0], p.pool.Snapshot()...)
	if len(eps) == 0 {
		s.eps = eps
		return Decision{}, ErrNoEndpoint("the inference pool has no ready endpoint")
	}
	for _, f := range p.filters {
		eps = f.Filter(ctx, req, eps)
		if len(eps) == 0 {
			s.eps = eps
			if sh, ok := f.(Shedder); ok && sh.Sheds() {
				return Decision{}, ErrOverloaded("every eligible endpoint is at its load limit; retry later")
			}
			return Decision{}, ErrNoEndpoint(fmt.Sprintf("no endpoint is eligible (excluded by %s)", f.Name()))
		}
	}
	s.eps = eps
	scores := grow(s.scores, len(eps))
	tmp := grow(s.tmp, len(eps))
	s.scores, s.tmp = scores, tmp
	clear(scores)
	if ex != nil {
		ex.begin(p.scorers, eps)
	}
	for j, ws := range p.scorers {
		clear(tmp)
		ws.Scorer.Score(ctx, req, eps, tmp)
		w := ws.Weight
		for i, v := range tmp {
			// Clamp so that one misbehaving scorer cannot outweigh the others.
			scores[i] += w * clamp01(v)
		}
		if ex != nil {
			ex.record(j, tmp)
		}
	}
	i := p.picker.Pick(ctx, req, eps, scores)
	if ex != nil {
		ex.end(scores, i)
	}
	if i < 0 || i >= len(eps) {
		return Decision{}, ErrNoEndpoint(fmt.Sprintf("picker %s chose no endpoint", p.picker.Name()))
	}
	d := Decision{Endpoint: eps[i]}
	if p.fallbacks > 0 && len(eps) > 1 {
		d.Fallbacks = rankOthers(eps, scores, i, p.fallbacks)
	}
	d.Endpoint.AddInFlight(1)
	req.PickSeq = d.Endpoint.countPick()
	p.notifyPicked(req, d.Endpoint)
	return d, nil
}

// notifyPicked tells the PickObservers. If one panics the caller never learns the decision,
// so it could never call Done: the request is ended here (in-flight count, every plugin's
// state) before the panic goes on to the server's recovery.
func (p *Pipeline) notifyPicked(req *Request, ep *Endpoint) {
	ok := false
	defer func() {
		if !ok {
			p.Done(req, ep)
		}
	}()
	for _, x := range p.picked {
		x.Picked(req, ep)
	}
	ok = true
}

// rankOthers returns up to n endpoints other than eps[skip], by descending score.
func rankOthers(eps []*Endpoint, scores []float64, skip, n int) []*Endpoint {
	idx := make([]int, 0, len(eps)-1)
	for i := range eps {
		if i != skip {
			idx = append(idx, i)
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case scores[a] > scores[b]:
			return -1
		case scores[a] < scores[b]:
			return 1
		}
		return 0
	})
	out := make([]*Endpoint, 0, min(n, len(idx)))
	for _, i := range idx[:min(n, len(idx))] {
		out = append(out, eps[i])
	}
	return out
}

// ResponseHeaders reports the upstream's status. servedAddr is the endpoint the proxy says
// served the request ("" when it did not say); it defaults to the picked one.
func (p *Pipeline) ResponseHeaders(req *Request, picked *Endpoint, servedAddr string, status int) {
	served := p.served(picked, servedAddr)
	for _, x := range p.responses {
		x.ResponseHeaders(req, served, status)
	}
}

// FirstByte reports the first byte of the response body. servedAddr is as for ResponseHeaders.
// The server calls it at most once per request.
func (p *Pipeline) FirstByte(req *Request, picked *Endpoint, servedAddr string) {
	if len(p.firsts) == 0 {
		return
	}
	served := p.served(picked, servedAddr)
	for _, x := range p.firsts {
		x.FirstByte(req, served)
	}
}

// Usage hands the server's usage report of a successful response to the plugins that want it.
// servedAddr is as for ResponseHeaders.
func (p *Pipeline) Usage(req *Request, picked *Endpoint, servedAddr string, u openai.Usage) {
	if len(p.usages) == 0 {
		return
	}
	served := p.served(picked, servedAddr)
	for _, x := range p.usages {
		x.Usage(req, served, u)
	}
}

// WantsUsage reports whether any plugin reads usage reports, so that the server can skip
// looking for them.
func (p *Pipeline) WantsUsage() bool { return len(p.usages) > 0 }

func (p *Pipeline) served(picked *Endpoint, servedAddr string) *Endpoint {
	if servedAddr != "" && servedAddr != picked.Addr {
		return p.pool.Lookup(servedAddr)
	}
	return picked
}

// Done ends the request's life in the pipeline: it leaves the in-flight count and every plugin
// drops what it kept for it.
func (p *Pipeline) Done(req *Request, picked *Endpoint) {
	picked.AddInFlight(-1)
	for _, x := range p.dones {
		x.Done(req, picked)
	}
}

// MetricsUpdated hands a new scrape of ep's metrics to the plugins that want it. The scraper
// calls it after ep.SetMetrics(m).
func (p *Pipeline) MetricsUpdated(ep *Endpoint, m *Metrics) {
	for _, x := range p.metrics {
		x.MetricsUpdated(ep, m)
	}
}

// Pool returns the endpoints the pipeline schedules over.
func (p *Pipeline) Pool() Endpoints { return p.pool }

func grow(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}

// clamp01 is v within [0, 1], NaN as 0: min and max would pass a NaN on and poison the sum
// (and the explanation's JSON). Written out, it also runs faster than min(max(v, 0), 1), which
// must order NaNs, on the loop every scorer's every candidate goes through.
func clamp01(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	if v > 1 {
		return 1
	}
	return v
}
