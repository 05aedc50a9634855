"""The controller's bulk writes (ManifestWorks: create, apply, delete) as coroutines on one
event loop, at most `limit` requests in flight for all resources together.

Why not threads: during a fan-out over N clusters the hub also decodes N watch events of the
works it creates; with a pool of blocking requests, 16 writer threads and the watch contend
for the GIL, and each blocking request costs more interpreter time than an asyncio one
(docs/scale.md). On the hub, `AioKube` sends the requests from kopf's own loop through one
aiohttp session; the reconcile passes (in worker threads) submit coroutines and wait for
their futures.

`ThreadedKube` runs the same coroutines over a blocking `Kube`-like client (the unit tests'
counting clients) on a loop of its own: one write path, whichever transport.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import ssl
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import aiohttp

from ocmfl.kube import APPLY_PATCH, Encoded, Kube, KubeError, Obj, encode_body, object_path

T = TypeVar("T")
TIMEOUT_S = 30.0  # per request, as Kube.request


class AsyncKube(Protocol):
    """The requests the bulk writes need."""

    async def create(self, path: str, body: Obj) -> bool:
        """POST `body` to the collection `path`; False when the name is taken (409)."""
        ...

    async def get(self, path: str) -> Obj | None:
        """GET; None on 404."""
        ...

    async def apply(self, obj: Mapping[str, Any]) -> None:
        """Server-side apply, taking over conflicts."""
        ...

    async def delete(self, path: str, body: Obj | None = None) -> None:
        """DELETE; a 404 is no error."""
        ...


class AioKube:
    """`AsyncKube` over aiohttp, with the TLS and credentials of a `Kube` (its headers are
    asked per request: a rotated service-account token is picked up). Errors are KubeError
    as `Kube` raises them (status 0: no answer). Use on one event loop only."""

    def __init__(self, kube: Kube, limit: int) -> None:
        cfg = kube.api.configuration
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        self._ssl = ctx
        self._kube = kube
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None
        self._manager = {"fieldManager": kube.field_manager}
        self._apply = {**self._manager, "force": "true"}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # One connection per request in flight, kept open (a new one costs a handshake).
            conn = aiohttp.TCPConnector(ssl=self._ssl, limit=self._limit)
            timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
            self._session = aiohttp.ClientSession(connector=conn, timeout=timeout)
        return self._session

    async def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        decode: bool = False,
    ) -> tuple[int, Obj | None]:
        """(status, decoded answer when `decode`); raises KubeError on any answer but 2xx,
        404 and 409 (those two are the callers' to judge)."""
        url = self._kube.host + path
        headers = self._kube._headers(content_type)
        data = None if body is None else encode_body(body)
        try:
            async with self._client().request(
                method, url, params=query, data=data, headers=headers
            ) as resp:
                raw = await resp.read()
                status, reason = resp.status, resp.reason or ""
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise KubeError(0, f"{method} {url}: no answer from the Kubernetes API: {e}", "") from e
        if 200 <= status < 300:
            return status, (json.loads(raw) if decode and raw else None)
        if status in (404, 409):
            return status, None
        raise KubeError(status, reason, raw.decode(errors="replace"))

    async def create(self, path: str, body: Obj) -> bool:
        status, _ = await self._request("POST", path, body, self._manager)
        if status == 404:
            raise KubeError(404, "Not Found", f"POST {path}: no such collection")
        return status != 409

    async def get(self, path: str) -> Obj | None:
        status, obj = await self._request("GET", path, decode=True)
        if status == 409:
            raise KubeError(409, "Conflict", f"GET {path}")
        return obj if status != 404 else None

    async def apply(self, obj: Mapping[str, Any]) -> None:
        path = object_path(obj)
        body = obj if isinstance(obj, Encoded) else dict(obj)
        status, _ = await self._request("PATCH", path, body, self._apply, APPLY_PATCH)
        if status in (404, 409):
            reason = "Not Found" if status == 404 else "Conflict"
            raise KubeError(status, reason, f"apply {path}")

    async def delete(self, path: str, body: Obj | None = None) -> None:
        status, _ = await self._request("DELETE", path, body)
        if status == 409:
            raise KubeError(409, "Conflict", f"DELETE {path}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class ThreadedKube:
    """`AsyncKube` over a blocking `Kube`-like client (create/get/apply/delete), each
    request in a thread."""

    def __init__(self, kube: Any) -> None:
        self._kube = kube

    async def create(self, path: str, body: Obj) -> bool:
        return await asyncio.to_thread(self._kube.create, path, body) is not None

    async def get(self, path: str) -> Obj | None:
        got: Obj | None = await asyncio.to_thread(self._kube.get, path)
        return got

    async def apply(self, obj: Mapping[str, Any]) -> None:
        await asyncio.to_thread(self._kube.apply, obj)

    async def delete(self, path: str, body: Obj | None = None) -> None:
        await asyncio.to_thread(self._kube.delete, path, body=body)


class Writer:
    """Runs write coroutines on `loop` with at most `limit` of them in flight; `submit` may
    be called from any thread and returns a concurrent future."""

    def __init__(self, kube: AsyncKube, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.kube = kube
        self.loop = loop
        self.limit = limit
        self._slots: asyncio.Semaphore | None = None

    @classmethod
    def on_own_loop(cls, kube: AsyncKube, limit: int) -> Writer:
        """A writer with a loop of its own, in a daemon thread (no event loop to share)."""
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="ocmfl-writer", daemon=True).start()
        return cls(kube, loop, limit)

    async def _bounded(self, write: Callable[[AsyncKube], Awaitable[T]]) -> T:
        if self._slots is None:  # made on the loop that uses it
            self._slots = asyncio.Semaphore(self.limit)
        async with self._slots:
            return await write(self.kube)

    def submit(self, write: Callable[[AsyncKube], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """Schedule `write(kube)` on the loop (not from the loop's own thread: wait on the
        future elsewhere)."""
        return asyncio.run_coroutine_threadsafe(self._bounded(write), self.loop)

    def submit_many(
        self, writes: list[Callable[[AsyncKube], Awaitable[T]]]
    ) -> list[concurrent.futures.Future[T]]:
        """`submit` each of `writes`, handed to the loop in one wake-up (not one per write:
        at N = 3,500 a wake-up per work was a tenth of the hub's CPU in a fan-out)."""
        futures: list[concurrent.futures.Future[T]] = [concurrent.futures.Future() for _ in writes]
        if writes:
            self.loop.call_soon_threadsafe(self._start, list(zip(writes, futures, strict=True)))
        return futures

    def _start(
        self, batch: list[tuple[Callable[[AsyncKube], Awaitable[T]], concurrent.futures.Future[T]]]
    ) -> None:
        """On the loop: one task per write, its outcome copied to its future."""
        for write, future in batch:
            if future.cancelled():
                continue
            task = self.loop.create_task(self._bounded(write))
            task.add_done_callback(functools.partial(_settle, future))

    def run_all(self, writes: list[Callable[[AsyncKube], Awaitable[T]]]) -> list[T]:
        """Submit all, wait for all; the first failure is raised once all have finished."""
        futures = self.submit_many(writes)
        concurrent.futures.wait(futures)
        return [f.result() for f in futures]


def _settle(future: concurrent.futures.Future[T], task: asyncio.Task[T]) -> None:
    """Copy a finished task's outcome to the future a caller in another thread waits on."""
    if future.cancelled():
        return
    if task.cancelled():
        future.cancel()  # still pending (never marked running): its waiters are woken
        return
    exc = task.exception()
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(task.result())
