// Package kubeapi tests the picker in Kubernetes mode against a real API server: etcd and
// kube-apiserver run on loopback (internal/kubetest, binaries from hack/kube-binaries.sh), the
// tests create InferencePools and Pods (status patched to Ready with loopback IPs where stand-in
// model servers answer health probes), run the picker in-process as runner.Run would in a pod
// (and once as the cmd/extproc binary with the reference chart's flags), and check through the
// ext_proc API, as a proxy sees it, which endpoint each request is sent to, what readiness says
// and what the metrics show.
//
//	export KUBE_ASSETS=$(hack/kube-binaries.sh)
//	go test -race ./e2e/kubeapi/
//
// Without KUBE_ASSETS the tests skip, unless KUBE_ASSETS_REQUIRED=1 or CI=true (make test sets
// the former), where they fail.
package kubeapi
