"""In-memory store of the latest report per (run, cluster), keyed by the resource's uid.

Thread-safe: the aggregator writes from its event loop while the controller reads from its
worker threads. Each run's subscribers (the run's reconcile loop) are called after every
report of that run; `forget` drops a run whose resource is gone.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Callable
from dataclasses import dataclass

from hub_controller.reports import ClusterReport, RoundRow
from ocmfl.reports import CLIENT_PHASE_NAMES, ROUND_PHASE_NAMES
from ocmfl.status.v1 import report_pb2


@dataclass(frozen=True)
class Applied:
    """What `ReportStore.apply` tells the aggregator about the state it folded into."""

    cluster: str
    round: int
    loss: float | None
    accuracy: float | None
    final: bool


def _copy(state: ClusterReport) -> ClusterReport:
    """A copy that shares nothing mutable (RoundRows are frozen)."""
    return dataclasses.replace(
        state,
        rounds=dict(state.rounds),
        label_histogram=dict(state.label_histogram),
        _latest=dict(state._latest),
    )


def _fold_into(state: ClusterReport, report: report_pb2.Report) -> None:
    """Add a validated report's rows; its other fields only when it is not older."""
    for m in report.metrics:
        state.add_row(
            RoundRow(
                round=m.round,
                phase=ROUND_PHASE_NAMES[m.phase],
                loss=m.loss if m.HasField("loss") else None,
                accuracy=m.accuracy if m.HasField("accuracy") else None,
                samples=m.samples,
                duration_s=m.duration_s,
            )
        )
    state.reports += 1
    ts = report.timestamp.ToDatetime(tzinfo=dt.UTC)
    if ts >= state.last_report_time:
        state.last_report_time = ts
        state.phase = CLIENT_PHASE_NAMES[report.client_phase]
        state.round = max(state.round, report.round)
        state.agent_version = report.agent_version
        if report.HasField("data"):
            state.sample_count = report.data.sample_count
            state.label_histogram = dict(report.data.label_histogram)
    state.final = state.final or report.final


class ReportStore:
    """Latest state per run (resource uid) -> cluster, with per-run change callbacks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, dict[str, ClusterReport]] = {}
        self._subscribers: dict[str, list[Callable[[], object]]] = {}

    def apply(self, cluster: str, report: report_pb2.Report) -> Applied:
        """Fold a validated report from the authenticated `cluster`; tell the run's
        subscribers."""
        uid = report.fl_uid
        with self._lock:
            rows = self._runs.setdefault(uid, {})
            state = rows.get(cluster)
            if state is None:
                state = rows[cluster] = ClusterReport(
                    cluster=cluster,
                    fl_uid=uid,
                    last_report_time=report.timestamp.ToDatetime(tzinfo=dt.UTC),
                )
            _fold_into(state, report)
            result = Applied(cluster, state.round, state.loss, state.accuracy, state.final)
            subscribers = list(self._subscribers.get(uid, ()))
        for callback in subscribers:
            callback()
        return result

    def snapshot(self, uid: str) -> dict[str, ClusterReport]:
        """A copy of every cluster's state for one run (empty when none reported)."""
        with self._lock:
            return {c: _copy(r) for c, r in self._runs.get(uid, {}).items()}

    def runs(self) -> list[str]:
        """The uids of the runs that have reports."""
        with self._lock:
            return sorted(self._runs)

    def forget(self, uid: str) -> None:
        """Drop a run's reports (its FederatedLearning was deleted)."""
        with self._lock:
            self._runs.pop(uid, None)

    def subscribe(self, uid: str, callback: Callable[[], object]) -> Callable[[], None]:
        """Call `callback()` after every report of run `uid`; returns an unsubscriber.

        Callbacks run on the writer's thread and must be quick and thread-safe.
        """
        with self._lock:
            self._subscribers.setdefault(uid, []).append(callback)

        def unsubscribe() -> None:
            with self._lock:
                callbacks = self._subscribers.get(uid, [])
                if callback in callbacks:
                    callbacks.remove(callback)
                if not callbacks:
                    self._subscribers.pop(uid, None)

        return unsubscribe
