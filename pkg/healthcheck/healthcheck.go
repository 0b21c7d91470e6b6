// Package healthcheck probes the pool's endpoints over HTTP and marks those that stop answering
// unhealthy, so that the health filter stops routing to them, and healthy again once they recover.
package healthcheck

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/router"
)

// Checker probes every endpoint of a pool once per interval.
type Checker struct {
	cfg    config.HealthCheck
	pool   router.Endpoints
	client *http.Client
	log    *zap.Logger

	mu     sync.Mutex
	streak map[*router.Endpoint]int // >0: consecutive successes, <0: consecutive failures
}

// New returns a checker; Run starts it.
func New(cfg config.HealthCheck, pool router.Endpoints, log *zap.Logger) *Checker {
	return &Checker{
		cfg:  cfg,
		pool: pool,
		client: &http.Client{
			Timeout: cfg.Timeout.D(),
			// Probes must not hold connections that a dying server would keep half-open.
			Transport: &http.Transport{DisableKeepAlives: true, MaxIdleConnsPerHost: -1},
		},
		log:    log,
		streak: map[*router.Endpoint]int{},
	}
}

// Run probes until ctx ends. It does nothing when the interval is 0.
func (c *Checker) Run(ctx context.Context) {
	if c.cfg.Interval <= 0 {
		return
	}
	t := time.NewTicker(c.cfg.Interval.D())
	defer t.Stop()
	for {
		c.Round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Round probes every endpoint once, concurrently, and applies the thresholds.
func (c *Checker) Round(ctx context.Context) {
	eps := c.pool.Snapshot()
	var wg sync.WaitGroup
	for _, e := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.record(e, c.probe(ctx, e))
		}()
	}
	wg.Wait()
	// Forget endpoints that left the pool.
	live := make(map[*router.Endpoint]bool, len(eps))
	for _, e := range eps {
		live[e] = true
	}
	c.mu.Lock()
	for e := range c.streak {
		if !live[e] {
			delete(c.streak, e)
		}
	}
	c.mu.Unlock()
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
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode <= 299
}

func (c *Checker) record(e *router.Endpoint, ok bool) {
	c.mu.Lock()
	s := c.streak[e]
	switch {
	case ok && s >= 0:
		s++
	case ok:
		s = 1
	case s <= 0:
		s--
	default:
		s = -1
	}
	c.streak[e] = s
	c.mu.Unlock()
	switch {
	case e.Healthy() && -s >= c.cfg.UnhealthyThreshold:
		e.SetHealthy(false)
		c.log.Warn("endpoint failed its health checks; no longer routing to it",
			zap.String("endpoint", e.Addr), zap.Int("failures", -s))
	case !e.Healthy() && s >= c.cfg.HealthyThreshold:
		e.SetHealthy(true)
		c.log.Info("endpoint passes its health checks again", zap.String("endpoint", e.Addr))
	}
}
