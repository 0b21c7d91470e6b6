package runner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/discovery"
	"github.com/kvpick/kvpick/pkg/ha"
	"github.com/kvpick/kvpick/pkg/inferencepool"
)

// Kubernetes says which InferencePool the picker serves. The pool's endpoints come from the
// API server; the configuration's static endpoints must then be empty.
type Kubernetes struct {
	Kubeconfig    string // "" = KUBECONFIG, ~/.kube/config or the in-cluster service account
	PoolName      string
	PoolNamespace string // "" = the pod's own namespace (discovery.PoolNamespace)
	PoolGroup     string // "" = inference.networking.k8s.io
	// LeaderElection turns on active-passive HA: only the replica holding the Lease reports
	// ready. Identity names this replica ("" = POD_NAME or the host name, plus a random
	// suffix); LeaseName names the Lease ("" = kvpick-<pool name>).
	LeaderElection bool
	Identity       string
	LeaseName      string
}

// kubeSource runs discovery and, with HA, leader election.
type kubeSource struct {
	watcher *discovery.Watcher
	elector *ha.Elector
	log     *zap.Logger

	wg           sync.WaitGroup
	stopWatch    context.CancelFunc
	stopElection context.CancelFunc
}

// ErrStaticAndKubernetes is returned when both a static pool and --pool-name are configured.
var ErrStaticAndKubernetes = fmt.Errorf("a static pool (--endpoints or pool.endpoints in the config file) and Kubernetes discovery (--pool-name) are exclusive: set one of them")

func newKubeSource(k *Kubernetes, le config.LeaderElection, gate *readiness, reg prometheus.Registerer, log *zap.Logger) (*kubeSource, error) {
	if k.PoolName == "" {
		return nil, fmt.Errorf("--pool-name is required for Kubernetes discovery")
	}
	group := k.PoolGroup
	if group == "" {
		group = inferencepool.GroupV1
	}
	if _, err := inferencepool.GVR(group); err != nil {
		return nil, fmt.Errorf("--pool-group: %w", err)
	}
	clients, err := discovery.NewClients(k.Kubeconfig, "kvpick-extproc")
	if err != nil {
		return nil, err
	}
	ns := discovery.PoolNamespace(k.PoolNamespace, clients.Namespace)
	w, err := discovery.New(discovery.Options{
		Namespace: ns, PoolName: k.PoolName, PoolGroup: group,
		Client: clients.Typed, Dynamic: clients.Dynamic, Sink: gate, Log: log.Named("discovery"),
	})
	if err != nil {
		return nil, err
	}
	s := &kubeSource{watcher: w, log: log}
	if k.LeaderElection {
		id := k.Identity
		if id == "" {
			if id = os.Getenv("POD_NAME"); id == "" {
				id, _ = os.Hostname()
			}
			// Unique even if two processes share a name (a restarted container, a test).
			b := make([]byte, 4)
			_, _ = rand.Read(b)
			id += "_" + hex.EncodeToString(b)
		}
		lease := k.LeaseName
		if lease == "" {
			lease = "kvpick-" + k.PoolName
			if len(lease) > 253 {
				lease = lease[:253]
			}
		}
		leaderGauge := prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvpick_ha_leader",
			Help: "1 while this replica holds the leader Lease (--ha-enable-leader-election) and reports ready.",
		})
		reg.MustRegister(leaderGauge)
		s.elector, err = ha.New(ha.Options{
			Client: clients.Typed, Namespace: ns, LeaseName: lease, Identity: id,
			LeaseDuration: le.LeaseDuration.D(), RenewDeadline: le.RenewDeadline.D(), RetryPeriod: le.RetryPeriod.D(),
			Log: log.Named("ha"),
			OnChange: func(leader bool) {
				if leader {
					leaderGauge.Set(1)
				} else {
					leaderGauge.Set(0)
				}
				gate.setLeader(leader)
			},
		})
		if err != nil {
			return nil, err
		}
	}
	log.Info("Kubernetes discovery", zap.String("pool", ns+"/"+k.PoolName), zap.String("group", group),
		zap.String("api_server", clients.Config.Host), zap.Bool("leader_election", k.LeaderElection))
	return s, nil
}

// start runs discovery and the election in the background until stop.
func (s *kubeSource) start() {
	wctx, cancel := context.WithCancel(context.Background())
	s.stopWatch = cancel
	s.wg.Go(func() {
		if err := s.watcher.Run(wctx); err != nil {
			s.log.Error("discovery stopped", zap.Error(err))
		}
	})
	if s.elector != nil {
		ectx, cancel := context.WithCancel(context.Background())
		s.stopElection = cancel
		s.wg.Go(func() { s.elector.Run(ectx) })
	}
}

// resign gives up the lease (a follower takes over within its retry period), keeping
// discovery running for the streams still draining.
func (s *kubeSource) resign() {
	if s.stopElection != nil {
		s.stopElection()
	}
}

// stop ends discovery and the election and waits for them.
func (s *kubeSource) stop() {
	s.resign()
	if s.stopWatch != nil {
		s.stopWatch()
	}
	s.wg.Wait()
}
