#!/usr/bin/env bash
# Copies an InferencePool's ready pods into kvpick's static pool.
#
# kvpick does not watch InferencePools yet (a later release will): its pool is the --endpoints
# flag, which manifests/base/deployment.yaml fills from the env var KVPICK_ENDPOINTS. This
# script reads the pool's selector and target ports, lists the Ready pods it selects, and sets
# KVPICK_ENDPOINTS to their ip:port list with `kubectl set env`, which rolls the picker's
# Deployment. It does nothing when the list is unchanged. Run it after the model server pods
# change (or with --watch). Prints the list on stdout.
#
#   hack/sync-endpoints.sh [-n NAMESPACE] [--pool kvpick-pool] [--deployment kvpick]
#                          [--container extproc] [--dry-run] [--watch SECONDS]
#
# Needs kubectl (set KUBECTL to override, e.g. KUBECTL="kubectl --context kind-kvpick-e2e").
set -euo pipefail

KUBECTL=${KUBECTL:-kubectl}
ns=""
pool=kvpick-pool
deployment=kvpick
container=extproc
dry_run=false
watch=0

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--namespace) ns=$2; shift 2 ;;
    --pool) pool=$2; shift 2 ;;
    --deployment) deployment=$2; shift 2 ;;
    --container) container=$2; shift 2 ;;
    --dry-run) dry_run=true; shift ;;
    --watch) watch=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "sync-endpoints: unknown argument $1" >&2; usage ;;
  esac
done
# shellcheck disable=SC2206
k=($KUBECTL)
if [ -n "$ns" ]; then k+=(-n "$ns"); fi

endpoints() {
  local selector ports ips list=()
  selector=$("${k[@]}" get inferencepool "$pool" \
    -o go-template='{{range $k, $v := .spec.selector.matchLabels}}{{$k}}={{$v}},{{end}}')
  selector=${selector%,}
  ports=$("${k[@]}" get inferencepool "$pool" -o go-template='{{range .spec.targetPorts}}{{.number}} {{end}}')
  if [ -z "$selector" ] || [ -z "$ports" ]; then
    echo "sync-endpoints: InferencePool $pool has no selector.matchLabels or targetPorts" >&2
    return 1
  fi
  # Ready, not terminating, with an IP: what the InferencePool counts as an endpoint.
  ips=$("${k[@]}" get pods -l "$selector" -o go-template='{{range .items}}{{$ip := .status.podIP}}{{if and $ip (not .metadata.deletionTimestamp)}}{{range .status.conditions}}{{if and (eq .type "Ready") (eq .status "True")}}{{$ip}}{{"\n"}}{{end}}{{end}}{{end}}{{end}}')
  for ip in $ips; do
    for port in $ports; do
      case "$ip" in
        *:*) list+=("[$ip]:$port") ;;
        *) list+=("$ip:$port") ;;
      esac
    done
  done
  if [ ${#list[@]} -eq 0 ]; then
    echo "sync-endpoints: no Ready pod matches $selector" >&2
    return 1
  fi
  printf '%s\n' "${list[@]}" | sort | paste -sd, -
}

sync_once() {
  local want have
  want=$(endpoints)
  have=$("${k[@]}" get deployment "$deployment" \
    -o jsonpath="{.spec.template.spec.containers[?(@.name==\"$container\")].env[?(@.name==\"KVPICK_ENDPOINTS\")].value}")
  if [ "$want" = "$have" ]; then
    echo "sync-endpoints: $deployment already has $want" >&2
  elif $dry_run; then
    echo "sync-endpoints: would set KVPICK_ENDPOINTS=$want on $deployment (now: ${have:-<empty>})" >&2
  else
    "${k[@]}" set env "deployment/$deployment" -c "$container" "KVPICK_ENDPOINTS=$want" >&2
  fi
  echo "$want"
}

if [ "$watch" -gt 0 ]; then
  while :; do
    sync_once || true
    sleep "$watch"
  done
fi
sync_once
