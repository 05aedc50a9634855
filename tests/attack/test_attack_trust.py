"""Attacks on trust (issue 12 items 4 and 5): Fleet keys passing as agents, tenant-chosen
names on certificates agents trust, cluster private keys on the hub.

The hub CA is what agents trust for the aggregator and what the aggregator trusts for agents;
a federation's Fleet certificates come from that federation's own Fleet CA.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from cryptography import x509
from google.protobuf.timestamp_pb2 import Timestamp
from kopf.testing import KopfRunner

from hack import keyscan
from hack.localfed import grant_namespace
from hack.testing import TestPKI, agent_accepts, wait_for
from hub_controller import credentials_layout
from hub_controller.aggregator.servicer import AggregatorServer, ReloadingServerCredentials
from hub_controller.aggregator.store import ReportStore
from hub_controller.membership import ClusterResolution, StaticMembers
from hub_controller.operator.desired import credentials as cr
from hub_controller.operator.desired import works as works_mod
from hub_controller.signer import fleet_server
from ocmfl import constants, pki
from ocmfl.kube import Kube
from ocmfl.status.stream import first_ack
from ocmfl.status.v1 import report_pb2, report_pb2_grpc
from tests.integration.test_controller import (  # noqa: F401 (fixtures by name)
    bound,
    claim,
    fl_body,
    fl_path,
    hub,
    namespace,
    operator,
    spokes,
    test_namespaces,
)
from tests.unit.fl_fixtures import REF as FIXTURE_REF
from tests.unit.fl_fixtures import spec as fixture_spec

pytestmark = [pytest.mark.attack, pytest.mark.timeout(60)]

AGGREGATOR_HOST = "ocm-fl-hub.open-cluster-management.svc"
FL_UID = "6f1c-tenant-uid"


FLEET_CA = fleet_server.fleet_ca({}, "ocm-fl-fleet-ca team/digits", pki.utcnow())[0]


def tenant_credentials(*clusters: str, gateway_host: str = "fl.team.example") -> dict[str, bytes]:
    """What the signer issues into a tenant's credentials Secret (the tenant can read it)
    with the federation's Fleet CA, whose key stays in the signer's namespace."""
    gateway = credentials_layout.GatewayNames(dns=(gateway_host,))
    return fleet_server.server_tls({}, FLEET_CA, gateway, pki.utcnow())


def tenant_fleet_identity(cluster: str) -> pki.CertAndKey:
    """A Fleet client identity as the Fleet signer issues them with the federation's Fleet CA
    (the tenant's code in a client pod can read its pod's)."""
    return pki.issue_fleet_client_cert(FLEET_CA, FL_UID, cluster)


# --- the aggregator refuses Fleet certificates ----------------------------------------------
@pytest.fixture
def hub_pki(tmp_path: Path) -> TestPKI:
    return TestPKI(tmp_path)  # its CA plays the hub CA


@pytest.fixture
async def aggregator(hub_pki: TestPKI) -> AsyncIterator[AggregatorServer]:
    creds = ReloadingServerCredentials.from_dir(hub_pki.server_dir())
    server = AggregatorServer(ReportStore(), StaticMembers(["cluster-a"]), credentials=creds)
    await server.start()
    yield server
    await server.stop(None)


def _report(cluster: str) -> report_pb2.Report:
    """A well-formed report as cluster-a's agent would send it, for another tenant's run."""
    ts = Timestamp()
    ts.FromDatetime(dt.datetime.now(dt.UTC))
    return report_pb2.Report(
        cluster=cluster,
        fl_namespace="victim",
        fl_name="fl",
        fl_uid="victim-uid",
        client_phase=report_pb2.CLIENT_PHASE_RUNNING,
        round=1,
        timestamp=ts,
        sequence=1,
    )


async def _spoof(aggregator: AggregatorServer, hub_ca: bytes, cert: bytes, key: bytes) -> None:
    """Send one report as cluster-a with this identity and read the answer (raises the
    refusal). The write can race a refusal that comes before any read; the answer is read."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=hub_ca, private_key=key, certificate_chain=cert
    )
    async with grpc.aio.secure_channel(f"127.0.0.1:{aggregator.port}", creds) as ch:
        call = report_pb2_grpc.StatusServiceStub(ch).StreamReports()
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await call.write(_report("cluster-a"))
        await first_ack(call)


