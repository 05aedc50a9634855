"""In-memory store of the latest report per (run, cluster), keyed by the resource's uid.

Thread-safe: the aggregator writes from its event loop while the controller reads from its
worker threads. Each run's subscribers (the run's reconcile loop) are called after every
report of that run; `forget` drops a run whose resource is gone.

Durability (`wait_for_status=True`, as the hub runs it): the store is memory, so a report
counts as durable only once the run's status fold has written a status that includes it.
Every applied report gets the run's next version; the reconcile loop reads `version(uid)`
before its snapshot and calls `persisted(uid, version)` after its status write;
`when_durable` calls back then (the aggregator acks the report to its agent only at that
point, so an agent keeps it across a hub crash). `forget` releases a run's waiters (nothing
is left to keep). Without a status writer (benchmarks, tests) a report is durable once applied.

Bounded (`StoreLimits`): a cluster keeps its newest rows per run (older rounds are evicted);
a report that would take a run, or the whole store, past its row limit, or open a run past
the run limit, is refused with `StoreFull` and changes nothing. A flood therefore costs the
hub at most the limits' worth of memory.
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
class StoreLimits:
    """How much the store keeps (rows are RoundRows, a few hundred bytes each)."""

    max_rows_per_cluster: int = 2_000  # per run and cluster; the oldest rounds are evicted
    max_rows_per_run: int = 200_000  # over all clusters of one run
    max_rows: int = 2_000_000  # the whole store
    max_runs: int = 10_000  # distinct resource uids


class StoreFull(Exception):
    """The report would take the store past a limit; nothing of it was kept."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # a bounded label for the refusal counter
        self.message = message


@dataclass(frozen=True)
class Applied:
    """What `ReportStore.apply` tells the aggregator about the state it folded into."""

    cluster: str
    round: int
    loss: float | None
    accuracy: float | None
    final: bool
    version: int = 0  # the run's version after this report (see `when_durable`)


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
        state.problem = report.client_problem
        if report.HasField("data"):
            state.sample_count = report.data.sample_count
            state.label_histogram = dict(report.data.label_histogram)
    if report.client_log:  # sent once per failure, kept until the next
        state.client_log = report.client_log
    state.final = state.final or report.final


def _evict_oldest(state: ClusterReport, keep: int) -> None:
    """Drop the oldest (round, phase) rows beyond `keep` (latest values stay as they are)."""
    excess = len(state.rounds) - keep
    if excess > 0:
        for key in sorted(state.rounds)[:excess]:
            del state.rounds[key]


