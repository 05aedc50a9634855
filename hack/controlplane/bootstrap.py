"""Hub and managed-cluster setup: OCM CRDs, namespaces, cluster sets, ManagedClusters, RBAC.

What the OCM registration agent/hub and clusteradm would normally do, done directly (test
infrastructure): ManagedCluster objects are created accepted, with Joined/Available conditions
patched into their status; claims_mirror keeps their status.clusterClaims current.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from ocmfl.constants import CLUSTER_GROUP, HUB_NAMESPACE, WORK_GROUP
from ocmfl.kube import Kube, KubeError, Obj

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MC_PATH = f"/apis/{CLUSTER_GROUP}/v1/managedclusters"
SET_PATH = f"/apis/{CLUSTER_GROUP}/v1beta2/managedclustersets"
CLUSTERSET_LABEL = f"{CLUSTER_GROUP}/clusterset"
WORK_AGENT_ROLE = "ocmfl-local:work-agent"


def now() -> str:
    """RFC 3339 UTC timestamp, second precision (what metav1.Time serialises)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def work_agent_user(cluster: str) -> str:
    """The hub identity of the work agent of `cluster` (client certificate CN)."""
    return f"system:open-cluster-management:{cluster}:work-agent"


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


def managed_cluster(name: str) -> Obj:
    """An accepted ManagedCluster in the `default` set."""
    return {
        "apiVersion": f"{CLUSTER_GROUP}/v1",
        "kind": "ManagedCluster",
        "metadata": {"name": name, "labels": {CLUSTERSET_LABEL: "default", "name": name}},
        "spec": {"hubAcceptsClient": True, "leaseDurationSeconds": 60},
    }


def _cond(ctype: str, reason: str, message: str) -> Obj:
    return {
        "type": ctype,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now(),
    }


def managed_cluster_status(kube_version: str, claims: list[Obj] | None = None) -> Obj:
    """The status the registration agent would report for a healthy joined cluster."""
    status: Obj = {
        "conditions": [
            _cond(
                "HubAcceptedManagedCluster",
                "HubClusterAdminAccepted",
                "Accepted by hub cluster admin",
            ),
            _cond(
                "ManagedClusterJoined",
                "ManagedClusterJoined",
                "Managed cluster joined (local control plane)",
            ),
            _cond(
                "ManagedClusterConditionAvailable",
                "ManagedClusterAvailable",
                "Managed cluster is available (local control plane)",
            ),
        ],
        "version": {"kubernetes": kube_version},
        "capacity": {"cpu": "2", "memory": "8Gi"},
        "allocatable": {"cpu": "2", "memory": "8Gi"},
    }
    if claims is not None:
        status["clusterClaims"] = claims
    return status


def work_agent_rbac(cluster: str) -> tuple[Obj, Obj]:
    """(ClusterRole, RoleBinding in the cluster namespace) for the work agent's hub identity."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": WORK_AGENT_ROLE},
        "rules": [
            {
                "apiGroups": [WORK_GROUP],
                "resources": ["manifestworks"],
                "verbs": ["get", "list", "watch", "update", "patch"],
            },
            {
                "apiGroups": [WORK_GROUP],
                "resources": ["manifestworks/status"],
                "verbs": ["get", "update", "patch"],
            },
            {
                "apiGroups": ["", "events.k8s.io"],
                "resources": ["events"],
                "verbs": ["create", "patch", "update"],
            },
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "ocmfl-local:work-agent", "namespace": cluster},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": WORK_AGENT_ROLE,
        },
        "subjects": [
            {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "User",
                "name": work_agent_user(cluster),
            }
        ],
    }
    return role, binding


def bootstrap_hub(kube: Kube, crds: Iterable[Path], clusters: list[str], kube_version: str) -> None:
    """CRDs, namespaces, `default`/`global` sets, accepted ManagedClusters, work-agent RBAC."""
    apply_crds(kube, crds)
    for ns in (HUB_NAMESPACE, *clusters):
        ensure_namespace(kube, ns)
    kube.create(
        SET_PATH,
        {
            "apiVersion": f"{CLUSTER_GROUP}/v1beta2",
            "kind": "ManagedClusterSet",
            "metadata": {"name": "global"},
            "spec": {"clusterSelector": {"selectorType": "LabelSelector", "labelSelector": {}}},
        },
    )
    kube.create(
        SET_PATH,
        {
            "apiVersion": f"{CLUSTER_GROUP}/v1beta2",
            "kind": "ManagedClusterSet",
            "metadata": {"name": "default"},
            "spec": {"clusterSelector": {"selectorType": "ExclusiveClusterSetLabel"}},
        },
    )
    for c in clusters:
        kube.create(MC_PATH, managed_cluster(c))
        set_cluster_status(kube, c, managed_cluster_status(kube_version))
        role, binding = work_agent_rbac(c)
        kube.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
        kube.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{c}/rolebindings", binding)


def set_cluster_status(kube: Kube, cluster: str, status: dict[str, Any]) -> None:
    """Merge-patch a ManagedCluster's status (retrying briefly while the CRD settles)."""
    for attempt in range(20):
        try:
            kube.patch(f"{MC_PATH}/{cluster}/status", {"status": status})
            return
        except KubeError as e:
            if e.status not in (404, 409, 503) or attempt == 19:
                raise
            time.sleep(0.25)


def bootstrap_cluster(kube: Kube, crds: Iterable[Path]) -> None:
    """A managed cluster needs the ClusterClaim and AppliedManifestWork CRDs."""
    apply_crds(kube, crds)
