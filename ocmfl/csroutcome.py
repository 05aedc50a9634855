"""A CSR's outcome as the requesting cluster's agent reads it: ConfigMap `<csr name>` in that
cluster's namespace on the hub.

CSRs are cluster-scoped, and RBAC cannot limit `get` on them to one cluster's, so agents may
only create CSRs. The hub's signers mirror the outcome of each CSR that a cluster's genuine
agent sent (hub_controller/signer/csr_outcome.py), and bind READER_ROLE in that cluster's
namespace to that cluster's agent user alone; so an agent sees no other cluster's
certificates or refusals.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Final

from ocmfl import constants
from ocmfl.kube import path_of

# The chart's ClusterRole (get ConfigMaps), and the RoleBinding of it in each cluster namespace.
READER_ROLE: Final = f"open-cluster-management:{constants.ADDON_NAME}:agent-csr-outcomes"
READER_BINDING: Final = f"{constants.ADDON_NAME}:agent-csr-outcomes"
CERTIFICATE: Final = "certificate"  # the signed PEM (chain), as text
DENIED: Final = "denied"  # "<denied|failed>: <reason>: <message>"


class Refused(Exception):
    """The CSR was denied or failed; the message says why."""


def configmap_path(cluster: str, csr_name: str) -> str:
    """Where the outcome of `cluster`'s CSR `csr_name` is kept."""
    return path_of("v1", "ConfigMap", cluster, csr_name)


def outcome_data(csr: Mapping[str, Any]) -> dict[str, str] | None:
    """The ConfigMap data for a decided CSR (as the API returns it); None while pending."""
    status = csr.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("type") in ("Denied", "Failed"):
            kind = str(c.get("type")).lower()
            return {DENIED: f"{kind}: {c.get('reason')}: {c.get('message')}"}
    cert = status.get("certificate")
    if cert:
        return {CERTIFICATE: base64.b64decode(cert).decode("ascii", "replace")}
    return None


def read_outcome(data: Mapping[str, str] | None) -> bytes | None:
    """The signed PEM from an outcome ConfigMap's data; None while there is none; Refused for
    a denied or failed CSR."""
    data = data or {}
    if data.get(DENIED):
        raise Refused(f"CSR {data[DENIED]}")
    cert = data.get(CERTIFICATE)
    return cert.encode() if cert else None
