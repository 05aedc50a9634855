"""Drill 6's pure part: after a hub restart the report store is empty until the agents send
again; the clusters' rows keep the values of the resource's last status meanwhile."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fl_fixtures import spec

from hub_controller.membership import ClusterResolution
from hub_controller.operator.fold import fold
from hub_controller.operator.observed import JobState, Observations, PlacementState, WorkState
from hub_controller.reports import ClusterReport, RoundRow

T0 = datetime(2026, 1, 1, tzinfo=UTC)
A = ClusterResolution("a", "/srv/a", "why a")
B = ClusterResolution("b", "/srv/b", "why b")


def _obs(reports: dict[str, ClusterReport]) -> Observations:
    works = {
        n: WorkState(cluster=n, name="w", applied=True, job=JobState(exists=True, active=1))
        for n in ("a", "b")
    }
    return Observations(
        placement=PlacementState(exists=True, satisfied="True"),
        resolutions=(A, B),
        works=works,
        server_job=JobState(exists=True, active=1),
        server_address="10.0.0.1:9443",
        reports=reports,
    )


def _report(cluster: str) -> ClusterReport:
    r = ClusterReport(cluster, "uid", T0, phase="Running", round=2, sample_count=40)
    r.add_row(RoundRow(2, "evaluate", loss=0.5, accuracy=0.8))
    return r


def test_rows_keep_their_values_while_the_restarted_hub_has_no_report() -> None:
    s = spec()
    before = fold(s, 1, _obs({"a": _report("a"), "b": _report("b")}), None, T0)
    after = fold(s, 1, _obs({"b": _report("b")}), before, T0 + timedelta(seconds=5))
    rows = {r.name: r for r in after.clusters}
    assert (rows["a"].round, rows["a"].loss, rows["a"].accuracy, rows["a"].samples) == (
        2, 0.5, 0.8, 40,
    )  # fmt: skip
    assert rows["a"].last_report_time == before.clusters[0].last_report_time
    assert after.accuracy == before.accuracy


def test_a_new_resource_has_no_previous_values() -> None:
    rows = fold(spec(), 1, _obs({}), None, T0).clusters
    assert all(r.loss is None and r.round is None for r in rows)


def test_a_report_after_the_restart_without_samples_keeps_the_previous_samples() -> None:
    s = spec()
    before = fold(s, 1, _obs({"a": _report("a"), "b": _report("b")}), None, T0)
    evaluate_only = ClusterReport("a", "uid", T0 + timedelta(seconds=9), phase="Running", round=3)
    evaluate_only.add_row(RoundRow(3, "evaluate", loss=0.4, accuracy=0.85))
    after = fold(s, 1, _obs({"a": evaluate_only}), before, T0 + timedelta(seconds=10))
    row = next(r for r in after.clusters if r.name == "a")
    assert (row.round, row.loss, row.accuracy, row.samples) == (3, 0.4, 0.85, 40)
