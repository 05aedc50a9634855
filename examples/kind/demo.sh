#!/usr/bin/env bash
# Federated learning across three kind clusters: an OCM hub and two managed clusters that each
# hold one partition of the digits data set. Needs Docker, kind, kubectl, clusteradm and the
# project's Python environment (.venv, `make setup`); helm is built by hack/tools/build-helm.sh.
#
#   examples/kind/demo.sh          create everything, train, wait for Completed
#   examples/kind/demo.sh clean    delete the kind clusters and the load-balancer container
#
# Everything after the clusters exist (after_clusters: chart, addon, data + claims, training,
# the model) uses only kubectl, helm and the node_* functions below, so CI runs those same
# functions against the local control plane's kubelet nodes (hack/demo-local.sh sources this
# file and replaces node_sh/node_put_dir, the contexts and the node addresses).
#
# What it does: kind clusters hub/cluster1/cluster2 -> OCM (clusteradm init/join/accept) ->
# images built and loaded into every cluster -> hub chart installed -> addon enabled on both
# clusters -> a data partition copied into each cluster's node + a ClusterClaim naming it ->
# examples/federatedlearning.yaml applied -> waits until the resource is Completed.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"

HUB=${HUB:-hub}
CLUSTERS=${CLUSTERS:-cluster1,cluster2}
FL_NAMESPACE=${FL_NAMESPACE:-fl}
FL_NAME=${FL_NAME:-digits}
HUB_NAMESPACE=${HUB_NAMESPACE:-ocm-fl-system}
DATA_CLAIM=${DATA_CLAIM:-digits.data.federated-learning.io}
DATA_DIR_ON_NODE=${DATA_DIR_ON_NODE:-/var/lib/ocm-fl/data/digits}
AGGREGATOR_NODE_PORT=${AGGREGATOR_NODE_PORT:-30443}
TIMEOUT_SECONDS=${TIMEOUT_SECONDS:-1800}
PYTHON=${PYTHON:-$root/.venv/bin/python}
# The FL server Service is a LoadBalancer: cloud-provider-kind gives it an address on the kind
# network that the managed clusters can reach.
CLOUD_PROVIDER_KIND_IMAGE=${CLOUD_PROVIDER_KIND_IMAGE:-registry.k8s.io/cloud-provider-kind/cloud-controller-manager:v0.6.0}
LB_CONTAINER=ocm-fl-cloud-provider-kind

IFS=, read -r -a cluster_list <<<"$CLUSTERS"
hub_ctx=${HUB_CONTEXT:-kind-$HUB}
# Where the managed clusters reach the hub's nodes (the aggregator's NodePort).
HUB_NODE_ADDRESS=${HUB_NODE_ADDRESS:-$HUB-control-plane}
# Root of the HostPath model stores on the hub's node (Helm value storage.hostPathRoot); each
# resource's store is <root>/<namespace>/<name>-<uid>. Empty: the chart's default.
MODELS_DIR=${MODELS_DIR:-}

cluster_ctx() { printf 'kind-%s' "$1"; }
# A shell command on the (single) node of cluster $1, and a directory copied onto it.
node_sh() { docker exec "$1-control-plane" sh -c "$2"; }
node_put_dir() { docker cp "$2" "$1-control-plane:$3"; }
# The data directory on cluster $1's node (its ClusterClaim's value).
node_data_dir() { printf '%s' "$DATA_DIR_ON_NODE"; }

