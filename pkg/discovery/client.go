package discovery

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// serviceAccountNamespaceFile holds the pod's namespace in a cluster.
var serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// Clients are the API clients discovery and leader election use.
type Clients struct {
	Config  *rest.Config
	Typed   kubernetes.Interface
	Dynamic dynamic.Interface
	// Namespace is the kubeconfig context's namespace ("default" when it names none, or the
	// service account's in a cluster).
	Namespace string
}

// NewClients connects the way kubectl does: the file named by kubeconfig if set, else the
// KUBECONFIG environment variable's files, else ~/.kube/config, and in a cluster with none of
// those the pod's service account.
func NewClients(kubeconfig, userAgent string) (*Clients, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration (--kubeconfig, KUBECONFIG, ~/.kube/config or the in-cluster service account): %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = userAgent
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, err
	}
	typed, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Clients{Config: cfg, Typed: typed, Dynamic: dyn, Namespace: ns}, nil
}

// PoolNamespace resolves the namespace to watch: the flag if set, else the pod's own namespace
// (POD_NAMESPACE or NAMESPACE from the downward API, the reference chart sets the latter, or the
// service-account namespace file), else the kubeconfig context's namespace (fallback).
func PoolNamespace(flag, fallback string) string {
	if flag != "" {
		return flag
	}
	for _, env := range []string{"POD_NAMESPACE", "NAMESPACE"} {
		if v := strings.TrimSpace(os.Getenv(env)); v != "" {
			return v
		}
	}
	if b, err := os.ReadFile(serviceAccountNamespaceFile); err == nil {
		if v := strings.TrimSpace(string(b)); v != "" {
			return v
		}
	}
	if fallback != "" {
		return fallback
	}
	return "default"
}
