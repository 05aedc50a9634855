"""The hub aggregator over real mTLS gRPC on 127.0.0.1 with real certificates."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, cast

import grpc
import grpc.aio
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from hack.testing import TestPKI
from hub_controller.aggregator.server_cert import SecretServerCert
from hub_controller.aggregator.servicer import AggregatorServer, ReloadingServerCredentials
from hub_controller.aggregator.store import ReportStore
from hub_controller.membership import AddonMembers, ClusterInfo, StaticMembers
from ocmfl import pki
from ocmfl.kube import Kube
from ocmfl.status.stream import HubRefusal, ReportCall, first_ack, hub_acks, read_ack
from ocmfl.status.v1 import report_pb2, report_pb2_grpc

pytestmark = pytest.mark.timeout(60)
UID = "1234-abcd"


def make_report(cluster: str, seq: int = 1, **kw: object) -> report_pb2.Report:
    ts = Timestamp()
    ts.FromDatetime(dt.datetime.now(dt.UTC))
    fields: dict[str, object] = dict(
        cluster=cluster,
        fl_namespace="fl",
        fl_name="mnist",
        fl_uid=UID,
        client_phase=report_pb2.CLIENT_PHASE_RUNNING,
        round=1,
        timestamp=ts,
        sequence=seq,
        metrics=[
            report_pb2.RoundMetrics(
                round=1,
                phase=report_pb2.ROUND_PHASE_FIT,
                loss=0.5,
                accuracy=0.8,
                samples=100,
                duration_s=1.5,
            )
        ],
    )
    fields.update(kw)
    return report_pb2.Report(**fields)  # type: ignore[arg-type]


def channel_for(port: int, client_dir: Path | None, ca: bytes) -> grpc.aio.Channel:
    if client_dir is None:
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
    else:
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(client_dir / pki.KEY_FILE).read_bytes(),
            certificate_chain=(client_dir / pki.CERT_FILE).read_bytes(),
        )
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", creds)


@pytest.fixture
def tpki(tmp_path: Path) -> TestPKI:
    return TestPKI(tmp_path)


@pytest.fixture
def registry() -> StaticMembers:
    return StaticMembers(["cluster-a", "cluster-b"])


@pytest.fixture
async def hub(tpki: TestPKI, registry: StaticMembers) -> AsyncIterator[AggregatorServer]:
    creds = ReloadingServerCredentials.from_dir(tpki.server_dir())
    server = AggregatorServer(
        ReportStore(), registry, credentials=creds, max_message_bytes=16 * 1024
    )
    await server.start()
    yield server
    await server.stop(None)


async def send(
    hub: AggregatorServer, tpki: TestPKI, client_dir: Path | None, *reports: report_pb2.Report
) -> list[int]:
    """Send reports on one stream; the acked sequence numbers (raises AioRpcError)."""
    ca = pki.cert_to_pem(tpki.ca.cert)
    async with channel_for(hub.port, client_dir, ca) as channel:
        call = report_pb2_grpc.StatusServiceStub(channel).StreamReports()
        answers = hub_acks(call)  # an iterator: it sees a refusal that ends a failed write
        acks = []
        try:
            for r in reports:
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    await call.write(r)  # the hub may refuse the stream during this write
                acks.append((await anext(answers)).sequence)
            await call.done_writing()
        finally:
            await answers.aclose()
        return acks


async def test_report_from_registered_cluster_is_stored_and_acked(
    hub: AggregatorServer, tpki: TestPKI
) -> None:
    acks = await send(
        hub,
        tpki,
        tpki.client_dir("cluster-a"),
        make_report("cluster-a", 1),
        make_report("cluster-a", 2, round=2),
    )
    assert acks == [1, 2]
    snap = hub.store.snapshot(UID)
    assert snap["cluster-a"].phase == "Running"
    assert snap["cluster-a"].accuracy == 0.8
    assert snap["cluster-a"].round == 2
    metric = hub.metrics.registry.get_sample_value(
        "ocmfl_reports_received_total",
        {"cluster": "cluster-a", "namespace": "fl", "name": "mnist"},
    )
    assert metric == 2


async def test_certificate_for_a_sending_as_b_is_refused(
    hub: AggregatorServer, tpki: TestPKI
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await send(hub, tpki, tpki.client_dir("cluster-a"), make_report("cluster-b"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "cluster-b" in (err.value.details() or "")
    assert hub.store.snapshot(UID) == {}
    assert (
        hub.metrics.registry.get_sample_value(
            "ocmfl_reports_rejected_total", {"reason": "cluster_mismatch"}
        )
        == 1
    )


async def test_unregistered_cluster_is_refused(hub: AggregatorServer, tpki: TestPKI) -> None:
    code, details = await opening_status(hub, tpki, "cluster-x")
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "not an accepted ManagedCluster" in details


async def opening_status(
    server: AggregatorServer, tpki: TestPKI, cluster: str
) -> tuple[grpc.StatusCode, str]:
    """The status a stream gets when it only opens: a refusal that comes before any report
    is read."""
    ca = pki.cert_to_pem(tpki.ca.cert)
    async with channel_for(server.port, tpki.client_dir(cluster), ca) as channel:
        call = report_pb2_grpc.StatusServiceStub(channel).StreamReports()
        with pytest.raises(HubRefusal) as refusal:
            await read_ack(call)
        assert await call.code() == refusal.value.code()  # nothing wrote: no race to lose it
        return refusal.value.code(), refusal.value.details() or ""


async def test_a_starting_hub_says_come_back_until_its_clusters_are_listed(
    tpki: TestPKI,
) -> None:
    # The hub process's indexes fill in after the aggregator listens: a cluster not in them
    # yet is "hub starting" (the agent retries), not "not registered", until kopf has listed.
    clusters: dict[str, list[ClusterInfo]] = {}
    addons: dict[str, list[str]] = {}
    members = AddonMembers(clusters, addons, grace_s=600)
    server = AggregatorServer(
        ReportStore(), members, credentials=ReloadingServerCredentials.from_dir(tpki.server_dir())
    )
    await server.start()
    try:
        code, details = await opening_status(server, tpki, "cluster-a")
        assert code == grpc.StatusCode.UNAVAILABLE
        assert "not listed its clusters yet" in details
        clusters["cluster-a"] = [ClusterInfo("cluster-a", accepted=True)]
        addons["cluster-a"] = ["ocm-fl"]
        members.mark_listed()
        assert await send(server, tpki, tpki.client_dir("cluster-a"), make_report("cluster-a"))
        code, details = await opening_status(server, tpki, "cluster-x")
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "not an accepted ManagedCluster" in details
        rejected = server.metrics.registry.get_sample_value
        assert rejected("ocmfl_reports_rejected_total", {"reason": "hub_starting"}) == 1
        assert rejected("ocmfl_reports_rejected_total", {"reason": "not_registered"}) == 1
    finally:
        await server.stop(None)


def test_membership_is_final_after_the_listing_or_the_grace() -> None:
    now = [0.0]
    members = AddonMembers({}, {}, grace_s=60, clock=lambda: now[0])
    assert not members.complete()
    now[0] = 61.0
    assert members.complete()
    listed = AddonMembers({}, {}, grace_s=60, clock=lambda: now[0] - 61.0)
    listed.mark_listed()
    assert listed.complete()


async def test_cluster_removed_from_registry_is_refused_mid_stream(
    hub: AggregatorServer, tpki: TestPKI, registry: StaticMembers
) -> None:
    ca = pki.cert_to_pem(tpki.ca.cert)
    async with channel_for(hub.port, tpki.client_dir("cluster-a"), ca) as channel:
        call = report_pb2_grpc.StatusServiceStub(channel).StreamReports()
        await call.write(make_report("cluster-a", 1))
        assert (await call.read()).sequence == 1
        registry.remove("cluster-a")
        await call.write(make_report("cluster-a", 2))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await read_ack(call)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_writing_client_learns_the_hubs_own_reason_for_ending_its_stream(
    hub: AggregatorServer, tpki: TestPKI
) -> None:
    # An agent writes while the hub refuses it. gRPC's Python client turns a status that lands
    # during a write into INTERNAL "Internal error from Core" most of the time; the hub's
    # closing Ack, which arrives before the status, keeps the real reason.
    ca = pki.cert_to_pem(tpki.ca.cert)
    seen: list[str] = []
    for _ in range(20):
        async with channel_for(hub.port, tpki.client_dir("cluster-x"), ca) as channel:
            call = report_pb2_grpc.StatusServiceStub(channel).StreamReports()

            async def write_on(call: ReportCall = call) -> None:
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    for seq in range(1, 200):
                        await call.write(make_report("cluster-x", seq))

            writer = asyncio.create_task(write_on())
            with pytest.raises(HubRefusal) as err:
                async for _ack in hub_acks(call):
                    pass
            await writer
            seen.append(f"{err.value.code().name}: {err.value.details()}")
        # One report, then its answer (the probe's way): the write may fail, the answer not.
        async with channel_for(hub.port, tpki.client_dir("cluster-x"), ca) as channel:
            call = report_pb2_grpc.StatusServiceStub(channel).StreamReports()
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await call.write(make_report("cluster-x", 1))
            with pytest.raises(HubRefusal) as err:
                await first_ack(call)
            seen.append(f"{err.value.code().name}: {err.value.details()}")
    assert set(seen) == {
        "PERMISSION_DENIED: cluster 'cluster-x' is not an accepted ManagedCluster with the "
        "addon enabled"
    }


@pytest.mark.parametrize("case", ["expired", "other_ca", "no_cert", "bad_subject"])
async def test_bad_client_certificates_are_refused(
    hub: AggregatorServer, tpki: TestPKI, tmp_path: Path, case: str
) -> None:
    if case == "expired":
        past = dt.datetime.now(dt.UTC) - dt.timedelta(days=2)
        client: Path | None = tpki.client_dir("cluster-a", lifetime=dt.timedelta(hours=1), now=past)
    elif case == "other_ca":
        client = TestPKI(tmp_path / "other").client_dir("cluster-a")
    elif case == "bad_subject":  # signed by our CA, but the CN names no cluster
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import NameOID

        key = pki.generate_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin")]))
            .issuer_name(tpki.ca.cert.subject)
            .public_key(key.public_key())
            .serial_number(1)
            # Backdated as ocmfl.pki does: gRPC's TLS reads a coarse clock that can trail
            # this process's by a moment ("certificate is not yet valid").
            .not_valid_before(dt.datetime.now(dt.UTC) - pki.CLOCK_SKEW)
            .not_valid_after(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
            .sign(tpki.ca.key, hashes.SHA256())
        )
        client = pki.save_tls_dir(tmp_path / "bad", pki.CertAndKey(cert, key), tpki.ca.cert)
    else:
        client = None
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await send(hub, tpki, client, make_report("cluster-a"))
    expected = (
        grpc.StatusCode.UNAUTHENTICATED if case == "bad_subject" else grpc.StatusCode.UNAVAILABLE
    )  # refused in the TLS handshake
    assert err.value.code() == expected
    assert hub.store.snapshot(UID) == {}


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("fl_namespace", {"fl_namespace": "Not_A_Namespace"}),
        ("client_phase", {"client_phase": report_pb2.CLIENT_PHASE_UNSPECIFIED}),
        (
            "metrics[0].accuracy",
            {
                "metrics": [
                    report_pb2.RoundMetrics(
                        round=1, phase=report_pb2.ROUND_PHASE_EVALUATE, accuracy=1.5
                    )
                ]
            },
        ),
        ("metrics[0].phase", {"metrics": [report_pb2.RoundMetrics(round=1)]}),
        ("timestamp", {"timestamp": None}),
        ("sequence", {"sequence": 0}),
    ],
)
async def test_malformed_report_is_refused_naming_the_field(
    hub: AggregatorServer, tpki: TestPKI, field: str, change: dict[str, object]
) -> None:
    report = make_report("cluster-a", 1)
    for k, v in change.items():
        if v is None:
            report.ClearField(k)  # type: ignore[arg-type]
        elif k == "metrics":
            del report.metrics[:]
            report.metrics.extend(v)  # type: ignore[arg-type]
        else:
            setattr(report, k, v)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await send(hub, tpki, tpki.client_dir("cluster-a"), report)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field + ":")


async def test_bad_streams_do_not_harm_another_stream(hub: AggregatorServer, tpki: TestPKI) -> None:
    ca = pki.cert_to_pem(tpki.ca.cert)
    async with channel_for(hub.port, tpki.client_dir("cluster-b"), ca) as good_channel:
        good = report_pb2_grpc.StatusServiceStub(good_channel).StreamReports()
        await good.write(make_report("cluster-b", 1))
        assert (await good.read()).sequence == 1

        # an oversized message on another stream of the same kind
        huge = make_report("cluster-a", 1, agent_version="x" * 40_000)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await send(hub, tpki, tpki.client_dir("cluster-a"), huge)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # a malformed one
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await send(hub, tpki, tpki.client_dir("cluster-a"), make_report("cluster-a", 0))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        await good.write(make_report("cluster-b", 2, round=2))
        assert (await good.read()).sequence == 2
        await good.done_writing()
    assert hub.store.snapshot(UID)["cluster-b"].round == 2
    assert "cluster-a" not in hub.store.snapshot(UID)


async def test_server_certificate_rotation_without_restart(
    hub: AggregatorServer, tpki: TestPKI
) -> None:
    client = tpki.client_dir("cluster-a")
    assert await send(hub, tpki, client, make_report("cluster-a", 1)) == [1]
    server_dir = tpki.root / "server"
    old = pki.load_tls_dir(server_dir)[0].cert
    # rotate: a new key and certificate from a new CA the clients already trust
    new = tpki.rotate_server(server_dir)
    assert new.cert.serial_number != old.serial_number
    assert await send(hub, tpki, client, make_report("cluster-a", 2)) == [2]
    assert hub.credentials is not None and hub.credentials.reloads == 1


async def test_server_credentials_reload_only_a_consistent_pair(tpki: TestPKI) -> None:
    d = tpki.server_dir()
    creds = ReloadingServerCredentials.from_dir(d)
    creds.credentials()
    assert creds.fetch() is None  # unchanged
    other = pki.issue_server_cert(tpki.ca)
    pki.write_atomic(d / pki.CERT_FILE, other.cert_pem)  # key not yet written: mismatch
    assert creds.fetch() is None and creds.reloads == 0
    pki.write_atomic(d / pki.KEY_FILE, other.key_pem)
    assert creds.fetch() is not None and creds.reloads == 1


async def test_concurrent_streams_from_many_clusters(
    hub: AggregatorServer, tpki: TestPKI, registry: StaticMembers
) -> None:
    names = [f"c{i}" for i in range(8)]
    for n in names:
        registry.add(n)
    dirs = {n: tpki.client_dir(n) for n in names}
    results = await asyncio.gather(
        *(send(hub, tpki, dirs[n], *(make_report(n, s) for s in range(1, 6))) for n in names)
    )
    assert all(r == [1, 2, 3, 4, 5] for r in results)
    assert sorted(hub.store.snapshot(UID)) == names


def signer_issued(tmp_path: Path, hub_ca: pki.CertAndKey) -> tuple[Any, SecretServerCert]:
    """What the signer part does (its issuer, on an in-memory Secret API) and the aggregator's
    view of that Secret."""
    from secrets_kube import SecretsKube

    from hub_controller.ca import CADir
    from hub_controller.signer.aggregator_cert import AggregatorCertIssuer, ServerNames

    kube = cast(Kube, SecretsKube())
    ca_dir = CADir.hub(pki.save_tls_dir(tmp_path / "hub-ca", hub_ca, None))
    issuer = AggregatorCertIssuer(kube, ca_dir, ServerNames(), "hub")
    issuer.ensure()
    return issuer, SecretServerCert(kube, "hub")


async def test_service_serves_with_the_hub_ca_and_trusts_only_agent_ca_clients(
    tmp_path: Path,
) -> None:
    """The server certificate is the one the signer issued from the hub CA into its Secret
    (what agents trust for the aggregator), and follows its renewal; client certificates must
    come from the agent CA: one the hub CA signed for a cluster is refused in the handshake."""
    import urllib.request

    from hub_controller.aggregator.scope import WorkScope
    from hub_controller.aggregator.service import AggregatorService, AggregatorSettings
    from hub_controller.ca import CADir

    agents = TestPKI(tmp_path / "agents", key_kind="rsa")  # the agent CA and agent certificates
    hub_ca = pki.create_ca("hub", key_kind="rsa")
    issuer, secret = signer_issued(tmp_path, hub_ca)
    agent_ca_dir = pki.save_tls_dir(tmp_path / "agent-ca", agents.ca, None)
    # The aggregator gets the agent CA's certificate only, never a key.
    (agent_ca_dir / pki.KEY_FILE).unlink()
    service = AggregatorService(
        AggregatorSettings(
            listen="127.0.0.1:0", metrics_port=0, metrics_host="127.0.0.1", metrics_token="t0k"
        ),
        StaticMembers(["cluster-a"]),
        secret,
        WorkScope({("cluster-a", UID): [("fl", "mnist")]}, grace_s=0),
        CADir.agent(agent_ca_dir),
    )
    port = await service.start()
    root = pki.cert_to_pem(hub_ca.cert)

    async def send_with(client: Path, *reports: report_pb2.Report) -> list[int]:
        async with channel_for(port, client, root) as channel:
            call = report_pb2_grpc.StatusServiceStub(channel).StreamReports()
            acks = []
            for r in reports:
                await call.write(r)
                acks.append((await read_ack(call)).sequence)
            await call.done_writing()
            return acks

    try:
        assert service.server is not None
        store = service.store
        sending = asyncio.create_task(
            send_with(agents.client_dir("cluster-a"), make_report("cluster-a", 7))
        )
        # The hub's store holds the ack until the resource's status holds the report.
        while store.version(UID) < 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert not sending.done()
        assert store.awaiting() == 1
        await asyncio.to_thread(store.persisted, UID, store.version(UID))  # the status writer
        assert await asyncio.wait_for(sending, 10) == [7]
        # A cluster certificate from the hub CA is no agent identity.
        hub_signed = pki.issue_client_cert("cluster-a", hub_ca)
        forged = pki.save_tls_dir(tmp_path / "hub-signed", hub_signed, None)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await send_with(forged, make_report("cluster-a", 8))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # refused in the handshake
        metrics_port = service._metrics_server[0].server_port
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        # Without the bearer token (or with another): 401, nothing of the samples.
        for headers in ({}, {"Authorization": "Bearer wrong"}):

            def fetch(h: dict[str, str] = headers) -> Any:
                return urllib.request.urlopen(urllib.request.Request(url, headers=h))

            with pytest.raises(urllib.error.HTTPError) as refused:
                await asyncio.to_thread(fetch)
            assert refused.value.code == 401
            assert b"ocmfl_cluster" not in refused.value.read()
        authorized = urllib.request.Request(url, headers={"Authorization": "Bearer t0k"})
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(authorized).read())
        assert (
            b'ocmfl_cluster_accuracy{cluster="cluster-a",name="mnist",namespace="fl"} 0.8' in body
        )
        assert port == service.server.port
        # The signer renews (here: a new hub CA); the aggregator serves the new certificate.
        new_ca = pki.create_ca("hub-2", key_kind="rsa")
        pki.save_tls_dir(tmp_path / "hub-ca", new_ca, None)
        await asyncio.to_thread(issuer.ensure)
        assert await asyncio.to_thread(service._take_server_cert)
        served = await asyncio.to_thread(
            ssl.get_server_certificate, ("127.0.0.1", port), timeout=10
        )
        assert pki.verify_issued_by(pki.load_cert_pem(served), new_ca.cert)
    finally:
        await service.stop()


async def test_a_rotated_agent_ca_becomes_the_client_trust(tmp_path: Path) -> None:
    from hub_controller.aggregator.scope import WorkScope
    from hub_controller.aggregator.service import AggregatorService, AggregatorSettings
    from hub_controller.ca import CADir

    old, new = pki.create_ca("agent-1", key_kind="ec"), pki.create_ca("agent-2", key_kind="ec")
    agent_ca_dir = pki.save_tls_dir(tmp_path / "agent-ca", old, None)
    service = AggregatorService(
        AggregatorSettings(listen="127.0.0.1:0", metrics_port=None),
        StaticMembers(["cluster-a"]),
        signer_issued(tmp_path, pki.create_ca("hub"))[1],
        WorkScope({}, grace_s=0),
        CADir.agent(agent_ca_dir),
    )
    await service.start()
    try:
        assert service._tls_dir is not None
        trusted = service._tls_dir / pki.CA_FILE
        assert pki.load_certs_pem(trusted.read_bytes()) == [old.cert]
        assert not service._write_client_trust()  # unchanged: nothing written
        # The Secret now holds the new CA with the old one appended (a rotation window).
        pki.write_atomic(agent_ca_dir / pki.KEY_FILE, new.key_pem)
        pki.write_atomic(agent_ca_dir / pki.CERT_FILE, new.cert_pem + old.cert_pem)
        assert service._write_client_trust()
        assert pki.load_certs_pem(trusted.read_bytes()) == [new.cert, old.cert]
    finally:
        await service.stop()


def test_addon_members_are_accepted_clusters_with_the_addon_from_the_indexes() -> None:
    from hub_controller.membership import AddonMembers, ClusterInfo

    clusters = {
        "ok": [ClusterInfo("ok", accepted=True)],
        "not-accepted": [ClusterInfo("not-accepted")],
        "no-addon": [ClusterInfo("no-addon", accepted=True)],
    }
    addons: dict[str, list[str]] = {"ok": ["federated-learning"], "not-accepted": ["x"]}
    members = AddonMembers(clusters, addons)
    assert members.registered() == {"ok"}
    assert not members.is_registered("missing")
    addons["no-addon"] = ["federated-learning"]  # the indexes are live: no caching
    assert members.is_registered("no-addon")


def _cluster(name: str, accepted: bool = True) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": {"hubAcceptsClient": accepted}}


def _addon(cluster: str, deleting: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"name": "federated-learning", "namespace": cluster}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


@pytest.mark.parametrize(
    "revoke", ["hub_accepts_client_false", "cluster_deleted", "addon_deleted", "addon_deleting"]
)
async def test_revoked_membership_stops_reports_at_once_and_csr_approvals(
    tpki: TestPKI, revoke: str
) -> None:
    """Membership comes from the hub's kopf indexes (what their index functions make of the
    ManagedCluster and ManagedClusterAddOn): once the cluster is no longer accepted, is
    deleted, or its addon is deleted (or being deleted), the open stream's next report is
    refused and the signer denies the cluster's next CSR."""
    from hub_creds import issue_hub_credential, requested_with

    from agent_addon.csr import csr_object
    from hub_controller import membership_indexes as indexes
    from hub_controller.signer.policy import Approve, Deny, decide_csr

    # kopf.index types a decorated handler as kopf's IndexingFn (every kwarg required); kopf
    # calls these with all of them, the test with the few each handler reads.
    addon_idx = cast(Callable[..., Awaitable[Any]], indexes.addon_idx)
    cluster_idx = cast(Callable[..., Awaitable[Any]], indexes.cluster_idx)

    def indexed(value: Mapping[str, Any] | None) -> dict[str, list[Any]]:
        return {k: [v] for k, v in (value or {}).items()}

    clusters = indexed(await cluster_idx(name="cluster-a", body=_cluster("cluster-a")))
    addons = indexed(await addon_idx(namespace="cluster-a", body=_addon("cluster-a")))
    credential = issue_hub_credential("cluster-a")
    members = AddonMembers(clusters, addons, {"cluster-a": [credential.identity]})
    members.mark_listed()

    def agent_csr() -> dict[str, object]:
        csr: dict[str, object] = requested_with(
            csr_object("cluster-a", pki.generate_key()), credential
        )
        return csr

    assert isinstance(decide_csr(agent_csr(), members), Approve)
    server = AggregatorServer(
        ReportStore(), members, credentials=ReloadingServerCredentials.from_dir(tpki.server_dir())
    )
    await server.start()
    try:
        ca = pki.cert_to_pem(tpki.ca.cert)
        async with channel_for(server.port, tpki.client_dir("cluster-a"), ca) as channel:
            call = report_pb2_grpc.StatusServiceStub(channel).StreamReports()
            await call.write(make_report("cluster-a", 1))
            assert (await call.read()).sequence == 1
            if revoke == "hub_accepts_client_false":
                clusters.update(
                    indexed(await cluster_idx(name="cluster-a", body=_cluster("cluster-a", False)))
                )
            elif revoke == "cluster_deleted":
                clusters.pop("cluster-a")
            elif revoke == "addon_deleted":
                addons.pop("cluster-a")
            else:
                deleting = await addon_idx(namespace="cluster-a", body=_addon("cluster-a", True))
                assert deleting is None  # the index drops it
                addons.pop("cluster-a")
            await call.write(make_report("cluster-a", 2))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await read_ack(call)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "no longer registered" in (err.value.details() or "")
        decision = decide_csr(agent_csr(), members)
        assert isinstance(decision, Deny) and decision.reason == "UnknownCluster"
    finally:
        await server.stop(None)


