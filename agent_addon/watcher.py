"""Watches this cluster's FL client pods and jobs (label component=client).

Runs the blocking kubernetes watches in threads and hands the full per-run phase view to
the event loop after every event.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from agent_addon.phase import RunKey, phases_by_run, runs_by_pod_ip
from ocmfl import constants
from ocmfl.reports import ClientPhase

log = logging.getLogger(__name__)

CLIENT_SELECTOR = f"{constants.LABEL_COMPONENT}=client"
PhaseView = dict[RunKey, tuple[str, ClientPhase]]


class ClientWatcher:
    """Keeps pods and jobs with the client label; calls `on_change(view)` on the loop."""

    def __init__(
        self,
        api_client: Any,
        loop: asyncio.AbstractEventLoop,
        on_change: Callable[[PhaseView], object],
        *,
        namespace: str | None = None,
    ) -> None:
        self._api_client = api_client
        self._loop = loop
        self._on_change = on_change
        self._namespace = namespace
        self._objects: dict[str, dict[str, dict[str, Any]]] = {"pod": {}, "job": {}}
        self._by_ip: dict[str, tuple[RunKey, str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for kind in ("pod", "job"):
            t = threading.Thread(
                target=self._watch, args=(kind,), daemon=True, name=f"watch-{kind}s"
            )
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()

    def _list_fn(self, kind: str) -> tuple[Callable[..., Any], tuple[str, ...]]:
        """The list function (a real API method, so watches deserialize) and its args."""
        from kubernetes import client

        ns = self._namespace
        if kind == "pod":
            core = client.CoreV1Api(self._api_client)
            return (
                (core.list_namespaced_pod, (ns,)) if ns else (core.list_pod_for_all_namespaces, ())
            )
        batch = client.BatchV1Api(self._api_client)
        return (batch.list_namespaced_job, (ns,)) if ns else (batch.list_job_for_all_namespaces, ())

    def run_at(self, ip: str) -> tuple[RunKey, str] | None:
        """The run (and uid) of the live client pod with address `ip`, if there is one."""
        with self._lock:
            return self._by_ip.get(ip)

    def _publish(self) -> None:
        with self._lock:
            view = phases_by_run(self._objects["pod"].values(), self._objects["job"].values())
            self._by_ip = runs_by_pod_ip(self._objects["pod"].values())
        self._loop.call_soon_threadsafe(self._on_change, view)

    def _watch(self, kind: str) -> None:
        from kubernetes import watch

        list_fn, args = self._list_fn(kind)
        serialize = self._api_client.sanitize_for_serialization
        while not self._stop.is_set():
            try:
                listing = list_fn(*args, label_selector=CLIENT_SELECTOR)
                with self._lock:
                    self._objects[kind] = {o.metadata.uid: serialize(o) for o in listing.items}
                self._publish()
                w = watch.Watch()  # type: ignore[no-untyped-call]
                events = w.stream(  # type: ignore[no-untyped-call]
                    list_fn,
                    *args,
                    label_selector=CLIENT_SELECTOR,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=300,
                )
                for event in events:
                    if self._stop.is_set():
                        w.stop()  # type: ignore[no-untyped-call]
                        return
                    obj = event["object"]
                    uid = obj.metadata.uid
                    with self._lock:
                        if event["type"] == "DELETED":
                            self._objects[kind].pop(uid, None)
                        else:
                            self._objects[kind][uid] = serialize(obj)
                    self._publish()
            except Exception as e:  # relist on any watch failure (410 Gone, network)
                log.warning("%s watch failed (%s); relisting", kind, e)
                self._stop.wait(2.0)
