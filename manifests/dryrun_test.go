package manifests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/kvpick/kvpick/internal/kubetest"
)

// versions reads manifests/versions.yaml.
func versions(t *testing.T) map[string]string {
	t.Helper()
	docs, err := loadFile("versions.yaml")
	if err != nil || len(docs) != 1 {
		t.Fatalf("versions.yaml: %v", err)
	}
	out := map[string]string{}
	for k, v := range docs[0].Raw {
		s, ok := v.(string)
		if !ok {
			t.Fatalf("versions.yaml: %s is not a string (quote it)", k)
		}
		out[k] = s
	}
	return out
}

// gatewayAPICRDs returns the standard-channel CRDs of the Gateway API release in
// versions.yaml, from its Go module (the module proxy carries the YAML with the Go code).
func gatewayAPICRDs(t *testing.T, version string) []byte {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", "sigs.k8s.io/gateway-api@"+version)
	cmd.Dir = t.TempDir() // outside this module: no go.mod requirement is involved
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download sigs.k8s.io/gateway-api@%s: %v", version, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download sigs.k8s.io/gateway-api@%s: %s %v", version, mod.Error, err)
	}
	files, err := filepath.Glob(filepath.Join(mod.Dir, "config", "crd", "standard", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no standard-channel CRDs in %s: %v", mod.Dir, err)
	}
	var crds [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := parseDocs(f, b)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range docs {
			// The directory also holds a ValidatingAdmissionPolicy against downgrades.
			if d.Kind() != "CustomResourceDefinition" {
				continue
			}
			// Versions kept only for old stored objects (served: false) validate nothing, and
			// kubetest waits for every listed version to be served: leave them out.
			spec := d.Raw["spec"].(map[string]any)
			var served []any
			for _, v := range spec["versions"].([]any) {
				if v.(map[string]any)["served"] == true {
					served = append(served, v)
				}
			}
			spec["versions"] = served
			j, _ := json.Marshal(d.Raw)
			crds = append(crds, j)
		}
	}
	return bytes.Join(crds, []byte("\n---\n"))
}

// dryRunner applies objects to a real API server with server-side apply in dry-run mode and
// strict field validation: what `kubectl apply --server-side --dry-run=server` does, with
// unknown and duplicate fields refused.
type dryRunner struct {
	client kubernetes.Interface
	dyn    dynamic.Interface
	mapper meta.ResettableRESTMapper
}

