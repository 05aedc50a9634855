"""The addon agent: local API, buffering, and delivery to a real mTLS aggregator."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent_addon.agent import Agent, AgentConfig
from agent_addon.buffer import ReportBuffer
from agent_addon.phase import derive_client_phase, phases_by_run, runs_by_pod_ip
from agent_addon.state import AgentState, BadRequest, Forbidden, PostScope, parse_metrics_post
from hack.testing import TestPKI, await_for, free_port
from hub_controller.aggregator.servicer import AggregatorServer, ReloadingServerCredentials
from hub_controller.aggregator.store import ReportStore
from hub_controller.membership import StaticMembers
from ocmfl import constants, pki
from ocmfl.status.v1 import report_pb2

pytestmark = pytest.mark.timeout(60)

RUN = ("fl", "mnist")
POST: dict[str, Any] = {
    "cluster": "cluster-a",
    "round": 1,
    "phase": "fit",
    "loss": 0.7,
    "accuracy": 0.6,
    "samples": 120,
    "duration_s": 2.0,
    "fl_namespace": "fl",
    "fl_name": "mnist",
    "fl_uid": "0a1b-2c3d",
}


# --- pure parts ----------------------------------------------------------------------------
def test_metrics_post_is_parsed() -> None:
    post = parse_metrics_post(POST, PostScope("cluster-a", {}))
    assert (post.round, post.phase, post.accuracy, post.fl_name) == (1, "fit", 0.6, "mnist")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"phase": "train"}, "phase"),
        ({"round": 0}, "round"),
        ({"round": "1"}, "round"),
        ({"accuracy": 2}, "accuracy"),
        ({"loss": float("inf")}, "loss"),
        ({"samples": -1}, "samples"),
        ({"cluster": "cluster-b"}, "cluster"),
        ({"fl_namespace": "Bad_NS"}, "fl_namespace"),
        ({"duration_s": -1}, "duration_s"),
    ],
)
def test_bad_metrics_posts_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(BadRequest, match=f"^{field}:"):
        parse_metrics_post({**POST, **change}, PostScope("cluster-a", {}))


def test_run_is_inferred_only_when_exactly_one_is_active() -> None:
    body = {k: v for k, v in POST.items() if not k.startswith("fl_")}
    post = parse_metrics_post(body, PostScope("cluster-a", {RUN: "u1"}))
    assert (post.fl_namespace, post.fl_name, post.fl_uid) == ("fl", "mnist", "u1")
    with pytest.raises(BadRequest, match="fl_namespace, fl_name"):
        parse_metrics_post(body, PostScope("cluster-a", {}))


def test_a_client_pod_posts_only_for_its_own_run() -> None:
    """Attributed by its address, a tenant's client cannot write another run's status."""
    mine = (("fl", "mnist"), "0a1b-2c3d")
    body = {k: v for k, v in POST.items() if not k.startswith("fl_")}
    post = parse_metrics_post(body, PostScope("cluster-a", {}, mine))
    assert (post.fl_namespace, post.fl_name, post.fl_uid) == ("fl", "mnist", "0a1b-2c3d")
    assert parse_metrics_post(POST, PostScope("cluster-a", {}, mine)).fl_name == "mnist"
    other = {**POST, "fl_namespace": "tenant-b", "fl_name": "mnist", "fl_uid": ""}
    with pytest.raises(Forbidden, match="belongs to fl/mnist, not tenant-b/mnist"):
        parse_metrics_post(other, PostScope("cluster-a", {}, mine))
    with pytest.raises(Forbidden, match=r"^fl_uid"):
        parse_metrics_post({**POST, "fl_uid": "ffff"}, PostScope("cluster-a", {}, mine))


def test_client_pod_addresses_name_their_runs() -> None:
    def pod(ip: str, phase: str, name: str, uid: str) -> dict[str, Any]:
        p = _pod(phase, uid)
        p["metadata"]["labels"][constants.LABEL_OWNER_NAME] = name
        p["status"]["podIP"] = ip
        return p

    pods = [
        pod("10.0.0.2", "Running", "mnist", "a"),
        pod("10.0.0.3", "Succeeded", "mnist", "b"),  # finished: its address may be reused
        pod("10.0.0.4", "Running", "mnist", "c"),
        pod("10.0.0.4", "Running", "cifar", "d"),  # two runs on one address: not telling
        pod("10.0.0.5", "Pending", "cifar", "e"),
    ]
    assert runs_by_pod_ip(pods) == {
        "10.0.0.2": (("fl", "mnist"), POST["fl_uid"]),
        "10.0.0.5": (("fl", "cifar"), POST["fl_uid"]),
    }


def test_nan_accuracy_counts_as_absent() -> None:
    post = parse_metrics_post({**POST, "accuracy": float("nan")}, PostScope("cluster-a", {}))
    assert post.accuracy is None


def test_buffer_drops_oldest_but_never_the_final_report() -> None:
    buf = ReportBuffer(capacity=3)
    final = buf.add(report_pb2.Report(final=True))
    for _ in range(5):
        buf.add(report_pb2.Report())
    assert len(buf) == 3 and buf.dropped == 3
    assert buf.pending()[0] is final
    assert [r.sequence for r in buf.pending()] == [1, 5, 6]
    assert buf.ack(5) and not buf.ack(5)
    assert [r.sequence for r in buf.pending(after=1)] == [6]


def _pod(phase: str, uid: str = "p1") -> dict[str, Any]:
    return {
        "metadata": {
            "uid": uid,
            "labels": {
                constants.LABEL_COMPONENT: "client",
                constants.LABEL_OWNER_NAMESPACE: "fl",
                constants.LABEL_OWNER_NAME: "mnist",
                constants.LABEL_OWNER_UID: POST["fl_uid"],
            },
        },
        "status": {"phase": phase},
    }


def _job(cond: str | None) -> dict[str, Any]:
    job = _pod("", "j1")
    job["status"] = {"conditions": [{"type": cond, "status": "True"}] if cond else []}
    return job


@pytest.mark.parametrize(
    ("pods", "jobs", "phase"),
    [
        ([], [], None),
        ([_pod("Pending")], [], report_pb2.CLIENT_PHASE_PENDING),
        ([_pod("Running"), _pod("Failed", "p2")], [_job(None)], report_pb2.CLIENT_PHASE_RUNNING),
        ([_pod("Succeeded")], [_job("Complete")], report_pb2.CLIENT_PHASE_SUCCEEDED),
        ([_pod("Failed")], [_job("Failed")], report_pb2.CLIENT_PHASE_FAILED),
        ([_pod("Failed")], [_job(None)], report_pb2.CLIENT_PHASE_PENDING),  # job retries
        ([_pod("Failed")], [], report_pb2.CLIENT_PHASE_FAILED),
    ],
)
def test_client_phase_from_pods_and_jobs(
    pods: list[dict[str, Any]], jobs: list[dict[str, Any]], phase: int | None
) -> None:
    assert derive_client_phase(pods, jobs) == phase


def test_phase_changes_become_reports_and_completion_is_final() -> None:
    state = AgentState("cluster-a", ReportBuffer())
    assert len(state.on_phases(phases_by_run([_pod("Pending")], []))) == 1
    assert state.on_phases(phases_by_run([_pod("Pending")], [])) == []  # no change, no report
    [running] = state.on_phases(phases_by_run([_pod("Running")], []))
    assert running.client_phase == report_pb2.CLIENT_PHASE_RUNNING and not running.final
    [done] = state.on_phases(phases_by_run([_pod("Succeeded")], [_job("Complete")]))
    assert done.final and done.fl_uid == POST["fl_uid"]
    assert state.on_phases({}) == []  # vanished after its final report: nothing more


def test_client_vanishing_mid_run_sends_a_final_report() -> None:
    state = AgentState("cluster-a", ReportBuffer())
    state.on_phases(phases_by_run([_pod("Running")], []))
    [last] = state.on_phases({})
    assert last.final and last.client_phase == report_pb2.CLIENT_PHASE_RUNNING


# --- agent against a real aggregator -------------------------------------------------------
@pytest.fixture
def tpki(tmp_path: Path) -> TestPKI:
    return TestPKI(tmp_path)


class Hub:
    """An aggregator that can be stopped and started again on the same port."""

    def __init__(self, tpki: TestPKI) -> None:
        self.store = ReportStore()
        self.registry = StaticMembers(["cluster-a"])
        self.server_dir = tpki.server_dir()
        self.port = free_port()
        self.server: AggregatorServer | None = None

    async def start(self) -> None:
        self.server = AggregatorServer(
            self.store,
            self.registry,
            credentials=ReloadingServerCredentials.from_dir(self.server_dir),
            address=f"127.0.0.1:{self.port}",
        )
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
            self.server = None


@pytest.fixture
async def hub(tpki: TestPKI) -> AsyncIterator[Hub]:
    h = Hub(tpki)
    await h.start()
    yield h
    await h.stop()


@pytest.fixture
async def agent(tpki: TestPKI, hub: Hub) -> AsyncIterator[Agent]:
    config = AgentConfig(
        cluster="cluster-a",
        hub_address=f"127.0.0.1:{hub.port}",
        cert_dir=tpki.client_dir("cluster-a"),
        watch=False,
        listen_host="127.0.0.1",
        port=0,
        health_port=None,
        buffer_size=50,
        backoff_initial_s=0.05,
        backoff_max_s=0.3,
        cert_check_interval_s=0.1,
    )
    a = Agent(config)
    await a.start()
    yield a
    await a.stop()


async def _eventually(cond: Any, timeout: float = 10.0) -> None:
    await await_for(cond, timeout, "the condition", interval=0.02)


async def post(agent: Agent, body: Any) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{agent.port}/v1/metrics", data=json.dumps(body)) as r,
    ):
        return r.status, await r.json()


async def test_posted_metrics_reach_the_hub(agent: Agent, hub: Hub) -> None:
    status, body = await post(agent, POST)
    assert status == 202 and body["sequence"] == 1
    await _eventually(lambda: "cluster-a" in hub.store.snapshot(POST["fl_uid"]))
    row = hub.store.snapshot(POST["fl_uid"])["cluster-a"]
    assert (row.phase, row.round, row.samples, row.loss) == ("Running", 1, 120, 0.7)
    await _eventually(lambda: len(agent.buffer) == 0)
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{agent.port}/healthz") as r:
        health = await r.json()
    assert health["hubConnected"] and health["delivered"] == 1


async def test_bad_post_gets_400_with_a_message(agent: Agent) -> None:
    status, body = await post(agent, {**POST, "phase": "train"})
    assert status == 400 and body["error"].startswith("phase:")
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{agent.port}/v1/metrics", data=b"{nope") as r,
    ):
        assert r.status == 400 and "not JSON" in (await r.json())["error"]


class _Watcher:
    """Stands in for the pod watcher: every peer is a client pod of ("fl", "other")."""

    def run_at(self, ip: str) -> tuple[tuple[str, str], str]:
        return ("fl", "other"), "u-other"

    def stop(self) -> None:
        pass


async def test_a_client_pod_posting_for_another_run_gets_403(agent: Agent, hub: Hub) -> None:
    agent._watcher = _Watcher()  # type: ignore[assignment]
    status, body = await post(agent, POST)
    assert status == 403 and "belongs to fl/other" in body["error"]
    unnamed = {k: v for k, v in POST.items() if not k.startswith("fl_")}
    status, _ = await post(agent, unnamed)
    assert status == 202
    await _eventually(lambda: "cluster-a" in hub.store.snapshot("u-other"))
    assert "cluster-a" not in hub.store.snapshot(POST["fl_uid"])


async def test_hub_restart_mid_stream_loses_no_final_report(agent: Agent, hub: Hub) -> None:
    await post(agent, POST)
    await _eventually(lambda: agent.buffer.acked == 1)
    await hub.stop()
    # while the hub is down: more rounds than the buffer holds, then the final report
    for r in range(2, 80):
        status, _ = await post(agent, {**POST, "round": r})
        assert status == 202
    agent.state.on_phases(phases_by_run([_pod("Succeeded")], [_job("Complete")]))
    assert agent.buffer.has_final() and agent.buffer.dropped > 0
    hub.store = ReportStore()  # a restarted hub remembers nothing
    await hub.start()
    await _eventually(lambda: len(agent.buffer) == 0)
    row = hub.store.snapshot(POST["fl_uid"])["cluster-a"]
    assert row.final and row.phase == "Succeeded" and row.round == 79


async def test_client_certificate_rotation_keeps_reports_flowing(
    agent: Agent, hub: Hub, tpki: TestPKI
) -> None:
    await post(agent, POST)
    await _eventually(lambda: agent.buffer.acked == 1)
    connects = agent.streamer.connects
    new = tpki.rotate_client(agent.config.cert_dir, "cluster-a")
    await _eventually(lambda: agent.streamer.rotations == 1)
    for r in range(2, 6):
        await post(agent, {**POST, "round": r})
    await _eventually(lambda: agent.buffer.acked == 5)
    assert agent.streamer.connects == connects + 1
    assert hub.store.snapshot(POST["fl_uid"])["cluster-a"].round == 5
    assert new.cert.not_valid_after_utc > dt.datetime.now(dt.UTC)


async def test_both_sides_rotating_keeps_reports_flowing(
    agent: Agent, hub: Hub, tpki: TestPKI
) -> None:
    await post(agent, POST)
    await _eventually(lambda: agent.buffer.acked == 1)
    tpki.rotate_server(hub.server_dir)
    tpki.rotate_client(agent.config.cert_dir, "cluster-a")
    await _eventually(lambda: agent.streamer.rotations == 1)
    await post(agent, {**POST, "round": 2})
    await _eventually(lambda: agent.buffer.acked == 2)
    assert hub.server is not None and hub.server.credentials is not None
    assert hub.server.credentials.reloads == 1


async def test_agent_with_a_foreign_certificate_keeps_its_reports(
    tpki: TestPKI, hub: Hub, tmp_path: Path
) -> None:
    other = TestPKI(tmp_path / "other")
    cert_dir = other.client_dir("cluster-a")
    pki.write_atomic(cert_dir / pki.CA_FILE, pki.cert_to_pem(tpki.ca.cert))
    a = Agent(
        AgentConfig(
            cluster="cluster-a",
            hub_address=f"127.0.0.1:{hub.port}",
            cert_dir=cert_dir,
            watch=False,
            listen_host="127.0.0.1",
            port=0,
            health_port=None,
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
            cert_check_interval_s=0.1,
        )
    )
    await a.start()
    try:
        await post(a, POST)
        await _eventually(lambda: a.streamer.last_error is not None)
        await asyncio.sleep(0.3)
        assert len(a.buffer) == 1 and hub.store.snapshot(POST["fl_uid"]) == {}
        # the cluster gets a certificate from the right CA: the report goes through
        tpki.rotate_client(cert_dir, "cluster-a")
        await _eventually(lambda: len(a.buffer) == 0)
        assert "cluster-a" in hub.store.snapshot(POST["fl_uid"])
    finally:
        await a.stop()


def test_buffer_save_and_load_round_trip(tmp_path: Path) -> None:
    buf = ReportBuffer()
    for r in range(1, 4):
        buf.add(report_pb2.Report(cluster="cluster-a", round=r, final=r == 3))
    buf.ack(1)
    path = tmp_path / "pending.bin"
    buf.save(path)
    assert not buf.dirty
    with path.open("ab") as f:  # a torn write at the tail is ignored
        f.write(b"\x00\x00\x01")
    again = ReportBuffer()
    assert again.load(path) == 2
    assert [(r.round, r.final, r.sequence) for r in again.pending()] == [
        (2, False, 1),
        (3, True, 2),
    ]
    assert ReportBuffer().load(tmp_path / "missing") == 0


async def test_final_report_survives_an_agent_restart_while_the_hub_is_down(
    tpki: TestPKI, hub: Hub, tmp_path: Path
) -> None:
    await hub.stop()
    config = AgentConfig(
        cluster="cluster-a",
        hub_address=f"127.0.0.1:{hub.port}",
        cert_dir=tpki.client_dir("cluster-a"),
        watch=False,
        listen_host="127.0.0.1",
        port=0,
        health_port=None,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        state_dir=tmp_path / "state",
    )
    first = Agent(config)
    await first.start()
    await post(first, POST)
    first.on_phases(phases_by_run([_pod("Succeeded")], [_job("Complete")]))
    assert (tmp_path / "state" / "pending-reports.bin").exists()  # saved at once
    await first.stop()

    await hub.start()
    second = Agent(config)
    await second.start()
    try:
        await _eventually(lambda: len(second.buffer) == 0)
        row = hub.store.snapshot(POST["fl_uid"])["cluster-a"]
        assert row.final and row.phase == "Succeeded" and row.round == 1
    finally:
        await second.stop()


def test_the_agent_takes_one_hub_kubeconfig_and_a_writable_cert_dir(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agent_addon.agent import parse_args

    base = ["--cluster", "c1", "--hub-address", "hub:9443"]
    monkeypatch.setenv(constants.ENV_HUB_KUBECONFIG, "/managed/hub-kubeconfig/kubeconfig")
    config = parse_args(base)
    assert config.hub_kubeconfig == "/managed/hub-kubeconfig/kubeconfig"
    assert str(config.cert_dir) == constants.AGENT_CERT_DIR == "/var/run/ocm-fl/agent-tls"
    assert parse_args([*base, "--hub-kubeconfig", "/k"]).hub_kubeconfig == "/k"
    monkeypatch.delenv(constants.ENV_HUB_KUBECONFIG)
    assert parse_args(base).hub_kubeconfig is None
    for gone in ("--csr-hub-kubeconfig", "--fleet-hub-kubeconfig"):
        with pytest.raises(SystemExit):
            parse_args([*base, gone, "/k"])