@contextlib.asynccontextmanager
async def _durable_stream(
    tpki: TestPKI,
) -> AsyncIterator[
    tuple[ReportStore, grpc.aio.StreamStreamCall[report_pb2.Report, report_pb2.Ack]]
]:
    """cluster-a's report stream to an aggregator whose store acks only durable reports."""
    store = ReportStore(wait_for_status=True)
    creds = ReloadingServerCredentials.from_dir(tpki.server_dir("srv"))
    hub = AggregatorServer(store, StaticMembers(["cluster-a"]), credentials=creds)
    await hub.start()
    try:
        ca = pki.cert_to_pem(tpki.ca.cert)
        async with channel_for(hub.port, tpki.client_dir("cluster-a"), ca) as channel:
            yield store, report_pb2_grpc.StatusServiceStub(channel).StreamReports()
    finally:
        await hub.stop()


async def test_acks_wait_for_durability_in_order_while_reading_goes_on(tpki: TestPKI) -> None:
    """A store that waits for the status: reports keep being read and stored while their
    acks wait; each ack leaves once a status write covers its report, in report order; a
    stream that ends leaves the unacked ones to be resent; forgetting the run releases them."""
    async with _durable_stream(tpki) as (store, call):
        for seq in (1, 2, 3):
            await call.write(make_report("cluster-a", seq, round=seq))
        while store.version(UID) < 3:  # all three read and stored, none acked
            await asyncio.sleep(0.01)
        assert store.snapshot(UID)["cluster-a"].round == 3
        assert store.awaiting() == 3
        store.persisted(UID, 2)
        assert [(await call.read()).sequence for _ in range(2)] == [1, 2]
        reading = asyncio.ensure_future(call.read())
        await asyncio.sleep(0.2)
        assert not reading.done()
        store.persisted(UID, 3)
        assert (await asyncio.wait_for(reading, 10)).sequence == 3
        await call.write(make_report("cluster-a", 4, round=4))
        await call.done_writing()
        while store.version(UID) < 4:
            await asyncio.sleep(0.01)
        store.forget(UID)  # the resource was deleted: nothing left to keep
        assert (await asyncio.wait_for(call.read(), 10)).sequence == 4


