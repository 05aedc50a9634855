"""kopf indexes: what the hub process knows about related objects, in memory, by owner.

Placements, PlacementDecisions and the server Job, Service and Pod are indexed under the
owning resource's (namespace, name), as the small values `observed.py` reads from them (the
ManifestWorks likewise, but by a watch of the operator's own: workwatch.py). The membership
indexes (ManagedClusters, the addon's ManagedClusterAddOns and hub-credential CSRs) live in
`hub_controller.membership_indexes`, shared with the aggregator and the signers, which run
without this module in `ocm-fl-hub --role signer`. The hub admin's FederationPolicy
`default` is indexed (its spec) by namespace.
`gather` turns what the indexes hold for one resource into its `Observations`, without any
API read.

The index functions are `async` although they do no I/O: kopf runs a plain function in a
thread of its executor (a context copy, a future and a task per call), and they run on every
event, thousands per second during a fan-out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import kopf

# Registers the membership indexes (clusters, addons, hub-credential CSRs) this bundle reads.
from hub_controller import membership_indexes  # noqa: F401
from hub_controller import policy as policy_mod
from hub_controller.api import (
    FederatedLearningSpec,
    FLRef,
    HistoryEntry,
    ModelArtifact,
    PrivacySpent,
    data_claim_of,
)
from hub_controller.membership import (
    AddonInfo,
    AddonMembers,
    ClusterInfo,
    decided_clusters,
    decision_clusters,
    decision_index,
    resolve_clusters,
)
from hub_controller.operator.desired import placement as placement_mod
from hub_controller.operator.desired import server as server_mod
from hub_controller.operator.observed import (
    DecisionState,
    JobState,
    Observations,
    PlacementState,
    WorkState,
    controller_uid,
    job_state,
    placement_state,
    server_address,
    server_pod_state,
)
from hub_controller.reports import ReportSource
from hub_controller.signer.hub_identity import HubIdentity
from ocmfl import constants

log = logging.getLogger(__name__)

OWNED: Final[dict[str, Any]] = {
    constants.LABEL_OWNER_NAME: kopf.PRESENT,
    constants.LABEL_OWNER_NAMESPACE: kopf.PRESENT,
}
SERVER_OWNED: Final[dict[str, Any]] = {**OWNED, constants.LABEL_COMPONENT: server_mod.COMPONENT}
DECIDED: Final[dict[str, Any]] = {placement_mod.PLACEMENT_LABEL: kopf.PRESENT}

Key = tuple[str, str]  # (namespace, name) of a FederatedLearning
# (slice number, clusters) of each decision and the Placement's selected count -> decided
Settle = Callable[[list[tuple[int, tuple[str, ...]]], int | None], Iterable[str]]


class WorkIndex(Protocol):
    """Owner key -> its works' states (workwatch.WorkStore.works; a dict in tests)."""

    def get(self, key: Key, default: Any = ..., /) -> Any: ...


@dataclass(frozen=True)
class Owned:
    """An owned object's state tagged with the owner uid (stale owners are ignored)."""

    uid: str
    value: Any


def owner_key(labels: Mapping[str, str]) -> Key | None:
    ns = labels.get(constants.LABEL_OWNER_NAMESPACE)
    name = labels.get(constants.LABEL_OWNER_NAME)
    return (ns, name) if ns and name else None


def _owned_by(labels: Mapping[str, str], value: Any) -> Any:
    key = owner_key(labels)
    return {key: Owned(labels.get(constants.LABEL_OWNER_UID, ""), value)} if key else None


@kopf.index(constants.CLUSTER_GROUP, "v1beta1", "placements", labels=OWNED)
async def placement_idx(labels: Mapping[str, str], body: Any, **_: Any) -> Any:
    return _owned_by(labels, placement_state(body))


@kopf.index(constants.CLUSTER_GROUP, "v1beta1", "placementdecisions", labels=DECIDED)
async def decision_idx(
    namespace: str | None, name: str, labels: Mapping[str, str], body: Any, **_: Any
) -> Any:
    """Decisions by (namespace, placement label), with the uid of the Placement that controls
    them: the label alone is anyone's to set, so `gather` also checks the owner."""
    placement = labels[placement_mod.PLACEMENT_LABEL]
    owner = controller_uid(body, "Placement", placement)
    state = DecisionState(owner, decision_clusters(body), decision_index(name))
    return {(namespace or "", placement): state}


@kopf.index("batch", "v1", "jobs", labels=SERVER_OWNED)
async def server_job_idx(labels: Mapping[str, str], body: Any, **_: Any) -> Any:
    return _owned_by(labels, job_state(body))


@kopf.index("", "v1", "services", labels=SERVER_OWNED)
async def server_service_idx(labels: Mapping[str, str], body: Any, **_: Any) -> Any:
    lb = dict((body.get("status") or {}).get("loadBalancer") or {})
    return _owned_by(labels, {"status": {"loadBalancer": lb}})


@kopf.index("", "v1", "pods", labels=SERVER_OWNED)
async def server_pod_idx(labels: Mapping[str, str], body: Any, **_: Any) -> Any:
    return _owned_by(labels, server_pod_state(body))


