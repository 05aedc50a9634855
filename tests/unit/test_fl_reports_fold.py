"""The aggregator's ReportStore is a ReportSource: its reports reach the status fold."""

from __future__ import annotations

from datetime import UTC, datetime

from fl_fixtures import REF, spec

from hub_controller.aggregator.store import ReportStore
from hub_controller.membership import ClusterResolution
from hub_controller.operator.fold import fold
from hub_controller.operator.observed import JobState, Observations, PlacementState, WorkState
from hub_controller.reports import ReportSource
from ocmfl.status.v1 import report_pb2

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _report(cluster: str, accuracy: float, samples: int) -> report_pb2.Report:
    r = report_pb2.Report(
        cluster=cluster,
        fl_namespace=REF.namespace,
        fl_name=REF.name,
        fl_uid=REF.uid,
        client_phase=report_pb2.CLIENT_PHASE_RUNNING,
        round=2,
        sequence=1,
    )
    r.metrics.append(
        report_pb2.RoundMetrics(
            round=2,
            phase=report_pb2.ROUND_PHASE_EVALUATE,
            loss=0.3,
            accuracy=accuracy,
            samples=samples,
        )
    )
    r.data.sample_count = samples
    r.timestamp.FromDatetime(T0)
    return r


def test_aggregator_reports_fill_cluster_rows_and_accuracy() -> None:
    store = ReportStore()
    store.apply("a", _report("a", 0.9, 300))
    store.apply("b", _report("b", 0.5, 100))
    source: ReportSource = store
    resolutions = (ClusterResolution("a", "/d/a", ""), ClusterResolution("b", "/d/b", ""))
    works = {c: WorkState(cluster=c, name="w", applied=True) for c in ("a", "b")}
    obs = Observations(
        placement=PlacementState(exists=True, satisfied="True"),
        resolutions=resolutions,
        works=works,
        server_job=JobState(exists=True, active=1),
        server_address="127.0.0.1:9443",
        reports=source.snapshot(REF.uid),
    )
    status = fold(spec(), 1, obs, None, T0)
    assert status.round == 2
    assert status.accuracy == 0.8
    rows = {r.name: r for r in status.clusters}
    assert rows["a"].samples == 300 and rows["a"].loss == 0.3
    assert rows["a"].phase.value == "Running"
    assert rows["a"].last_report_time == T0
    history = {(h.round, h.cluster): h for h in status.history}
    assert history[(2, "a")].accuracy == 0.9
    assert history[(2, "global")].accuracy == 0.8


def test_folded_status_renders_in_the_cli_dashboard() -> None:
    from fl_fixtures import spec_dict
    from rich.console import Console

    from hub_controller.operator.fold import status_body
    from ocmfl_cli import dashboard

    store = ReportStore()
    store.apply("a", _report("a", 0.9, 300))
    resolutions = (ClusterResolution("a", "/d/a", "why"), ClusterResolution("b", None, "no"))
    obs = Observations(
        resolutions=resolutions,
        works={"a": WorkState(cluster="a", name="w", applied=True)},
        server_job=JobState(exists=True, active=1),
        server_address="127.0.0.1:9443",
        reports=store.snapshot(REF.uid),
    )
    fl = {
        "metadata": {"name": REF.name, "namespace": REF.namespace},
        "spec": spec_dict(),
        "status": status_body(fold(spec(), 1, obs, None, T0)),
    }
    console = Console(width=160, record=True)
    console.print(dashboard.render_dashboard(fl, now=T0))
    text = console.export_text()
    assert "/d/a" in text and "Running" in text
    series = dashboard.history_series(fl)
    assert series["accuracy"]["a"] == [(2, 0.9)]
