#!/usr/bin/env bash
# examples/kind/demo.sh's steps after the clusters exist (after_clusters: chart, addon, data and
# claims, training, the model), run by the same functions against the local control plane's
# real kubelet nodes (`python -m hack.controlplane up --kubelet`), whose
# containerd already holds the images hack/images built. Only what differs from kind is set
# here: contexts, how to reach a node and where its directories are.
#   OCMFL_CP_DIR=... bash hack/demo-local.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
PYTHON=${PYTHON:-$root/.venv/bin/python}

# One kubeconfig with a context per apiserver (hub, cluster1, ...), and the node facts.
eval "$("$PYTHON" -m hack.controlplane.kubelet demo-env)"
: "${NODES_DIR:?}"
export KUBECONFIG HUB_CONTEXT HUB_NODE_ADDRESS MODELS_DIR CLUSTERS HELM PATH
# shellcheck source=SCRIPTDIR/../examples/kind/demo.sh
source examples/kind/demo.sh

cluster_ctx() { printf '%s' "$1"; }
# The kubelet nodes share this machine's file system (their mount namespaces are private only
# for /run and the like): a node's directory is a directory here.
node_sh() { sh -c "$2"; }
node_put_dir() { cp -r "$2" "$3"; }
node_data_dir() { printf '%s/%s/data/digits' "$NODES_DIR" "$1"; }

for tool in kubectl "$HELM"; do need "$tool"; done
after_clusters
