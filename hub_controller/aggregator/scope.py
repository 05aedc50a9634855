"""Which federations a cluster may report for: those with a ManifestWork on that cluster.

A report from cluster C for resource (namespace, name, uid) is in scope only when the hub has a
ManifestWork in C's cluster namespace labelled with that owner and uid (the operator's works;
`workwatch.WorkStore.owners` keeps them as (cluster, uid) -> (namespace, name)). A cluster's
agent certificate therefore lets it speak for the federations that placed work on it, and for
no other tenant's federation.

Right after the hub process starts, the operator's ManifestWork streams may not have listed
yet: until they have (`WorkStore.when_synced`) or a grace period, `ready()` is False and the
aggregator asks agents to come back later rather than refusing reports for good.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final, Protocol

STARTUP_GRACE_S: Final = 60.0

OwnerKey = tuple[str, str]  # (cluster, resource uid)


class Scope(Protocol):
    """Answers whether a cluster may report for one federation."""

    def ready(self) -> bool:
        """The answer of `allows` is final (the hub has seen its works)."""
        ...

    def allows(self, cluster: str, namespace: str, name: str, uid: str) -> bool:
        """Cluster `cluster` has a work of resource namespace/name with this uid."""
        ...


class WorkScope:
    """Scope over the live index (cluster, uid) -> [(namespace, name)] of ManifestWorks."""

    def __init__(
        self,
        works: Mapping[OwnerKey, Iterable[tuple[str, str]]],
        *,
        grace_s: float = STARTUP_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._works = works
        self._clock = clock
        self._ready_at = clock() + grace_s
        self._seen = False

    def mark_ready(self) -> None:
        """The work store is complete (its streams have listed)."""
        self._seen = True

    @property
    def seen(self) -> bool:
        """Whether `mark_ready` was called."""
        return self._seen

    def ready(self) -> bool:
        return self._seen or self._clock() >= self._ready_at

    def allows(self, cluster: str, namespace: str, name: str, uid: str) -> bool:
        return (namespace, name) in set(self._works.get((cluster, uid), ()))


class AnyScope:
    """Every federation is in scope: only for benchmarks and tests of other checks."""

    def ready(self) -> bool:
        return True

    def allows(self, cluster: str, namespace: str, name: str, uid: str) -> bool:
        return True
