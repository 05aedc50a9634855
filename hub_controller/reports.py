"""Per-cluster agent reports, as the controller's status fold reads them.

The aggregator (hub_controller.aggregator) keeps the latest state per (resource, cluster) in
its `ReportStore`; anything with the same `snapshot(namespace, name)` read side works here
(`ReportSource`), so the controller does not depend on protobufs or gRPC.
`hub_controller.operator.handlers.apply_status_reports` installs the source the fold uses.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol


class RoundRowView(Protocol):
    """One step (fit or evaluate) of one round on one cluster."""

    @property
    def round(self) -> int: ...
    @property
    def phase(self) -> str: ...  # fit | evaluate
    @property
    def loss(self) -> float | None: ...
    @property
    def accuracy(self) -> float | None: ...
    @property
    def samples(self) -> int: ...


class ClusterReportView(Protocol):
    """What the fold reads from one cluster's latest report."""

    @property
    def cluster(self) -> str: ...
    @property
    def phase(self) -> str: ...  # Pending | Running | Succeeded | Failed (agent's view)
    @property
    def round(self) -> int: ...
    @property
    def last_report_time(self) -> datetime: ...
    @property
    def samples(self) -> int | None: ...
    @property
    def loss(self) -> float | None: ...
    @property
    def accuracy(self) -> float | None: ...
    @property
    def rounds(self) -> Mapping[tuple[int, str], RoundRowView]: ...


class ReportSource(Protocol):
    """Read side of the aggregator's report state (its ReportStore satisfies it)."""

    def snapshot(self, namespace: str, name: str) -> Mapping[str, ClusterReportView]:
        """Latest report per cluster for one FederatedLearning resource."""
        ...


@dataclass(frozen=True)
class Report:
    """A plain ClusterReportView (tests, and feeding reports in-process)."""

    cluster: str
    last_report_time: datetime
    phase: str = "Running"
    round: int = 0
    samples: int | None = None
    loss: float | None = None
    accuracy: float | None = None
    rounds: Mapping[tuple[int, str], RoundRow] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundRow:
    """A plain RoundRowView."""

    round: int
    phase: str = "evaluate"
    loss: float | None = None
    accuracy: float | None = None
    samples: int = 0


class InMemoryReports:
    """Thread-safe ReportSource holding `Report`s: put from anywhere, snapshot to read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[tuple[str, str], dict[str, Report]] = {}

    def put(self, namespace: str, name: str, report: Report) -> None:
        """Keep `report` unless a newer one for the same cluster is already stored."""
        with self._lock:
            per_cluster = self._data.setdefault((namespace, name), {})
            current = per_cluster.get(report.cluster)
            if current is None or current.last_report_time <= report.last_report_time:
                per_cluster[report.cluster] = report

    def snapshot(self, namespace: str, name: str) -> Mapping[str, Report]:
        with self._lock:
            return dict(self._data.get((namespace, name), {}))


class NoReports:
    """The ReportSource used until an aggregator is attached."""

    def snapshot(self, namespace: str, name: str) -> Mapping[str, ClusterReportView]:
        return {}
