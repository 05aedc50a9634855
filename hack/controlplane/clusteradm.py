"""What `clusteradm` does on a hub, for the local plane (clusteradm cannot be built here).

Each function makes exactly the objects (or the changes) its clusteradm command makes, against
the real apiserver; the OCM controllers do the rest, as on a real hub. The command each stands
for and what it creates, read from open-cluster-management-io/clusteradm (`pkg/cmd/init`,
`get token`, `join`, `accept`, `clusterset bind`, `addon enable`):

* `clusteradm init` (`init`): the bootstrap identity only (namespace `open-cluster-management`,
  ServiceAccount `cluster-bootstrap`, ClusterRole `system:open-cluster-management:bootstrap`:
  create/get/list/watch CSRs, get/create ManagedClusters, create `managedclustersets/join`;
  ClusterRoleBinding `cluster-bootstrap-sa`). The controllers clusteradm's operator would deploy
  run as processes of the plane (plane.py).
* `clusteradm get token` / `join` (`bootstrap_kubeconfig`): a token of that ServiceAccount in
  a kubeconfig for the hub, which the cluster's registration agent starts from.
* `clusteradm accept --clusters C` (`accept`): approve the cluster's pending CSR from the
  bootstrap identity (condition Approved) and set the ManagedCluster's
  `spec.hubAcceptsClient: true`.
* `clusteradm clusterset bind S --namespace NS` (`clusterset_bind`): a
  ManagedClusterSetBinding `S` in `NS` with `spec.clusterSet: S`.
* `clusteradm addon enable --names A --clusters C` (`addon_enable`): a v1alpha1
  ManagedClusterAddOn `A` in namespace `C` (spec.installNamespace the addon's namespace).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import yaml

from ocmfl.constants import ADDON_GROUP, CLUSTER_GROUP
from ocmfl.kube import Kube, KubeError, Obj

OCM_NAMESPACE = "open-cluster-management"
BOOTSTRAP_SA = "cluster-bootstrap"
BOOTSTRAP_ROLE = "system:open-cluster-management:bootstrap"
BOOTSTRAP_BINDING = "cluster-bootstrap-sa"
BOOTSTRAP_USER = f"system:serviceaccount:{OCM_NAMESPACE}:{BOOTSTRAP_SA}"
BOOTSTRAP_GROUP = f"system:serviceaccounts:{OCM_NAMESPACE}"
CLUSTER_LABEL = "open-cluster-management.io/cluster-name"
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
MANAGED_CLUSTERS = f"/apis/{CLUSTER_GROUP}/v1/managedclusters"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
BOOTSTRAP_TOKEN_SECONDS = 7 * 24 * 3600
# How much older than its ManagedCluster an approved registration CSR may be and still count.
APPROVED_CSR_SLACK = timedelta(seconds=30)


class AcceptError(RuntimeError):
    """A cluster could not be accepted; the message says why and what to look at."""


def init(kube: Kube) -> None:
    """`clusteradm init`'s bootstrap identity (see the module docstring); idempotent."""
    kube.create("/api/v1/namespaces", {"metadata": {"name": OCM_NAMESPACE}})
    kube.create(
        f"/api/v1/namespaces/{OCM_NAMESPACE}/serviceaccounts",
        {"metadata": {"name": BOOTSTRAP_SA, "namespace": OCM_NAMESPACE}},
    )
    kube.create(
        f"{RBAC}/clusterroles",
        {
            "metadata": {"name": BOOTSTRAP_ROLE},
            "rules": [
                {
                    "apiGroups": ["certificates.k8s.io"],
                    "resources": ["certificatesigningrequests"],
                    "verbs": ["create", "get", "list", "watch"],
                },
                {
                    "apiGroups": [CLUSTER_GROUP],
                    "resources": ["managedclusters"],
                    "verbs": ["get", "create"],
                },
                {
                    "apiGroups": [CLUSTER_GROUP],
                    "resources": ["managedclustersets/join"],
                    "verbs": ["create"],
                },
            ],
        },
    )
    kube.create(
        f"{RBAC}/clusterrolebindings",
        {
            "metadata": {"name": BOOTSTRAP_BINDING},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": BOOTSTRAP_ROLE,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": BOOTSTRAP_SA, "namespace": OCM_NAMESPACE}
            ],
        },
    )


