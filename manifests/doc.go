// Package manifests holds kvpick's Kubernetes manifests (kustomize: base, envoy-gateway, e2e)
// and a plain Envoy bootstrap (envoy/envoy.yaml). It has no code: its tests check that every
// document is well formed and agrees with the binaries it runs — flags that cmd/extproc and
// cmd/simserver define, ports, gRPC health services, the picker's configuration file — and
// that the Envoy bootstrap decodes against Envoy's protos with the wiring an endpoint picker
// needs. See manifests/README.md.
package manifests
