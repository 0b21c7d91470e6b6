package runner

import (
	"sync"

	"go.uber.org/zap"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvpick/kvpick/pkg/pool"
	"github.com/kvpick/kvpick/pkg/router"
)

// ServiceInferenceExtension is the health service the reference InferencePool chart's probes
// ask for; it follows readiness.
const ServiceInferenceExtension = "inference-extension"

// readinessServices all report the same status: "" (the server as a whole), readiness, the
// ext_proc service (the proxy's cluster health check) and the reference chart's name.
var readinessServices = []string{"", ServiceReadiness, ServiceExtProc, ServiceInferenceExtension}

// readiness decides whether the picker reports ready: its pool's source has delivered the
// pool at least once, the pool is not empty, this replica leads (when leader election is on),
// and it is not shutting down. A picker that would answer every request 503 must not be ready,
// or the proxy sends it traffic it cannot route.
type readiness struct {
	hs  *health.Server
	p   *pool.Pool
	log *zap.Logger

	mu          sync.Mutex
	synced      bool
	needHealthy bool // health checks are on: some endpoint must have passed one
	needLeader  bool
	leader      bool
	stopping    bool
	serving     bool
	reported    bool // serving has been written at least once
}

func newReadiness(hs *health.Server, p *pool.Pool, needLeader bool, log *zap.Logger) *readiness {
	r := &readiness{hs: hs, p: p, needLeader: needLeader, log: log}
	r.update(func() {})
	return r
}

// update applies f to the inputs under the lock and publishes the result if it changed.
func (r *readiness) update(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f()
	eps := r.p.Snapshot() // one membership for both checks below
	reason := ""
	switch {
	case r.stopping:
		reason = "shutting down"
	case !r.synced:
		reason = "the pool has not been read from its source yet"
	case len(eps) == 0:
		reason = "the pool has no endpoints"
	case r.needHealthy && !anyHealthy(eps):
		reason = "no endpoint has passed its health check"
	case r.needLeader && !r.leader:
		reason = "another replica leads"
	}
	serving := reason == ""
	if r.reported && serving == r.serving {
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, svc := range readinessServices {
		r.hs.SetServingStatus(svc, st)
	}
	if r.reported || serving {
		if serving {
			r.log.Info("readiness: SERVING", zap.Int("endpoints", len(r.p.Snapshot())))
		} else {
			r.log.Info("readiness: NOT_SERVING", zap.String("reason", reason))
		}
	}
	r.serving, r.reported = serving, true
}

// Set implements discovery.Sink and is what the static pool goes through too: the pool
// changes, then readiness follows.
func (r *readiness) Set(addrs []string) {
	r.p.Set(addrs)
	r.update(func() { r.synced = true })
}

func (r *readiness) setLeader(leader bool) { r.update(func() { r.leader = leader }) }

func (r *readiness) shutdown() { r.update(func() { r.stopping = true }) }

// Serving reports the current readiness.
func (r *readiness) Serving() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.serving
}

// anyHealthy reports whether an endpoint passes its health checks.
func anyHealthy(eps []*router.Endpoint) bool {
	for _, e := range eps {
		if e.Healthy() {
			return true
		}
	}
	return false
}

// healthChanged re-evaluates readiness after an endpoint's health changed.
func (r *readiness) healthChanged() { r.update(func() {}) }

// requireHealthy makes readiness wait for an endpoint that passed its health check: with
// checks on, endpoints join unhealthy until their first good probe, and a picker reporting
// ready before that would answer its first requests 503.
func (r *readiness) requireHealthy() { r.update(func() { r.needHealthy = true }) }
