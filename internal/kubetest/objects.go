package kubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kvpick/kvpick/internal/pickerproc"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InferencePoolCRDDir returns the repository's directory of InferencePool CRDs (config/crd:
// inference.networking.k8s.io/v1 and inference.networking.x-k8s.io/v1alpha2).
func InferencePoolCRDDir() (string, error) {
	root, err := pickerproc.ModuleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "config", "crd"), nil
}

// InstallCRDDir installs every CustomResourceDefinition in the directory's .yaml files (see
// InstallCRDYAML).
func (c *Cluster) InstallCRDDir(ctx context.Context, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no .yaml files in %s", dir)
	}
	slices.Sort(files)
	var all [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		all = append(all, b)
	}
	return c.InstallCRDYAML(ctx, bytes.Join(all, []byte("\n---\n")))
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// InstallCRDYAML creates (or replaces) the CustomResourceDefinitions in a multi-document YAML
// stream, and returns once each is Established and its resources are served, so a test can
// create objects at once. Documents of other kinds are an error.
func (c *Cluster) InstallCRDYAML(ctx context.Context, stream []byte) error {
	dyn, err := dynamic.NewForConfig(c.Config())
	if err != nil {
		return err
	}
	var installed []*unstructured.Unstructured
	for i, doc := range docSeparator.Split(string(stream), -1) {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return fmt.Errorf("document %d: %w", i, err)
		}
		if t := bytes.TrimSpace(j); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err != nil {
			return fmt.Errorf("document %d: %w", i, err)
		}
		if u.GetKind() != "CustomResourceDefinition" {
			return fmt.Errorf("document %d: kind %q, want CustomResourceDefinition", i, u.GetKind())
		}
		_, err = dyn.Resource(crdGVR).Create(ctx, u, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			cur, gerr := dyn.Resource(crdGVR).Get(ctx, u.GetName(), metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			u.SetResourceVersion(cur.GetResourceVersion())
			_, err = dyn.Resource(crdGVR).Update(ctx, u, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("CRD %s: %w", u.GetName(), err)
		}
		installed = append(installed, u)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(c.Config())
	if err != nil {
		return err
	}
	for _, u := range installed {
		if err := waitCRD(ctx, dyn, disc, u); err != nil {
			return err
		}
	}
	return nil
}

func waitCRD(ctx context.Context, dyn dynamic.Interface, disc discovery.DiscoveryInterface, crd *unstructured.Unstructured) error {
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	return Eventually(ctx, time.Minute, func() error {
		cur, err := dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(cur.Object, "status", "conditions")
		established := false
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				established = true
			}
		}
		if !established {
			return fmt.Errorf("CRD %s not Established yet", crd.GetName())
		}
		for _, v := range versions {
			name, _ := v.(map[string]any)["name"].(string)
			rl, err := disc.ServerResourcesForGroupVersion(group + "/" + name)
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Name == plural }) {
				return fmt.Errorf("%s/%s does not serve %s yet", group, name, plural)
			}
		}
		return nil
	})
}

// Eventually calls f until it returns nil or timeout (or ctx) ends, and returns f's last error
// then. Tests wait on conditions with it rather than sleeping.
func Eventually(ctx context.Context, timeout time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %v: %w", timeout, err)
		case <-tick.C:
		}
	}
}

var nsCounter atomic.Int64

// Namespace creates a namespace with a name derived from the test's and returns its name. It
// is deleted when the test ends (the API server has no namespace controller, so its objects
// stay in etcd until the cluster stops: that is fine for a throwaway cluster).
func Namespace(t testing.TB, client kubernetes.Interface) string {
	t.Helper()
	base := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-"))
	if len(base) > 40 {
		base = base[:40]
	}
	name := fmt.Sprintf("%s-%d", strings.Trim(base, "-"), nsCounter.Add(1))
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}) })
	return name
}

// PodStatus is the status a test gives a pod that no kubelet runs.
type PodStatus struct {
	IP    string // status.podIP ("" for none)
	Ready bool   // the Ready condition
}

// CreatePod creates a pod with those labels (one container, never run) and sets its status.
func CreatePod(ctx context.Context, client kubernetes.Interface, ns, name string, labels map[string]string, st PodStatus) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			// Bound to a node, as a scheduled pod is: deleting it then only sets its
			// deletionTimestamp (terminating) until DeletePodNow, as with a real kubelet.
			NodeName:   "kubetest-node",
			Containers: []corev1.Container{{Name: "server", Image: "example.invalid/model-server:test"}},
		},
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	return SetPodStatus(ctx, client, ns, name, st)
}

