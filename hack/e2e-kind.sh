#!/usr/bin/env bash
# The kind end-to-end suite: `make e2e-kind` (up and test), `make e2e-kind-down` (delete the
# cluster). See e2e/kind/README.md for what it does and how to debug it.
#
#   hack/e2e-kind.sh [up|test|down]
#     up    create (or reuse) the cluster, install everything, run the tests   (default)
#     test  run the tests against an existing cluster (port-forward + go test)
#     down  delete the cluster
#
# Versions come from manifests/versions.yaml (the one place they are pinned); override any of
# them from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."

# version KEY: the value of a top-level key of manifests/versions.yaml.
version() { sed -n "s/^$1:[[:space:]]*\([^[:space:]#]*\).*/\1/p" manifests/versions.yaml; }

CLUSTER=${KIND_CLUSTER:-kvpick-e2e}
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-}                            # empty: the kind release's default node
GATEWAY_API_VERSION=${GATEWAY_API_VERSION:-$(version gatewayAPI)}        # Gateway API CRDs, standard channel
GIE_VERSION=${GIE_VERSION:-$(version inferenceExtension)}                # Inference Extension CRDs
ENVOY_GATEWAY_VERSION=${ENVOY_GATEWAY_VERSION:-$(version envoyGateway)}  # Envoy Gateway (helm chart)
AI_GATEWAY_VERSION=${AI_GATEWAY_VERSION:-$(version envoyAIGateway)}      # Envoy AI Gateway (InferencePool support)
LOCAL_PORT=${E2E_LOCAL_PORT:-8080}                       # where the Gateway is port-forwarded
E2E_TEST_ARGS=${E2E_TEST_ARGS:-}                         # extra `go test` arguments, e.g. -run Stream
GO=${GO:-go}
NS=kvpick-e2e
CONTEXT=kind-$CLUSTER
LOGS=tmp/e2e-kind

log() { printf '\n==> %s\n' "$*" >&2; }
die() { printf 'e2e-kind: %s\n' "$*" >&2; exit 1; }
k() { kubectl --context "$CONTEXT" "$@"; }
h() { helm --kube-context "$CONTEXT" "$@"; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 not found. $2"
}

check_tools() {
  need docker "Install Docker Engine 23+ or Docker Desktop: https://docs.docker.com/get-docker/"
  docker info >/dev/null 2>&1 ||
    die "docker is installed but its daemon is not reachable: is it running, and may this user use it?"
  need kind "Install kind v0.27 or later: https://kind.sigs.k8s.io/docs/user/quick-start/#installation (or: go install sigs.k8s.io/kind@latest)"
  need kubectl "Install kubectl v1.32 or later: https://kubernetes.io/docs/tasks/tools/"
  need helm "Install Helm v3.8 or later (OCI charts): https://helm.sh/docs/intro/install/"
  need "$GO" "Install Go 1.26: https://go.dev/dl/"
}

cluster_exists() { kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; }

create_cluster() {
  if cluster_exists; then
    log "reusing kind cluster $CLUSTER (make e2e-kind-down deletes it)"
  else
    log "creating kind cluster $CLUSTER"
    kind create cluster --name "$CLUSTER" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 3m
  fi
  k cluster-info >/dev/null
}

install_gateway() {
  log "Gateway API $GATEWAY_API_VERSION CRDs (standard channel)"
  k apply --server-side --force-conflicts -f \
    "https://github.com/kubernetes-sigs/gateway-api/releases/download/$GATEWAY_API_VERSION/standard-install.yaml"

  log "Gateway API Inference Extension $GIE_VERSION CRDs (InferencePool)"
  k apply --server-side --force-conflicts -f \
    "https://github.com/kubernetes-sigs/gateway-api-inference-extension/releases/download/$GIE_VERSION/v1-manifests.yaml"
  k wait --for=condition=Established --timeout=2m \
    crd/gateways.gateway.networking.k8s.io crd/httproutes.gateway.networking.k8s.io \
    crd/inferencepools.inference.networking.k8s.io

  log "Envoy Gateway $ENVOY_GATEWAY_VERSION CRDs (its own; the Gateway API ones are installed above)"
  h template eg-crds oci://docker.io/envoyproxy/gateway-crds-helm --version "$ENVOY_GATEWAY_VERSION" \
    --set crds.gatewayAPI.enabled=false --set crds.envoyGateway.enabled=true |
    k apply --server-side --force-conflicts -f -

  log "Envoy Gateway $ENVOY_GATEWAY_VERSION with InferencePool backends (manifests/gateways/envoy-gateway/helm-values.yaml)"
  h upgrade -i eg oci://docker.io/envoyproxy/gateway-helm --version "$ENVOY_GATEWAY_VERSION" \
    -n envoy-gateway-system --create-namespace --skip-crds \
    -f manifests/gateways/envoy-gateway/helm-values.yaml --wait --timeout 5m

  log "Envoy AI Gateway $AI_GATEWAY_VERSION (Envoy Gateway's extension server for InferencePool)"
  h upgrade -i aieg-crd oci://docker.io/envoyproxy/ai-gateway-crds-helm --version "$AI_GATEWAY_VERSION" \
    -n envoy-ai-gateway-system --create-namespace --wait --timeout 5m
  h upgrade -i aieg oci://docker.io/envoyproxy/ai-gateway-helm --version "$AI_GATEWAY_VERSION" \
    -n envoy-ai-gateway-system --create-namespace --wait --timeout 5m
  # Envoy Gateway dials its extension server; restart it now that the server is up.
  k -n envoy-gateway-system rollout restart deployment/envoy-gateway
  k -n envoy-gateway-system rollout status deployment/envoy-gateway --timeout=3m
}

