// Package inferencepool holds the minimal InferencePool API types the picker reads, for both API
// groups in use: inference.networking.k8s.io/v1 (spec.selector.matchLabels, spec.targetPorts[])
// and the older inference.networking.x-k8s.io/v1alpha2 (spec.selector as a plain map,
// spec.targetPortNumber). The upstream Go module cannot be fetched here, and the picker needs
// only the selector and the ports, so each version decodes into its own small struct and is
// normalised to a Spec.
package inferencepool

import (
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// API groups the picker accepts for --pool-group.
const (
	GroupV1       = "inference.networking.k8s.io"
	GroupV1Alpha2 = "inference.networking.x-k8s.io"
	Resource      = "inferencepools"
	Kind          = "InferencePool"
)

// Groups lists the accepted API groups, the default first.
var Groups = []string{GroupV1, GroupV1Alpha2}

// GVR returns the resource to watch for an API group.
func GVR(group string) (schema.GroupVersionResource, error) {
	switch group {
	case GroupV1:
		return schema.GroupVersionResource{Group: GroupV1, Version: "v1", Resource: Resource}, nil
	case GroupV1Alpha2:
		return schema.GroupVersionResource{Group: GroupV1Alpha2, Version: "v1alpha2", Resource: Resource}, nil
	}
	return schema.GroupVersionResource{}, fmt.Errorf("pool group %q: want %s (v1) or %s (v1alpha2)", group, GroupV1, GroupV1Alpha2)
}

// Spec is what the picker needs from a pool, whatever its version: the pods' labels and the
// ports each selected pod serves on (one endpoint per pod and port).
type Spec struct {
	MatchLabels map[string]string
	Ports       []int32 // sorted, unique
}

// Equal reports whether two specs select the same endpoints.
func (s Spec) Equal(o Spec) bool {
	return maps.Equal(s.MatchLabels, o.MatchLabels) && slices.Equal(s.Ports, o.Ports)
}

// V1Spec is the part of inference.networking.k8s.io/v1 InferencePool's spec the picker reads.
type V1Spec struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	TargetPorts []struct {
		Number int32 `json:"number"`
	} `json:"targetPorts"`
}

// V1Alpha2Spec is the part of inference.networking.x-k8s.io/v1alpha2 InferencePool's spec the
// picker reads: the selector is a plain label map and there is a single port.
type V1Alpha2Spec struct {
	Selector         map[string]string `json:"selector"`
	TargetPortNumber int32             `json:"targetPortNumber"`
}

// FromUnstructured decodes the spec of an InferencePool object of either group and normalises
// it. Errors say which field is wrong; a pool that selects nothing or has no port is an error,
// since the API server's validation should have rejected it.
func FromUnstructured(u *unstructured.Unstructured) (Spec, error) {
	raw, ok := u.Object["spec"].(map[string]any)
	if !ok {
		return Spec{}, fmt.Errorf("InferencePool %s/%s has no spec", u.GetNamespace(), u.GetName())
	}
	var s Spec
	switch g := u.GroupVersionKind().Group; g {
	case GroupV1:
		var v V1Spec
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &v); err != nil {
			return Spec{}, fmt.Errorf("InferencePool %s/%s: %w", u.GetNamespace(), u.GetName(), err)
		}
		s.MatchLabels = v.Selector.MatchLabels
		for _, p := range v.TargetPorts {
			s.Ports = append(s.Ports, p.Number)
		}
	case GroupV1Alpha2:
		var v V1Alpha2Spec
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &v); err != nil {
			return Spec{}, fmt.Errorf("InferencePool %s/%s: %w", u.GetNamespace(), u.GetName(), err)
		}
		s.MatchLabels = v.Selector
		if v.TargetPortNumber != 0 {
			s.Ports = []int32{v.TargetPortNumber}
		}
	default:
		return Spec{}, fmt.Errorf("InferencePool %s/%s: API group %q is not supported", u.GetNamespace(), u.GetName(), g)
	}
	return s, s.validate(u)
}

func (s *Spec) validate(u *unstructured.Unstructured) error {
	name := u.GetNamespace() + "/" + u.GetName()
	if len(s.MatchLabels) == 0 {
		// An empty selector would select every pod in the namespace: refuse rather than route
		// to pods that are not model servers.
		return fmt.Errorf("InferencePool %s: the selector has no labels", name)
	}
	for _, p := range s.Ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("InferencePool %s: target port %d is not in 1..65535", name, p)
		}
	}
	slices.Sort(s.Ports)
	s.Ports = slices.Compact(s.Ports)
	if len(s.Ports) == 0 {
		return fmt.Errorf("InferencePool %s: no target port", name)
	}
	return nil
}
