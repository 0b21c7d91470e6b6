// Package kind is kvpick's end-to-end suite on a real Kubernetes cluster: kind, Envoy Gateway
// with Envoy AI Gateway (its InferencePool support), the picker and four simulated vLLM
// servers from manifests/e2e. Its tests send OpenAI requests through the real Envoy and check
// status codes, conversation stickiness, OpenAI-style errors and SSE streaming.
//
// The tests are behind the build tag "kind": `make e2e-kind` creates the cluster and runs
// them (see README.md). Without the tag the package holds only this file, so `go test ./...`
// skips it, while `go vet -tags kind ./e2e/kind/` keeps the suite compiling in CI.
package kind