load_images() {
  log "building kvpick.local/kvpick:e2e and kvpick.local/simserver:e2e (make image image-simserver)"
  make image image-simserver IMAGE=kvpick.local/kvpick:e2e SIM_IMAGE=kvpick.local/simserver:e2e
  log "loading the images into the cluster"
  kind load docker-image --name "$CLUSTER" kvpick.local/kvpick:e2e kvpick.local/simserver:e2e
}

deploy() {
  log "applying manifests/gateways/envoy-gateway/cluster and manifests/e2e"
  k apply -k manifests/gateways/envoy-gateway/cluster
  k apply -k manifests/e2e
  # Same image tags on every run: restart so that a reused cluster runs the images just loaded.
  k -n "$NS" rollout restart deployment/kvpick-sim
  k -n "$NS" rollout status deployment/kvpick-sim --timeout=3m
  # The picker reads its pool from the InferencePool (Kubernetes mode): it turns Ready once it
  # has seen the simulators.
  k -n "$NS" rollout restart deployment/kvpick
  k -n "$NS" rollout status deployment/kvpick --timeout=3m

  log "waiting for the Gateway and its Envoy"
  k -n "$NS" wait gateway/kvpick-gateway --for=condition=Programmed --timeout=3m
  k -n envoy-gateway-system wait deployment --for=condition=Available --timeout=3m \
    -l "gateway.envoyproxy.io/owning-gateway-name=kvpick-gateway,gateway.envoyproxy.io/owning-gateway-namespace=$NS"
}

run_tests() {
  local svc eps pf status
  svc=$(k -n envoy-gateway-system get service -o jsonpath='{.items[0].metadata.name}' \
    -l "gateway.envoyproxy.io/owning-gateway-name=kvpick-gateway,gateway.envoyproxy.io/owning-gateway-namespace=$NS")
  [ -n "$svc" ] || die "no Envoy Service for Gateway $NS/kvpick-gateway (is Envoy Gateway running?)"
  # The pool's members now: every answer must come from one of them (the suite re-reads the
  # pods itself after changing them).
  eps=$(k -n "$NS" get pods -l app=kvpick-model-server --field-selector=status.phase=Running \
    -o jsonpath='{range .items[*]}{.status.podIP}:8000,{end}')
  eps=${eps%,}
  [ -n "$eps" ] || die "no running simulator pods in $NS: run make e2e-kind"

  mkdir -p "$LOGS"
  log "port-forward envoy-gateway-system/$svc :80 to 127.0.0.1:$LOCAL_PORT"
  k -n envoy-gateway-system port-forward "service/$svc" "$LOCAL_PORT:80" >"$LOGS/port-forward.log" 2>&1 &
  pf=$!
  trap 'kill "$pf" 2>/dev/null || true' EXIT
  for _ in $(seq 30); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$LOCAL_PORT") 2>/dev/null; then break; fi
    kill -0 "$pf" 2>/dev/null || die "port-forward exited: $(cat "$LOGS/port-forward.log") (set E2E_LOCAL_PORT if $LOCAL_PORT is taken)"
    sleep 1
  done

  log "go test -tags kind ./e2e/kind/ (gateway http://127.0.0.1:$LOCAL_PORT, pool $eps)"
  status=0
  # shellcheck disable=SC2086
  KVPICK_E2E_GATEWAY="http://127.0.0.1:$LOCAL_PORT" KVPICK_E2E_ENDPOINTS="$eps" \
    KVPICK_E2E_KUBECTL="kubectl --context $CONTEXT" KVPICK_E2E_NAMESPACE="$NS" \
    "$GO" test -tags kind -count=1 -v ./e2e/kind/ $E2E_TEST_ARGS || status=$?
  if [ "$status" -ne 0 ]; then
    collect_logs
    die "tests failed (exit $status); cluster state and logs in $LOGS/ (the cluster is kept: make e2e-kind-down)"
  fi
  log "passed; the cluster is kept for reruns (make e2e-kind reuses it; make e2e-kind-down deletes it)"
}

collect_logs() {
  log "collecting cluster state into $LOGS/"
  mkdir -p "$LOGS"
  k get pods,services,deployments -A -o wide >"$LOGS/objects.txt" 2>&1 || true
  k -n "$NS" get gateway,httproute,inferencepool -o yaml >"$LOGS/gateway-objects.yaml" 2>&1 || true
  k -n "$NS" logs deployment/kvpick --all-containers --tail=-1 >"$LOGS/kvpick.log" 2>&1 || true
  k -n "$NS" logs -l app=kvpick-model-server --all-containers --prefix --tail=500 >"$LOGS/simservers.log" 2>&1 || true
  k -n envoy-gateway-system logs deployment/envoy-gateway --tail=2000 >"$LOGS/envoy-gateway.log" 2>&1 || true
  k -n envoy-ai-gateway-system logs deployment/ai-gateway-controller --tail=2000 >"$LOGS/ai-gateway-controller.log" 2>&1 || true
  k -n envoy-gateway-system logs --all-containers --prefix --tail=2000 \
    -l "gateway.envoyproxy.io/owning-gateway-name=kvpick-gateway" >"$LOGS/envoy.log" 2>&1 || true
}

case "${1:-up}" in
  up)
    check_tools
    start=$(date +%s)
    create_cluster
    install_gateway
    load_images
    deploy
    run_tests
    log "done in $(($(date +%s) - start)) s"
    ;;
  test)
    check_tools
    cluster_exists || die "no kind cluster $CLUSTER: run make e2e-kind first"
    run_tests
    ;;
  down)
    need kind "Install kind: https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
    if cluster_exists; then
      kind delete cluster --name "$CLUSTER"
    else
      echo "e2e-kind: no kind cluster $CLUSTER" >&2
    fi
    ;;
  *)
    die "usage: $0 [up|test|down]"
    ;;
esac
