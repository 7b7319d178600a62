#!/usr/bin/env bash
# Installs kubeconform v0.8.0 and writes offline JSON schemas for Kubernetes v1.37.2 (from the
# k8s.io/kubernetes module's api/openapi-spec/v3, by scripts/kube-json-schemas.py) into
# ${SKEIN_CI_CACHE:-$HOME/.cache/skein-ci}/kubeconform-v0.8.0, and prints that directory: the value
# of SKEIN_KUBECONFORM for deploy/helm/chartcheck's TestChartPassesKubeconform. Reused when built.
# Cold: a 21 MB module download and a small Go build (see the design notes, issue 25).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${SKEIN_CI_CACHE:-$HOME/.cache/skein-ci}/kubeconform-v0.8.0
schemas=$out/schemas/v1.37.2-standalone-strict
if [ ! -x "$out/kubeconform" ]; then
  mkdir -p "$out"
  GOBIN="$out" GOEXPERIMENT= go install github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0
fi
if [ ! -f "$schemas/deployment-apps-v1.json" ]; then
  spec=$(cd "$(mktemp -d)" && go mod download -json k8s.io/kubernetes@v1.37.2 | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')/api/openapi-spec/v3
  rm -rf "$schemas.tmp"
  python3 "$here/kube-json-schemas.py" "$spec" "$schemas.tmp" >&2
  rm -rf "$schemas"
  mv "$schemas.tmp" "$schemas"
fi
echo "$out"
