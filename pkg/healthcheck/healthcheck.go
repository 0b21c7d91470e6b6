// Package healthcheck probes the pool's endpoints over HTTP and marks those that do not answer
// unhealthy, so that the health filter does not route to them, and healthy once they do.
//
// Each endpoint has one long-lived probe loop, from the moment it joins the pool until it
// leaves, over a kept-alive connection: a round costs neither a goroutine nor a TCP handshake
// per endpoint. An endpoint that joins is unhealthy until its first good probe, so that a
// server that is not up yet (a pod whose process is still loading its model) gets no request.
package healthcheck

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/router"
)

// Pool is what the checker needs from the endpoint pool: to see every endpoint before it is
// published (pool.Pool implements it).
type Pool interface {
	router.Endpoints
	OnAdd(func(*router.Endpoint))
}

// Checker probes every endpoint of a pool once per interval.
type Checker struct {
	cfg    config.HealthCheck
	client *http.Client
	log    *zap.Logger

	mu       sync.Mutex
	loops    map[*router.Endpoint]struct{} // endpoints with a running probe loop
	onChange func()                        // called after an endpoint's health changed
}

// OnChange registers f, called (on a probe loop's goroutine) after any endpoint turned healthy
// or unhealthy. Register before Watch.
func (c *Checker) OnChange(f func()) {
	c.mu.Lock()
	c.onChange = f
	c.mu.Unlock()
}

// New returns a checker; Watch starts it.
func New(cfg config.HealthCheck, log *zap.Logger) *Checker {
	timeout := cfg.Timeout.D()
	return &Checker{
		cfg: cfg,
		client: &http.Client{
			Timeout: timeout,
			Transport: &http.Transport{
				// One kept-alive connection per endpoint, reused by every probe. A server that
				// dies without closing it fails the next probe by its timeout, and the failed
				// connection is dropped.
				MaxIdleConnsPerHost: 1,
				IdleConnTimeout:     3 * max(cfg.Interval.D(), time.Second),
				DialContext:         (&net.Dialer{Timeout: timeout}).DialContext,
				DisableCompression:  true,
			},
		},
		log:   log,
		loops: map[*router.Endpoint]struct{}{},
	}
}

// Enabled reports whether the configuration asks for probes (interval > 0).
func (c *Checker) Enabled() bool { return c.cfg.Interval > 0 }

// Watch makes the checker follow p until ctx ends: every endpoint that joins p is unhealthy
// until its first good probe and is probed by a loop of its own until it leaves. Endpoints
// already in p are treated alike. Call it before p is populated, so that no request can pick an
// endpoint not probed yet. With probes disabled it does nothing: endpoints are healthy at once.
func (c *Checker) Watch(ctx context.Context, p Pool) {
	if !c.Enabled() {
		return
	}
	p.OnAdd(func(e *router.Endpoint) {
		e.SetHealthy(false)
		c.start(ctx, e)
	})
	for _, e := range p.Snapshot() {
		e.SetHealthy(false)
		c.start(ctx, e)
	}
}

// Loops returns the number of running probe loops (one per endpoint in the pool).
func (c *Checker) Loops() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.loops)
}

func (c *Checker) start(ctx context.Context, e *router.Endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.loops[e]; ok {
		return
	}
	c.loops[e] = struct{}{}
	go c.loop(ctx, e)
}

// loop probes e at once, then every interval, until e leaves the pool or ctx ends.
func (c *Checker) loop(ctx context.Context, e *router.Endpoint) {
	defer func() {
		c.mu.Lock()
		delete(c.loops, e)
		c.mu.Unlock()
	}()
	t := time.NewTicker(c.cfg.Interval.D())
	defer t.Stop()
	var h health
	for {
		if e.Removed() || ctx.Err() != nil {
			return
		}
		c.apply(e, h.record(c.probe(ctx, e), c.cfg))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *Checker) probe(ctx context.Context, e *router.Endpoint) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.Addr+c.cfg.Path, nil)
	if err != nil {
		return false
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return false
	}
	// Read what a health page holds, so that the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode <= 299
}

// verdict is what one probe changes.
type verdict uint8

const (
	unchanged verdict = iota
	becameHealthy
	firstHealthy
	becameUnhealthy
)

// health is one endpoint's probe history.
type health struct {
	probed  bool // a probe has succeeded once
	healthy bool
	streak  int // >0: consecutive successes, <0: consecutive failures
}

// record applies one probe's result to the thresholds.
func (h *health) record(ok bool, cfg config.HealthCheck) verdict {
	switch {
	case ok && h.streak >= 0:
		h.streak++
	case ok:
		h.streak = 1
	case h.streak <= 0:
		h.streak--
	default:
		h.streak = -1
	}
	switch {
	case ok && !h.probed:
		// A new endpoint: healthy at its first good probe.
		h.probed, h.healthy = true, true
		return firstHealthy
	case h.healthy && -h.streak >= cfg.UnhealthyThreshold:
		h.healthy = false
		return becameUnhealthy
	case !h.healthy && h.probed && h.streak >= cfg.HealthyThreshold:
		h.healthy = true
		return becameHealthy
	}
	return unchanged
}

func (c *Checker) apply(e *router.Endpoint, v verdict) {
	defer func() {
		if v == unchanged {
			return
		}
		c.mu.Lock()
		f := c.onChange
		c.mu.Unlock()
		if f != nil {
			f()
		}
	}()
	switch v {
	case firstHealthy:
		e.SetHealthy(true)
		c.log.Debug("endpoint passed its first health check", zap.String("endpoint", e.Addr))
	case becameUnhealthy:
		e.SetHealthy(false)
		c.log.Warn("endpoint failed its health checks; no longer routing to it",
			zap.String("endpoint", e.Addr), zap.Int("failures", c.cfg.UnhealthyThreshold))
	case becameHealthy:
		e.SetHealthy(true)
		c.log.Info("endpoint passes its health checks again", zap.String("endpoint", e.Addr))
	}
}