// SetPodStatus patches the pod's status as a kubelet would: phase Running, the Ready condition,
// the pod IP.
func SetPodStatus(ctx context.Context, client kubernetes.Interface, ns, name string, st PodStatus) error {
	ready := corev1.ConditionFalse
	if st.Ready {
		ready = corev1.ConditionTrue
	}
	status := map[string]any{
		"phase": corev1.PodRunning,
		"conditions": []map[string]any{
			{"type": "Ready", "status": ready, "lastTransitionTime": time.Now().UTC().Format(time.RFC3339)},
		},
		"podIP":  nil,
		"podIPs": nil,
	}
	if st.IP != "" {
		status["podIP"] = st.IP
		status["podIPs"] = []map[string]any{{"ip": st.IP}}
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	_, err = client.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

// SetPodLabels replaces the pod's labels.
func SetPodLabels(ctx context.Context, client kubernetes.Interface, ns, name string, labels map[string]string) error {
	pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	pod.Labels = labels
	_, err = client.CoreV1().Pods(ns).Update(ctx, pod, metav1.UpdateOptions{})
	return err
}

// DeletePodNow deletes the pod without a grace period, as a kubelet does once the containers
// stopped (a plain Delete of a pod bound to a node leaves it terminating).
func DeletePodNow(ctx context.Context, client kubernetes.Interface, ns, name string) error {
	zero := int64(0)
	return client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
}

// Pool describes an InferencePool for a test.
type Pool struct {
	Group       string // inference.networking.k8s.io (v1, the default) or inference.networking.x-k8s.io (v1alpha2)
	Namespace   string
	Name        string
	MatchLabels map[string]string
	Ports       []int32 // v1alpha2 takes the first
	Picker      string  // the endpoint picker Service's name ("epp" if empty)
}

// GVR returns the pool's resource.
func (p Pool) GVR() schema.GroupVersionResource {
	if p.Group == "inference.networking.x-k8s.io" {
		return schema.GroupVersionResource{Group: p.Group, Version: "v1alpha2", Resource: "inferencepools"}
	}
	return schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}
}

// Object returns the pool in its version's shape.
func (p Pool) Object() *unstructured.Unstructured {
	gvr := p.GVR()
	picker := p.Picker
	if picker == "" {
		picker = "epp"
	}
	labels := map[string]any{}
	for k, v := range p.MatchLabels {
		labels[k] = v
	}
	spec := map[string]any{}
	if gvr.Version == "v1alpha2" {
		spec["selector"] = labels
		if len(p.Ports) > 0 {
			spec["targetPortNumber"] = int64(p.Ports[0])
		}
		spec["extensionRef"] = map[string]any{"name": picker}
	} else {
		ports := []any{}
		for _, n := range p.Ports {
			ports = append(ports, map[string]any{"number": int64(n)})
		}
		spec["selector"] = map[string]any{"matchLabels": labels}
		spec["targetPorts"] = ports
		spec["endpointPickerRef"] = map[string]any{"name": picker, "port": map[string]any{"number": int64(9002)}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(),
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": p.Name, "namespace": p.Namespace},
		"spec":       spec,
	}}
}

// ApplyPool creates the pool, or replaces its spec if it exists.
func ApplyPool(ctx context.Context, dyn dynamic.Interface, p Pool) error {
	res := dyn.Resource(p.GVR()).Namespace(p.Namespace)
	obj := p.Object()
	cur, err := res.Get(ctx, p.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = res.Create(ctx, obj, metav1.CreateOptions{})
		return err
	case err != nil:
		return err
	}
	cur.Object["spec"] = obj.Object["spec"]
	_, err = res.Update(ctx, cur, metav1.UpdateOptions{})
	return err
}

// DeletePool deletes the pool.
func DeletePool(ctx context.Context, dyn dynamic.Interface, p Pool) error {
	return dyn.Resource(p.GVR()).Namespace(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
}

// Shared is one cluster for every test of a package: the first test that calls Get starts it
// (or skips or fails, as Require says), and TestMain calls Stop after the tests:
//
//	var cluster kubetest.Shared
//	func TestMain(m *testing.M) { code := m.Run(); cluster.Stop(); os.Exit(code) }
type Shared struct {
	mu  sync.Mutex
	c   *Cluster
	err error
}

// Get returns the shared cluster, starting it on first use.
func (s *Shared) Get(t testing.TB) *Cluster {
	t.Helper()
	assets := Require(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c == nil && s.err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*startTimeout)
		defer cancel()
		s.c, s.err = Start(ctx, Options{AssetsDir: assets})
	}
	if s.err != nil {
		t.Fatalf("starting the test cluster: %v", s.err)
	}
	return s.c
}

// Stop stops the shared cluster if it was started.
func (s *Shared) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil {
		_ = s.c.Stop()
		s.c = nil
	}
}

// InstallInferencePoolCRDs installs the repository's InferencePool CRDs (both versions).
func (c *Cluster) InstallInferencePoolCRDs(ctx context.Context) error {
	dir, err := InferencePoolCRDDir()
	if err != nil {
		return err
	}
	return c.InstallCRDDir(ctx, dir)
}

// Env is one namespace of a cluster with the InferencePool CRDs installed: what each test
// against the real API server starts from.
type Env struct {
	Cluster *Cluster
	NS      string
	Client  kubernetes.Interface
	Dyn     dynamic.Interface
	Ctx     context.Context
}

// Env starts the shared cluster on first use, installs the CRDs and gives the test a namespace
// of its own.
func (s *Shared) Env(t testing.TB) *Env {
	t.Helper()
	c := s.Get(t)
	ctx := context.Background()
	if err := c.InstallInferencePoolCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	e := &Env{Cluster: c, Client: c.Client(), Dyn: dynamic.NewForConfigOrDie(c.Config()), Ctx: ctx}
	e.NS = Namespace(t, e.Client)
	return e
}

// Must fails the test at once when err, the outcome of step what, is not nil.
func (e *Env) Must(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
