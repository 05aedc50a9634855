#!/usr/bin/env bash
# Builds the helm CLI from the Go module registry at the version pinned in
# hack/tools/gomod/helm/go.mod, into ~/.cache/ocm-fl/bin/helm-<version>/helm.
# Skips the build when that binary already exists. Prints the binary's path on stdout.
set -euo pipefail
# shellcheck source=SCRIPTDIR/gotool.sh
. "$(dirname "$0")/gotool.sh"
pinned_tool helm helm.sh/helm/v3
# Helm's default Kubernetes version (helm template, lint) comes from its client-go module, as
# helm's own Makefile does it: v0.35.x -> 1.35.
client_go=$(awk '$1 == "k8s.io/client-go" {print $2; exit}' "$mod/go.mod")
k8s_minor=$(cut -d. -f2 <<<"$client_go")
cd "$mod"
# -mod=mod: the wrapper's go.sum is the pin; a fresh module cache downloads what it lists.
GOFLAGS=-mod=mod go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version \
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor \
    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor" \
  -o "$out/helm.tmp" helm.sh/helm/v3/cmd/helm
mv "$out/helm.tmp" "$out/helm"
echo "$out/helm"
