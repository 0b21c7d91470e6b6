#!/usr/bin/env bash
# Regenerates manifests/base/configmap.yaml from config/default.yaml, the picker's compiled-in
# defaults. manifests/validate_test.go fails when the two differ; run this to bring them back
# in line: hack/gen-configmap.sh
set -euo pipefail
cd "$(dirname "$0")/.."

out=manifests/base/configmap.yaml
{
  cat <<'HEADER'
# The picker's configuration file, mounted at /etc/kvpick/config.yaml (--config-file).
#
# SOURCE: a copy of config/default.yaml (the compiled-in defaults, `extproc
# --print-default-config`); manifests/validate_test.go fails when the two differ in value, so
# edit both or neither. To customise, change only what you need in an overlay: a file that sets
# a subset of fields keeps the defaults for the rest. Kubernetes does not restart pods when a
# ConfigMap changes: `kubectl rollout restart deployment/kvpick` after editing it.
apiVersion: v1
kind: ConfigMap
metadata:
  name: kvpick-config
  labels:
    app.kubernetes.io/name: kvpick
data:
  config.yaml: |
HEADER
  # Indent under the block scalar; keep blank lines blank (no trailing spaces).
  sed 's/^/    /; s/^    $//' config/default.yaml
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out"
