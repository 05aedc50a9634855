#!/usr/bin/env bash
# Keeps the Helm chart's copy of the CRDs identical to crds/ (generated from the pydantic
# models by `python -m hack.codegen.crdgen`). Helm installs everything in the chart's crds/.
#   hack/sync-chart-crds.sh          copy crds/*.yaml into the chart
#   hack/sync-chart-crds.sh --check  exit 1 (and say which) when the copies differ
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/crds"
dst="$root/deploy/helm/ocm-federated-learning/crds"
mode=${1:-sync}
status=0
shopt -s nullglob
for f in "$src"/*.yaml; do
  name=$(basename "$f")
  if [ "$mode" = "--check" ]; then
    if ! cmp -s "$f" "$dst/$name"; then
      echo "chart CRD out of date: $dst/$name (run hack/sync-chart-crds.sh)" >&2
      status=1
    fi
  else
    mkdir -p "$dst"
    cp "$f" "$dst/$name"
  fi
done
for f in "$dst"/*.yaml; do
  if [ ! -e "$src/$(basename "$f")" ]; then
    if [ "$mode" = "--check" ]; then
      echo "chart CRD has no source in crds/: $f" >&2
      status=1
    else
      rm -f "$f"
    fi
  fi
done
exit "$status"
