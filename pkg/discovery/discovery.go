// Package discovery keeps the picker's pool equal to the endpoints of one Kubernetes
// InferencePool: the Ready pods its selector picks, with their IPs, times each of its target
// ports. It watches the pool object and the pods with client-go informers scoped to the pool's
// namespace (the pod watch also to the pool's label selector, re-created when the selector
// changes), so it needs only get/list/watch on inferencepools and pods in that namespace.
package discovery

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kvpick/kvpick/pkg/inferencepool"
)

// Sink receives the pool's full membership, as canonical "ip:port" strings, after every change.
// *pool.Pool implements it.
type Sink interface {
	Set(addrs []string)
}

// Options say which pool to follow and where to put its endpoints.
type Options struct {
	Namespace string // the pool's namespace
	PoolName  string
	PoolGroup string // inferencepool.GroupV1 or inferencepool.GroupV1Alpha2
	Client    kubernetes.Interface
	Dynamic   dynamic.Interface
	Sink      Sink
	Log       *zap.Logger
}

// Watcher follows one InferencePool. Run starts it.
type Watcher struct {
	o   Options
	gvr string // for logs

	poolInformer cache.SharedIndexInformer
	poolKey      string

	mu         sync.Mutex // serialises recomputes and pod-informer switches
	spec       *inferencepool.Spec
	pods       *podWatch // nil while the pool is absent
	podsCtx    context.Context
	last       []string
	haveSynced bool

	synced atomic.Bool
}

// podWatch is the pod informer of one selector.
type podWatch struct {
	labels   map[string]string
	informer cache.SharedIndexInformer
	stop     context.CancelFunc
	synced   atomic.Bool
}

// New checks the options and returns a watcher.
func New(o Options) (*Watcher, error) {
	gvr, err := inferencepool.GVR(o.PoolGroup)
	if err != nil {
		return nil, err
	}
	switch {
	case o.PoolName == "":
		return nil, fmt.Errorf("discovery: no pool name")
	case o.Namespace == "":
		return nil, fmt.Errorf("discovery: no namespace")
	case o.Client == nil || o.Dynamic == nil || o.Sink == nil:
		return nil, fmt.Errorf("discovery: clients and sink are required")
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	w := &Watcher{o: o, gvr: gvr.String(), poolKey: o.Namespace + "/" + o.PoolName}
	res := o.Dynamic.Resource(gvr).Namespace(o.Namespace)
	byName := fields.OneTermEqualSelector("metadata.name", o.PoolName).String()
	w.poolInformer = cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = byName
			return res.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = byName
			return res.Watch(ctx, opts)
		},
	}, &unstructured.Unstructured{}, 0, cache.Indexers{})
	return w, nil
}

// Synced reports whether the watcher has read the pool and, if it exists, its pods at least
// once and handed the result to the sink.
func (w *Watcher) Synced() bool { return w.synced.Load() }

// Run watches until ctx ends. It returns an error only if the informers cannot be set up.
func (w *Watcher) Run(ctx context.Context) error {
	w.mu.Lock()
	w.podsCtx = ctx
	w.mu.Unlock()
	onPool := func(any) { w.poolChanged() }
	if _, err := w.poolInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onPool,
		UpdateFunc: func(_, _ any) { w.poolChanged() },
		DeleteFunc: onPool,
	}); err != nil {
		return err
	}
	w.o.Log.Info("watching the InferencePool", zap.String("resource", w.gvr), zap.String("pool", w.poolKey))
	go w.poolInformer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), w.poolInformer.HasSynced) {
		return nil // ctx ended
	}
	w.poolChanged() // the pool may not exist: sync on its absence too
	<-ctx.Done()
	w.mu.Lock()
	if w.pods != nil {
		w.pods.stop()
		w.pods = nil
	}
	w.mu.Unlock()
	return nil
}

// poolChanged reads the pool from the cache, follows a selector change by replacing the pod
// watch, and recomputes the endpoints.
func (w *Watcher) poolChanged() {
	if !w.poolInformer.HasSynced() {
		return
	}
	obj, exists, err := w.poolInformer.GetStore().GetByKey(w.poolKey)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.podsCtx == nil || w.podsCtx.Err() != nil {
		return
	}
	switch {
	case err != nil:
		w.o.Log.Error("reading the InferencePool from the cache", zap.Error(err))
		return
	case !exists:
		if w.spec != nil || !w.haveSynced {
			w.o.Log.Warn("the InferencePool does not exist: the pool is empty until it is created",
				zap.String("resource", w.gvr), zap.String("pool", w.poolKey))
		}
		w.spec = nil
		if w.pods != nil {
			w.pods.stop()
			w.pods = nil
		}
		w.publishLocked()
		return
	}
	spec, err := inferencepool.FromUnstructured(obj.(*unstructured.Unstructured))
	if err != nil {
		// The API server validates pools; one that slips through (an older CRD, say) must
		// not empty a pool that is serving: keep the last valid membership.
		w.o.Log.Error("the InferencePool is not usable; keeping the endpoints read before", zap.Error(err))
		return
	}
	if w.spec == nil || !maps.Equal(w.spec.MatchLabels, spec.MatchLabels) {
		w.startPodsLocked(spec.MatchLabels)
	}
	if w.spec == nil || !w.spec.Equal(spec) {
		w.o.Log.Info("InferencePool spec", zap.String("pool", w.poolKey),
			zap.Any("matchLabels", spec.MatchLabels), zap.Any("targetPorts", spec.Ports))
	}
	w.spec = &spec
	w.publishLocked()
}

