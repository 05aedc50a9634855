"""The aggregator's ReportStore: reports folded per run (resource uid) and cluster."""

from __future__ import annotations

import datetime as dt

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from hub_controller.aggregator.store import ReportStore
from ocmfl.reports import ClientPhase
from ocmfl.status.v1 import report_pb2

pytestmark = pytest.mark.timeout(30)


def report(
    cluster: str,
    rnd: int,
    *,
    acc: float | None = None,
    uid: str = "u1",
    when: dt.datetime | None = None,
    final: bool = False,
    phase: ClientPhase = report_pb2.CLIENT_PHASE_RUNNING,
) -> report_pb2.Report:
    ts = Timestamp()
    ts.FromDatetime(when or dt.datetime.now(dt.UTC))
    m = report_pb2.RoundMetrics(
        round=rnd, phase=report_pb2.ROUND_PHASE_EVALUATE, loss=1.0 / rnd, samples=10
    )
    if acc is not None:
        m.accuracy = acc
    return report_pb2.Report(
        cluster=cluster,
        fl_namespace="fl",
        fl_name="job",
        fl_uid=uid,
        client_phase=phase,
        round=rnd,
        metrics=[m],
        timestamp=ts,
        final=final,
        sequence=rnd,
    )


def test_store_keeps_latest_state_and_all_rounds() -> None:
    store = ReportStore()
    now = dt.datetime.now(dt.UTC)
    store.apply("a", report("a", 2, acc=0.7, when=now))
    store.apply("a", report("a", 1, acc=0.5, when=now - dt.timedelta(seconds=5)))  # late
    row = store.snapshot("u1")["a"]
    assert (row.round, row.accuracy, sorted(row.rounds)) == (
        2,
        0.7,
        [(1, "evaluate"), (2, "evaluate")],
    )
    assert row.phase == "Running" and row.reports == 2


def test_a_recreated_resource_starts_clean_and_a_deleted_one_is_forgotten() -> None:
    store = ReportStore()
    store.apply("a", report("a", 3, acc=0.9))
    store.apply("a", report("a", 1, uid="u2"))  # same name, new resource
    assert store.snapshot("u1")["a"].round == 3
    assert store.snapshot("u2")["a"].round == 1
    assert store.snapshot("u2")["a"].accuracy is None
    store.forget("u1")
    assert store.snapshot("u1") == {} and store.runs() == ["u2"]


def test_subscribers_hear_only_their_own_run() -> None:
    store = ReportStore()
    heard: list[str] = []
    unsubscribe = store.subscribe("u1", lambda: heard.append("u1"))
    store.subscribe("u2", lambda: heard.append("u2"))
    store.apply("a", report("a", 1))
    store.apply("b", report("b", 1, uid="u2"))
    unsubscribe()
    store.apply("a", report("a", 2))
    assert heard == ["u1", "u2"]


def test_final_report_sticks_and_the_last_round_sets_loss_and_accuracy() -> None:
    store = ReportStore()
    store.apply("a", report("a", 3, acc=0.9, final=True, phase=report_pb2.CLIENT_PHASE_SUCCEEDED))
    now = dt.datetime.now(dt.UTC)
    store.apply("a", report("a", 2, acc=0.4, when=now - dt.timedelta(minutes=1)))  # stale
    row = store.snapshot("u1")["a"]
    assert (row.final, row.phase, row.round, row.accuracy) == (True, "Succeeded", 3, 0.9)
    assert row.loss == 1.0 / 3


def test_a_report_is_durable_once_a_status_write_covers_it() -> None:
    """The hub's store (`wait_for_status`): a report's waiter is called only once the status
    writer says a status folded from a snapshot at or after it was written; per run."""
    store = ReportStore(wait_for_status=True)
    done: list[str] = []
    v1 = store.apply("a", report("a", 1)).version
    seen = store.version("u1")  # the reconcile pass reads this before its snapshot
    v2 = store.apply("a", report("a", 2, final=True)).version
    other = store.apply("a", report("a", 1, uid="u2")).version
    store.when_durable("u1", v1, lambda: done.append("r1"))
    store.when_durable("u1", v2, lambda: done.append("r2"))
    store.when_durable("u2", other, lambda: done.append("u2"))
    assert (v1, seen, v2, other, done, store.awaiting()) == (1, 1, 2, 1, [], 3)
    store.persisted("u1", seen)  # that status write did not include report 2
    assert done == ["r1"]
    store.persisted("u1", 1)  # an older write changes nothing
    store.persisted("u1", store.version("u1"))
    assert done == ["r1", "r2"]
    store.when_durable("u1", v2, lambda: done.append("again"))  # already durable: at once
    assert done[-1] == "again"
    store.forget("u2")  # its resource is gone: nothing left to keep
    assert done[-1] == "u2" and store.awaiting() == 0


def test_without_a_status_writer_a_report_is_durable_once_applied() -> None:
    store = ReportStore()
    done: list[int] = []
    applied = store.apply("a", report("a", 1))
    store.when_durable("u1", applied.version, lambda: done.append(applied.version))
    assert done == [1]
