"""Which clusters are members (pure): of the addon, and of each federation.

Addon membership: an accepted ManagedCluster (not being deleted) that has the addon's
ManagedClusterAddOn (not being deleted) may report to the aggregator and get an agent
certificate. With it the hub keeps, per cluster, the hub credentials OCM issued to the
cluster's addon agent through its own registration agent (`signer/hub_identity.py`): the
ledger annotation on the ManagedClusterAddOn and the live addon CSRs.
Federation membership: every PlacementDecision of the resource's Placement (OCM splits
decisions over several objects: take the union) and the ManagedClusters'
`status.clusterClaims` give one resolution per decided cluster, with the data path from the
claim named by spec.client.dataClaim or the reason the cluster cannot take part. The path is
never guessed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from hub_controller.signer.hub_identity import HubIdentity, ledger_of
from ocmfl.constants import ADDON_NAME
from ocmfl.privacy import (
    PRIVACY_CLAIM,
    ClusterRequirement,
    PrivacySettingError,
    parse_requirement,
)


@dataclass(frozen=True)
class ClusterInfo:
    """What the hub knows about one ManagedCluster."""

    name: str
    claims: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    accepted: bool = False  # the hub accepts it and it is not being deleted


@dataclass(frozen=True)
class ClusterResolution:
    """One decided cluster: its data path, or why it gets no work."""

    name: str
    data_path: str | None
    reason: str
    labels: Mapping[str, str] = field(default_factory=dict)
    privacy: ClusterRequirement | None = None  # what its data requires (PRIVACY_CLAIM)

    @property
    def has_data(self) -> bool:
        return self.data_path is not None


def cluster_info(managed_cluster: Mapping[str, Any]) -> ClusterInfo:
    """ClusterInfo from a ManagedCluster object."""
    meta = managed_cluster.get("metadata") or {}
    status = managed_cluster.get("status") or {}
    claims = {
        str(c["name"]): str(c.get("value", ""))
        for c in status.get("clusterClaims") or []
        if c.get("name")
    }
    return ClusterInfo(
        name=str(meta["name"]),
        claims=claims,
        labels=dict(meta.get("labels") or {}),
        accepted=is_accepted(managed_cluster),
    )


def decision_clusters(decision: Mapping[str, Any]) -> tuple[str, ...]:
    """Cluster names of one PlacementDecision object."""
    status = decision.get("status") or {}
    return tuple(
        str(d["clusterName"]) for d in status.get("decisions") or [] if d.get("clusterName")
    )


def decided_clusters(decisions: Iterable[Iterable[str]]) -> list[str]:
    """Sorted union of the cluster names of all PlacementDecision objects."""
    return sorted({name for decision in decisions for name in decision})


# How long a cluster that vanished from the decisions while OCM may still be rewriting them
# is counted as decided (see settle_decisions), and how long a first, incomplete decision set
# is waited on before it is acted on anyway.
DECISION_HOLD_S: Final = 5.0


# How long a cluster keeps its work after the decisions dropped it only because its agent
# is down (the addon's availability label says so, the data claim is still there): an agent
# restart (a crash, an upgrade) makes OCM's addon manager mark it unhealthy for seconds, and a
# Placement that selects on that label drops the cluster meanwhile; deleting its work would
# kill a client in the middle of a round.
AGENT_GRACE_S: Final = 120.0
ADDON_AVAILABILITY_LABEL: Final = f"feature.open-cluster-management.io/addon-{ADDON_NAME}"


def agents_recovering(
    dropped: Iterable[str],
    clusters: Mapping[str, ClusterInfo],
    data_claim: str,
    previous: Mapping[str, float],
    now: float,
    grace_s: float = AGENT_GRACE_S,
) -> dict[str, float]:
    """Of `dropped` (clusters with a work of the run that the decisions no longer name), those
    kept as decided because their agent is briefly down: the ManagedCluster is there, accepted,
    with the data claim, and the registration hub's addon label says `unhealthy` or
    `unreachable` (not `available`, not absent). Kept for at most `grace_s` from when this loop
    first saw it so (`previous`: cluster -> since); returns the clusters kept -> since."""
    kept: dict[str, float] = {}
    for cluster in dropped:
        info = clusters.get(cluster)
        if info is None or not info.accepted or data_claim not in info.claims:
            continue  # deleted, denied by the hub, or its data claim removed: it has left
        if info.labels.get(ADDON_AVAILABILITY_LABEL, "available") == "available":
            continue  # the agent is fine: the decisions dropped it for another reason
        since = previous.get(cluster, now)
        if now - since < grace_s:
            kept[cluster] = since
    return kept


def decision_index(name: str) -> int:
    """The slice number that ends a PlacementDecision's name (`<placement>-decision-<i>`, as
    OCM names them); 0 when the name has none."""
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def in_slice_gap(cluster: str, slices: Sequence[Sequence[str]]) -> bool:
    """Whether `cluster` sorts strictly between two consecutive non-empty slices.

    OCM writes a Placement's decisions as sorted slices of at most 100 clusters, one object
    after the other. A cluster joining at sorted position p pushes the last cluster of p's
    slice into the next one; between the two writes that cluster is in neither, exactly in
    the gap between them. A cluster that really left is almost never there (only the first
    of a slice, at the next slice's boundary after the rewrite)."""
    ordered = [s for s in slices if s]
    return any(max(a) < cluster < min(b) for a, b in itertools.pairwise(ordered))


@dataclass(frozen=True)
class DecisionView:
    """The decided clusters one resource's controller loop acts on (`settle_decisions`)."""

    decided: frozenset[str] = frozenset()
    held: Mapping[str, float] = field(default_factory=dict)  # absent cluster -> absent since
    started: bool = False  # a complete decision set was seen (or waited on DECISION_HOLD_S)
    waiting_since: float | None = None  # not started: when decisions were first seen

    def recheck_in(self, now: float, hold_s: float = DECISION_HOLD_S) -> float | None:
        """Seconds until a hold ends (a pass is due then even without an event)."""
        times = list(self.held.values())
        if self.waiting_since is not None:
            times.append(self.waiting_since)
        return max(0.0, min(times) + hold_s - now) if times else None


def settle_decisions(
    slices: Iterable[tuple[int, Sequence[str]]],
    selected: int | None,
    previous: DecisionView,
    now: float,
    hold_s: float = DECISION_HOLD_S,
) -> DecisionView:
    """The clusters to act on, from the PlacementDecisions' (index, clusters) and the
    Placement's `status.numberOfSelectedClusters` (`selected`, written by OCM after all of a
    scheduling's decisions).

    OCM rewrites the slices one by one, so a read can catch a set in the middle. Acting on it
    would delete a cluster's work (its training) and create it again moments later. So:
    - before a first complete set (the union has `selected` clusters) nothing is decided: the
      controller's writes do not compete with the placement controller's, and a partial first
      set is not acted on (after `hold_s` of incomplete decisions they are taken as they are);
    - a cluster that joins is decided at once;
    - a cluster that is gone stays decided while the set is incomplete or it sits in a gap
      between two slices (`in_slice_gap`), for at most `hold_s`; then it has left."""
    ordered = [tuple(clusters) for _, clusters in sorted(slices, key=lambda s: s[0])]
    union = frozenset(c for clusters in ordered for c in clusters)
    complete = selected is not None and len(union) == selected
    if not previous.started:
        since = previous.waiting_since
        if complete or (since is not None and now - since >= hold_s):
            return DecisionView(decided=union, started=True)
        return DecisionView(waiting_since=since if since is not None else (now if union else None))
    held: dict[str, float] = {}
    for cluster in previous.decided - union:
        since = previous.held.get(cluster, now)
        if now - since >= hold_s or (complete and not in_slice_gap(cluster, ordered)):
            continue  # it has left
        held[cluster] = since
    return DecisionView(decided=union | held.keys(), held=held, started=True)


def resolve_clusters(
    decided: Iterable[str], clusters: Mapping[str, ClusterInfo], data_claim: str
) -> list[ClusterResolution]:
    """Resolve each decided cluster to its data path (sorted by cluster name)."""
    out = []
    for name in sorted(set(decided)):
        info = clusters.get(name)
        if info is None:
            out.append(
                ClusterResolution(
                    name, None, "selected by the placement, but no ManagedCluster of that name"
                )
            )
            continue
        value = info.claims.get(data_claim)
        if value is None:
            reason = (
                f"selected by the placement, but it has no ClusterClaim {data_claim}: create "
                f"one on the cluster whose value is its data path (no work created)"
            )
            out.append(ClusterResolution(name, None, reason, info.labels))
        elif not value.startswith("/") or ".." in value.split("/"):
            reason = (
                f"selected by the placement, but ClusterClaim {data_claim}={value!r} is not an "
                "absolute path: set it to the data directory (no work created)"
            )
            out.append(ClusterResolution(name, None, reason, info.labels))
        else:
            reason = f"selected by the placement; data at {value} (ClusterClaim {data_claim})"
            try:
                required = _requirement(info)
            except PrivacySettingError as exc:
                reason = f"selected by the placement, but {exc} (no work created)"
                out.append(ClusterResolution(name, None, reason, info.labels))
                continue
            if required is not None:
                reason += f"; its data requires {required.describe()}"
            out.append(ClusterResolution(name, value, reason, info.labels, required))
    return out


def _requirement(info: ClusterInfo) -> ClusterRequirement | None:
    value = info.claims.get(PRIVACY_CLAIM)
    return None if value is None else parse_requirement(value)


def is_accepted(managed_cluster: Mapping[str, Any]) -> bool:
    """The hub accepts this ManagedCluster and it is not being deleted."""
    meta = managed_cluster.get("metadata") or {}
    spec = managed_cluster.get("spec") or {}
    return bool(spec.get("hubAcceptsClient")) and not meta.get("deletionTimestamp")


# --- addon membership ----------------------------------------------------------------------
# How long a hub process that has not yet seen its clusters listed calls a "no" provisional.
MEMBERS_GRACE_S: Final = 60.0


@dataclass(frozen=True)
class AddonInfo:
    """What the hub keeps of one cluster's ManagedClusterAddOn of this addon."""

    name: str
    ledger: tuple[HubIdentity, ...] = ()  # its hub-identities annotation
    ledger_problem: str | None = None  # why the annotation was ignored (malformed)


def addon_info(addon: Mapping[str, Any]) -> AddonInfo | None:
    """AddonInfo from a ManagedClusterAddOn object; None while it is being deleted (the addon
    is off for that cluster from the moment its deletion starts)."""
    meta = addon.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    entries, problem = ledger_of(str(meta.get("namespace") or ""), meta.get("annotations"))
    return AddonInfo(str(meta.get("name") or ""), tuple(entries), problem)


class Registry(Protocol):
    """Answers whether a cluster is a member of the addon (may report, may get a certificate)
    and which hub credentials OCM issued to its addon agent."""

    def is_registered(self, cluster: str) -> bool: ...

    def registered(self) -> set[str]: ...

    def complete(self) -> bool:
        """Whether a "not registered" is final (the hub has listed its clusters)."""
        ...

    def hub_identities(self, cluster: str) -> list[HubIdentity]:
        """The hub credentials issued to `cluster`'s addon agent through its own registration
        agent (expired ones too: the caller compares with its clock)."""
        ...


class AddonMembers:
    """Addon membership read from the hub process's kopf indexes (no API call): the
    ManagedClusters (`ClusterInfo` by name), the addon's ManagedClusterAddOns (`AddonInfo` by
    cluster namespace) and the addon's hub-credential CSRs (`HubIdentity` by cluster, see
    membership_indexes.hub_csr_idx). The indexes are live, so one instance serves for the process's
    life."""

    def __init__(
        self,
        clusters: Mapping[str, Iterable[ClusterInfo]],
        addons: Mapping[str, Iterable[Any]],
        hub_csrs: Mapping[str, Iterable[Any]] | None = None,
        *,
        grace_s: float = MEMBERS_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clusters = clusters
        self._addons = addons
        self._hub_csrs: Mapping[str, Iterable[Any]] = hub_csrs if hub_csrs is not None else {}
        self._clock = clock
        self._complete_at = clock() + grace_s
        self._listed = False

    def mark_listed(self) -> None:
        """kopf has listed every indexed resource (it calls resource handlers only then)."""
        self._listed = True

    def complete(self) -> bool:
        # Right after the process starts the indexes fill in: a cluster missing from them
        # may be one not listed yet (fault drill 5 saw a stream refused 16 ms after start).
        return self._listed or self._clock() >= self._complete_at

    def is_registered(self, cluster: str) -> bool:
        accepted = any(info.accepted for info in self._clusters.get(cluster, ()))
        return accepted and bool(list(self._addons.get(cluster, ())))

    def registered(self) -> set[str]:
        return {c for c in list(self._clusters.keys()) if self.is_registered(c)}

    def hub_identities(self, cluster: str) -> list[HubIdentity]:
        out: list[HubIdentity] = []
        for addon in list(self._addons.get(cluster, ())):
            if isinstance(addon, AddonInfo):
                out.extend(addon.ledger)
        out.extend(
            i
            for i in list(self._hub_csrs.get(cluster, ()))
            if isinstance(i, HubIdentity) and i.cluster == cluster
        )
        return out


class StaticMembers:
    """A fixed, editable set of member clusters (tests, benchmarks), with the hub credentials
    `trust` adds."""

    def __init__(self, clusters: Iterable[str] = ()) -> None:
        self.clusters: set[str] = set(clusters)
        self.identities: dict[str, list[HubIdentity]] = {}

    def is_registered(self, cluster: str) -> bool:
        return cluster in self.clusters

    def registered(self) -> set[str]:
        return set(self.clusters)

    def complete(self) -> bool:
        return True

    def hub_identities(self, cluster: str) -> list[HubIdentity]:
        return list(self.identities.get(cluster, ()))

    def trust(self, identity: HubIdentity) -> None:
        self.identities.setdefault(identity.cluster, []).append(identity)

    def add(self, cluster: str) -> None:
        self.clusters.add(cluster)

    def remove(self, cluster: str) -> None:
        self.clusters.discard(cluster)
