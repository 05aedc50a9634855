"""Issue 12, reports, local API, names and ownership: attacks by a tenant or a member cluster.

Each test plays the attacker against the real code path (the aggregator over real mTLS gRPC on
127.0.0.1 with real certificates; the agent's real aiohttp app; the operator's real reconcile
pass with a recording fake of the API layer) and asserts the refusal a user would see.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import grpc.aio
import kopf
import pytest
from aiohttp import web
from google.protobuf.timestamp_pb2 import Timestamp

from agent_addon.buffer import ReportBuffer
from agent_addon.local_api import make_app
from agent_addon.state import AgentState
from agent_addon.tokens import TokenCheck
from hack.testing import TestPKI
from hub_controller.aggregator.limits import Limits
from hub_controller.aggregator.scope import WorkScope
from hub_controller.aggregator.servicer import AggregatorServer, ReloadingServerCredentials
from hub_controller.aggregator.store import ReportStore, StoreLimits
from hub_controller.api import FLRef, claim_placement, parse_spec
from hub_controller.membership import ClusterInfo, StaticMembers
from hub_controller.operator import reconcile as reconciler
from hub_controller.operator.desired import works as works_mod
from hub_controller.operator.indexes import Indexes, Owned, gather
from hub_controller.operator.observed import DecisionState, PlacementState, WorkState
from hub_controller.reports import NoReports
from ocmfl import constants, pki
from ocmfl.kube import object_path
from ocmfl.names import cluster_side_name
from ocmfl.status.stream import hub_acks
from ocmfl.status.v1 import report_pb2, report_pb2_grpc

pytestmark = [pytest.mark.attack, pytest.mark.timeout(120)]
LOG = logging.getLogger("attack")

# Tenant A's federation runs on cluster-a; tenant B's on cluster-b only.
FED_A = ("team-a", "digits", "uid-a")
FED_B = ("team-b", "digits", "uid-b")


def report(cluster: str, fed: tuple[str, str, str], seq: int, rnd: int = 1) -> report_pb2.Report:
    ts = Timestamp()
    ts.FromDatetime(dt.datetime.now(dt.UTC))
    ns, name, uid = fed
    return report_pb2.Report(
        cluster=cluster,
        fl_namespace=ns,
        fl_name=name,
        fl_uid=uid,
        client_phase=report_pb2.CLIENT_PHASE_RUNNING,
        round=rnd,
        timestamp=ts,
        sequence=seq,
        metrics=[
            report_pb2.RoundMetrics(
                round=rnd, phase=report_pb2.ROUND_PHASE_EVALUATE, loss=0.1, accuracy=0.99
            )
        ],
    )


def work_index() -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(cluster, uid) -> [(namespace, name)]: what `indexes.work_owner_idx` holds."""
    return {("cluster-a", FED_A[2]): [FED_A[:2]], ("cluster-b", FED_B[2]): [FED_B[:2]]}


@pytest.fixture
def tpki(tmp_path: Path) -> TestPKI:
    return TestPKI(tmp_path)


async def start_hub(tpki: TestPKI, limits: Limits, store: ReportStore) -> AggregatorServer:
    server = AggregatorServer(
        store,
        StaticMembers(["cluster-a", "cluster-b"]),
        credentials=ReloadingServerCredentials.from_dir(tpki.server_dir()),
        scope=WorkScope(work_index(), grace_s=0),
        limits=limits,
    )
    await server.start()
    return server


@pytest.fixture
async def hub(tpki: TestPKI) -> AsyncIterator[AggregatorServer]:
    server = await start_hub(tpki, Limits(), ReportStore())
    yield server
    await server.stop(None)


def channel(hub: AggregatorServer, tpki: TestPKI, cluster: str) -> grpc.aio.Channel:
    d = tpki.client_dir(cluster)
    creds = grpc.ssl_channel_credentials(
        root_certificates=pki.cert_to_pem(tpki.ca.cert),
        private_key=(d / pki.KEY_FILE).read_bytes(),
        certificate_chain=(d / pki.CERT_FILE).read_bytes(),
    )
    return grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds)


