package inferencepool

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

func obj(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(j); err != nil {
		t.Fatal(err)
	}
	return u
}

func TestFromUnstructuredReadsBothVersions(t *testing.T) {
	tests := []struct {
		name, doc string
		labels    map[string]string
		ports     []int32
		err       string
	}{
		{"v1 one port", `
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: p, namespace: ns}
spec:
  selector: {matchLabels: {app: vllm}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: epp, port: {number: 9002}}
`, map[string]string{"app": "vllm"}, []int32{8000}, ""},
		{"v1 ports sorted and deduplicated", `
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: p, namespace: ns}
spec:
  selector: {matchLabels: {app: vllm, tier: gpu}}
  targetPorts: [{number: 8002}, {number: 8000}, {number: 8002}]
`, map[string]string{"app": "vllm", "tier": "gpu"}, []int32{8000, 8002}, ""},
		{"v1alpha2 plain selector and single port", `
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferencePool
metadata: {name: p, namespace: ns}
spec:
  selector: {app: sglang}
  targetPortNumber: 30000
  extensionRef: {name: epp}
`, map[string]string{"app": "sglang"}, []int32{30000}, ""},
		{"v1 without selector labels", `
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: p, namespace: ns}
spec:
  selector: {matchLabels: {}}
  targetPorts: [{number: 8000}]
`, nil, nil, "selector has no labels"},
		{"v1alpha2 without port", `
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferencePool
metadata: {name: p, namespace: ns}
spec:
  selector: {app: x}
`, nil, nil, "no target port"},
		{"port out of range", `
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: p, namespace: ns}
spec:
  selector: {matchLabels: {app: x}}
  targetPorts: [{number: 70000}]
`, nil, nil, "not in 1..65535"},
		{"v1 fields under the v1alpha2 group are not read as v1", `
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferencePool
metadata: {name: p, namespace: ns}
spec:
  selector: {app: x}
  targetPorts: [{number: 8000}]
`, nil, nil, "no target port"},
		{"unknown group", `
apiVersion: example.com/v1
kind: InferencePool
metadata: {name: p, namespace: ns}
spec: {}
`, nil, nil, "not supported"},
		{"no spec", `
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: p, namespace: ns}
`, nil, nil, "has no spec"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := FromUnstructured(obj(t, tc.doc))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want it to mention %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := Spec{MatchLabels: tc.labels, Ports: tc.ports}
			if !s.Equal(want) {
				t.Fatalf("spec = %+v, want %+v", s, want)
			}
		})
	}
}

func TestGVRAcceptsOnlyTheTwoGroups(t *testing.T) {
	for group, version := range map[string]string{GroupV1: "v1", GroupV1Alpha2: "v1alpha2"} {
		g, err := GVR(group)
		if err != nil || g.Version != version || g.Resource != "inferencepools" {
			t.Errorf("GVR(%s) = %v, %v", group, g, err)
		}
	}
	if _, err := GVR("inference.networking.k8s.io/v1"); err == nil {
		t.Error("a group with a version was accepted")
	}
	if !slices.Equal(Groups, []string{GroupV1, GroupV1Alpha2}) {
		t.Errorf("Groups = %v: the default must come first", Groups)
	}
}
