// Package ha runs active-passive leader election among picker replicas with a
// coordination.k8s.io Lease: only the leader reports ready, so the proxy sends all traffic to
// one replica whose prefix index sees every request. The others keep their discovery warm and
// take over when the leader's lease lapses or is released.
package ha

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Options configure the election.
type Options struct {
	Client    kubernetes.Interface
	Namespace string
	LeaseName string
	Identity  string // unique per replica (the pod name)
	// LeaseDuration is how long followers wait after the last renewal before taking over a
	// leader that died; RenewDeadline how long the leader keeps trying to renew before it
	// steps down; RetryPeriod how often each replica tries.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Log                                       *zap.Logger
	// OnChange is called with true when this replica starts leading and false when it stops.
	OnChange func(leader bool)
}

// Elector runs the election.
type Elector struct {
	o      Options
	leader atomic.Bool
}

// New checks the options.
func New(o Options) (*Elector, error) {
	switch {
	case o.Client == nil:
		return nil, fmt.Errorf("leader election: no client")
	case o.Namespace == "" || o.LeaseName == "" || o.Identity == "":
		return nil, fmt.Errorf("leader election: namespace, lease name and identity are required")
	case o.LeaseDuration <= o.RenewDeadline:
		return nil, fmt.Errorf("leader election: lease duration %v must exceed the renew deadline %v", o.LeaseDuration, o.RenewDeadline)
	case o.RetryPeriod <= 0 || o.RenewDeadline <= o.RetryPeriod:
		return nil, fmt.Errorf("leader election: renew deadline %v must exceed the retry period %v", o.RenewDeadline, o.RetryPeriod)
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.OnChange == nil {
		o.OnChange = func(bool) {}
	}
	return &Elector{o: o}, nil
}

// Leader reports whether this replica holds the lease.
func (e *Elector) Leader() bool { return e.leader.Load() }

// Run takes part in the election until ctx ends; a replica that loses the lease goes back to
// waiting for it. When ctx ends, a leader releases the lease so a follower takes over within
// its retry period rather than after the lease lapses.
func (e *Elector) Run(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.o.Namespace, Name: e.o.LeaseName},
		Client:     e.o.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.o.Identity},
	}
	cfg := leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   e.o.LeaseDuration,
		RenewDeadline:   e.o.RenewDeadline,
		RetryPeriod:     e.o.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            e.o.LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				e.leader.Store(true)
				e.o.Log.Info("leader election: this replica leads; reporting ready", zap.String("lease", e.o.Namespace+"/"+e.o.LeaseName), zap.String("identity", e.o.Identity))
				e.o.OnChange(true)
			},
			OnStoppedLeading: func() {
				if e.leader.Swap(false) {
					e.o.Log.Info("leader election: this replica stopped leading; reporting not ready", zap.String("identity", e.o.Identity))
					e.o.OnChange(false)
				}
			},
			OnNewLeader: func(id string) {
				if id != e.o.Identity {
					e.o.Log.Info("leader election: following", zap.String("leader", id))
				}
			},
		},
	}
	e.o.Log.Info("leader election: waiting for the lease", zap.String("lease", e.o.Namespace+"/"+e.o.LeaseName), zap.String("identity", e.o.Identity))
	for ctx.Err() == nil {
		// A fresh elector per term: one that lost the lease starts over as a candidate.
		le, err := leaderelection.NewLeaderElector(cfg)
		if err != nil {
			e.o.Log.Error("leader election", zap.Error(err)) // New validated the settings
			return
		}
		le.Run(ctx) // returns when the lease is lost or ctx ends
	}
}
