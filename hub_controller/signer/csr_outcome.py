"""Mirror the outcome of each agent CSR into the requesting cluster's namespace on the hub.

Agents may create CSRs but not read them (ocmfl.csroutcome says why). For a CSR of either of
our signers that is signed, denied or failed, and that the cluster's genuine agent sent
(policy.check_requester: its user, group and OCM-issued hub credential), the signer writes
ConfigMap `<csr name>` in that cluster's namespace with the certificate or the refusal, and
binds the reader role there to that cluster's agent user (no group: all agents share one). The
ConfigMap is owned by the CSR, so it goes when the CSR is cleaned up, and is immutable: a CSR
is decided once. Requests by anyone else leave no trace in any cluster's namespace.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

from hub_controller.membership import Registry
from hub_controller.signer.policy import agent_user, check_requester
from ocmfl import constants, csroutcome
from ocmfl.kube import Kube, KubeError, Obj, path_of

log = logging.getLogger(__name__)


def outcome_configmap(csr: Mapping[str, Any], cluster: str, data: dict[str, str]) -> Obj:
    """The ConfigMap holding `data` (ocmfl.csroutcome.outcome_data) for `cluster`'s CSR."""
    meta = csr["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": meta["name"],
            "namespace": cluster,
            "labels": {constants.LABEL_CLUSTER: cluster, constants.LABEL_COMPONENT: "csr-outcome"},
            "ownerReferences": [
                {
                    "apiVersion": constants.CSR_API_VERSION,
                    "kind": "CertificateSigningRequest",
                    "name": meta["name"],
                    "uid": meta.get("uid", ""),
                }
            ],
        },
        "immutable": True,
        "data": data,
    }


def reader_binding(cluster: str) -> Obj:
    """The RoleBinding that lets `cluster`'s agent user, and no group, read its outcomes."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": csroutcome.READER_BINDING,
            "namespace": cluster,
            "labels": {constants.LABEL_CLUSTER: cluster, constants.LABEL_COMPONENT: "csr-outcome"},
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": csroutcome.READER_ROLE,
        },
        # The user only: every cluster's agent shares the group system:open-cluster-management:
        # addon:<addon>, which is why this is not the AddOnTemplate's hubPermissions.
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": agent_user(cluster)}
        ],
    }


def requesting_cluster(csr: Mapping[str, Any], members: Registry, now: dt.datetime) -> str | None:
    """The cluster whose genuine agent sent `csr`, else None."""
    cluster = ((csr.get("metadata") or {}).get("labels") or {}).get(constants.LABEL_CLUSTER)
    if not cluster:
        return None
    if check_requester(csr, str(cluster), members.hub_identities(str(cluster)), now) is not None:
        return None
    return str(cluster)


def mirror(kube: Kube, csr: Mapping[str, Any], members: Registry, now: dt.datetime) -> bool:
    """Write the outcome of a decided CSR for its cluster's agent; True when it did."""
    data = csroutcome.outcome_data(csr)
    if data is None:
        return False
    cluster = requesting_cluster(csr, members, now)
    if cluster is None:
        return False
    body = outcome_configmap(csr, cluster, data)
    try:
        # The binding first, so that every outcome is readable; both are created once and
        # never changed (a CSR is decided once; the signer may only create these).
        binding = reader_binding(cluster)
        kube.create(path_of(binding["apiVersion"], "RoleBinding", cluster), binding)
        created = kube.create(path_of("v1", "ConfigMap", cluster), body)
    except KubeError as e:
        # The agent gives this CSR up after a few waits and asks anew (agent_addon/csr.py).
        log.warning("CSR %s: outcome for cluster %s not written: %s", csr["metadata"]["name"],
                    cluster, e)  # fmt: skip
        return False
    return created is not None