def bootstrap_token(kube: Kube, seconds: int = BOOTSTRAP_TOKEN_SECONDS) -> str:
    """A token of the bootstrap ServiceAccount (`clusteradm get token`)."""
    got = kube.request(
        "POST",
        f"/api/v1/namespaces/{OCM_NAMESPACE}/serviceaccounts/{BOOTSTRAP_SA}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        },
    )
    token = ((got or {}).get("status") or {}).get("token")
    if not token:
        raise AcceptError(f"no token for ServiceAccount {OCM_NAMESPACE}/{BOOTSTRAP_SA}: {got}")
    return str(token)


def kubeconfig(server: str, ca_pem: bytes, token: str) -> str:
    """The bootstrap kubeconfig `clusteradm join --hub-token T --hub-apiserver S` writes."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "hub",
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": "bootstrap", "user": {"token": token}}],
            "contexts": [{"name": "bootstrap", "context": {"cluster": "hub", "user": "bootstrap"}}],
            "current-context": "bootstrap",
        }
    )


def bootstrap_kubeconfig(kube: Kube, server: str, ca_pem: bytes) -> str:
    """A bootstrap kubeconfig for a new cluster's registration agent (`get token` + `join`)."""
    return kubeconfig(server, ca_pem, bootstrap_token(kube))


def _approved_or_denied(csr: Obj) -> tuple[bool, bool]:
    types = {c.get("type") for c in (csr.get("status") or {}).get("conditions") or []}
    return "Approved" in types, "Denied" in types


