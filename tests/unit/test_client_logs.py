"""A failed client's log: the launcher's tail after "ClientApp raised an exception", the
agent's POST /v1/client-log (and its off switch), the report over real mTLS gRPC, the status
row and its bounds (docs/status-path.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import re
from collections import deque
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from fl_fixtures import REF, spec

from agent_addon.agent import Agent, AgentConfig, client_logs_on
from hack.testing import TestPKI, await_for, free_port
from hub_controller.aggregator.servicer import AggregatorServer, ReloadingServerCredentials
from hub_controller.aggregator.store import ReportStore
from hub_controller.membership import ClusterResolution, StaticMembers
from hub_controller.operator.fold import MAX_ROWS_WITH_LOG, fold, log_headline
from hub_controller.operator.observed import JobState, Observations, PlacementState, WorkState
from ocmfl import constants
from ocmfl.reports import MAX_CLIENT_LOG, MAX_LOG_LINE, ReportInvalid, client_log_tail
from ocmfl.reports import validate_report as validate
from ocmfl.status.v1 import report_pb2
from workloads import client_launcher as launcher

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# As Flower prints it: coloured levels, and the SuperNode's own lines after the traceback.
TRACEBACK = [
    "\x1b[92mINFO \x1b[0m:      Received: train message 1a2b\n",
    "\x1b[91mERROR \x1b[0m:     ClientApp raised an exception\n",
    "Traceback (most recent call last):\n",
    '  File "/app/task.py", line 12, in train\n',
    "    raise ValueError('labels 10 and 11 are not in the data of this cluster')\n",
    "ValueError: labels 10 and 11 are not in the data of this cluster\n",
    "\x1b[92mINFO \x1b[0m:      Sent successfully\n",
]
PLAIN = [re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip("\n") for line in TRACEBACK]


def _report(log: str) -> report_pb2.Report:
    r = report_pb2.Report(
        cluster="cluster-a", fl_namespace=REF.namespace, fl_name=REF.name, fl_uid=REF.uid,
        client_phase=report_pb2.CLIENT_PHASE_RUNNING, round=1, sequence=1, client_log=log,
    )  # fmt: skip
    r.timestamp.FromDatetime(T0)
    return r


# --- the tail --------------------------------------------------------------------------------
def test_the_tail_escapes_control_bytes_and_cuts_long_lines_and_old_ones() -> None:
    lines = [f"line {i}\n" for i in range(5000)]
    lines += ["\x1b[31mred\x1b[0m and a NUL \x00 here\r\n", "x" * 1000, "ünïcødé 😀\x07\n"]
    tail = client_log_tail(lines)
    assert len(tail) <= MAX_CLIENT_LOG
    out = tail.splitlines()
    assert out[0].startswith("[") and out[0].endswith(" earlier lines cut]")
    assert out[-3] == "red and a NUL \\x00 here"  # colour codes go, other control bytes show
    assert out[-2] == "x" * MAX_LOG_LINE + "[... 700 characters cut]"
    assert out[-1] == "ünïcødé 😀\\x07"
    assert out[-4] == "line 4999"
    validate(_report(tail), now=T0)  # what the agent makes, the hub takes


@pytest.mark.parametrize(
    ("log", "why"),
    [("a\x1b[2Jb", "only printable text"), ("x" * (MAX_CLIENT_LOG + 1), "at most 4096")],
)
def test_the_hub_refuses_a_raw_or_oversized_log(log: str, why: str) -> None:
    with pytest.raises(ReportInvalid) as err:
        validate(_report(log), now=T0)
    assert err.value.field == "client_log" and why in str(err.value)


def test_only_off_switches_client_logs_off() -> None:
    assert not any(map(client_logs_on, ["off", "OFF", " false ", "no", "0"]))
    # OCM leaves a variable a per-cluster config does not set as its template text
    assert all(map(client_logs_on, ["on", "", "{{CLIENT_LOGS}}", "true"]))


# --- launcher -> agent -> hub ----------------------------------------------------------------
@pytest.fixture
def tpki(tmp_path: Any) -> TestPKI:
    return TestPKI(tmp_path)


@pytest.fixture
async def hub(tpki: TestPKI) -> AsyncIterator[AggregatorServer]:
    server = AggregatorServer(
        ReportStore(),
        StaticMembers(["cluster-a"]),
        credentials=ReloadingServerCredentials.from_dir(tpki.server_dir()),
        address=f"127.0.0.1:{free_port()}",
    )
    await server.start()
    yield server
    await server.stop(None)


async def _agent(tpki: TestPKI, hub: AggregatorServer, client_logs: bool) -> Agent:
    agent = Agent(
        AgentConfig(
            cluster="cluster-a", hub_address=f"127.0.0.1:{hub.port}",
            cert_dir=tpki.client_dir("cluster-a"), watch=False, listen_host="127.0.0.1",
            port=0, health_port=None, backoff_initial_s=0.05, backoff_max_s=0.3,
            client_logs=client_logs,
        )
    )  # fmt: skip
    await agent.start()
    return agent


@pytest.fixture
def client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The env the client pod's launcher has (its federation; no token without a watch)."""
    monkeypatch.setenv(constants.ENV_FL_NAMESPACE, REF.namespace)
    monkeypatch.setenv(constants.ENV_FL_NAME, REF.name)
    monkeypatch.setenv(constants.ENV_FL_UID, REF.uid)


async def _pump(reporter: launcher.LogReporter, tail: deque[str], lines: list[str]) -> None:
    """The SuperNode's output through the launcher's reader, as in `supervise`."""
    out = launcher._Output(on_app_error=reporter.app_raised, tail=tail)
    await asyncio.to_thread(out.pump, io.StringIO("".join(lines)))


