package ha

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvpick/kvpick/internal/kubetest"
)

var cluster kubetest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	cluster.Stop()
	os.Exit(code)
}

func TestNewRejectsInconsistentTimings(t *testing.T) {
	ok := Options{Client: fake.NewClientset(), Namespace: "ns", LeaseName: "l", Identity: "me",
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
	tests := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"valid", func(*Options) {}, ""},
		{"no client", func(o *Options) { o.Client = nil }, "no client"},
		{"no identity", func(o *Options) { o.Identity = "" }, "identity"},
		{"lease not longer than the renew deadline", func(o *Options) { o.LeaseDuration = o.RenewDeadline }, "lease duration"},
		{"renew deadline not longer than the retry period", func(o *Options) { o.RenewDeadline = o.RetryPeriod }, "renew deadline"},
		{"no retry period", func(o *Options) { o.RetryPeriod = 0 }, "retry period"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.edit(&o)
			_, err := New(o)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("New = %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

type elector struct {
	e      *Elector
	leader atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
}

func run(t *testing.T, client kubernetes.Interface, ns, id string) *elector {
	t.Helper()
	el := &elector{done: make(chan struct{})}
	e, err := New(Options{Client: client, Namespace: ns, LeaseName: "picker", Identity: id,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
		Log: kubetest.Logger(t), OnChange: func(l bool) { el.leader.Store(l) }})
	if err != nil {
		t.Fatal(err)
	}
	el.e = e
	ctx, cancel := context.WithCancel(context.Background())
	el.cancel = cancel
	go func() { defer close(el.done); e.Run(ctx) }()
	t.Cleanup(el.stop)
	return el
}

func (el *elector) stop() {
	el.cancel()
	<-el.done
}

func wait(t *testing.T, what string, f func() bool) {
	t.Helper()
	if err := kubetest.Eventually(context.Background(), time.Minute, func() error {
		if f() {
			return nil
		}
		return errString(what)
	}); err != nil {
		t.Fatal(err)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// A leader that dies without releasing the Lease (a crash, a lost node) is replaced once the
// Lease lapses; one that stops cleanly hands over at once.
func TestAFollowerTakesOverACrashedAndAStoppedLeader(t *testing.T) {
	c := cluster.Get(t)
	client := c.Client()
	ns := kubetest.Namespace(t, client)
	ctx := context.Background()

	// A leader that crashed: its Lease was renewed just now and will not be again.
	now := metav1.NewMicroTime(time.Now())
	dur := int32(3)
	ghost := "crashed-replica"
	if _, err := client.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "picker", Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &ghost, LeaseDurationSeconds: &dur,
			AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := run(t, client, ns, "a")
	b := run(t, client, ns, "b")
	wait(t, "a replica takes over the crashed leader's Lease once it lapses", func() bool {
		return a.leader.Load() != b.leader.Load()
	})
	leader, follower := a, b
	if b.leader.Load() {
		leader, follower = b, a
	}
	if !leader.e.Leader() || follower.e.Leader() {
		t.Fatal("Leader() disagrees with the callbacks")
	}
	lease, err := client.CoordinationV1().Leases(ns).Get(ctx, "picker", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == ghost {
		t.Fatalf("the Lease is still the crashed leader's: %v", err)
	}

	leader.stop()
	if leader.leader.Load() {
		t.Fatal("a stopped leader still believes it leads")
	}
	wait(t, "the follower takes over the released Lease", follower.leader.Load)
}