async def exchange(
    hub: AggregatorServer, tpki: TestPKI, cluster: str, reports: list[report_pb2.Report]
) -> tuple[list[report_pb2.Ack], grpc.aio.AioRpcError | None]:
    """Send reports one by one on one stream; the acks, and the error that ended it."""
    acks: list[report_pb2.Ack] = []
    async with channel(hub, tpki, cluster) as ch:
        call = report_pb2_grpc.StatusServiceStub(ch).StreamReports()
        # An iterator: a refusal as the stream opens can race the first write (first_ack).
        answers = hub_acks(call)
        try:
            for r in reports:
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    await call.write(r)
                acks.append(await anext(answers))
            await call.done_writing()
        except grpc.aio.AioRpcError as e:
            return acks, e
        except asyncio.InvalidStateError:
            pass
        return acks, None


# --- report spoofing -----------------------------------------------------------------------
async def test_report_for_a_federation_with_no_work_on_that_cluster_is_refused(
    hub: AggregatorServer, tpki: TestPKI
) -> None:
    """cluster-a (its own valid agent certificate) reports for tenant B's federation, which
    runs only on cluster-b: refused, nothing stored, and the stream stays usable."""
    acks, err = await exchange(
        hub,
        tpki,
        "cluster-a",
        [
            report("cluster-a", FED_B, 1),
            report("cluster-a", (*FED_A[:2], FED_B[2]), 2),  # A's name, B's uid
            report("cluster-a", FED_A, 3),  # its own federation: still accepted
        ],
    )
    assert err is None
    assert [a.sequence for a in acks] == [1, 2, 3]
    assert acks[0].refused.startswith("not_in_scope: cluster 'cluster-a' has no ManifestWork")
    assert "team-b/digits uid uid-b" in acks[0].refused
    assert acks[1].refused.startswith("not_in_scope:")
    assert acks[2].refused == ""
    assert hub.store.snapshot(FED_B[2]) == {}
    assert set(hub.store.snapshot(FED_A[2])) == {"cluster-a"}
    rejected = hub.metrics.registry.get_sample_value(
        "ocmfl_reports_rejected_total", {"reason": "not_in_scope"}
    )
    assert rejected == 2


async def test_the_agent_drops_a_report_the_hub_refused_for_good(
    hub: AggregatorServer, tpki: TestPKI
) -> None:
    """A refused report must not wedge the agent's buffer (it would resend it forever)."""
    from agent_addon.hub_client import ClientTLSFiles, HubStreamer

    buffer = ReportBuffer(10)
    buffer.add(report("cluster-a", FED_B, 1))
    buffer.add(report("cluster-a", FED_A, 1))
    d = tpki.client_dir("cluster-a")
    streamer = HubStreamer(
        f"127.0.0.1:{hub.port}",
        ClientTLSFiles.from_dir(d),
        buffer,
        backoff_initial_s=0.05,
        backoff_max_s=0.1,
        server_name="localhost",
    )
    streamer.start()
    try:
        await buffer.wait_empty(10)
    finally:
        await streamer.stop()
    assert len(buffer) == 0 and streamer.rejected == 1
    assert set(hub.store.snapshot(FED_A[2])) == {"cluster-a"}


# --- report floods -------------------------------------------------------------------------
async def test_report_flood_keeps_hub_memory_bounded(tpki: TestPKI) -> None:
    """A cluster floods its own federation with 3,000 reports of new rounds: the hub keeps at
    most the configured rows, refuses the rest by reason, and tenant A's metric series stay
    within their cap."""
    limits = Limits(max_rows_per_cluster=100, reports_per_s=1e6, report_burst=1_000_000)
    store = ReportStore(StoreLimits(max_rows_per_cluster=100, max_rows_per_run=150))
    hub = await start_hub(tpki, limits, store)
    try:
        flood = [report("cluster-a", FED_A, i, rnd=i) for i in range(1, 3001)]
        acks, err = await exchange(hub, tpki, "cluster-a", flood)
        assert err is None and len(acks) == 3000
        runs, entries, rows = store.size()
        assert (runs, entries) == (1, 1)
        assert rows == 100  # the newest rounds only
        snap = store.snapshot(FED_A[2])["cluster-a"]
        assert min(r for r, _ in snap.rounds) == 2901 and snap.round == 3000
        # cluster-b's rows would take the run past 150: refused, not stored
        b_in_a = {("cluster-b", FED_A[2]): [FED_A[:2]]}
        hub.servicer.scope = WorkScope({**work_index(), **b_in_a}, grace_s=0)
        acks, err = await exchange(
            hub, tpki, "cluster-b", [report("cluster-b", FED_A, i, rnd=i) for i in range(1, 80)]
        )
        assert err is None
        refused = [a for a in acks if a.refused]
        assert len(refused) == 79 - 50
        assert refused[0].refused.startswith("run_rows: run uid-a already has 150 rows")
        assert store.size()[2] == 150
    finally:
        await hub.stop(None)


