"""The status path on the real local control plane (hub kube-apiserver with OCM CRDs).

A cluster's agent posts metrics -> mTLS report -> aggregator (kubernetes-backed registry:
accepted ManagedCluster + ManagedClusterAddOn) -> StatusWriter -> FederatedLearning
status.clusters. The CSR signer issues the agent's identity on the same hub: a CSR created
by cluster1's addon-agent identity is approved and signed; one for a cluster without the
addon is denied; a CSR for a foreign signer is left alone.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
import yaml

from agent_addon.agent import Agent, AgentConfig
from agent_addon.csr import RenewalError, request_certificate
from hack.controlplane.plane import ControlPlane
from hack.localfed import (
    CSR_RBAC_NAME,
    addon_agent_kubeconfig,
    ensure_agent_csr_rbac,
    install_crd,
)
from hack.testing import TestPKI
from hub_controller.aggregator import (
    AggregatorServer,
    KubernetesClusterRegistry,
    KubernetesStatusClient,
    ReloadingServerCredentials,
    ReportStore,
    StatusWriter,
)
from hub_controller.signer.handlers import CSRSigner, registered_clusters
from ocmfl import constants, pki
from ocmfl.kube import Kube, api_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "federatedlearning.yaml"
MCA_PATH = f"/apis/{constants.ADDON_GROUP}/v1alpha1/namespaces/{{ns}}/managedclusteraddons"
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


def wait_for(fn: Callable[[], T | None], timeout: float = 30.0, what: str = "it") -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last  # type: ignore[no-any-return]
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


async def await_for(fn: Callable[[], T | None], timeout: float = 30.0, what: str = "it") -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(fn)
        if last:
            return last  # type: ignore[no-any-return]
        await asyncio.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@pytest.fixture
def hub(control_plane: ControlPlane) -> Iterator[Kube]:
    k = Kube(control_plane.hub_kubeconfig)
    install_crd(k)
    yield k
    k.close()


@pytest.fixture
def addon_on_cluster1(hub: Kube, control_plane: ControlPlane) -> Iterator[str]:
    """The addon enabled on the first cluster only (its ManagedClusterAddOn exists)."""
    cluster = control_plane.clusters[0]
    hub.create(
        MCA_PATH.format(ns=cluster),
        {
            "apiVersion": f"{constants.ADDON_GROUP}/v1alpha1",
            "kind": "ManagedClusterAddOn",
            "metadata": {"name": constants.ADDON_NAME, "namespace": cluster},
            "spec": {},
        },
    )
    yield cluster
    hub.delete(f"{MCA_PATH.format(ns=cluster)}/{constants.ADDON_NAME}")


@pytest.fixture
def fl(hub: Kube, namespace: str) -> dict[str, Any]:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": "digits", "namespace": namespace}
    path = f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{constants.PLURAL}"
    return hub.request("POST", path, body)


def fl_status(hub: Kube, namespace: str) -> dict[str, Any]:
    path = f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{constants.PLURAL}/digits"
    return (hub.get(path) or {}).get("status") or {}


@pytest.fixture
async def aggregator(
    control_plane: ControlPlane, tmp_path: Path
) -> AsyncIterator[tuple[AggregatorServer, StatusWriter, TestPKI]]:
    tpki = TestPKI(tmp_path / "pki")
    custom = __import__("kubernetes").client.CustomObjectsApi(
        api_client(control_plane.hub_kubeconfig)
    )
    store = ReportStore()
    server = AggregatorServer(
        store,
        KubernetesClusterRegistry(custom, negative_ttl_s=0.5),
        credentials=ReloadingServerCredentials.from_dir(tpki.server_dir()),
    )
    await server.start()
    writer = StatusWriter(store, KubernetesStatusClient(custom), interval_s=0.5)
    await writer.start()
    yield server, writer, tpki
    await writer.stop()
    await server.stop(None)


def agent_for(cluster: str, port: int, cert_dir: Path) -> Agent:
    return Agent(
        AgentConfig(
            cluster=cluster,
            hub_address=f"127.0.0.1:{port}",
            cert_dir=cert_dir,
            watch=False,
            listen_host="127.0.0.1",
            port=0,
            health_port=None,
            backoff_initial_s=0.1,
            backoff_max_s=0.5,
            cert_check_interval_s=0.2,
        )
    )


async def post(agent: Agent, body: dict[str, Any]) -> int:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{agent.port}/v1/metrics", json=body) as r,
    ):
        return r.status


async def test_report_reaches_federatedlearning_status(
    hub: Kube,
    control_plane: ControlPlane,
    namespace: str,
    fl: dict[str, Any],
    addon_on_cluster1: str,
    aggregator: tuple[AggregatorServer, StatusWriter, TestPKI],
) -> None:
    server, writer, tpki = aggregator
    cluster1, cluster2 = control_plane.clusters[0], control_plane.clusters[1]
    agents = [agent_for(c, server.port, tpki.client_dir(c)) for c in (cluster1, cluster2)]
    for a in agents:
        await a.start()
    try:
        for a in agents:
            body = {
                "round": 2,
                "phase": "evaluate",
                "loss": 0.31,
                "accuracy": 0.91,
                "samples": 180,
                "duration_s": 1.2,
                "fl_namespace": namespace,
                "fl_name": "digits",
                "fl_uid": fl["metadata"]["uid"],
            }
            assert await post(a, body) == 202

        def row() -> dict[str, Any] | None:
            rows = fl_status(hub, namespace).get("clusters") or []
            return next((r for r in rows if r["name"] == cluster1), None)

        got = await await_for(row, 30, "cluster1's row in status.clusters")
        assert (got["phase"], got["round"], got["accuracy"], got["loss"]) == (
            "Running",
            2,
            0.91,
            0.31,
        )
        assert got["lastReportTime"].endswith("Z")
        # cluster2 has no ManagedClusterAddOn: refused, never in status
        await await_for(
            lambda: server.metrics.registry.get_sample_value(
                "ocmfl_reports_rejected_total", {"reason": "not_registered"}
            ),
            15,
            "cluster2 refused",
        )
        assert agents[1].buffer.acked == 0 and len(agents[1].buffer) == 1
        names = [r["name"] for r in fl_status(hub, namespace).get("clusters") or []]
        assert cluster2 not in names
        assert writer.patches >= 1
    finally:
        for a in agents:
            await a.stop()


# --- the CSR signer ----------------------------------------------------------------------


@pytest.fixture
def csr_rbac(hub: Kube, control_plane: ControlPlane) -> Iterator[None]:
    """Addon agents may create and read CSRs (what the agent's hub permissions would grant)."""
    ensure_agent_csr_rbac(hub)
    yield
    hub.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{CSR_RBAC_NAME}")
    hub.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{CSR_RBAC_NAME}")


async def test_csr_signer_issues_identities_only_to_registered_clusters(
    hub: Kube,
    control_plane: ControlPlane,
    addon_on_cluster1: str,
    csr_rbac: None,
    tmp_path: Path,
    aggregator: tuple[AggregatorServer, StatusWriter, TestPKI],
) -> None:
    from kubernetes import client as k8s

    server, _writer, tpki = aggregator
    cluster1, cluster2 = control_plane.clusters[0], control_plane.clusters[1]
    admin = api_client(control_plane.hub_kubeconfig)
    custom = k8s.CustomObjectsApi(admin)
    assert cluster1 in registered_clusters(custom)
    assert cluster2 not in registered_clusters(custom)
    signer = CSRSigner(admin, lambda: tpki.ca, lambda: registered_clusters(custom))
    thread = threading.Thread(target=signer.run, daemon=True)
    thread.start()
    foreign = hub.request(
        "POST",
        CSRS,
        {
            "metadata": {"generateName": "ocmfl-test-foreign-"},
            "spec": {
                "signerName": "example.com/other",
                "usages": ["client auth"],
                "request": base64.b64encode(
                    pki.csr_to_pem(pki.create_csr(cluster1, pki.generate_key()))
                ).decode(),
            },
        },
    )
    try:
        as_agent1 = k8s.CertificatesV1Api(
            api_client(addon_agent_kubeconfig(control_plane, cluster1, tmp_path / "a1"))
        )
        pair = await request_certificate(as_agent1, cluster1, expiration_seconds=3600, timeout_s=30)
        assert pki.cluster_from_certificate(pair.cert) == cluster1
        assert pki.verify_issued_by(pair.cert, tpki.ca.cert)
        life = pair.cert.not_valid_after_utc - pair.cert.not_valid_before_utc
        assert life <= pki.CLOCK_SKEW + dt.timedelta(hours=1)

        as_agent2 = k8s.CertificatesV1Api(
            api_client(addon_agent_kubeconfig(control_plane, cluster2, tmp_path / "a2"))
        )
        with pytest.raises(RenewalError, match="UnknownCluster"):
            await request_certificate(as_agent2, cluster2, timeout_s=30)

        # the issued identity works end to end: it reports through the aggregator
        cert_dir = pki.save_tls_dir(tmp_path / "issued", pair, tpki.ca.cert)
        agent = agent_for(cluster1, server.port, cert_dir)
        await agent.start()
        try:
            assert (
                await post(
                    agent,
                    {
                        "round": 1,
                        "phase": "fit",
                        "loss": 0.5,
                        "samples": 10,
                        "duration_s": 0.1,
                        "fl_namespace": "x",
                        "fl_name": "y",
                    },
                )
                == 202
            )
            await await_for(lambda: agent.buffer.acked == 1, 15, "the report acked")
        finally:
            await agent.stop()

        current = hub.get(f"{CSRS}/{foreign['metadata']['name']}") or {}
        assert not (current.get("status") or {}).get("conditions")
        assert not (current.get("status") or {}).get("certificate")
    finally:
        signer.stop()
        hub.delete(f"{CSRS}/{foreign['metadata']['name']}")
        for item in (hub.get(CSRS) or {}).get("items", []):
            if item["spec"].get("signerName") == constants.SIGNER_NAME:
                hub.delete(f"{CSRS}/{item['metadata']['name']}")


async def test_agent_watches_a_real_client_job_and_delivers_its_final_report(
    hub: Kube,
    control_plane: ControlPlane,
    namespace: str,
    fl: dict[str, Any],
    addon_on_cluster1: str,
    aggregator: tuple[AggregatorServer, StatusWriter, TestPKI],
) -> None:
    """A client Job run by the cluster's local node: Pending -> Running -> Succeeded."""
    server, _writer, tpki = aggregator
    cluster = control_plane.clusters[0]
    spoke = Kube(control_plane.cluster_kubeconfigs[cluster])
    spoke.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    labels = {
        constants.LABEL_COMPONENT: "client",
        constants.LABEL_OWNER_NAMESPACE: namespace,
        constants.LABEL_OWNER_NAME: "digits",
        constants.LABEL_OWNER_UID: fl["metadata"]["uid"],
    }
    agent = Agent(
        AgentConfig(
            cluster=cluster,
            hub_address=f"127.0.0.1:{server.port}",
            cert_dir=tpki.client_dir(cluster),
            watch=True,
            watch_namespace=namespace,
            kubeconfig=control_plane.cluster_kubeconfigs[cluster],
            listen_host="127.0.0.1",
            port=0,
            health_port=None,
            backoff_initial_s=0.1,
            backoff_max_s=0.5,
        )
    )
    await agent.start()
    try:
        spoke.request(
            "POST",
            f"/apis/batch/v1/namespaces/{namespace}/jobs",
            {
                "metadata": {"name": "client", "labels": labels},
                "spec": {
                    "backoffLimit": 0,
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "client",
                                    "image": constants.WORKLOAD_IMAGE,
                                    "command": ["python", "-c", "import time; time.sleep(8)"],
                                }
                            ],
                        },
                    },
                },
            },
        )

        def phase() -> str | None:
            row = server.store.snapshot(namespace, "digits").get(cluster)
            return row.phase if row else None

        await await_for(lambda: phase() in ("Running", "Succeeded"), 90, "the client started")
        body: dict[str, Any] = {
            "round": 1,
            "phase": "fit",
            "loss": 0.4,
            "samples": 50,
            "duration_s": 0.5,
        }
        if phase() != "Running":  # a slow plane: too late to infer the run from the watcher
            body.update(fl_namespace=namespace, fl_name="digits", fl_uid=fl["metadata"]["uid"])
        assert await post(agent, body) == 202

        def final_row() -> dict[str, Any] | None:
            rows = fl_status(hub, namespace).get("clusters") or []
            row = next((r for r in rows if r["name"] == cluster), None)
            return row if row and row.get("phase") == "Succeeded" else None

        row = await await_for(final_row, 90, "Succeeded in status.clusters")
        assert row["round"] == 1 and row["samples"] == 50
        state = server.store.snapshot(namespace, "digits")[cluster]
        assert state.final and state.fl_uid == fl["metadata"]["uid"]
    finally:
        await agent.stop()
        spoke.delete(f"/api/v1/namespaces/{namespace}")
        spoke.close()
