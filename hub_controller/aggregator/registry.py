"""Which clusters may report: accepted ManagedClusters with the addon enabled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from hub_controller.membership import is_accepted
from ocmfl import constants


@runtime_checkable
class ClusterRegistry(Protocol):
    """Answers whether a cluster is allowed to report."""

    async def is_registered(self, cluster: str) -> bool: ...


class InMemoryClusterRegistry:
    """A fixed, editable set of clusters (unit tests, standalone runs)."""

    def __init__(self, clusters: Iterable[str] = ()) -> None:
        self.clusters: set[str] = set(clusters)

    async def is_registered(self, cluster: str) -> bool:
        return cluster in self.clusters

    def add(self, cluster: str) -> None:
        self.clusters.add(cluster)

    def remove(self, cluster: str) -> None:
        self.clusters.discard(cluster)


class KubernetesClusterRegistry:
    """Checks on the hub API that the ManagedCluster is accepted and the addon enabled.

    The addon is enabled on a cluster when ManagedClusterAddOn ``constants.ADDON_NAME``
    exists in the cluster's namespace. Answers are cached for `ttl_s` (positive) and
    `negative_ttl_s` (negative) so a report stream does not hit the API per message.
    """

    def __init__(
        self,
        custom_objects_api: Any,
        *,
        ttl_s: float = 30.0,
        negative_ttl_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = custom_objects_api
        self._ttl = ttl_s
        self._negative_ttl = negative_ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[bool, float]] = {}

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None, **kw: Any) -> KubernetesClusterRegistry:
        from ocmfl.kube import custom_objects

        return cls(custom_objects(kubeconfig), **kw)

    def _lookup(self, cluster: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            mc = self._api.get_cluster_custom_object(
                constants.CLUSTER_GROUP, "v1", "managedclusters", cluster
            )
            if not is_accepted(mc):
                return False
            self._api.get_namespaced_custom_object(
                constants.ADDON_GROUP,
                "v1alpha1",
                cluster,
                "managedclusteraddons",
                constants.ADDON_NAME,
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    async def is_registered(self, cluster: str) -> bool:
        now = self._clock()
        hit = self._cache.get(cluster)
        if hit is not None and hit[1] > now:
            return hit[0]
        ok = await asyncio.to_thread(self._lookup, cluster)
        self._cache[cluster] = (ok, now + (self._ttl if ok else self._negative_ttl))
        return ok

    def invalidate(self, cluster: str | None = None) -> None:
        if cluster is None:
            self._cache.clear()
        else:
            self._cache.pop(cluster, None)