log() { printf '\n=== %s\n' "$*" >&2; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 is required (see docs/install.md)"; }

constant() { "$PYTHON" -c "from ocmfl import constants; print(constants.$1)"; }

clean() {
  for c in "$HUB" "${cluster_list[@]}"; do
    kind delete cluster --name "$c" || true
  done
  docker rm -f "$LB_CONTAINER" >/dev/null 2>&1 || true
}

# Poll "$@" until it succeeds or $1 seconds pass.
wait_for() {
  local timeout=$1 what=$2
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      die "timed out after ${timeout}s waiting for $what"
    fi
    sleep 5
  done
}

create_clusters() {
  log "kind clusters: $HUB ${cluster_list[*]}"
  for c in "$HUB" "${cluster_list[@]}"; do
    if ! kind get clusters 2>/dev/null | grep -qx "$c"; then
      kind create cluster --name "$c" --wait 120s
    fi
  done
  if ! docker inspect "$LB_CONTAINER" >/dev/null 2>&1; then
    docker run -d --name "$LB_CONTAINER" --network kind \
      -v /var/run/docker.sock:/var/run/docker.sock "$CLOUD_PROVIDER_KIND_IMAGE" >/dev/null
  fi
}

install_ocm() {
  log "OCM: clusteradm init on $HUB, join ${cluster_list[*]}, accept"
  local join
  join=$(clusteradm init --wait --context "$hub_ctx" | grep 'clusteradm join' || true)
  if [ -z "$join" ]; then
    # Already initialised: ask for a fresh join command.
    join=$(clusteradm get token --context "$hub_ctx" | grep 'clusteradm join')
  fi
  local token
  token=$(sed -n 's/.*--hub-token \([^ ]*\).*/\1/p' <<<"$join")
  [ -n "$token" ] || die "could not read the hub token from: $join"
  for c in "${cluster_list[@]}"; do
    if kubectl --context "$hub_ctx" get managedcluster "$c" >/dev/null 2>&1; then
      continue
    fi
    clusteradm join --hub-token "$token" --hub-apiserver "https://$HUB-control-plane:6443" \
      --cluster-name "$c" --force-internal-endpoint-lookup --wait --context "kind-$c"
  done
  for c in "${cluster_list[@]}"; do
    wait_for 300 "the CSR of $c" \
      bash -c "kubectl --context '$hub_ctx' get csr -l open-cluster-management.io/cluster-name='$c' -o name | grep -q ."
  done
  clusteradm accept --clusters "$CLUSTERS" --wait --context "$hub_ctx"
}

build_images() {
  log "images: build and load into every kind cluster"
  local image
  for name in addon workload; do
    image=$(constant "$(tr '[:lower:]' '[:upper:]' <<<"$name")_IMAGE")
    docker build -f "deploy/images/$name.Dockerfile" -t "$image" .
    for c in "$HUB" "${cluster_list[@]}"; do
      kind load docker-image "$image" --name "$c"
    done
  done
}

install_chart() {
  log "hub chart into $HUB_NAMESPACE"
  local helm
  helm=${HELM:-$(bash hack/tools/build-helm.sh)}
  bash hack/sync-chart-crds.sh
  # Helm installs crds/ only on a first install: a re-run (upgrade) gets new or changed CRDs
  # (FederationPolicy) this way.
  kubectl --context "$hub_ctx" apply --server-side -f deploy/helm/ocm-federated-learning/crds/
  # The chart grants the hub its server-side writes only in rbac.flNamespaces (a Role in
  # each), so the tenant namespace exists first.
  kubectl --context "$hub_ctx" create namespace "$FL_NAMESPACE" --dry-run=client -o yaml |
    kubectl --context "$hub_ctx" apply -f -
  "$helm" upgrade --install ocm-fl deploy/helm/ocm-federated-learning \
    --kube-context "$hub_ctx" --namespace "$HUB_NAMESPACE" --create-namespace \
    --set "rbac.flNamespaces={$FL_NAMESPACE}" \
    --set aggregator.service.type=NodePort \
    --set "aggregator.service.nodePort=$AGGREGATOR_NODE_PORT" \
    --set "aggregator.externalAddress=$HUB_NODE_ADDRESS:$AGGREGATOR_NODE_PORT" \
    ${MODELS_DIR:+--set "storage.hostPathRoot=$MODELS_DIR"} \
    --wait --timeout 10m
  local addon
  addon=$(constant ADDON_NAME)
  # What `clusteradm addon enable --names $addon --clusters ...` creates.
  for c in "${cluster_list[@]}"; do
    kubectl --context "$hub_ctx" apply -f - <<EOF
apiVersion: addon.open-cluster-management.io/v1alpha1
kind: ManagedClusterAddOn
metadata:
  name: $addon
  namespace: $c
spec:
  installNamespace: $(constant AGENT_NAMESPACE)
EOF
  done
  for c in "${cluster_list[@]}"; do
    wait_for 600 "addon $addon available on $c" \
      bash -c "kubectl --context '$hub_ctx' get managedcluster '$c' \
        -o jsonpath='{.metadata.labels.feature\.open-cluster-management\.io/addon-$addon}' \
        | grep -qx available"
  done
}

place_data() {
  log "data: one digits partition per cluster, named by ClusterClaim $DATA_CLAIM"
  local out
  out=$(mktemp -d)
  "$PYTHON" -m workloads.data partition --out "$out" --clusters "$CLUSTERS" --task digits \
    --split iid --seed 0
  for c in "${cluster_list[@]}"; do
    local dir
    dir=$(node_data_dir "$c")
    node_sh "$c" "mkdir -p '$(dirname "$dir")' && rm -rf '$dir'"
    node_put_dir "$c" "$out/$c" "$dir"
    node_sh "$c" "chmod -R a+rX '$dir'"
    kubectl --context "$(cluster_ctx "$c")" apply -f - <<EOF
apiVersion: cluster.open-cluster-management.io/v1alpha1
kind: ClusterClaim
metadata:
  name: $DATA_CLAIM
spec:
  value: $dir
EOF
    wait_for 300 "ClusterClaim $DATA_CLAIM of $c on the hub" \
      bash -c "kubectl --context '$hub_ctx' get managedcluster '$c' \
        -o jsonpath='{.status.clusterClaims[*].name}' | tr ' ' '\n' | grep -qx '$DATA_CLAIM'"
  done
  rm -rf "$out"
}

train() {
  log "FederatedLearning $FL_NAMESPACE/$FL_NAME"
  # The server Job stores the model under the chart's storage.hostPathRoot on the hub node,
  # in a directory of its own that its init container hands to the workload uid (65532).
  local manifest
  manifest=$(cat examples/federatedlearning.yaml)
  kubectl --context "$hub_ctx" create namespace "$FL_NAMESPACE" --dry-run=client -o yaml |
    kubectl --context "$hub_ctx" apply -f -
  # What `clusteradm clusterset bind global --namespace $FL_NAMESPACE` creates.
  kubectl --context "$hub_ctx" apply -f - <<EOF
apiVersion: cluster.open-cluster-management.io/v1beta2
kind: ManagedClusterSetBinding
metadata:
  name: global
  namespace: $FL_NAMESPACE
spec:
  clusterSet: global
EOF
  # The admin's FederationPolicy for the namespace: without it the FederatedLearning is refused.
  sed "s/^  namespace: fl$/  namespace: $FL_NAMESPACE/" examples/federationpolicy.yaml |
    kubectl --context "$hub_ctx" apply -f -
  kubectl --context "$hub_ctx" apply -f - <<<"$manifest"
  local deadline=$((SECONDS + TIMEOUT_SECONDS)) phase=""
  while ((SECONDS < deadline)); do
    phase=$(kubectl --context "$hub_ctx" -n "$FL_NAMESPACE" get fl "$FL_NAME" \
      -o jsonpath='{.status.phase}' 2>/dev/null || true)
    kubectl --context "$hub_ctx" -n "$FL_NAMESPACE" get fl "$FL_NAME" --no-headers 2>/dev/null || true
    case "$phase" in
      Completed)
        log "Completed"
        return 0
        ;;
      Failed)
        kubectl --context "$hub_ctx" -n "$FL_NAMESPACE" get fl "$FL_NAME" -o yaml >&2
        die "training failed"
        ;;
    esac
    sleep 10
  done
  die "not Completed after ${TIMEOUT_SECONDS}s (phase: ${phase:-none})"
}

show_model() {
  log "the trained model"
  kubectl --context "$hub_ctx" -n "$FL_NAMESPACE" get fl "$FL_NAME" -o yaml
  "$(dirname "$PYTHON")/ocm-fl" model "$FL_NAME" -n "$FL_NAMESPACE" --context "$hub_ctx"
}

# Everything once the clusters exist, OCM runs and the images are on the nodes.
after_clusters() {
  install_chart
  place_data
  train
  show_model
}

main() {
  if [ "${1:-}" = "clean" ]; then
    clean
    return
  fi
  for tool in docker kind kubectl clusteradm; do need "$tool"; done
  [ -x "$PYTHON" ] || die "no Python environment at $PYTHON (run make setup)"
  create_clusters
  install_ocm
  build_images
  after_clusters
}

# Sourced (hack/demo-local.sh): define the functions, run nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
