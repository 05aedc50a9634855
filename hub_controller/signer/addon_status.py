"""Why a cluster's agent has (or lacks) its identity, on its ManagedClusterAddOn.

OCM's own conditions on the ManagedClusterAddOn say nothing when the cluster was never
accepted, its registration agent stopped, OCM's KubeClient CSR for the addon was denied, or the
hub's signer refused the agent: the addon just stays `Progressing` or unavailable. The hub adds
one condition of its own, `CONDITION` (its type is prefixed, so no OCM controller writes it),
which names the first thing missing on the way to an agent identity and how to fix it:

    ManagedCluster exists -> accepted -> joined -> available -> addon hub credential issued
    (OCM's KubeClient registration, not denied) -> agent identity issued by the hub's signer

`condition_for` is the pure rule; `AddonStatus` applies it by server-side apply on the
ManagedClusterAddOn's status, as its own field manager: the condition list is a map keyed by
type, so OCM's conditions stay OCM's.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf

from ocmfl import constants, pki
from ocmfl.kube import Kube, KubeError, path_of

log = logging.getLogger(__name__)

# Prefixed with the project's signer domain: a condition type no OCM controller writes.
CONDITION: Final = f"{constants.SIGNER_NAME.split('/')[0]}/AgentIdentity"
FIELD_MANAGER: Final = "ocm-fl-addon-status"
MC_PATH: Final = f"/apis/{constants.CLUSTER_GROUP}/v1/managedclusters"


@dataclass(frozen=True)
class Outcome:
    """The latest decision on something the cluster asked for: a reason and a message."""

    reason: str
    message: str
    ok: bool = False


def _cond(mc: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for c in (mc.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def condition_for(
    cluster: str,
    managed_cluster: Mapping[str, Any] | None,
    has_hub_credential: bool,
    credential: Outcome | None,
    agent: Outcome | None,
) -> tuple[str, str, str]:
    """(status, reason, message) of `CONDITION` for `cluster`'s addon: the first step missing
    on the way to an agent identity (module docstring), or True once the hub's signer issued
    one. `has_hub_credential`: the ledger holds a credential OCM issued to the cluster's own
    registration agent; `credential`: the latest addon KubeClient CSR seen (a denial);
    `agent`: the signer's latest decision on the agent's CSR."""
    accept = f"`clusteradm accept --clusters {cluster}`"
    if managed_cluster is None:
        return (
            "False",
            "ClusterNotFound",
            f"no ManagedCluster {cluster} on the hub: its registration agent never registered; "
            "check the bootstrap kubeconfig it was given (server, CA and token) and its log",
        )
    meta = managed_cluster.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return "False", "ClusterDeleting", f"the ManagedCluster {cluster} is being deleted"
    if not (managed_cluster.get("spec") or {}).get("hubAcceptsClient"):
        return (
            "False",
            "ClusterNotAccepted",
            f"the hub has not accepted cluster {cluster} (spec.hubAcceptsClient is false): "
            f"run {accept} if it is yours",
        )
    joined = _cond(managed_cluster, "ManagedClusterJoined")
    if joined.get("status") != "True":
        return (
            "False",
            "ClusterNotJoined",
            f"cluster {cluster} is accepted but has not joined: its registration agent has "
            "no hub certificate yet (is its registration CSR approved? "
            f"{accept} approves it)",
        )
    available = _cond(managed_cluster, "ManagedClusterConditionAvailable")
    if available.get("status") != "True":
        return (
            "False",
            "ClusterUnavailable",
            f"cluster {cluster} is not available ({available.get('reason', 'no lease')}: "
            f"{available.get('message', 'its registration agent does not renew its lease')})",
        )
    if credential is not None and not credential.ok and not has_hub_credential:
        return (
            "False",
            "HubCredentialDenied",
            f"{credential.message}; delete Secret {constants.HUB_KUBECONFIG_SECRET} in "
            f"{constants.AGENT_NAMESPACE} on {cluster} to have its registration agent ask again",
        )
    if not has_hub_credential:
        return (
            "False",
            "WaitingForHubCredential",
            f"the registration agent of {cluster} has not got the addon's hub kubeconfig yet "
            "(OCM's KubeClient registration: its CSR, the addon manager's approval)",
        )
    if agent is None:
        return (
            "False",
            "WaitingForAgent",
            "the addon's hub kubeconfig is issued; the agent has not asked the hub's signer for "
            "its identity yet (is its pod running?)",
        )
    if not agent.ok:
        return "False", agent.reason, f"the hub's signer refused the agent: {agent.message}"
    return "True", agent.reason, agent.message


@dataclass
class AddonStatus:
    """Keeps `CONDITION` current on every cluster's ManagedClusterAddOn (`memo.addon_status`);
    the signers and the ledger report their decisions here."""

    kube: Kube
    clock: Callable[[], dt.datetime] = pki.utcnow
    credentials: dict[str, Outcome] = field(default_factory=dict)
    agents: dict[str, Outcome] = field(default_factory=dict)
    # Clusters whose ManagedClusterAddOn exists (from its events): a ManagedCluster's change
    # is looked at only for them, so thousands of clusters without the addon cost nothing.
    clusters: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def credential(self, cluster: str, outcome: Outcome) -> None:
        with self._lock:
            self.credentials[cluster] = outcome
        self.refresh(cluster)

    def agent(self, cluster: str, outcome: Outcome) -> None:
        with self._lock:
            self.agents[cluster] = outcome
        self.refresh(cluster)

    def refresh(self, cluster: str, addon: Mapping[str, Any] | None = None) -> None:
        """Apply the condition for `cluster` when it changed (logs, never raises on a
        cluster whose addon is gone)."""
        path = path_of(
            f"{constants.ADDON_GROUP}/v1alpha1",
            "ManagedClusterAddOn",
            cluster,
            constants.ADDON_NAME,
        )
        try:
            addon = addon if addon is not None else self.kube.get(path)
            if addon is None or (addon.get("metadata") or {}).get("deletionTimestamp"):
                return
            from hub_controller.signer.hub_identity import ledger_of

            ledger, _ = ledger_of(cluster, (addon.get("metadata") or {}).get("annotations"))
            now = self.clock()
            with self._lock:
                credential, agent = self.credentials.get(cluster), self.agents.get(cluster)
            status, reason, message = condition_for(
                cluster,
                self.kube.get(f"{MC_PATH}/{cluster}"),
                any(i.valid(now) for i in ledger),
                credential,
                agent,
            )
            have: Mapping[str, Any] = next(
                (
                    c
                    for c in (addon.get("status") or {}).get("conditions") or []
                    if c.get("type") == CONDITION
                ),
                {},
            )
            if (have.get("status"), have.get("reason"), have.get("message")) == (
                status,
                reason,
                message,
            ):
                return
            since = have.get("lastTransitionTime") if have.get("status") == status else None
            condition = {
                "type": CONDITION,
                "status": status,
                "reason": reason,
                "message": message[:32768],
                "lastTransitionTime": since or now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            body = {
                "apiVersion": f"{constants.ADDON_GROUP}/v1alpha1",
                "kind": "ManagedClusterAddOn",
                "metadata": {"name": constants.ADDON_NAME, "namespace": cluster},
                "status": {"conditions": [condition]},
            }
            self.kube.apply(body, f"{path}/status")
            log.info("cluster %s: %s=%s (%s: %s)", cluster, CONDITION, status, reason, message)
        except KubeError as e:
            log.warning("cluster %s: cannot update its addon's condition: %s", cluster, e)


@kopf.on.startup()
def start_addon_status(memo: kopf.Memo, **_: Any) -> None:
    memo.addon_status = AddonStatus(Kube(field_manager=FIELD_MANAGER))


@kopf.on.event(
    constants.ADDON_GROUP,
    "v1alpha1",
    "managedclusteraddons",
    field="metadata.name",
    value=constants.ADDON_NAME,
)
def addon_changed(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    status: AddonStatus = memo.addon_status
    cluster = str(body["metadata"]["namespace"])
    if type == "DELETED":
        status.clusters.discard(cluster)
        return
    status.clusters.add(cluster)
    status.refresh(cluster, dict(body))


@kopf.on.event(constants.CLUSTER_GROUP, "v1", "managedclusters")
def cluster_changed(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    status: AddonStatus = memo.addon_status
    cluster = str(body["metadata"]["name"])
    if cluster in status.clusters:
        status.refresh(cluster)