def _timestamp(stamp: str) -> datetime | None:
    """An RFC 3339 timestamp as the apiserver writes it (`...Z`); None when unreadable."""
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def approve_csr(kube: Kube, cluster: str, since: str = "") -> str | None:
    """Approve the cluster's pending registration CSRs from the bootstrap identity, as
    `clusteradm accept` does; the newest one's name (approved now or before), or None when
    there is none yet.

    A pending CSR is approved whatever its age: the registration agent creates its CSR and its
    ManagedCluster concurrently (OCM v1.2.0 `spokeagent.go` runs both bootstrap controllers at
    once), so the CSR can be seconds older than the ManagedCluster. An already approved CSR
    counts only when it was created at most `APPROVED_CSR_SLACK` before `since` (the
    ManagedCluster's creationTimestamp): an earlier registration's CSR, which the csrcleaner
    keeps for an hour, must not make a cluster that registers again look accepted."""
    got = kube.get(CSRS, query={"labelSelector": f"{CLUSTER_LABEL}={cluster}"}) or {}
    registered = _timestamp(since) if since else None
    mine: list[Obj] = []
    for csr in got.get("items") or []:
        username = str((csr.get("spec") or {}).get("username"))
        if username != BOOTSTRAP_USER and not username.startswith("system:bootstrap:"):
            continue  # not a registration request (an addon's, a renewal, ...)
        if _approved_or_denied(csr) != (False, False) and registered is not None:
            created = _timestamp(str(csr["metadata"].get("creationTimestamp") or ""))
            if created is None or created < registered - APPROVED_CSR_SLACK:
                continue  # decided before this registration began
        mine.append(csr)
    for csr in mine:
        if _approved_or_denied(csr)[1]:
            name = csr["metadata"]["name"]
            raise AcceptError(f"the registration CSR {name} of {cluster} is denied")
    pending = [csr for csr in mine if not _approved_or_denied(csr)[0]]
    for csr in pending:  # all of them: a restarted agent leaves its first CSR pending
        conds = list((csr.get("status") or {}).get("conditions") or [])
        conds.append(
            {
                "type": "Approved",
                "status": "True",
                "reason": "ClusteradmApprove",
                "message": "This CSR was approved by clusteradm certificate approve.",
                "lastUpdateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )
        body = {**csr, "status": {**(csr.get("status") or {}), "conditions": conds}}
        kube.request("PUT", f"{CSRS}/{csr['metadata']['name']}/approval", body)
    newest = sorted(pending or mine, key=lambda csr: str(csr["metadata"].get("creationTimestamp")))
    return str(newest[-1]["metadata"]["name"]) if newest else None


def set_hub_accepts(kube: Kube, cluster: str, accepts: bool = True) -> bool:
    """Set the ManagedCluster's `spec.hubAcceptsClient`; False while it does not exist yet."""
    try:
        kube.patch(f"{MANAGED_CLUSTERS}/{cluster}", {"spec": {"hubAcceptsClient": accepts}})
    except KubeError as e:
        if e.status == 404:
            return False
        raise
    return True


def accept(
    kube: Kube,
    cluster: str,
    timeout: float = 60.0,
    why_not: Callable[[], str] | None = None,
) -> str:
    """`clusteradm accept --clusters <cluster> --wait`: approve its registration CSR and accept
    its ManagedCluster; returns the CSR's name. AcceptError after `timeout` says what is missing
    and, from `why_not` (e.g. the registration agent's last log lines), why."""
    deadline = time.monotonic() + timeout
    csr: str | None = None
    accepted = False
    while True:
        mc = kube.get(f"{MANAGED_CLUSTERS}/{cluster}")
        if csr is None and mc is not None:  # its CSR comes with it (a little before or after)
            csr = approve_csr(kube, cluster, str(mc["metadata"].get("creationTimestamp", "")))
        if not accepted:
            accepted = set_hub_accepts(kube, cluster)
        if csr is not None and accepted:
            return csr
        if time.monotonic() > deadline:
            missing = " and ".join(
                what
                for what, seen in (
                    ("no registration CSR", csr is not None),
                    ("no ManagedCluster", accepted),
                )
                if not seen
            )
            detail = why_not() if why_not is not None else ""
            raise AcceptError(
                f"cluster {cluster!r}: {missing} reached the hub in {timeout:.0f} s; its "
                "registration agent could not bootstrap (check its bootstrap kubeconfig: "
                f"server, CA and token){': ' + detail if detail else ''}"
            )
        time.sleep(0.2)


def clusterset_bind(kube: Kube, clusterset: str, namespace: str) -> None:
    """`clusteradm clusterset bind <set> --namespace <ns>`: the ManagedClusterSetBinding."""
    kube.create(
        f"/apis/{CLUSTER_GROUP}/v1beta2/namespaces/{namespace}/managedclustersetbindings",
        {
            "apiVersion": f"{CLUSTER_GROUP}/v1beta2",
            "kind": "ManagedClusterSetBinding",
            "metadata": {"name": clusterset, "namespace": namespace},
            "spec": {"clusterSet": clusterset},
        },
    )


def addon_enable(kube: Kube, addon: str, cluster: str, install_namespace: str) -> bool:
    """`clusteradm addon enable --names <addon> --clusters <cluster> --namespace <ns>`: the
    v1alpha1 ManagedClusterAddOn; True when this call created it."""
    body: dict[str, Any] = {
        "apiVersion": f"{ADDON_GROUP}/v1alpha1",
        "kind": "ManagedClusterAddOn",
        "metadata": {"name": addon, "namespace": cluster},
        "spec": {"installNamespace": install_namespace},
    }
    path = f"/apis/{ADDON_GROUP}/v1alpha1/namespaces/{cluster}/managedclusteraddons"
    return kube.create(path, body) is not None