async def test_a_flooding_cluster_is_throttled_to_its_rate_and_cut_off_past_it(
    tpki: TestPKI,
) -> None:
    """cluster-a floods on 4 streams at once: together they get its rate (50/s after a burst
    of 10), streams that would wait longer are cut off (RESOURCE_EXHAUSTED: the agent keeps
    the reports and resends later), and cluster-b's reports meanwhile pass at full speed."""
    limits = Limits(reports_per_s=50, report_burst=10, max_wait_s=0.03)
    hub = await start_hub(tpki, limits, ReportStore())
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        reports = [report("cluster-a", FED_A, i) for i in range(1, 41)]
        flood = asyncio.gather(*(exchange(hub, tpki, "cluster-a", reports) for _ in range(4)))
        await asyncio.sleep(0.1)
        b_started = loop.time()
        acks_b, err_b = await exchange(
            hub, tpki, "cluster-b", [report("cluster-b", FED_B, i) for i in range(1, 11)]
        )
        b_took = loop.time() - b_started
        results = await flood
        took = loop.time() - started
        assert err_b is None and len(acks_b) == 10 and b_took < 1.0
        errors = [e for _, e in results if e is not None]
        assert errors and all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in errors)
        assert "sends more than 50 reports/s: slow down and resend" in (errors[0].details() or "")
        accepted = sum(len(acks) for acks, _ in results)
        assert accepted < 160
        assert took >= (accepted - 10) / 50 * 0.9  # never faster than the rate
    finally:
        await hub.stop(None)


async def test_a_cluster_cannot_open_more_than_its_streams(tpki: TestPKI) -> None:
    hub = await start_hub(tpki, Limits(max_streams_per_cluster=2), ReportStore())
    try:
        async with channel(hub, tpki, "cluster-a") as ch:
            stub = report_pb2_grpc.StatusServiceStub(ch)
            calls = [stub.StreamReports() for _ in range(2)]
            for i, call in enumerate(calls, 1):  # both streams open and working
                await call.write(report("cluster-a", FED_A, i))
                assert (await call.read()).sequence == i
            acks, err = await exchange(hub, tpki, "cluster-a", [report("cluster-a", FED_A, 9)])
            assert err is not None and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "already has 2 open streams" in (err.details() or "")
            for call in calls:
                call.cancel()
        # once they are closed, the cluster may stream again
        await asyncio.sleep(0.2)
        acks, err = await exchange(hub, tpki, "cluster-a", [report("cluster-a", FED_A, 10)])
        assert err is None and [a.sequence for a in acks] == [10]
    finally:
        await hub.stop(None)


async def test_metric_label_sets_stay_bounded(tpki: TestPKI) -> None:
    """Refused reports add no series; accepted ones past the cap count under '_other'."""
    feds = [("team-a", f"fed-{i}", f"uid-{i}") for i in range(10)]
    hub = await start_hub(tpki, Limits(max_metric_series=3), ReportStore())
    hub.servicer.metrics.max_series = 3
    hub.servicer.scope = WorkScope(
        {("cluster-a", uid): [(ns, name)] for ns, name, uid in feds}, grace_s=0
    )
    try:
        spoofs = [report("cluster-a", (f"ns-{i}", "x", f"u-{i}"), i) for i in range(1, 51)]
        accepted = [report("cluster-a", fed, 100 + i) for i, fed in enumerate(feds)]
        acks, err = await exchange(hub, tpki, "cluster-a", spoofs + accepted)
        assert err is None and len(acks) == 60
        series = {
            tuple(sorted(s.labels.items()))
            for metric in hub.metrics.registry.collect()
            if metric.name == "ocmfl_reports_received"
            for s in metric.samples
            if s.name.endswith("_total")
        }
        assert len(series) == 4  # 3 federations + _other
        assert (
            hub.metrics.registry.get_sample_value(
                "ocmfl_reports_received_total",
                {"cluster": "_other", "namespace": "_other", "name": "_other"},
            )
            == 7
        )
    finally:
        await hub.stop(None)


