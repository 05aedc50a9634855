"""What the hub knows from one cluster's agent about one FederatedLearning run.

The aggregator folds validated report messages into a `ClusterReport` per (run, cluster) in
its store; the operator's status fold reads them through `ReportSource`. A run is one
resource's life: reports are keyed by the resource's uid, so a resource re-created under the
same name starts with no reports.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

_PHASE_ORDER = {"fit": 0, "evaluate": 1}


@dataclass(frozen=True)
class RoundRow:
    """Local metrics of one step (fit or evaluate) of one round on one cluster."""

    round: int
    phase: str = "evaluate"  # fit | evaluate
    loss: float | None = None
    accuracy: float | None = None
    samples: int = 0
    duration_s: float = 0.0


@dataclass
class ClusterReport:
    """The latest state of one cluster's client of one run, plus its per-round rows."""

    cluster: str
    fl_uid: str
    last_report_time: dt.datetime
    phase: str = "Pending"  # Pending | Running | Succeeded | Failed (the agent's view)
    round: int = 0
    agent_version: str = ""
    final: bool = False
    sample_count: int | None = None
    label_histogram: dict[str, int] = field(default_factory=dict)
    rounds: dict[tuple[int, str], RoundRow] = field(default_factory=dict)
    reports: int = 0
    problem: str = ""  # why the client pod cannot run (the kubelet's reason), "" when none
    # The last lines of its client's log when its ClientApp raised or its client failed (the
    # latest the agent sent; ocmfl.reports.client_log_tail), "" when none
    client_log: str = ""
    # (round, phase order) and value of the latest row carrying loss / accuracy
    _latest: dict[str, tuple[tuple[int, int], float]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def add_row(self, row: RoundRow) -> None:
        """Keep `row` (a repeated round and phase replaces the earlier one)."""
        self.rounds[(row.round, row.phase)] = row
        self.round = max(self.round, row.round)
        order = (row.round, _PHASE_ORDER.get(row.phase, 9))
        for what in ("loss", "accuracy"):
            value: float | None = getattr(row, what)
            best = self._latest.get(what)
            if value is not None and (best is None or order >= best[0]):
                self._latest[what] = (order, value)

    def _latest_value(self, what: str) -> float | None:
        """The last round's evaluate value, else its fit value, of loss or accuracy."""
        best = self._latest.get(what)
        return best[1] if best else None

    @property
    def loss(self) -> float | None:
        return self._latest_value("loss")

    @property
    def accuracy(self) -> float | None:
        return self._latest_value("accuracy")

    @property
    def samples(self) -> int | None:
        """Local training samples: the data summary when sent, else the last fit row's."""
        if self.sample_count is not None:
            return self.sample_count
        fits = [r for r in self.rounds.values() if r.phase == "fit"]
        return max(fits, key=lambda r: r.round).samples if fits else None


class ReportSource(Protocol):
    """Read side of the reports (the aggregator's ReportStore is one)."""

    def snapshot(self, uid: str) -> Mapping[str, ClusterReport]:
        """Latest report per cluster for the run of the resource with this uid."""
        ...

    def subscribe(self, uid: str, callback: Callable[[], object]) -> Callable[[], None]:
        """Call `callback()` (from any thread) after each new report of that run; returns
        the unsubscriber."""
        ...

    def forget(self, uid: str) -> None:
        """Drop a run's reports (its resource is gone)."""
        ...

    def version(self, uid: str) -> int:
        """A counter of the run's reports: read it before `snapshot`, hand it to
        `persisted` once a status folded from that snapshot is written."""
        ...

    def persisted(self, uid: str, version: int) -> None:
        """The run's status holds every report up to `version` (they may be acknowledged)."""
        ...


class NoReports:
    """The ReportSource of a hub that runs no aggregator (`ocm-fl-hub --no-aggregator`)."""

    def snapshot(self, uid: str) -> Mapping[str, ClusterReport]:
        return {}

    def subscribe(self, uid: str, callback: Callable[[], object]) -> Callable[[], None]:
        return lambda: None

    def forget(self, uid: str) -> None:
        return None

    def version(self, uid: str) -> int:
        return 0

    def persisted(self, uid: str, version: int) -> None:
        return None
