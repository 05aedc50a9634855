"""Hub and managed-cluster setup before the OCM controllers start: CRDs and namespaces.

Everything about clusters (ManagedClusters, their status, claims, leases, RBAC, the cluster
sets) comes from OCM's real registration controller and agents (plane.py starts them;
clusteradm.py does the admin's part).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from pathlib import Path

import yaml

from hack.controlplane import clusteradm
from ocmfl.constants import AGENT_NAMESPACE as ADDON_NAMESPACE
from ocmfl.constants import HUB_NAMESPACE
from ocmfl.kube import Kube

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
# Where the klusterlet's agents (registration, work) keep their state on a managed cluster.
AGENT_NAMESPACE = "open-cluster-management-agent"


def now() -> str:
    """RFC 3339 UTC timestamp, second precision (what metav1.Time serialises)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def apply_crds(kube: Kube, files: Iterable[Path], timeout: float = 60.0) -> list[str]:
    """Create or replace the CRDs in `files`; wait until all are Established."""
    names = []
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            if not doc:
                continue
            name = doc["metadata"]["name"]
            names.append(name)
            if kube.create(CRD_PATH, doc) is None:
                cur = kube.get(f"{CRD_PATH}/{name}")
                if cur is not None:
                    doc["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
                    kube.request("PUT", f"{CRD_PATH}/{name}", doc)
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        for name in list(pending):
            crd = kube.get(f"{CRD_PATH}/{name}") or {}
            conds = crd.get("status", {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                pending.discard(name)
        if pending:
            time.sleep(0.2)
    if pending:
        raise TimeoutError(f"CRDs not Established: {sorted(pending)}")
    return names


def ensure_namespace(kube: Kube, name: str) -> None:
    kube.create("/api/v1/namespaces", {"metadata": {"name": name}})


# The hub's default StorageClass: what a claim without storageClassName gets (the model PVC a
# FederatedLearning's server uses by default), provisioned by kube-controller-manager's
# in-tree hostPath provisioner (plane.py: --enable-hostpath-provisioner).
DEFAULT_STORAGE_CLASS = "ocm-fl-local-hostpath"


def default_storage_class() -> dict[str, object]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": DEFAULT_STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": "kubernetes.io/host-path",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def bootstrap_hub(kube: Kube, crds: Iterable[Path]) -> None:
    """OCM's hub CRDs, the hub namespace, a default StorageClass and `clusteradm init`'s
    bootstrap identity. The ManagedClusters, their RBAC and the `default`/`global` sets are
    the registration controller's (it creates a ManagedCluster's RBAC once the cluster
    registers)."""
    apply_crds(kube, crds)
    ensure_namespace(kube, HUB_NAMESPACE)
    kube.create("/apis/storage.k8s.io/v1/storageclasses", default_storage_class())
    clusteradm.init(kube)


def bootstrap_cluster(kube: Kube, crds: Iterable[Path]) -> None:
    """A managed cluster needs the ClusterClaim and AppliedManifestWork CRDs, and the two
    namespaces the klusterlet operator creates: its agents' (the registration agent keeps its
    hub kubeconfig Secret there) and the addons' default install namespace."""
    apply_crds(kube, crds)
    ensure_namespace(kube, AGENT_NAMESPACE)
    ensure_namespace(kube, ADDON_NAMESPACE)