async def test_report_spoofed_with_a_fleet_key_is_refused(
    aggregator: AggregatorServer, hub_pki: TestPKI
) -> None:
    # A tenant holds a valid Fleet identity for cluster-a: its client pod's (its own code runs
    # there). It reports as cluster-a into the hub, e.g. into another tenant's federation.
    fleet = tenant_fleet_identity("cluster-a")
    hub_ca = pki.cert_to_pem(hub_pki.ca.cert)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _spoof(aggregator, hub_ca, fleet.cert_pem, fleet.key_pem)
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
    assert aggregator.store.runs() == []  # nothing of the spoofed report was kept


async def test_fleet_certificate_is_refused_even_if_signed_by_the_hub_ca(
    aggregator: AggregatorServer, hub_pki: TestPKI
) -> None:
    # Defence in depth: the subject form and URI SAN alone keep a Fleet identity from
    # passing as an agent, whoever signed it.
    pair = pki.issue_fleet_client_cert(hub_pki.ca, FL_UID, "cluster-a")
    hub_ca = pki.cert_to_pem(hub_pki.ca.cert)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _spoof(aggregator, hub_ca, pair.cert_pem, pair.key_pem)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "does not name a cluster" in (err.value.details() or "")
    assert aggregator.store.runs() == []
    with pytest.raises(pki.IdentityError, match="Fleet certificate"):
        pki.cluster_from_certificate(pair.cert)


def test_no_fleet_certificate_chains_to_the_hub_ca(hub_pki: TestPKI) -> None:
    data = tenant_credentials("cluster-a", "cluster-b")
    fleet_ca = pki.load_cert_pem(data[credentials_layout.CA])
    certs = {
        n: pki.load_cert_pem(data[n])
        for n in (credentials_layout.GATEWAY_CERT, credentials_layout.SUPERLINK_CERT)
    }
    certs["fleet"] = tenant_fleet_identity("cluster-a").cert
    for name, cert in certs.items():
        assert not pki.verify_issued_by(cert, hub_pki.ca.cert), name
        assert pki.verify_issued_by(cert, fleet_ca), name


# --- advertiseAddress yields no certificate agents trust for the aggregator ---------------
def test_tenant_chosen_advertise_address_is_no_aggregator_certificate(hub_pki: TestPKI) -> None:
    # The tenant sets advertiseAddress to the aggregator's name: its gateway certificate then
    # carries that SAN, and an attacker holding it (the tenant reads the Secret) could
    # impersonate the aggregator to every agent if the agents' CA had signed it.
    data = tenant_credentials("cluster-a", gateway_host=AGGREGATOR_HOST)
    hub_ca = pki.cert_to_pem(hub_pki.ca.cert)
    gw_cert, gw_key = data[credentials_layout.GATEWAY_CERT], data[credentials_layout.GATEWAY_KEY]
    assert not agent_accepts(gw_cert, gw_key, hub_ca, AGGREGATOR_HOST)
    # The real aggregator certificate still passes: the check is not vacuous.
    real = pki.issue_server_cert(hub_pki.ca, dns_names=[AGGREGATOR_HOST])
    assert agent_accepts(real.cert_pem, real.key_pem, hub_ca, AGGREGATOR_HOST)


