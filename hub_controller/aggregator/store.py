"""In-memory store of the latest report per (FederatedLearning, cluster).

Keyed by (fl namespace, fl name) -> cluster -> `ClusterReport` (latest state plus the
per-round metrics). Thread-safe: the aggregator writes from its event loop while the
controller may read from another thread. Subscribers are told which resource changed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ocmfl.reports import CLIENT_PHASE_NAMES, ROUND_PHASE_NAMES
from ocmfl.status.v1 import report_pb2

ResourceKey = tuple[str, str]  # (namespace, name)
ChangeCallback = Callable[[str, str], None]

_PHASE_ORDER = {"fit": 0, "evaluate": 1}


@dataclass(frozen=True)
class RoundRow:
    """Local metrics of one step (fit or evaluate) of one round on one cluster."""

    round: int
    phase: str
    loss: float | None
    accuracy: float | None
    samples: int
    duration_s: float


@dataclass
class ClusterReport:
    """What the hub knows about one cluster's client of one FederatedLearning run."""

    cluster: str
    fl_uid: str
    phase: str  # Pending | Running | Succeeded | Failed
    round: int
    last_report_time: dt.datetime
    agent_version: str = ""
    final: bool = False
    sample_count: int | None = None
    label_histogram: dict[str, int] = field(default_factory=dict)
    rounds: dict[tuple[int, str], RoundRow] = field(default_factory=dict)
    reports: int = 0
    # (round, phase order) and value of the latest row carrying loss / accuracy
    _latest: dict[str, tuple[tuple[int, int], float]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def _note(self, row: RoundRow) -> None:
        order = (row.round, _PHASE_ORDER.get(row.phase, 9))
        for what in ("loss", "accuracy"):
            value: float | None = getattr(row, what)
            best = self._latest.get(what)
            if value is not None and (best is None or order >= best[0]):
                self._latest[what] = (order, value)

    def latest(self, what: str) -> float | None:
        """Latest loss or accuracy: the last round's evaluate value, else its fit value."""
        best = self._latest.get(what)
        return best[1] if best else None

    @property
    def loss(self) -> float | None:
        return self.latest("loss")

    @property
    def accuracy(self) -> float | None:
        return self.latest("accuracy")

    @property
    def samples(self) -> int | None:
        """Local training samples: the data summary when sent, else the last fit row's."""
        if self.sample_count is not None:
            return self.sample_count
        fits = [r for r in self.rounds.values() if r.phase == "fit"]
        return max(fits, key=lambda r: r.round).samples if fits else None

    def status_row(self) -> dict[str, Any]:
        """This cluster's row for FederatedLearning status.clusters (camelCase JSON)."""
        row: dict[str, Any] = {
            "name": self.cluster,
            "phase": self.phase,
            "round": self.round,
            "lastReportTime": self.last_report_time.astimezone(dt.UTC)
            .replace(microsecond=0)
            .strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        for key, value in (
            ("samples", self.samples),
            ("loss", self.loss),
            ("accuracy", self.accuracy),
        ):
            if value is not None:
                row[key] = value
        return row


def _copy(state: ClusterReport) -> ClusterReport:
    """A copy that shares nothing mutable (RoundRows are frozen)."""
    return dataclasses.replace(
        state,
        rounds=dict(state.rounds),
        label_histogram=dict(state.label_histogram),
        _latest=dict(state._latest),
    )


@dataclass(frozen=True)
class Applied:
    """What `ReportStore.apply` tells the aggregator about the state it folded into."""

    cluster: str
    round: int
    loss: float | None
    accuracy: float | None
    final: bool


def _fresh(current: ClusterReport | None, cluster: str, report: report_pb2.Report) -> bool:
    """True when `report` starts a new state (first report, or a new resource UID)."""
    return current is None or bool(
        report.fl_uid and current.fl_uid and report.fl_uid != current.fl_uid
    )


def _fold_into(state: ClusterReport, report: report_pb2.Report, newer: bool) -> None:
    for m in report.metrics:
        phase = ROUND_PHASE_NAMES[m.phase]
        row = RoundRow(
            round=m.round,
            phase=phase,
            loss=m.loss if m.HasField("loss") else None,
            accuracy=m.accuracy if m.HasField("accuracy") else None,
            samples=m.samples,
            duration_s=m.duration_s,
        )
        state.rounds[(m.round, phase)] = row
        state._note(row)
        state.round = max(state.round, m.round)
    state.reports += 1
    if newer:
        state.last_report_time = report.timestamp.ToDatetime(tzinfo=dt.UTC)
        state.phase = CLIENT_PHASE_NAMES[report.client_phase]
        state.round = max(state.round, report.round)
        state.agent_version = report.agent_version
        state.fl_uid = report.fl_uid or state.fl_uid
        if report.HasField("data"):
            state.sample_count = report.data.sample_count
            state.label_histogram = dict(report.data.label_histogram)
    state.final = state.final or report.final


def _new_state(cluster: str, report: report_pb2.Report) -> ClusterReport:
    ts = report.timestamp.ToDatetime(tzinfo=dt.UTC)
    return ClusterReport(
        cluster=cluster, fl_uid=report.fl_uid, phase="Pending", round=0, last_report_time=ts
    )


def fold_report(
    current: ClusterReport | None, cluster: str, report: report_pb2.Report
) -> ClusterReport:
    """Pure: the state after `report` (already validated) from `cluster` arrives.

    A report for a new resource UID replaces the old state; older reports (by timestamp) only
    add the round rows they carry; a final report stays final.
    """
    if current is None or _fresh(current, cluster, report):
        new, newer = _new_state(cluster, report), True
    else:
        new = _copy(current)
        newer = report.timestamp.ToDatetime(tzinfo=dt.UTC) >= current.last_report_time
    _fold_into(new, report, newer)
    return new


class ReportStore:
    """Latest state per (fl namespace, fl name) -> cluster, with change notification."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[ResourceKey, dict[str, ClusterReport]] = {}
        self._subscribers: list[ChangeCallback] = []

    def apply(self, cluster: str, report: report_pb2.Report) -> Applied:
        """Fold a validated report from the authenticated `cluster`; notify subscribers.

        Same result as `fold_report`, computed in place (the store's objects never leave
        it: `snapshot` hands out copies).
        """
        key = (report.fl_namespace, report.fl_name)
        with self._lock:
            rows = self._data.setdefault(key, {})
            state = rows.get(cluster)
            if state is None or _fresh(state, cluster, report):
                state = rows[cluster] = _new_state(cluster, report)
                newer = True
            else:
                newer = report.timestamp.ToDatetime(tzinfo=dt.UTC) >= state.last_report_time
            _fold_into(state, report, newer)
            result = Applied(cluster, state.round, state.loss, state.accuracy, state.final)
            subscribers = list(self._subscribers)
        for cb in subscribers:
            cb(*key)
        return result

    def snapshot(self, namespace: str, name: str) -> dict[str, ClusterReport]:
        """A copy of every cluster's state for one resource (empty when none reported)."""
        with self._lock:
            rows = self._data.get((namespace, name), {})
            return {c: _copy(r) for c, r in rows.items()}

    def resources(self) -> list[ResourceKey]:
        with self._lock:
            return sorted(self._data)

    def forget(self, namespace: str, name: str) -> None:
        """Drop a resource's reports (call when the FederatedLearning is deleted)."""
        with self._lock:
            self._data.pop((namespace, name), None)

    def subscribe(self, callback: ChangeCallback) -> Callable[[], None]:
        """Call `callback(namespace, name)` after every change; returns an unsubscriber.

        Callbacks run on the writer's thread and must be quick and thread-safe.
        """
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe


def status_rows(snapshot: Mapping[str, ClusterReport]) -> list[dict[str, Any]]:
    """status.clusters rows for a snapshot, sorted by cluster name."""
    return [snapshot[c].status_row() for c in sorted(snapshot)]


def merge_cluster_rows(
    existing: list[dict[str, Any]] | None, snapshot: Mapping[str, ClusterReport]
) -> list[dict[str, Any]]:
    """Pure: status.clusters with report fields folded in, other fields kept.

    Rows other writers own (dataPath, reason, workApplied, ...) are preserved; clusters
    that reported but have no row yet get one. Order: existing rows first, new ones sorted.
    """
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for row in existing or []:
        name = row.get("name")
        merged = dict(row)
        if isinstance(name, str) and name in snapshot:
            merged.update(snapshot[name].status_row())
            seen.add(name)
        out.append(merged)
    out.extend(snapshot[c].status_row() for c in sorted(snapshot) if c not in seen)
    return out
