"""kopf indexes of addon membership, shared by every part of the hub process: ManagedClusters
by name, the addon's ManagedClusterAddOns by cluster (with their hub-identities ledger), and
the addon's hub-credential CSRs by cluster as the `HubIdentity` they prove (so a credential
issued seconds ago is trusted before its ledger entry lands). Importing this module registers
them. The operator resolves federation members from them (operator/indexes.py); the
aggregator and the signers ask `members_of` who may report or get a certificate, without
the operator's own indexes (the signer runs without them: `ocm-fl-hub --role signer`).

The index functions are `async` although they do no I/O: kopf runs a plain function in a
thread of its executor, on every event.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from hub_controller.membership import AddonMembers, addon_info, cluster_info
from hub_controller.signer.csr_events import CSR_RESOURCE, HUB_CREDENTIAL_CSRS
from hub_controller.signer.hub_identity import HubIdentity, classify
from ocmfl import constants

log = logging.getLogger(__name__)


@kopf.index(constants.CLUSTER_GROUP, "v1", "managedclusters")
async def cluster_idx(name: str, body: Any, **_: Any) -> Any:
    return {name: cluster_info(body)}


@kopf.index(
    constants.ADDON_GROUP,
    "v1alpha1",
    "managedclusteraddons",
    when=lambda name, **_: name == constants.ADDON_NAME,
)
async def addon_idx(namespace: str | None, body: Any, **_: Any) -> Any:
    """The cluster's addon (None while it is being deleted: no longer a member), with its
    hub-identities ledger; a malformed ledger is logged and trusts nothing."""
    info = addon_info(body)
    if info is None:
        return None
    if info.ledger_problem:
        log.warning("%s", info.ledger_problem)
    return {namespace or "": info}


@kopf.index(*CSR_RESOURCE, **HUB_CREDENTIAL_CSRS)
async def hub_csr_idx(body: Any, **_: Any) -> Any:
    """The addon's hub-credential CSRs that prove a `HubIdentity` (issued, asked by the
    cluster's own registration agent), by cluster; forged ones are never indexed
    (signer/ledger.py warns about them)."""
    found = classify(body)
    return {found.cluster: found} if isinstance(found, HubIdentity) else None


def members_of(kwargs: Mapping[str, Any]) -> AddonMembers:
    """Addon membership over the live indexes a kopf handler receives (`kwargs`)."""
    hub_csrs: Mapping[str, Iterable[HubIdentity]] = kwargs.get("hub_csr_idx", {})
    return AddonMembers(kwargs["cluster_idx"], kwargs["addon_idx"], hub_csrs)