func newDryRunner(t *testing.T) *dryRunner {
	t.Helper()
	c := kubetest.StartT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// CRDs first: InferencePool (both groups), the Gateway API, and stand-ins for the rest.
	dir, err := kubetest.InferencePoolCRDDir()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.InstallCRDDir(ctx, dir); err != nil {
		t.Fatalf("InferencePool CRDs: %v", err)
	}
	if err := c.InstallCRDYAML(ctx, gatewayAPICRDs(t, versions(t)["gatewayAPI"])); err != nil {
		t.Fatalf("Gateway API CRDs: %v", err)
	}
	stand, err := os.ReadFile(filepath.Join("testdata", "crds.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.InstallCRDYAML(ctx, stand); err != nil {
		t.Fatalf("testdata/crds.yaml: %v", err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	return &dryRunner{client: c.Client(), dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
}

// apply dry-runs a set of objects. Namespaced objects without a namespace go to defaultNS; the
// namespaces the set uses are created for real first (dry-run creations would not exist for
// the objects that follow, as with `kubectl apply` of a set holding its own Namespace).
func (r *dryRunner) apply(t testing.TB, objs []object, defaultNS string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var nss []string
	type item struct {
		o   object
		gvr schema.GroupVersionResource
		ns  string
	}
	var items []item
	for _, o := range objs {
		gv, err := schema.ParseGroupVersion(o.APIVersion())
		if err != nil {
			t.Errorf("%s: %v", o, err)
			continue
		}
		m, err := r.mapper.RESTMapping(gv.WithKind(o.Kind()).GroupKind(), gv.Version)
		if err != nil {
			t.Errorf("%s: the API server does not serve %s/%s: %v", o, o.APIVersion(), o.Kind(), err)
			continue
		}
		ns := ""
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns = o.Namespace()
			if ns == "" {
				ns = defaultNS
			}
			if !slices.Contains(nss, ns) {
				nss = append(nss, ns)
			}
		} else if o.Namespace() != "" {
			t.Errorf("%s: cluster-scoped %s with namespace %q (kustomize sets namespaces on custom kinds it does not know)", o, o.Kind(), o.Namespace())
		}
		items = append(items, item{o, m.Resource, ns})
	}
	for _, ns := range nss {
		_, err := r.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("namespace %s: %v", ns, err)
		}
	}
	for _, it := range items {
		body, err := json.Marshal(it.o.Raw)
		if err != nil {
			t.Fatal(err)
		}
		force := true
		res := r.dyn.Resource(it.gvr)
		var ri dynamic.ResourceInterface = res
		if it.ns != "" {
			ri = res.Namespace(it.ns)
		}
		_, err = ri.Patch(ctx, it.o.Name(), types.ApplyPatchType, body, metav1.PatchOptions{
			DryRun:          []string{metav1.DryRunAll},
			Force:           &force,
			FieldManager:    "kvpick-manifests-test",
			FieldValidation: metav1.FieldValidationStrict,
		})
		if err != nil {
			t.Errorf("%s: server-side dry run: %v", it.o, err)
		}
	}
}

// TestManifestsDryRun applies every rendered chart variant and every kustomization's output
// to a real API server with server-side dry run, CRDs first: the server's own validation
// (schemas, required fields, enums, CEL rules of the Gateway API CRDs, unknown fields) on
// exactly what `helm install` and `kubectl apply -k` would send.
func TestManifestsDryRun(t *testing.T) {
	r := newDryRunner(t)

	chartVariants := map[string][]string{
		"default":        nil,
		"istio":          {"provider.name=istio"},
		"istio-plain":    {"provider.name=istio", "inferenceExtension.tls.enabled=false"},
		"gke":            {"provider.name=gke"},
		"ha":             {"inferenceExtension.replicas=2"},
		"active-active":  {"inferenceExtension.replicas=2", "inferenceExtension.highAvailability=active"},
		"servicemonitor": {"inferenceExtension.monitoring.prometheus.enabled=true"},
		"v1alpha2":       {"inferencePool.apiVersion=inference.networking.x-k8s.io/v1alpha2"},
		"httproute":      {"httpRoute.enabled=true", "httpRoute.parentRefs[0].name=kvpick-gateway"},
		"tls-secret":     {"inferenceExtension.tls.secretName=epp-cert"},
	}
	for _, name := range slices.Sorted(maps.Keys(chartVariants)) {
		t.Run("chart/"+name, func(t *testing.T) {
			objs := mustRender(t, "", chartVariants[name]...)
			for i := range objs {
				objs[i].Raw["metadata"].(map[string]any)["namespace"] = "chart-" + name
			}
			r.apply(t, objs, "chart-"+name)
		})
	}

	dirs, err := kustomizations(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range dirs {
		if isComponent(t, dir) {
			continue
		}
		t.Run("kustomize/"+filepath.ToSlash(dir), func(t *testing.T) {
			objs, err := build(dir)
			if err != nil {
				t.Fatal(err)
			}
			r.apply(t, objs, "k-"+strings.ReplaceAll(filepath.ToSlash(dir), "/", "-"))
		})
	}
	t.Run("kustomize/base+components/ha", func(t *testing.T) {
		r.apply(t, haOverlay(t), "k-ha")
	})
	t.Run("kustomize/base+components/active-active", func(t *testing.T) {
		r.apply(t, componentOverlay(t, "active-active"), "k-active-active")
	})
}

// TestDryRunRefusesBrokenObjects: the dry run is a real check; a broken InferencePool and a
// misspelt Deployment field are refused by the server.
func TestDryRunRefusesBrokenObjects(t *testing.T) {
	r := newDryRunner(t)
	tests := []struct {
		name string
		edit func(t *testing.T, objs []object)
		want string
	}{
		{"pool without ports", func(t *testing.T, objs []object) {
			delete(find(t, objs, "InferencePool", "llama")["spec"].(map[string]any), "targetPorts")
		}, "targetPorts"},
		{"bad failure mode", func(t *testing.T, objs []object) {
			at(find(t, objs, "InferencePool", "llama"), "spec", "endpointPickerRef").(map[string]any)["failureMode"] = "FailClosed"
		}, "failureMode"},
		{"unknown Deployment field", func(t *testing.T, objs []object) {
			at(find(t, objs, "Deployment", "llama-epp"), "spec", "template", "spec").(map[string]any)["terminationGracePeriod"] = 10
		}, "terminationGracePeriod"},
		{"DestinationRule TLS mode", func(t *testing.T, objs []object) {
			at(find(t, objs, "DestinationRule", "llama-epp"), "spec", "trafficPolicy", "tls").(map[string]any)["mode"] = "TLS"
		}, "mode"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := mustRender(t, "", "provider.name=istio")
			tc.edit(t, objs)
			ft := &fakeT{TB: t}
			r.apply(ft, objs, "broken")
			if !slices.ContainsFunc(ft.errs, func(e string) bool { return strings.Contains(e, tc.want) }) {
				t.Errorf("no dry-run error mentions %q: %v", tc.want, ft.errs)
			}
		})
	}
}

// fakeT records errors instead of failing, for tests of the checks themselves.
type fakeT struct {
	testing.TB
	errs []string
}

func (f *fakeT) Errorf(format string, a ...any) { f.errs = append(f.errs, fmt.Sprintf(format, a...)) }
