package discovery

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type podOpt func(*corev1.Pod)

func pod(name, ip string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "vllm"}},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func notReady(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }
func terminating(p *corev1.Pod) {
	now := metav1.Now()
	p.DeletionTimestamp = &now
}
func phase(ph corev1.PodPhase) podOpt { return func(p *corev1.Pod) { p.Status.Phase = ph } }
func labelled(l map[string]string) podOpt {
	return func(p *corev1.Pod) { p.Labels = l }
}
func noConditions(p *corev1.Pod) { p.Status.Conditions = nil }

func TestEndpointsAreReadyPodsTimesPorts(t *testing.T) {
	sel := map[string]string{"app": "vllm"}
	tests := []struct {
		name  string
		pods  []*corev1.Pod
		ports []int32
		want  []string
	}{
		{"ready pods, one port", []*corev1.Pod{pod("a", "10.0.0.2"), pod("b", "10.0.0.1")}, []int32{8000},
			[]string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"each port is an endpoint", []*corev1.Pod{pod("a", "10.0.0.1")}, []int32{8000, 8001},
			[]string{"10.0.0.1:8000", "10.0.0.1:8001"}},
		{"not ready is out", []*corev1.Pod{pod("a", "10.0.0.1", notReady), pod("b", "10.0.0.2")}, []int32{8000},
			[]string{"10.0.0.2:8000"}},
		{"no Ready condition is out", []*corev1.Pod{pod("a", "10.0.0.1", noConditions)}, []int32{8000}, nil},
		{"terminating is out even while Ready", []*corev1.Pod{pod("a", "10.0.0.1", terminating)}, []int32{8000}, nil},
		{"no IP is out", []*corev1.Pod{pod("a", "")}, []int32{8000}, nil},
		{"finished pods are out", []*corev1.Pod{pod("a", "10.0.0.1", phase(corev1.PodSucceeded)), pod("b", "10.0.0.2", phase(corev1.PodFailed))}, []int32{8000}, nil},
		{"pods without the labels are out", []*corev1.Pod{pod("a", "10.0.0.1", labelled(map[string]string{"app": "other"}))}, []int32{8000}, nil},
		{"extra labels do not matter", []*corev1.Pod{pod("a", "10.0.0.1", labelled(map[string]string{"app": "vllm", "x": "y"}))}, []int32{8000},
			[]string{"10.0.0.1:8000"}},
		{"IPv6 in brackets, compressed", []*corev1.Pod{pod("a", "fd00:0:0:0:0:0:0:1")}, []int32{8000}, []string{"[fd00::1]:8000"}},
		{"two pods with one IP count once", []*corev1.Pod{pod("a", "10.0.0.1"), pod("b", "10.0.0.1")}, []int32{8000}, []string{"10.0.0.1:8000"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := make([]any, len(tc.pods))
			for i, p := range tc.pods {
				objs[i] = p
			}
			got := Endpoints(objs, sel, tc.ports)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Endpoints = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPoolNamespaceOrder(t *testing.T) {
	dir := t.TempDir()
	saFile := filepath.Join(dir, "namespace")
	old := serviceAccountNamespaceFile
	serviceAccountNamespaceFile = saFile
	t.Cleanup(func() { serviceAccountNamespaceFile = old })
	tests := []struct {
		name, flag, podNS, ns, file, fallback, want string
	}{
		{"flag wins", "from-flag", "pod", "chart", "sa", "kc", "from-flag"},
		{"POD_NAMESPACE next", "", "pod", "chart", "sa", "kc", "pod"},
		{"NAMESPACE (the reference chart's) next", "", "", "chart", "sa", "kc", "chart"},
		{"service account file next", "", "", "", "sa\n", "kc", "sa"},
		{"kubeconfig context last", "", "", "", "", "kc", "kc"},
		{"default when nothing says", "", "", "", "", "", "default"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", tc.podNS)
			t.Setenv("NAMESPACE", tc.ns)
			os.Remove(saFile)
			if tc.file != "" {
				if err := os.WriteFile(saFile, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got := PoolNamespace(tc.flag, tc.fallback); got != tc.want {
				t.Fatalf("PoolNamespace = %q, want %q", got, tc.want)
			}
		})
	}
}