# --- the agent's local metrics API ---------------------------------------------------------
def token_secret(fed: tuple[str, str, str], token: str) -> dict[str, Any]:
    """The Secret the federation's ManifestWork puts in its client namespace."""
    return {
        "metadata": {
            "name": constants.CLIENT_TOKEN_SECRET,
            "namespace": cluster_side_name(*fed[:2]),
            "labels": {constants.LABEL_OWNER_UID: fed[2]},
        },
        "data": {constants.CLIENT_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


@pytest.fixture
async def agent_api() -> AsyncIterator[tuple[str, AgentState]]:
    secrets = {
        (s["metadata"]["namespace"], s["metadata"]["name"]): s
        for s in (token_secret(FED_A, "a" * 43), token_secret(FED_B, "b" * 43))
    }
    state = AgentState("cluster-a", ReportBuffer(100))
    app = make_app(
        state,
        lambda: {},
        tokens=TokenCheck(lambda ns, name: secrets.get((ns, name))),
    )
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/v1/metrics", state
    await runner.cleanup()


async def post(url: str, fed: tuple[str, str, str], token: str | None) -> tuple[int, str]:
    body = {
        "round": 1,
        "phase": "evaluate",
        "loss": 0.0,
        "accuracy": 1.0,
        "samples": 10,
        "fl_namespace": fed[0],
        "fl_name": fed[1],
    }
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as r:
        return r.status, (await r.json()).get("error", "")


async def test_post_to_the_agent_without_the_token_is_refused(
    agent_api: tuple[str, AgentState],
) -> None:
    """Any pod on the cluster could reach the agent's Service: without the federation's token
    (mounted only into that federation's client pod) its post is refused and reports nothing."""
    url, state = agent_api
    status, error = await post(url, FED_A, None)
    assert status == 401
    assert error.startswith("Authorization: a bearer token is required")
    status, error = await post(url, FED_A, "guessed-" + "x" * 40)
    assert (status, error.split(" (")[0]) == (403, "Authorization: not the token of team-a/digits")
    # tenant B's client (holding B's token) posting for tenant A's federation
    status, error = await post(url, FED_A, "b" * 43)
    assert status == 403
    assert len(state.buffer) == 0
    # the rightful client: accepted, attributed to A's uid from A's Secret
    status, _ = await post(url, FED_A, "a" * 43)
    assert status == 202
    [queued] = state.buffer.pending()
    assert (queued.fl_namespace, queued.fl_uid) == ("team-a", "uid-a")


async def test_post_for_a_federation_without_a_client_here_is_refused(
    agent_api: tuple[str, AgentState],
) -> None:
    url, state = agent_api
    status, error = await post(url, ("team-c", "other", ""), "a" * 43)
    assert status == 403
    assert "team-c/other has no client here" in error
    assert len(state.buffer) == 0


def test_the_token_reaches_only_its_federations_client_pod() -> None:
    """The work carries the token Secret in the federation's own client namespace and mounts
    it into its client container; the SDK sends it as a bearer token."""
    ref = FLRef(namespace="team-a", name="digits", uid="uid-a")
    spec = parse_spec(SPEC, ref.name)
    from hub_controller.membership import ClusterResolution

    work = works_mod.desired_work(
        ref,
        spec,
        ClusterResolution("cluster-a", "/data", ""),
        "hub:9443",
        server_name="hub",
        client_token="t" * 43,
    )
    manifests = work["spec"]["workload"]["manifests"]
    [secret] = [m for m in manifests if m["metadata"]["name"] == constants.CLIENT_TOKEN_SECRET]
    assert secret["metadata"]["namespace"] == works_mod.client_namespace(ref)
    [job] = [m for m in manifests if m["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    [volume] = [
        v
        for v in pod["volumes"]
        if v.get("secret", {}).get("secretName") == (constants.CLIENT_TOKEN_SECRET)
    ]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True and mount["mountPath"] == constants.CLIENT_TOKEN_DIR


# --- injected PlacementDecision --------------------------------------------------------------
KEY = ("team-a", "digits")
REF = FLRef(namespace="team-a", name="digits", uid="uid-a")
PLACEMENT_UID = "placement-uid"
SPEC: dict[str, Any] = {
    "server": {
        "rounds": 1,
        "minAvailableClients": 1,
        "app": {"path": "/opt/ocm-fl/apps/digits"},
        "advertiseAddress": "127.0.0.1:9443",
    },
    "client": {"dataClaim": "fl.data-path", "placement": {"clusterSets": ["global"]}},
}


def indexes(decisions: list[DecisionState], works: list[WorkState] | None = None) -> Indexes:
    clusters = ("cluster-a", "cluster-b", "victim")
    # The placement controller has made all of its decisions (only its own count).
    selected = len({c for d in decisions if d.owner_uid == PLACEMENT_UID for c in d.clusters})
    placement = PlacementState(exists=True, uid=PLACEMENT_UID, selected=selected)
    return Indexes.of(
        {
            "placement_idx": {KEY: [Owned(REF.uid, placement)]},
            "decision_idx": {KEY: decisions},
            "cluster_idx": {c: [ClusterInfo(c, {"fl.data-path": f"/srv/{c}"})] for c in clusters},
            "addon_idx": {},
            "work_idx": {KEY: works or []},
            "server_job_idx": {},
            "server_service_idx": {},
            "server_pod_idx": {},
            # The admin's policy allowing SPEC (hub_controller/policy.py): these tests are
            # about decisions and works, not policy.
            "policy_idx": {
                REF.namespace: [
                    {
                        "allowedImagePrefixes": ["quay.io/ocm-fl/"],
                        "allowedDataClaims": ["fl.data-path"],
                        "allowedAdvertiseDomains": ["127.0.0.1"],
                        "allowHostPathStore": True,
                        "allowedAppPathPrefixes": ["/opt/ocm-fl/apps/"],
                    }
                ]
            },
        }
    )


def test_injected_placement_decision_selects_no_cluster() -> None:
    """A PlacementDecision that carries the Placement's label but is not controlled by the
    resource's Placement (anyone's object, or one pointing at another Placement uid) adds no
    cluster: the clusters come from the placement controller's decisions only."""
    spec = parse_spec(SPEC, REF.name)
    idx = indexes(
        [
            DecisionState(PLACEMENT_UID, ("cluster-a",)),  # the placement controller's
            DecisionState("", ("victim",)),  # label only
            DecisionState("another-placement-uid", ("cluster-b",)),  # someone else's owner
        ]
    )
    obs = gather(REF, spec, idx, NoReports())
    assert [r.name for r in obs.resolutions] == ["cluster-a"]


def test_decision_owner_is_read_from_its_controller_reference() -> None:
    from hub_controller.operator.indexes import decision_idx

    body: dict[str, Any] = {
        "metadata": {
            "ownerReferences": [
                {"kind": "Placement", "name": "digits", "uid": PLACEMENT_UID, "controller": True}
            ]
        },
        "status": {"decisions": [{"clusterName": "cluster-a"}]},
    }
    label = {"cluster.open-cluster-management.io/placement": "digits"}
    fn: Any = decision_idx  # async (kopf calls it on the event loop)

    def index(body: Any) -> Any:
        return asyncio.run(
            fn(namespace="team-a", name="digits-decision-1", labels=label, body=body)
        )

    assert index(body) == {KEY: DecisionState(PLACEMENT_UID, ("cluster-a",), 1)}
    body["metadata"]["ownerReferences"][0]["controller"] = False
    assert index(body)[KEY].owner_uid == ""


# --- overwriting another uid's ManifestWork ------------------------------------------------
class FakeKube:
    """Records writes; `existing` answers GETs (objects already on the hub)."""

    def __init__(self, existing: Mapping[str, dict[str, Any]]) -> None:
        self.existing = dict(existing)
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.patched: list[tuple[str, Any]] = []

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(obj)
        self.existing[object_path(obj)] = obj
        return obj

    def create(self, path: str, body: dict[str, Any], exist_ok: bool = True) -> None:
        return None

    def get(self, path: str) -> dict[str, Any] | None:
        return self.existing.get(path)

    def list_objects(self, path: str, label_selector: str | None = None) -> list[Any]:
        return []  # no enrolled SuperNode keys

    def delete(self, path: str, query: Any = None, body: Any = None) -> None:
        self.deleted.append(path)

    def patch(self, path: str, body: Any, content_type: str = "") -> dict[str, Any]:
        self.patched.append((path, body))
        return {}


@pytest.fixture
def quiet_kopf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf, "warn", lambda *a, **k: None)
    monkeypatch.setattr(kopf, "info", lambda *a, **k: None)
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)


def reconcile(kube: FakeKube, idx: Indexes, tmp_path: Path) -> dict[str, Any]:
    pki.save_tls_dir(tmp_path / "hub-ca", pki.create_ca("test-hub-ca"), None)
    op = reconciler.Operator(kube=kube)  # type: ignore[arg-type]
    body = {"metadata": {"namespace": REF.namespace, "name": REF.name, "uid": REF.uid,
                         "generation": 1}, "spec": SPEC, "status": {}}  # fmt: skip
    reconciler.reconcile(op, NoReports(), body, idx, reconciler.Run(REF, status={}), LOG)
    [(_, patch)] = [p for p in kube.patched if p[0].endswith("/status")][-1:]
    status: dict[str, Any] = patch["status"]
    return status


def test_a_manifestwork_of_another_uid_is_never_overwritten(
    tmp_path: Path, quiet_kopf: None
) -> None:
    """Where this resource's work would go on cluster-a, a ManifestWork of the same name owned
    by another uid exists (not one the index shows as ours): it is left alone, and the
    resource's status names the conflict and the cluster."""
    name = works_mod.work_name(REF)
    path = f"/apis/{constants.WORK_GROUP}/v1/namespaces/cluster-a/manifestworks/{name}"
    theirs = {
        "apiVersion": works_mod.WORK_API_VERSION,
        "kind": "ManifestWork",
        "metadata": {"name": name, "namespace": "cluster-a",
                     "labels": {constants.LABEL_OWNER_UID: "someone-else"}},
    }  # fmt: skip
    kube = FakeKube({path: theirs})
    status = reconcile(kube, indexes([DecisionState(PLACEMENT_UID, ("cluster-a",))]), tmp_path)
    assert not [o for o in kube.applied if o["kind"] == "ManifestWork"]
    assert kube.existing[path] is theirs and not kube.deleted
    [row] = status["clusters"]
    assert "WorkConflict: on cluster cluster-a the ManifestWork of this name belongs to " \
        "resource uid someone-else" in row["reason"]  # fmt: skip
    ready = next(c for c in status["conditions"] if c["type"] == "ClientsReady")
    assert "WorkConflict: on cluster cluster-a" in ready["message"]


def test_a_same_named_resources_work_in_the_index_is_neither_applied_over_nor_deleted(
    tmp_path: Path, quiet_kopf: None
) -> None:
    """A resource re-created under the same name while the old one's work still exists on
    cluster-a: the new resource waits (status says why) instead of taking it over."""
    old = WorkState(cluster="cluster-a", name=works_mod.work_name(REF), uid="old-uid")
    idx = indexes([DecisionState(PLACEMENT_UID, ("cluster-a", "cluster-b"))], works=[old])
    kube = FakeKube({})
    status = reconcile(kube, idx, tmp_path)
    applied = [o["metadata"]["namespace"] for o in kube.applied if o["kind"] == "ManifestWork"]
    assert applied == ["cluster-b"] and not kube.deleted
    rows = {r["name"]: r for r in status["clusters"]}
    assert "belongs to resource uid old-uid" in rows["cluster-a"]["reason"]


# --- on the local control plane: real placement controller, real work agents --------------
CLUSTER_API = constants.CLUSTER_GROUP
WORKS_ALL = f"/apis/{constants.WORK_GROUP}/v1/manifestworks"


@pytest.fixture
def plane_operator(
    control_plane: Any, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The hub controller in-process (kopf) on the plane; the namespace bound to `global`,
    a claim on every cluster; yields (hub Kube, spokes). The resources are deleted while the
    operator still runs."""
    from kopf.testing import KopfRunner

    from hack.localfed import install_crd
    from hack.testing import kopf_registry, wait_for
    from ocmfl.kube import Kube

    hub = Kube(control_plane.hub_kubeconfig)
    install_crd(hub)
    spokes = {c: Kube(p) for c, p in control_plane.cluster_kubeconfigs.items()}
    hub.create(
        f"/apis/{CLUSTER_API}/v1beta2/namespaces/{namespace}/managedclustersetbindings",
        {"apiVersion": f"{CLUSTER_API}/v1beta2", "kind": "ManagedClusterSetBinding",
         "metadata": {"name": "global", "namespace": namespace},
         "spec": {"clusterSet": "global"}},
    )  # fmt: skip
    claim = f"{namespace}.data.ocmfl.io"
    for c, spoke in spokes.items():
        spoke.create(
            f"/apis/{CLUSTER_API}/v1alpha1/clusterclaims",
            {"apiVersion": f"{CLUSTER_API}/v1alpha1", "kind": "ClusterClaim",
             "metadata": {"name": claim}, "spec": {"value": f"/srv/data/{c}"}},
        )  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", control_plane.hub_kubeconfig)
    pki.save_tls_dir(tmp_path / "hub-ca", pki.create_ca("test-hub-ca"), None)
    monkeypatch.setenv(constants.ENV_CA_DIR, str(tmp_path / "hub-ca"))
    watched = [f"--namespace={n}" for n in (namespace, *control_plane.clusters)]
    registry = kopf_registry("hub_controller.operator.handlers")
    fls = f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{constants.PLURAL}"
    try:
        # kopf holds handlers back until its indexes are filled: no wait is needed here.
        with KopfRunner(["run", "--standalone", *watched], registry=registry, timeout=60) as r:
            yield hub, {"spokes": spokes, "claim": claim, "fls": fls}
            for item in (hub.get(fls) or {}).get("items", []):
                hub.delete(f"{fls}/{item['metadata']['name']}")
            wait_for(lambda: not (hub.get(fls) or {}).get("items"), 90, "FL gone")
        assert r.exception is None, r.exception
    finally:
        for spoke in spokes.values():
            spoke.delete(f"/apis/{CLUSTER_API}/v1alpha1/clusterclaims/{claim}")
            spoke.close()
        hub.close()


def plane_fl(namespace: str, claim: str, only: str | None) -> dict[str, Any]:
    """SPEC's resource, selecting the clusters with `claim` (and, with `only`, that one)."""
    only_one = {"matchLabels": {"name": only}} if only else None
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "digits", "namespace": namespace},
        "spec": {
            "server": {**SPEC["server"], "minAvailableClients": 9},
            "client": {
                "dataClaim": claim,
                "placement": claim_placement(claim, label_selector=only_one),
            },
        },
    }


