"""Watches this cluster's FL client pods and jobs (label component=client).

Two `ocmfl.kube.Informer`s (list+watch threads) keep the objects; after every change the full
per-run phase view goes to the event loop, and the address -> run map the agent checks
metrics posts against is refreshed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from agent_addon.phase import RunKey, phases_by_run, runs_by_pod_ip
from ocmfl import constants
from ocmfl.kube import Informer, Kube, path_of
from ocmfl.reports import ClientPhase

CLIENT_SELECTOR = f"{constants.LABEL_COMPONENT}=client"
PhaseView = dict[RunKey, tuple[str, ClientPhase, str]]  # run -> (uid, phase, problem)


class ClientWatcher:
    """Keeps pods and jobs with the client label; calls `on_change(view)` on the loop."""

    def __init__(
        self,
        kube: Kube,
        loop: asyncio.AbstractEventLoop,
        on_change: Callable[[PhaseView], object],
        *,
        namespace: str | None = None,
    ) -> None:
        self._loop = loop
        self._on_change = on_change
        self._stop = threading.Event()
        query = {"labelSelector": CLIENT_SELECTOR}
        self._pods, self._jobs = (
            Informer(
                kube,
                path_of(api_version, kind, namespace),
                threading.Event(),
                self._stop,
                f"watch-{kind.lower()}s",
                query=query,
            )
            for api_version, kind in (("v1", "Pod"), ("batch/v1", "Job"))
        )
        self._lock = threading.Lock()
        self._by_ip: dict[str, tuple[RunKey, str]] = {}
        for informer in (self._pods, self._jobs):
            informer.on_change = self._publish

    def start(self) -> None:
        self._pods.start()
        self._jobs.start()

    def stop(self) -> None:
        self._stop.set()

    def run_at(self, ip: str) -> tuple[RunKey, str] | None:
        """The run (and uid) of the live client pod with address `ip`, if there is one."""
        with self._lock:
            return self._by_ip.get(ip)

    def _publish(self) -> None:
        with self._lock:
            pods = self._pods.snapshot()
            view = phases_by_run(pods, self._jobs.snapshot())
            self._by_ip = runs_by_pod_ip(pods)
        if self._stop.is_set():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed while the watch answered
            self._loop.call_soon_threadsafe(self._on_change, view)
