package kubetest

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

func TestClusterServesCRDsPodsAndRBAC(t *testing.T) {
	c := StartT(t)
	ctx := context.Background()

	dir, err := InferencePoolCRDDir()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.InstallCRDDir(ctx, dir); err != nil {
		t.Fatal(err)
	}
	// Installing again updates in place.
	if err := c.InstallCRDDir(ctx, dir); err != nil {
		t.Fatalf("second install: %v", err)
	}
	client := c.Client()
	ns := Namespace(t, client)
	dyn := dynamic.NewForConfigOrDie(c.Config())

	pools := []struct {
		name, doc, err string
	}{
		{"v1 pool", `
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: ok}
spec:
  selector: {matchLabels: {app: vllm}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: epp, port: {number: 9002}}
`, ""},
		{"v1 pool with nine ports", `
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: too-many}
spec:
  selector: {matchLabels: {app: vllm}}
  targetPorts: [{number: 1}, {number: 2}, {number: 3}, {number: 4}, {number: 5}, {number: 6}, {number: 7}, {number: 8}, {number: 9}]
  endpointPickerRef: {name: epp}
`, "targetPorts"},
		{"v1 pool without a picker", `
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: no-picker}
spec:
  selector: {matchLabels: {app: vllm}}
  targetPorts: [{number: 8000}]
`, "endpointPickerRef"},
		{"v1alpha2 pool", `
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferencePool
metadata: {name: old}
spec:
  selector: {app: vllm}
  targetPortNumber: 8000
  extensionRef: {name: epp}
`, ""},
	}
	for _, tc := range pools {
		t.Run(tc.name, func(t *testing.T) {
			j, err := yaml.YAMLToJSON([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(j); err != nil {
				t.Fatal(err)
			}
			gv, _ := schema.ParseGroupVersion(u.GetAPIVersion())
			_, err = dyn.Resource(gv.WithResource("inferencepools")).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("create: %v", err)
			case tc.err != "" && (err == nil || !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("create = %v, want a validation error on %s", err, tc.err)
			}
		})
	}

	// A pod no kubelet runs, made Ready by a status patch.
	if err := CreatePod(ctx, client, ns, "p1", map[string]string{"app": "vllm"}, PodStatus{IP: "127.0.0.2", Ready: true}); err != nil {
		t.Fatal(err)
	}
	p, err := client.CoreV1().Pods(ns).Get(ctx, "p1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.PodIP != "127.0.0.2" || p.Status.Conditions[0].Type != corev1.PodReady || p.Status.Conditions[0].Status != corev1.ConditionTrue {
		t.Fatalf("status = %+v", p.Status)
	}
	if err := SetPodStatus(ctx, client, ns, "p1", PodStatus{IP: "127.0.0.3"}); err != nil {
		t.Fatalf("changing the IP: %v", err)
	}
	// A plain delete leaves a bound pod terminating, as with a kubelet.
	if err := client.CoreV1().Pods(ns).Delete(ctx, "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if p, err = client.CoreV1().Pods(ns).Get(ctx, "p1", metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil {
		t.Fatalf("after delete: %v, deletionTimestamp %v", err, p.DeletionTimestamp)
	}
	if err := DeletePodNow(ctx, client, ns, "p1"); err != nil {
		t.Fatal(err)
	}
	if _, err = client.CoreV1().Pods(ns).Get(ctx, "p1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after DeletePodNow: %v", err)
	}

	// RBAC is enforced: a service account without a role may not list pods.
	sa := kubernetes.NewForConfigOrDie(c.ImpersonatingConfig(ns, "nobody"))
	if _, err := sa.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list as a service account without rights: %v, want Forbidden", err)
	}

	// The kubeconfig file works for processes.
	cfg, err := clientcmd.BuildConfigFromFlags("", c.KubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		t.Fatalf("through the kubeconfig file: %v", err)
	}
}

func TestMissingAssetsSayHowToGetThemAndFailWhenRequired(t *testing.T) {
	tests := []struct {
		name, assets string
		wantErr      bool
	}{
		{"unset", "", true},
		{"missing dir", t.TempDir(), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvAssets, tc.assets)
			if _, err := AssetsDir(); (err != nil) != tc.wantErr || (err != nil && !strings.Contains(err.Error(), "hack/kube-binaries.sh")) {
				t.Fatalf("AssetsDir err = %v", err)
			}
		})
	}
	for _, tc := range []struct {
		required, ci string
		want         bool
	}{{"1", "", true}, {"", "true", true}, {"", "", false}, {"0", "false", false}} {
		t.Setenv(EnvRequired, tc.required)
		t.Setenv("CI", tc.ci)
		if got := Required(); got != tc.want {
			t.Errorf("%s=%q CI=%q: Required = %v, want %v", EnvRequired, tc.required, tc.ci, got, tc.want)
		}
	}
}
