// Package manifests holds kvpick's deployment: a Helm chart (charts/kvpick), kustomize bases
// and overlays (base, gateways/*, components/ha, e2e), the pinned versions of the gateways
// (versions.yaml) and a plain Envoy bootstrap (envoy/envoy.yaml). It has no code. Its tests
// render the chart with Helm's SDK and build every kustomization with kustomize's library as
// `helm install` and `kubectl apply -k` would, check the objects against the binaries they run
// (flags, ports, gRPC health services, the configuration file, RBAC for Kubernetes mode),
// apply them with server-side dry run to a real API server (when KUBE_ASSETS is set), and
// decode the Envoy bootstrap against Envoy's protos. See manifests/README.md.
package manifests