@kopf.index(
    constants.GROUP,
    constants.VERSION,
    policy_mod.PLURAL,
    when=lambda name, **_: name == policy_mod.POLICY_NAME,
)
async def policy_idx(namespace: str | None, spec: Mapping[str, Any], **_: Any) -> Any:
    return {namespace or "": dict(spec)}


@dataclass(frozen=True)
class Indexes:
    """The indexes a handler receives, bundled."""

    placements: kopf.Index[Key, Owned]
    decisions: kopf.Index[Key, DecisionState]
    clusters: kopf.Index[str, ClusterInfo]
    addons: kopf.Index[str, AddonInfo]
    works: WorkIndex
    jobs: kopf.Index[Key, Owned]
    services: kopf.Index[Key, Owned]
    pods: kopf.Index[Key, Owned]
    policies: kopf.Index[str, dict[str, Any]]
    hub_csrs: Mapping[str, Iterable[HubIdentity]]

    @classmethod
    def of(cls, kwargs: Mapping[str, Any], works: WorkIndex | None = None) -> Indexes:
        """From kopf's handler kwargs; the works from `works` (the operator's WorkStore)
        or, in tests, kwargs["work_idx"]."""
        return cls(
            placements=kwargs["placement_idx"],
            decisions=kwargs["decision_idx"],
            clusters=kwargs["cluster_idx"],
            addons=kwargs["addon_idx"],
            works=works if works is not None else kwargs.get("work_idx", {}),
            jobs=kwargs["server_job_idx"],
            services=kwargs["server_service_idx"],
            pods=kwargs["server_pod_idx"],
            policies=kwargs["policy_idx"],
            hub_csrs=kwargs.get("hub_csr_idx", {}),
        )

    def policy(self, namespace: str) -> dict[str, Any] | None:
        """The spec of the namespace's FederationPolicy `default`, or None when it has none."""
        for spec in self.policies.get(namespace, []):
            return spec
        return None

    def members(self) -> AddonMembers:
        """Addon membership over these (live) indexes (membership_indexes.members_of)."""
        return AddonMembers(self.clusters, self.addons, self.hub_csrs)


def _owned(store: Iterable[Owned], uid: str) -> Any:
    for item in store:
        if item.uid == uid:
            return item.value
    return None


def gather(
    ref: FLRef,
    spec: FederatedLearningSpec,
    idx: Indexes,
    reports: ReportSource,
    *,
    hostpath_root: str = constants.DEFAULT_HOSTPATH_ROOT,
    settle: Settle | None = None,
) -> Observations:
    """Observations for one resource, from the indexes and the report source only. With
    `settle`, the decided clusters are what it makes of the decisions' (slice number,
    clusters) and the Placement's selected count (membership.settle_decisions); without, the
    union of the decisions."""
    key = (ref.namespace, ref.name)
    placement: PlacementState = _owned(idx.placements.get(key, []), ref.uid) or PlacementState()
    # Only decisions the resource's own Placement controls (OCM's placement controller sets
    # that ownerReference); one that merely carries the label could pick any cluster.
    decisions = [
        d for d in idx.decisions.get(key, []) if placement.uid and d.owner_uid == placement.uid
    ]
    decided = (
        decided_clusters(d.clusters for d in decisions)
        if settle is None
        else sorted(settle([(d.index, d.clusters) for d in decisions], placement.selected))
    )
    clusters: dict[str, ClusterInfo] = {}
    for name in decided:
        for info in idx.clusters.get(name, []):
            clusters[name] = info
    resolutions = resolve_clusters(decided, clusters, data_claim_of(spec)[0] or "")
    works: dict[str, WorkState] = {}
    conflicts: dict[str, str] = {}
    for w in idx.works.get(key, []):
        if w.uid == ref.uid:
            works[w.cluster] = w
        else:  # a same-named resource's work (it was re-created): not ours to touch
            conflicts[w.cluster] = w.uid
    job: JobState = _owned(idx.jobs.get(key, []), ref.uid) or JobState()
    service = _owned(idx.services.get(key, []), ref.uid)
    model: ModelArtifact | None = None
    reason = problem = ""
    succeeded = False
    rounds: int | None = None
    history: tuple[HistoryEntry, ...] = ()
    privacy: PrivacySpent | None = None
    for item in idx.pods.get(key, []):
        if item.uid != ref.uid or item.value is None:
            continue
        reason = item.value.reason or reason
        problem = item.value.problem or problem
        succeeded = succeeded or item.value.succeeded
        rounds = item.value.rounds if item.value.rounds is not None else rounds
        history = item.value.history or history
        privacy = item.value.privacy or privacy
        if item.value.model is not None:
            model = item.value.model.model_copy(
                update={
                    "path": server_mod.model_location(
                        ref, spec, item.value.model.path, hostpath_root
                    )
                }
            )
    return Observations(
        placement=placement,
        resolutions=tuple(resolutions),
        works=works,
        server_job=job,
        server_address=server_address(spec, service),
        model=model,
        server_reason=reason,
        server_problem=problem,
        server_succeeded=succeeded,
        server_rounds=rounds,
        server_history=history,
        privacy=privacy,
        reports=reports.snapshot(ref.uid),
        conflicts=conflicts,
    )