def plane_works(hub: Any, namespace: str) -> dict[str, dict[str, Any]]:
    selector = f"{constants.LABEL_OWNER_NAMESPACE}={namespace},{constants.LABEL_OWNER_NAME}=digits"
    items = (hub.get(WORKS_ALL, {"labelSelector": selector}) or {}).get("items", [])
    return {w["metadata"]["namespace"]: w for w in items}


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_on_the_plane_a_manifestwork_of_another_owner_is_not_overwritten(
    control_plane: Any, namespace: str, plane_operator: tuple[Any, dict[str, Any]]
) -> None:
    """A ManifestWork of another owner already holds the resource's work name on cluster2:
    cluster1 gets its work, cluster2's is left as it was, and the status names the conflict."""
    from hack.localfed import grant_for, grant_namespace
    from hack.testing import wait_for

    hub, env = plane_operator
    first, second = control_plane.clusters[0], control_plane.clusters[1]
    name = works_mod.work_name(FLRef(namespace, "digits", "any"))
    squat_path = f"/apis/{constants.WORK_GROUP}/v1/namespaces/{second}/manifestworks/{name}"
    squatter = {
        "apiVersion": works_mod.WORK_API_VERSION,
        "kind": "ManifestWork",
        "metadata": {"name": name, "namespace": second,
                     "labels": {constants.LABEL_OWNER_UID: "someone-else"}},
        "spec": {"workload": {"manifests": [
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "squatter", "namespace": "default"}, "data": {"k": "v"}}
        ]}},
    }  # fmt: skip
    hub.create(f"/apis/{constants.WORK_GROUP}/v1/namespaces/{second}/manifestworks", squatter)
    try:
        body = plane_fl(namespace, env["claim"], only=None)
        grant_namespace(hub, namespace, **grant_for(body))  # the admin's policy (not the subject)
        hub.create(env["fls"], body)
        wait_for(lambda: first in plane_works(hub, namespace) or None, 90, "work on cluster1")

        def conflict_row() -> dict[str, Any] | None:
            got = hub.get(f"{env['fls']}/digits") or {}
            rows = {r["name"]: r for r in (got.get("status") or {}).get("clusters") or []}
            row = rows.get(second)
            return row if row and "WorkConflict" in row.get("reason", "") else None

        row = wait_for(conflict_row, 60, "cluster2's row naming the conflict")
        assert "belongs to resource uid someone-else" in row["reason"]
        current = hub.get(squat_path) or {}
        assert current["metadata"]["labels"] == {constants.LABEL_OWNER_UID: "someone-else"}
        assert [m["kind"] for m in current["spec"]["workload"]["manifests"]] == ["ConfigMap"]
    finally:
        hub.delete(squat_path)