async def test_a_raising_clientapps_traceback_reaches_the_hub(
    tpki: TestPKI, hub: AggregatorServer, client_env: None
) -> None:
    agent = await _agent(tpki, hub, client_logs=True)
    try:
        endpoint = f"http://127.0.0.1:{agent.port}"
        tail: deque[str] = deque(maxlen=launcher.LOG_TAIL_LINES)
        reporter = launcher.LogReporter(endpoint, lambda: list(tail), settle_s=0.1)
        await _pump(reporter, tail, TRACEBACK)
        await await_for(lambda: reporter.sent == 1, 10, "the launcher's post")
        await await_for(
            lambda: "cluster-a" in hub.store.snapshot(REF.uid), 10, "the report at the hub"
        )
        log = hub.store.snapshot(REF.uid)["cluster-a"].client_log
        assert log.splitlines() == PLAIN
        # every round may raise: one post per LOG_MIN_INTERVAL_S
        await _pump(reporter, tail, TRACEBACK)
        assert reporter.sent == 1 and not reporter._pending
    finally:
        await agent.stop()


async def test_a_cluster_with_client_logs_off_sends_none(
    tpki: TestPKI, hub: AggregatorServer, client_env: None
) -> None:
    agent = await _agent(tpki, hub, client_logs=False)
    try:
        body = {"log": "".join(TRACEBACK), "fl_namespace": REF.namespace, "fl_name": REF.name}
        url = f"http://127.0.0.1:{agent.port}{constants.CLIENT_LOG_PATH}"
        async with aiohttp.ClientSession() as s, s.post(url, data=json.dumps(body)) as r:
            answer = (r.status, await r.json())
        assert answer[0] == 200 and answer[1]["accepted"] is False
        assert "CLIENT_LOGS" in answer[1]["reason"]
        assert len(agent.buffer) == 0 and agent.buffer.acked == 0
        assert agent.health()["clientLogs"] is False
    finally:
        await agent.stop()


async def test_a_bad_client_log_post_gets_400_naming_the_field(
    tpki: TestPKI, hub: AggregatorServer
) -> None:
    agent = await _agent(tpki, hub, client_logs=True)
    try:
        url = f"http://127.0.0.1:{agent.port}{constants.CLIENT_LOG_PATH}"
        for body in ({"log": ""}, {"log": 3}, ["x"]):
            async with aiohttp.ClientSession() as s, s.post(url, data=json.dumps(body)) as r:
                status, error = r.status, (await r.json())["error"]
            assert status == 400, body
            assert error.startswith(("log:", "body must be")), error
        assert len(agent.buffer) == 0
    finally:
        await agent.stop()


# --- the status ------------------------------------------------------------------------------
def _obs(store: ReportStore, clusters: list[str]) -> Observations:
    return Observations(
        placement=PlacementState(exists=True, satisfied="True"),
        resolutions=tuple(ClusterResolution(c, f"/d/{c}", "") for c in clusters),
        works={c: WorkState(cluster=c, name="w", applied=True) for c in clusters},
        server_job=JobState(exists=True, active=1),
        server_address="127.0.0.1:9443",
        reports=store.snapshot(REF.uid),
    )


def test_the_log_reaches_the_clusters_row_and_its_reason() -> None:
    store = ReportStore()
    store.apply("cluster-a", _report(client_log_tail(TRACEBACK)))
    status = fold(spec(), 1, _obs(store, ["cluster-a", "cluster-b"]), None, T0)
    rows = {r.name: r for r in status.clusters}
    assert rows["cluster-a"].client_log and "ValueError: labels 10" in rows["cluster-a"].client_log
    assert rows["cluster-a"].reason.endswith(
        "its client's log says: ValueError: labels 10 and 11 are not in the data of this "
        "cluster (ocm-fl logs)"
    )
    assert rows["cluster-b"].client_log is None and "log" not in rows["cluster-b"].reason
    # a later report without a log keeps it; so does a restarted hub (the last status)
    later = dataclasses.replace(store.snapshot(REF.uid)["cluster-a"], client_log="")
    again = fold(spec(), 1, _obs_with(later), status, T0)
    assert {r.name: r for r in again.clusters}["cluster-a"].client_log == rows[
        "cluster-a"
    ].client_log


def _obs_with(report: Any) -> Observations:
    obs = _obs(ReportStore(), ["cluster-a", "cluster-b"])
    return dataclasses.replace(obs, reports={"cluster-a": report})


def test_at_most_twenty_rows_carry_a_log() -> None:
    store = ReportStore()
    clusters = [f"c{i:02d}" for i in range(MAX_ROWS_WITH_LOG + 5)]
    for c in clusters:
        store.apply(c, _with(c))
    status = fold(spec(), 1, _obs(store, clusters), None, T0)
    with_log = [r.name for r in status.clusters if r.client_log]
    assert with_log == clusters[:MAX_ROWS_WITH_LOG]
    assert all("its client's log says" in r.reason for r in status.clusters)


def _with(cluster: str) -> report_pb2.Report:
    r = _report(client_log_tail(["y" * 250] * 20))
    r.cluster = cluster
    return r


@pytest.mark.parametrize(
    ("log", "headline"),
    [
        ("\n".join(PLAIN), "ValueError: labels 10 and 11 are not in the data of this cluster"),
        (  # chained: the last traceback's exception
            "Traceback (most recent call last):\n  x\nKeyError: 'a'\n\nDuring handling...\n"
            "Traceback (most recent call last):\n  y\nRuntimeError: b\nINFO : done",
            "RuntimeError: b",
        ),
        ("ocm-fl-client: failed: no server\n\n", "ocm-fl-client: failed: no server"),
    ],
)
def test_the_reason_names_the_exception_not_the_lines_after_it(log: str, headline: str) -> None:
    assert log_headline(log) == headline
