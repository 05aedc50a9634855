"""Coalescing writer of report rows into FederatedLearning status.clusters.

At most one status patch per resource per `interval_s`: changes arriving in between are
folded into the next patch. Rows other writers own (dataPath, workApplied, ...) are kept:
the patch is computed from the current status with `merge_cluster_rows` and sent as a
merge patch on /status with the resourceVersion read, retried on conflict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from hub_controller.aggregator.store import ReportStore, ResourceKey, merge_cluster_rows
from ocmfl import constants

log = logging.getLogger(__name__)


class GoneError(Exception):
    """The resource no longer exists; stop writing its status."""


class ConflictError(Exception):
    """The resource changed since it was read; read again and retry."""


class StatusClient(Protocol):
    """Reads and patches a FederatedLearning (tests use an in-memory fake)."""

    async def get(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...


def status_patch(resource: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Pure: the merge patch that sets status.clusters, guarded by resourceVersion."""
    patch: dict[str, Any] = {"status": {"clusters": rows}}
    rv = (resource.get("metadata") or {}).get("resourceVersion")
    if rv:
        patch["metadata"] = {"resourceVersion": rv}
    return patch


class StatusWriter:
    """Folds ReportStore changes into status, at most once per resource per interval."""

    def __init__(
        self,
        store: ReportStore,
        client: StatusClient,
        *,
        interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        max_conflict_retries: int = 5,
    ) -> None:
        self.store = store
        self.client = client
        self.interval_s = interval_s
        self.clock = clock
        self.max_conflict_retries = max_conflict_retries
        self.patches = 0
        self.errors = 0
        self._last: dict[ResourceKey, float] = {}
        self._due: dict[ResourceKey, float] = {}
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._unsubscribe = self.store.subscribe(self.notify)
        for key in self.store.resources():
            self._mark(key)
        self._task = asyncio.create_task(self._run(), name="status-writer")

    async def stop(self, flush: bool = True) -> None:
        """Stop; with `flush`, write pending changes first (ignoring the interval)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if flush:
            for key in list(self._due):
                self._due.pop(key, None)
                await self._write(key)

    def notify(self, namespace: str, name: str) -> None:
        """ReportStore callback; safe from any thread."""
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._mark((namespace, name))
        else:
            loop.call_soon_threadsafe(self._mark, (namespace, name))

    def _mark(self, key: ResourceKey) -> None:
        if key in self._due:
            return
        self._due[key] = max(self.clock(), self._last.get(key, float("-inf")) + self.interval_s)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            now = self.clock()
            ready = [k for k, t in self._due.items() if t <= now]
            for key in ready:
                del self._due[key]
                await self._write(key)
            if ready:
                continue
            self._wake.clear()
            timeout = min(self._due.values()) - now if self._due else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _write(self, key: ResourceKey) -> None:
        namespace, name = key
        self._last[key] = self.clock()
        for _attempt in range(self.max_conflict_retries):
            try:
                resource = await self.client.get(namespace, name)
                status = resource.get("status") or {}
                rows = merge_cluster_rows(status.get("clusters"), self.store.snapshot(*key))
                if rows == status.get("clusters"):
                    return
                await self.client.patch_status(namespace, name, status_patch(resource, rows))
                self.patches += 1
                return
            except ConflictError:
                continue
            except GoneError:
                log.info("%s/%s is gone; dropping its reports", namespace, name)
                self.store.forget(namespace, name)
                return
            except Exception:
                self.errors += 1
                log.exception("status patch of %s/%s failed; retrying later", namespace, name)
                break
        self._mark(key)  # retry after the interval


class KubernetesStatusClient:
    """StatusClient on the hub API (kubernetes client, calls run in a thread)."""

    def __init__(self, custom_objects_api: Any) -> None:
        self._api = custom_objects_api

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None) -> KubernetesStatusClient:
        from ocmfl.kube import custom_objects

        return cls(custom_objects(kubeconfig))

    @staticmethod
    def _translate(e: Exception) -> Exception:
        status = getattr(e, "status", None)
        if status == 404:
            return GoneError(str(e))
        if status == 409:
            return ConflictError(str(e))
        return e

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            obj: dict[str, Any] = await asyncio.to_thread(
                self._api.get_namespaced_custom_object,
                constants.GROUP,
                constants.VERSION,
                namespace,
                constants.PLURAL,
                name,
            )
        except ApiException as e:
            raise self._translate(e) from e
        return obj

    async def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            await asyncio.to_thread(
                self._api.patch_namespaced_custom_object_status,
                constants.GROUP,
                constants.VERSION,
                namespace,
                constants.PLURAL,
                name,
                body,
                _content_type="application/merge-patch+json",
            )
        except ApiException as e:
            raise self._translate(e) from e