async def test_a_half_closed_stream_ends_without_waiting_forever_for_durability(
    tpki: TestPKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent half-closes to rotate its certificate: the stream ends after a short wait
    even when its reports are not durable yet (they stay unacked: the agent resends them)."""
    from hub_controller.aggregator import servicer

    monkeypatch.setattr(servicer, "HALF_CLOSE_ACK_WAIT_S", 0.3)
    async with _durable_stream(tpki) as (store, call):
        await call.write(make_report("cluster-a", 1))
        await call.done_writing()
        acks = await asyncio.wait_for(_all_acks(call), 10)
        assert acks == [] and store.version(UID) == 1


async def _all_acks(
    call: grpc.aio.StreamStreamCall[report_pb2.Report, report_pb2.Ack],
) -> list[int]:
    return [ack.sequence async for ack in call]


def test_the_metrics_token_is_made_once_and_kept() -> None:
    import base64

    from hub_controller.aggregator.metrics_http import ensure_token

    class Secrets:
        def __init__(self) -> None:
            self.made: list[dict[str, Any]] = []

        def get(self, path: str) -> dict[str, Any] | None:
            if not self.made:
                return None
            token = self.made[0]["stringData"]["token"]
            return {"data": {"token": base64.b64encode(token.encode()).decode()}}

        def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            self.made.append(body)
            return body

    kube = Secrets()
    first = ensure_token(kube, "hub-ns")  # type: ignore[arg-type]
    assert len(first) >= 40 and kube.made[0]["metadata"]["namespace"] == "hub-ns"
    assert ensure_token(kube, "hub-ns") == first  # type: ignore[arg-type]
    assert len(kube.made) == 1


async def test_a_report_is_kept_when_the_hub_sees_its_work_a_moment_later(tpki: TestPKI) -> None:
    """The hub's ManifestWork watch can trail the work that started the reporting client: a
    report out of scope is looked up again during the grace, and kept once the work shows;
    ones whose work never shows are refused when the stream's one grace ends."""
    from hub_controller.aggregator.limits import Limits
    from hub_controller.aggregator.scope import WorkScope

    works: dict[tuple[str, str], list[tuple[str, str]]] = {}
    scope = WorkScope(works, grace_s=0)
    scope.mark_ready()
    creds = ReloadingServerCredentials.from_dir(tpki.server_dir("srv"))
    hub = AggregatorServer(
        ReportStore(),
        StaticMembers(["cluster-a"]),
        credentials=creds,
        scope=scope,
        limits=Limits(scope_grace_s=1.5),
    )
    await hub.start()
    try:
        ca = pki.cert_to_pem(tpki.ca.cert)
        async with channel_for(hub.port, tpki.client_dir("cluster-a"), ca) as channel:
            call = report_pb2_grpc.StatusServiceStub(channel).StreamReports()
            await call.write(make_report("cluster-a", 1))
            await asyncio.sleep(0.5)
            works[("cluster-a", UID)] = [("fl", "mnist")]  # the watch catches up
            first = await asyncio.wait_for(read_ack(call), 10)
            assert (first.sequence, first.refused) == (1, "")
            assert hub.store.snapshot(UID)["cluster-a"].round == 1
            # Reports for other federations: the stream's one grace is spent, so twenty of them
            # are refused within 10 s (one grace each would take 30 s).
            for seq in range(2, 22):
                await call.write(make_report("cluster-a", seq, fl_uid=f"other-{seq}"))
            refused = [await asyncio.wait_for(read_ack(call), 10) for _ in range(2, 22)]
            assert [a.sequence for a in refused] == list(range(2, 22))
            assert all(a.refused.startswith("not_in_scope: cluster 'cluster-a' has no")
                       for a in refused)  # fmt: skip
            await call.done_writing()
    finally:
        await hub.stop()