class ReportStore:
    """Latest state per run (resource uid) -> cluster, with per-run change callbacks."""

    def __init__(self, limits: StoreLimits | None = None, *, wait_for_status: bool = False) -> None:
        self.limits = limits or StoreLimits()
        self.wait_for_status = wait_for_status
        self._versions: dict[str, int] = {}  # uid -> reports applied
        self._persisted: dict[str, int] = {}  # uid -> version the status holds
        self._waiters: dict[str, list[tuple[int, Callable[[], object]]]] = {}
        self._lock = threading.Lock()
        self._runs: dict[str, dict[str, ClusterReport]] = {}
        self._run_rows: dict[str, int] = {}
        self._rows = 0
        self._subscribers: dict[str, list[Callable[[], object]]] = {}

    def _check_room(self, uid: str, state: ClusterReport | None, report: report_pb2.Report) -> int:
        """Rows the store grows by when `report` is folded; StoreFull when that is too many."""
        lim = self.limits
        if uid not in self._runs and len(self._runs) >= lim.max_runs:
            raise StoreFull("store_full", f"the hub keeps reports of at most {lim.max_runs} runs")
        have = state.rounds if state is not None else {}
        new = len({(m.round, ROUND_PHASE_NAMES[m.phase]) for m in report.metrics} - set(have))
        grow = min(len(have) + new, lim.max_rows_per_cluster) - len(have)
        if grow > 0 and self._run_rows.get(uid, 0) + grow > lim.max_rows_per_run:
            raise StoreFull(
                "run_rows",
                f"run {uid} already has {self._run_rows.get(uid, 0)} rows (limit "
                f"{lim.max_rows_per_run})",
            )
        if grow > 0 and self._rows + grow > lim.max_rows:
            raise StoreFull("store_full", f"the hub keeps at most {lim.max_rows} report rows")
        return grow

    def apply(self, cluster: str, report: report_pb2.Report) -> Applied:
        """Fold a validated report from the authenticated `cluster`; tell the run's
        subscribers. StoreFull (and no change) when it would pass a limit."""
        uid = report.fl_uid
        with self._lock:
            state = self._runs.get(uid, {}).get(cluster)
            self._check_room(uid, state, report)
            rows = self._runs.setdefault(uid, {})
            if state is None:
                state = rows[cluster] = ClusterReport(
                    cluster=cluster,
                    fl_uid=uid,
                    last_report_time=report.timestamp.ToDatetime(tzinfo=dt.UTC),
                )
            before = len(state.rounds)
            _fold_into(state, report)
            _evict_oldest(state, self.limits.max_rows_per_cluster)
            grown = len(state.rounds) - before  # == grow
            self._run_rows[uid] = self._run_rows.get(uid, 0) + grown
            self._rows += grown
            version = self._versions[uid] = self._versions.get(uid, 0) + 1
            result = Applied(cluster, state.round, state.loss, state.accuracy, state.final, version)
            subscribers = list(self._subscribers.get(uid, ()))
        for callback in subscribers:
            callback()
        return result

    def snapshot(self, uid: str) -> dict[str, ClusterReport]:
        """A copy of every cluster's state for one run (empty when none reported)."""
        with self._lock:
            return {c: _copy(r) for c, r in self._runs.get(uid, {}).items()}

    def size(self) -> tuple[int, int, int]:
        """(runs, (run, cluster) entries, rows) held now."""
        with self._lock:
            entries = sum(len(r) for r in self._runs.values())
            return len(self._runs), entries, self._rows

    def runs(self) -> list[str]:
        """The uids of the runs that have reports."""
        with self._lock:
            return sorted(self._runs)

    def forget(self, uid: str) -> None:
        """Drop a run's reports (its FederatedLearning was deleted); release its waiters."""
        with self._lock:
            self._runs.pop(uid, None)
            self._rows -= self._run_rows.pop(uid, 0)
            self._versions.pop(uid, None)
            self._persisted.pop(uid, None)
            waiters = self._waiters.pop(uid, [])
        for _, callback in waiters:
            callback()

    def version(self, uid: str) -> int:
        """How many reports of run `uid` were applied (read before a `snapshot`)."""
        with self._lock:
            return self._versions.get(uid, 0)

    def persisted(self, uid: str, version: int) -> None:
        """The run's status now holds everything up to `version`: call its due waiters."""
        with self._lock:
            if version <= self._persisted.get(uid, 0):
                return
            self._persisted[uid] = version
            waiters = self._waiters.get(uid, [])
            due = [cb for v, cb in waiters if v <= version]
            left = [(v, cb) for v, cb in waiters if v > version]
            if left:
                self._waiters[uid] = left
            else:
                self._waiters.pop(uid, None)
        for callback in due:
            callback()

    def when_durable(self, uid: str, version: int, callback: Callable[[], object]) -> None:
        """Call `callback()` (now, or later from the status writer's thread) once the report
        that made run `uid` reach `version` is durable."""
        with self._lock:
            wait = self.wait_for_status and version > self._persisted.get(uid, 0)
            if wait:
                self._waiters.setdefault(uid, []).append((version, callback))
        if not wait:
            callback()

    def awaiting(self) -> int:
        """Reports applied whose ack waits for a status write (all runs)."""
        with self._lock:
            return sum(len(w) for w in self._waiters.values())

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
