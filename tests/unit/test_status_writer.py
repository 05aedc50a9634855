"""ReportStore folding and the coalescing StatusWriter (with an in-memory status client)."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from hub_controller.aggregator import ReportStore, StatusWriter, merge_cluster_rows
from hub_controller.aggregator.writer import ConflictError, GoneError
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
    seen: list[tuple[str, str]] = []
    store.subscribe(lambda ns, n: seen.append((ns, n)))
    now = dt.datetime.now(dt.UTC)
    store.apply("a", report("a", 2, acc=0.7, when=now))
    store.apply("a", report("a", 1, acc=0.5, when=now - dt.timedelta(seconds=5)))  # late
    row = store.snapshot("fl", "job")["a"]
    assert (row.round, row.accuracy, sorted(row.rounds)) == (
        2,
        0.7,
        [(1, "evaluate"), (2, "evaluate")],
    )
    assert seen == [("fl", "job")] * 2
    store.apply("a", report("a", 1, uid="u2"))  # the resource was recreated
    assert store.snapshot("fl", "job")["a"].round == 1


def test_merge_keeps_fields_other_writers_own() -> None:
    store = ReportStore()
    store.apply("a", report("a", 3, acc=0.9, final=True, phase=report_pb2.CLIENT_PHASE_SUCCEEDED))
    existing: list[dict[str, Any]] = [
        {"name": "a", "phase": "Applied", "dataPath": "/data", "workApplied": True},
        {"name": "b", "phase": "Pending"},
    ]
    rows = merge_cluster_rows(existing, store.snapshot("fl", "job"))
    assert rows[0]["dataPath"] == "/data" and rows[0]["workApplied"] is True
    assert (rows[0]["phase"], rows[0]["round"], rows[0]["accuracy"]) == ("Succeeded", 3, 0.9)
    assert rows[1] == {"name": "b", "phase": "Pending"}


class FakeStatusClient:
    def __init__(self) -> None:
        self.obj: dict[str, Any] = {
            "metadata": {"resourceVersion": "1"},
            "status": {"clusters": [{"name": "a", "dataPath": "/d"}]},
        }
        self.patches: list[dict[str, Any]] = []
        self.conflicts = 0
        self.gone = False

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        if self.gone:
            raise GoneError(name)
        return copy.deepcopy(self.obj)

    async def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise ConflictError("changed")
        assert body["metadata"]["resourceVersion"] == self.obj["metadata"]["resourceVersion"]
        self.patches.append(body)
        self.obj["status"].update(body["status"])
        self.obj["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)


async def test_writer_coalesces_bursts_into_one_patch_per_interval() -> None:
    store, client = ReportStore(), FakeStatusClient()
    writer = StatusWriter(store, client, interval_s=0.3)
    await writer.start()
    try:
        for r in range(1, 51):
            store.apply("a", report("a", r, acc=r / 100))
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.5)
        assert 1 <= len(client.patches) <= 3
        [row] = client.obj["status"]["clusters"]
        assert (row["round"], row["accuracy"], row["dataPath"]) == (50, 0.5, "/d")
    finally:
        await writer.stop()


async def test_writer_retries_conflicts_and_forgets_deleted_resources() -> None:
    store, client = ReportStore(), FakeStatusClient()
    client.conflicts = 2
    writer = StatusWriter(store, client, interval_s=0.05)
    await writer.start()
    try:
        store.apply("a", report("a", 1))
        await asyncio.sleep(0.2)
        assert len(client.patches) == 1
        client.gone = True
        store.apply("a", report("a", 2))
        await asyncio.sleep(0.2)
        assert store.snapshot("fl", "job") == {}
    finally:
        await writer.stop(flush=False)


async def test_writer_notified_from_another_thread() -> None:
    store, client = ReportStore(), FakeStatusClient()
    writer = StatusWriter(store, client, interval_s=0.05)
    await writer.start()
    try:
        await asyncio.to_thread(store.apply, "a", report("a", 4))
        await asyncio.sleep(0.2)
        assert client.obj["status"]["clusters"][0]["round"] == 4
    finally:
        await writer.stop()