// startPodsLocked replaces the pod watch with one scoped to the selector. The endpoints read
// under the old selector stay until the new watch has synced, so a selector change does not
// empty the pool in between.
func (w *Watcher) startPodsLocked(matchLabels map[string]string) {
	if w.pods != nil {
		w.pods.stop()
	}
	sel := labels.SelectorFromSet(matchLabels).String()
	pods := w.o.Client.CoreV1().Pods(w.o.Namespace)
	pw := &podWatch{labels: maps.Clone(matchLabels)}
	pw.informer = cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = sel
			return pods.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = sel
			return pods.Watch(ctx, opts)
		},
	}, &corev1.Pod{}, 0, cache.Indexers{})
	// Keep only what the endpoints need: managed fields and specs of large pods add up.
	_ = pw.informer.SetTransform(func(obj any) (any, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			p.ManagedFields = nil
			p.Spec = corev1.PodSpec{}
			p.Annotations = nil
		}
		return obj, nil
	})
	changed := func(any) { w.podsChanged(pw) }
	_, _ = pw.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, _ any) { w.podsChanged(pw) },
		DeleteFunc: changed,
	})
	ctx, cancel := context.WithCancel(w.podsCtx)
	pw.stop = cancel
	w.pods = pw
	go pw.informer.RunWithContext(ctx)
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), pw.informer.HasSynced) {
			pw.synced.Store(true)
			w.podsChanged(pw)
		}
	}()
	w.o.Log.Info("watching pods", zap.String("namespace", w.o.Namespace), zap.String("selector", sel))
}

func (w *Watcher) podsChanged(pw *podWatch) {
	if !pw.synced.Load() {
		return // the sync itself publishes
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pods != pw {
		return // an event of a watch that was replaced
	}
	w.publishLocked()
}

// publishLocked computes the endpoints and hands them to the sink, once the pool's state is
// known: absent, or present with its pod watch synced.
func (w *Watcher) publishLocked() {
	var addrs []string
	if w.spec != nil {
		if w.pods == nil || !w.pods.synced.Load() {
			return
		}
		addrs = Endpoints(w.pods.informer.GetStore().List(), w.pods.labels, w.spec.Ports)
	}
	if w.haveSynced && slices.Equal(addrs, w.last) {
		return
	}
	added, removed := diff(w.last, addrs)
	w.o.Sink.Set(addrs)
	if w.haveSynced || len(addrs) > 0 {
		w.o.Log.Info("pool endpoints changed", zap.Strings("added", added), zap.Strings("removed", removed), zap.Int("endpoints", len(addrs)))
	}
	w.last = addrs
	w.haveSynced = true
	w.synced.Store(true)
}

// Endpoints returns "ip:port" for every routable pod among objs (that carries the labels) and
// every port, sorted. A pod is routable when its Ready condition is True, it is not being
// deleted, it has not finished, and it has an IP.
func Endpoints(objs []any, matchLabels map[string]string, ports []int32) []string {
	sel := labels.SelectorFromSet(matchLabels)
	var out []string
	for _, o := range objs {
		p, ok := o.(*corev1.Pod)
		if !ok || !Routable(p) || !sel.Matches(labels.Set(p.Labels)) {
			continue
		}
		for _, port := range ports {
			out = append(out, net.JoinHostPort(canonicalIP(p.Status.PodIP), strconv.Itoa(int(port))))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Routable reports whether the pod may receive requests.
func Routable(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" {
		return false
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// canonicalIP prints the IP as the proxy will report it back (IPv6 compressed).
func canonicalIP(s string) string {
	if ip := net.ParseIP(s); ip != nil {
		return ip.String()
	}
	return s
}

func diff(old, cur []string) (added, removed []string) {
	for _, a := range cur {
		if _, ok := slices.BinarySearch(old, a); !ok {
			added = append(added, a)
		}
	}
	for _, a := range old {
		if _, ok := slices.BinarySearch(cur, a); !ok {
			removed = append(removed, a)
		}
	}
	return added, removed
}
