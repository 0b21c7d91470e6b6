#!/usr/bin/env bash
# Builds the etcd and kube-apiserver binaries the integration tests run (internal/kubetest), from
# the Go module proxy, and caches them by version. Idempotent: a second run only prints the
# directory. Prints the directory holding `etcd` and `kube-apiserver` on stdout (and nothing
# else), logs on stderr, so callers can do:
#
#   export KUBE_ASSETS=$(hack/kube-binaries.sh)
#
# Versions (override from the environment):
#   KUBE_VERSION  k8s.io/kubernetes release        (default v1.37.2)
#   ETCD_VERSION  go.etcd.io/etcd/server/v3 release (default v3.6.16)
#
# The builds happen in throwaway modules outside the repository, so the project's go.mod never
# depends on k8s.io/kubernetes. A cold kube-apiserver build takes ~10-15 min and ~2.5 GB of memory
# on 2 cores; etcd ~1 min. A lock serialises concurrent runs (CI and a developer's shell).
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
GO=${GO:-go}
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/kvpick/kube-binaries
DIR=$CACHE_ROOT/kube-$KUBE_VERSION-etcd-$ETCD_VERSION

log() { printf 'kube-binaries: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

have() { [[ -x $DIR/kube-apiserver && -x $DIR/etcd ]]; }

if have; then
  echo "$DIR"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
flock 9
if have; then # another run finished while we waited
  echo "$DIR"
  exit 0
fi
mkdir -p "$DIR"

# The throwaway modules must not see the repository's go.work or flags.
export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvpick-kube-binaries.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

build_etcd() {
  [[ -x $DIR/etcd ]] && return 0
  log "building etcd $ETCD_VERSION"
  local m=$WORK/etcd start=$SECONDS
  mkdir -p "$m"
  cat >"$m/main.go" <<'EOF'
// Command etcd: etcd's server entry point, built from go.etcd.io/etcd/server/v3.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  (cd "$m" && "$GO" mod init kvpick.local/etcd >/dev/null 2>&1 &&
    "$GO" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2 &&
    "$GO" mod tidy >&2 &&
    "$GO" build -trimpath -o "$WORK/etcd.bin" .) || die "etcd build failed"
  mv "$WORK/etcd.bin" "$DIR/etcd"
  log "etcd built in $((SECONDS - start))s"
}

build_apiserver() {
  [[ -x $DIR/kube-apiserver ]] && return 0
  log "building kube-apiserver $KUBE_VERSION (cold: ~10-15 min)"
  local m=$WORK/kube start=$SECONDS
  mkdir -p "$m"
  # k8s.io/kubernetes replaces every staging module with ./staging/...; a dependent module must
  # replace each with its published version (v1.X.Y -> v0.X.Y).
  local gomod
  gomod=$(cd "$m" && "$GO" mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
  [[ -f $gomod ]] || die "could not download k8s.io/kubernetes@$KUBE_VERSION's go.mod"
  local staging_version=v0.${KUBE_VERSION#v1.}
  {
    echo "module kvpick.local/kube"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#replace \1 => \1 '"$staging_version"'#p' "$gomod"
  } >"$m/go.mod"
  grep -q '^replace k8s.io/api ' "$m/go.mod" || die "no staging replaces found in $gomod"
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
  ldflags+=" -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$KUBE_VERSION")"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  (cd "$m" && "$GO" get "k8s.io/kubernetes/cmd/kube-apiserver@$KUBE_VERSION" >&2 &&
    "$GO" build -trimpath -ldflags "$ldflags" -o "$WORK/kube-apiserver.bin" \
      k8s.io/kubernetes/cmd/kube-apiserver) || die "kube-apiserver build failed"
  mv "$WORK/kube-apiserver.bin" "$DIR/kube-apiserver"
  log "kube-apiserver built in $((SECONDS - start))s"
}

build_etcd
build_apiserver
"$DIR/kube-apiserver" --version >&2
echo "$DIR"