# --- no private key of a cluster on the hub -------------------------------------------------
def test_a_federations_hub_objects_hold_no_cluster_private_key() -> None:
    # What the controller writes for a federation with members: its hub Secrets and each
    # cluster's ManifestWork. A reader of any of them (the tenant, a hub admin, the work
    # store) must not get a key a cluster uses.
    members = [ClusterResolution(c, f"/srv/{c}", "claim") for c in ("cluster-a", "cluster-b")]
    data = tenant_credentials("cluster-a", "cluster-b")
    server = credentials_layout.server_name(FIXTURE_REF)
    gateway = credentials_layout.GatewayNames(dns=("fl.team.example",))
    secrets = cr.hub_secrets({"namespace": FIXTURE_REF.namespace}, server, gateway, data)
    secrets[0]["data"] = {k: base64.b64encode(v).decode() for k, v in data.items()}
    works = works_mod.desired_works(
        FIXTURE_REF, fixture_spec(), members, "127.0.0.1:9443", server_name="fl.team.example"
    )
    findings = keyscan.scan({"Secret": secrets, "ManifestWork": list(works.values())})
    assert findings == [], [str(f) for f in findings]
    assert "PRIVATE KEY" not in json.dumps(list(works.values()))


# --- the same through the controller on the local plane --------------------------------------
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_plane_advertise_address_of_the_aggregator_gives_no_trusted_certificate(
    hub: Kube,  # noqa: F811 (fixtures imported above)
    bound: str,  # noqa: F811
    claim: str,  # noqa: F811
    operator: KopfRunner,  # noqa: F811
) -> None:
    # A tenant creates a FederatedLearning whose advertiseAddress is the aggregator's name;
    # the controller issues the gateway certificate and stores it where the tenant reads it.
    # Worst case for this test: the admin's policy even allows that domain (the admin policy's
    # own attack tests show it refused otherwise); the trust split must hold on its own.
    tenant_ns = bound
    grant_namespace(
        hub,
        tenant_ns,
        data_claims=[claim],
        advertise_domains=["127.0.0.1", AGGREGATOR_HOST],
        host_path_store=True,
    )
    body = fl_body(tenant_ns, claim, advertiseAddress=f"{AGGREGATOR_HOST}:443")
    hub.create(fl_path(tenant_ns), body)
    data = wait_for(lambda: _tenant_credentials(hub, tenant_ns), 90, "credentials Secret")
    gw_cert = pki.load_cert_pem(data[credentials_layout.GATEWAY_CERT])
    san = gw_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert AGGREGATOR_HOST in san.get_values_for_type(x509.DNSName)  # the tenant's name is on it
    hub_ca_dir = Path(os.environ[constants.ENV_CA_DIR])  # set by the operator fixture
    hub_ca = (hub_ca_dir / pki.CERT_FILE).read_bytes()
    assert not agent_accepts(
        data[credentials_layout.GATEWAY_CERT],
        data[credentials_layout.GATEWAY_KEY],
        hub_ca,
        AGGREGATOR_HOST,
    )
    # The hub CA key never lands in a tenant's Secret, and neither does the Fleet CA's key:
    # no entry but the SuperLink's and the gateway's own keys holds a private key.
    assert (hub_ca_dir / pki.KEY_FILE).read_bytes() not in data.values()
    keys = {k for k, v in data.items() if b"PRIVATE KEY" in v}
    assert keys == {credentials_layout.SUPERLINK_KEY, credentials_layout.GATEWAY_KEY}, keys
    fleet_ca = pki.load_cert_pem(data[credentials_layout.CA])
    assert pki.verify_issued_by(gw_cert, fleet_ca)


def _tenant_credentials(kube: Kube, tenant_ns: str) -> dict[str, bytes] | None:
    """The resource's credentials Secret data once it holds a gateway certificate."""
    items = (kube.get(f"/api/v1/namespaces/{tenant_ns}/secrets") or {}).get("items", [])
    for item in items:
        if item["metadata"]["name"].endswith("-credentials"):
            data = credentials_layout.secret_data(item)
            if credentials_layout.GATEWAY_CERT in data:
                return data
    return None
