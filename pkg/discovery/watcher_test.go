package discovery

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kvpick/kvpick/internal/kubetest"
	"github.com/kvpick/kvpick/pkg/inferencepool"
)

var cluster kubetest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	cluster.Stop()
	os.Exit(code)
}

// recorder is a Sink that keeps every membership it was handed.
type recorder struct {
	mu   sync.Mutex
	sets [][]string
}

func (r *recorder) Set(addrs []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sets = append(r.sets, slices.Clone(addrs))
}

func (r *recorder) history() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sets)
}

// wait polls until the last membership equals want (nil and empty alike).
func (r *recorder) wait(t *testing.T, what string, want ...string) {
	t.Helper()
	err := kubetest.Eventually(context.Background(), time.Minute, func() error {
		h := r.history()
		if len(h) > 0 && slices.Equal(h[len(h)-1], want) {
			return nil
		}
		if len(h) == 0 {
			return errorf("no membership yet")
		}
		return errorf("membership %v", h[len(h)-1])
	})
	if err != nil {
		t.Fatalf("%s: want %v: %v", what, want, err)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func errorf(s string, args ...any) error {
	return errString(fmt.Sprintf(s, args...))
}

// env is one namespace of the shared cluster with the CRDs installed.
type env struct{ *kubetest.Env }

func newEnv(t *testing.T) *env { return &env{cluster.Env(t)} }

// watch runs a watcher of pool name in the env's namespace with cfg's rights until the test ends.
func (e *env) watch(t *testing.T, cfg *rest.Config, group, name string) (*Watcher, *recorder) {
	t.Helper()
	rec := &recorder{}
	w, err := New(Options{
		Namespace: e.NS, PoolName: name, PoolGroup: group,
		Client: kubernetes.NewForConfigOrDie(cfg), Dynamic: dynamic.NewForConfigOrDie(cfg),
		Sink: rec, Log: kubetest.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := w.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w, rec
}

func TestWatcherFollowsPodsAndThePool(t *testing.T) {
	e := newEnv(t)
	vllm := map[string]string{"app": "vllm"}
	other := map[string]string{"app": "other"}
	pool := kubetest.Pool{Namespace: e.NS, Name: "llama", MatchLabels: vllm, Ports: []int32{8000}}

	w, rec := e.watch(t, e.Cluster.Config(), inferencepool.GroupV1, "llama")
	rec.wait(t, "no pool yet: synced and empty")
	if !w.Synced() {
		t.Fatal("not synced after publishing the pool's absence")
	}

	e.Must(t, "pods", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "a", vllm, kubetest.PodStatus{IP: "127.0.0.2", Ready: true}))
	e.Must(t, "pods", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "b", vllm, kubetest.PodStatus{IP: "127.0.0.3"}))
	e.Must(t, "pods", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "c", other, kubetest.PodStatus{IP: "127.0.0.4", Ready: true}))
	e.Must(t, "pool", kubetest.ApplyPool(e.Ctx, e.Dyn, pool))
	rec.wait(t, "pool created: the Ready pod it selects", "127.0.0.2:8000")

	steps := []struct {
		name string
		act  func() error
		want []string
	}{
		{"a pod turns Ready", func() error {
			return kubetest.SetPodStatus(e.Ctx, e.Client, e.NS, "b", kubetest.PodStatus{IP: "127.0.0.3", Ready: true})
		}, []string{"127.0.0.2:8000", "127.0.0.3:8000"}},
		{"a pod turns unready", func() error {
			return kubetest.SetPodStatus(e.Ctx, e.Client, e.NS, "a", kubetest.PodStatus{IP: "127.0.0.2"})
		}, []string{"127.0.0.3:8000"}},
		{"a pod comes back with another IP", func() error {
			return kubetest.SetPodStatus(e.Ctx, e.Client, e.NS, "a", kubetest.PodStatus{IP: "127.0.0.5", Ready: true})
		}, []string{"127.0.0.3:8000", "127.0.0.5:8000"}},
		{"a pod changes IP while Ready", func() error {
			return kubetest.SetPodStatus(e.Ctx, e.Client, e.NS, "a", kubetest.PodStatus{IP: "127.0.0.6", Ready: true})
		}, []string{"127.0.0.3:8000", "127.0.0.6:8000"}},
		{"a terminating pod leaves while still Ready", func() error {
			return e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, "b", metav1.DeleteOptions{})
		}, []string{"127.0.0.6:8000"}},
		{"its deletion changes nothing more", func() error {
			return kubetest.DeletePodNow(e.Ctx, e.Client, e.NS, "b")
		}, []string{"127.0.0.6:8000"}},
		{"a pod that loses the labels leaves", func() error {
			return kubetest.SetPodLabels(e.Ctx, e.Client, e.NS, "a", map[string]string{"app": "vllm-old"})
		}, nil},
		{"and returns when it gets them back", func() error {
			return kubetest.SetPodLabels(e.Ctx, e.Client, e.NS, "a", vllm)
		}, []string{"127.0.0.6:8000"}},
		{"a second target port doubles the endpoints", func() error {
			pool.Ports = []int32{8000, 8001}
			return kubetest.ApplyPool(e.Ctx, e.Dyn, pool)
		}, []string{"127.0.0.6:8000", "127.0.0.6:8001"}},
		{"a changed port replaces the old one", func() error {
			pool.Ports = []int32{8002}
			return kubetest.ApplyPool(e.Ctx, e.Dyn, pool)
		}, []string{"127.0.0.6:8002"}},
	}
	for _, s := range steps {
		e.Must(t, s.name, s.act())
		rec.wait(t, s.name, s.want...)
	}

	// A selector change swaps the pod watch; the old members stay until the new ones are known.
	before := len(rec.history())
	pool.MatchLabels = other
	e.Must(t, "selector", kubetest.ApplyPool(e.Ctx, e.Dyn, pool))
	rec.wait(t, "the selector changes", "127.0.0.4:8002")
	for _, m := range rec.history()[before:] {
		if len(m) == 0 {
			t.Fatalf("the pool was emptied during the selector change: %v", rec.history()[before:])
		}
	}

	e.Must(t, "pool", kubetest.DeletePool(e.Ctx, e.Dyn, pool))
	rec.wait(t, "the pool is deleted")
	pool.MatchLabels = vllm
	e.Must(t, "pool", kubetest.ApplyPool(e.Ctx, e.Dyn, pool))
	rec.wait(t, "the pool is created again", "127.0.0.6:8002")
}

