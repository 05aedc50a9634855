"""Which clusters are members (pure): of the addon, and of each federation.

Addon membership: an accepted ManagedCluster (not being deleted) that has the addon's
ManagedClusterAddOn may report to the aggregator and get an agent certificate.
Federation membership: every PlacementDecision of the resource's Placement (OCM splits
decisions over several objects: take the union) and the ManagedClusters'
`status.clusterClaims` give one resolution per decided cluster, with the data path from the
claim named by spec.client.dataClaim or the reason the cluster cannot take part. The path is
never guessed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol


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
            out.append(ClusterResolution(name, value, reason, info.labels))
    return out


def is_accepted(managed_cluster: Mapping[str, Any]) -> bool:
    """The hub accepts this ManagedCluster and it is not being deleted."""
    meta = managed_cluster.get("metadata") or {}
    spec = managed_cluster.get("spec") or {}
    return bool(spec.get("hubAcceptsClient")) and not meta.get("deletionTimestamp")


# --- addon membership ----------------------------------------------------------------------
# How long a hub process that has not yet seen its clusters listed calls a "no" provisional.
MEMBERS_GRACE_S: Final = 60.0


class Registry(Protocol):
    """Answers whether a cluster is a member of the addon (may report, may get a certificate)."""

    def is_registered(self, cluster: str) -> bool: ...

    def registered(self) -> set[str]: ...

    def complete(self) -> bool:
        """Whether a "not registered" is final (the hub has listed its clusters)."""
        ...


class AddonMembers:
    """Addon membership read from the hub process's kopf indexes (no API call): the
    ManagedClusters (`ClusterInfo` by name) and the addon's ManagedClusterAddOns (by cluster
    namespace). The indexes are live, so one instance serves for the process's life."""

    def __init__(
        self,
        clusters: Mapping[str, Iterable[ClusterInfo]],
        addons: Mapping[str, Iterable[Any]],
        *,
        grace_s: float = MEMBERS_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clusters = clusters
        self._addons = addons
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


class StaticMembers:
    """A fixed, editable set of member clusters (tests, benchmarks)."""

    def __init__(self, clusters: Iterable[str] = ()) -> None:
        self.clusters: set[str] = set(clusters)

    def is_registered(self, cluster: str) -> bool:
        return cluster in self.clusters

    def registered(self) -> set[str]:
        return set(self.clusters)

    def complete(self) -> bool:
        return True

    def add(self, cluster: str) -> None:
        self.clusters.add(cluster)

    def remove(self, cluster: str) -> None:
        self.clusters.discard(cluster)