func TestWatcherReadsV1Alpha2Pools(t *testing.T) {
	e := newEnv(t)
	labels := map[string]string{"app": "sglang"}
	e.Must(t, "pod", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "s", labels, kubetest.PodStatus{IP: "127.0.0.7", Ready: true}))
	pool := kubetest.Pool{Group: inferencepool.GroupV1Alpha2, Namespace: e.NS, Name: "old", MatchLabels: labels, Ports: []int32{30000}}
	e.Must(t, "pool", kubetest.ApplyPool(e.Ctx, e.Dyn, pool))
	// A v1 pool of the same name is not the one followed.
	e.Must(t, "v1 pool", kubetest.ApplyPool(e.Ctx, e.Dyn, kubetest.Pool{Namespace: e.NS, Name: "old", MatchLabels: labels, Ports: []int32{1}}))

	_, rec := e.watch(t, e.Cluster.Config(), inferencepool.GroupV1Alpha2, "old")
	rec.wait(t, "v1alpha2 pool", "127.0.0.7:30000")
	pool.Ports = []int32{30001}
	e.Must(t, "port", kubetest.ApplyPool(e.Ctx, e.Dyn, pool))
	rec.wait(t, "v1alpha2 port change", "127.0.0.7:30001")
}

// The picker's service account needs only get/list/watch on pods and inferencepools in its
// namespace; the chart's Role grants exactly that.
func TestWatcherNeedsOnlyNamespacedReadRights(t *testing.T) {
	e := newEnv(t)
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "picker", Namespace: e.NS},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{inferencepool.GroupV1}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
		},
	}
	_, err := e.Client.RbacV1().Roles(e.NS).Create(e.Ctx, role, metav1.CreateOptions{})
	e.Must(t, "role", err)
	_, err = e.Client.RbacV1().RoleBindings(e.NS).Create(e.Ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "picker", Namespace: e.NS},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "picker"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "picker", Namespace: e.NS}},
	}, metav1.CreateOptions{})
	e.Must(t, "binding", err)

	labels := map[string]string{"app": "vllm"}
	e.Must(t, "pod", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "a", labels, kubetest.PodStatus{IP: "127.0.0.2", Ready: true}))
	e.Must(t, "pool", kubetest.ApplyPool(e.Ctx, e.Dyn, kubetest.Pool{Namespace: e.NS, Name: "p", MatchLabels: labels, Ports: []int32{8000}}))

	sa := e.Cluster.ImpersonatingConfig(e.NS, "picker")
	_, rec := e.watch(t, sa, inferencepool.GroupV1, "p")
	rec.wait(t, "as the picker's service account", "127.0.0.2:8000")

	// The same account cannot read another namespace: the rights are not cluster-wide.
	if _, err := kubernetes.NewForConfigOrDie(sa).CoreV1().Pods("default").List(e.Ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("the service account lists pods outside its namespace")
	}
}
