"""The status path on the real local control plane, through the hub process as it runs.

kopf runs the hub's three parts in-process (operator, aggregator, CSR signer) against the real
hub apiserver. A cluster's agent posts metrics -> mTLS report -> aggregator (member clusters
only: accepted ManagedCluster with the addon's ManagedClusterAddOn, from the hub's indexes) ->
report store -> the operator's status fold -> FederatedLearning status.clusters. The CSR signer
issues the agent's identity on the same hub: a CSR created by cluster1's addon-agent identity
is approved and signed; one for a cluster without the addon is denied; a CSR for a foreign
signer is left alone.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from kopf.testing import KopfRunner

from agent_addon.agent import Agent, AgentConfig
from agent_addon.csr import RenewalError, request_certificate
from hack.controlplane import clusteradm
from hack.localfed import (
    addon_hub_kubeconfig,
    grant_for,
    grant_namespace,
    inert_fl_body,
    install_addon,
    install_crd,
    metrics_headers,
)
from hack.testing import TestPKI, await_for, free_port, kopf_registry, wait_for
from ocmfl import constants, pki, reports
from ocmfl.kube import Kube
from ocmfl.names import cluster_side_name

if TYPE_CHECKING:
    from hack.controlplane.plane import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CLUSTER = constants.CLUSTER_GROUP
MCA_PATH = f"/apis/{constants.ADDON_GROUP}/v1alpha1/namespaces/{{ns}}/managedclusteraddons"
CLAIMS = f"/apis/{CLUSTER}/v1alpha1/clusterclaims"
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
HUB_PARTS = (  # `ocm-fl-hub --role all`, in its import order
    "hub_controller.signer.aggregator_cert",
    "hub_controller.operator.handlers",
    "hub_controller.aggregator.handlers",
    "hub_controller.signer.addon_status",
    "hub_controller.signer.handlers",
    "hub_controller.signer.ledger",
)


@pytest.fixture
def hub(control_plane: ControlPlane) -> Iterator[Kube]:
    k = Kube(control_plane.hub_kubeconfig)
    install_crd(k)
    yield k
    k.close()


@pytest.fixture
def addon_on_cluster1(
    hub: Kube, control_plane: ControlPlane, tpki: TestPKI, tmp_path: Path
) -> Iterator[str]:
    """The chart's addon installed and enabled on the first cluster only (`clusteradm addon
    enable`): OCM deploys its agent there and its registration agent gives it a hub
    kubeconfig. The deployed agent dials an address where no aggregator listens; the tests
    act as the agent with its credentials."""
    cluster = control_plane.clusters[0]
    install_addon(hub, "127.0.0.1:9", pki.cert_to_pem(tpki.ca.cert), tmp_path)
    clusteradm.addon_enable(hub, constants.ADDON_NAME, cluster, constants.AGENT_NAMESPACE)
    yield cluster
    hub.delete(f"{MCA_PATH.format(ns=cluster)}/{constants.ADDON_NAME}")


@pytest.fixture
def tpki(tmp_path: Path) -> TestPKI:
    """The hub CA (the hub process issues from it) and the agents' certificates."""
    return TestPKI(tmp_path / "pki")


class HubProcess:
    """Where the in-process hub listens."""

    def __init__(self, aggregator_port: int, metrics_port: int, hub: Kube) -> None:
        self.aggregator_port = aggregator_port
        self.metrics_port = metrics_port
        self.hub = hub

    def metric(self, name: str, labels: dict[str, str]) -> float | None:
        """A sample from the hub's /metrics, or None (also while /metrics is not up)."""
        want = f"{{{','.join(f'{k}={v!r}' for k, v in sorted(labels.items()))}}}".replace("'", '"')
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        request = urllib.request.Request(url, headers=metrics_headers(self.hub))
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(f"{name}{want if labels else ''} "):
                return float(line.rsplit(" ", 1)[1])
        return None


@pytest.fixture
def hub_process(
    control_plane: ControlPlane,
    hub: Kube,
    namespace: str,
    tpki: TestPKI,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[HubProcess]:
    """`ocm-fl-hub` in-process (kopf), with its CA, watching this test's namespace and the
    cluster namespaces; at the end the test's resources are deleted while it still runs."""
    ca_dir = pki.save_tls_dir(tmp_path / "hub-ca", tpki.ca, None)
    process = HubProcess(free_port(), free_port(), hub)
    monkeypatch.setenv("KUBECONFIG", control_plane.hub_kubeconfig)
    # One CA for both roles here (the server certificate and the agents' identities), so the
    # test's agents trust the aggregator with the directory their certificate comes in; the
    # split is the attack tests' subject (tests/attack/test_attack_registration.py).
    monkeypatch.setenv(constants.ENV_CA_DIR, str(ca_dir))
    monkeypatch.setenv(constants.ENV_AGENT_CA_DIR, str(ca_dir))
    monkeypatch.setenv(constants.ENV_AGGREGATOR_LISTEN, f"127.0.0.1:{process.aggregator_port}")
    monkeypatch.setenv(constants.ENV_METRICS_LISTEN, f"127.0.0.1:{process.metrics_port}")
    watched = [f"--namespace={n}" for n in (namespace, *control_plane.clusters)]
    with KopfRunner(["run", "--standalone", *watched], registry=kopf_registry(*HUB_PARTS)) as run:
        wait_for(lambda: process.metric("ocmfl_agent_streams", {}) is not None, 60, "the hub")
        yield process
        hub.delete(f"{fl_path(namespace)}/digits")
        wait_for(lambda: hub.get(f"{fl_path(namespace)}/digits") is None, 90, "FL gone")
    assert run.exception is None, run.exception


def fl_path(namespace: str) -> str:
    return f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{constants.PLURAL}"


@pytest.fixture
def fl(
    hub: Kube, control_plane: ControlPlane, namespace: str, addon_on_cluster1: str
) -> Iterator[dict[str, Any]]:
    """A FederatedLearning that selects cluster1 (a data claim only it has). Its clients never
    run (an image the local node refuses), minAvailableClients is out of reach: the rows are
    about the reports."""
    claim = f"{namespace}.data.ocmfl.io"
    spoke = Kube(control_plane.cluster_kubeconfigs[addon_on_cluster1])
    spoke.create(
        CLAIMS,
        {
            "apiVersion": f"{CLUSTER}/v1alpha1",
            "kind": "ClusterClaim",
            "metadata": {"name": claim},
            "spec": {"value": "/srv/data/cluster1"},
        },
    )
    hub.create(
        f"/apis/{CLUSTER}/v1beta2/namespaces/{namespace}/managedclustersetbindings",
        {
            "apiVersion": f"{CLUSTER}/v1beta2",
            "kind": "ManagedClusterSetBinding",
            "metadata": {"name": "global", "namespace": namespace},
            "spec": {"clusterSet": "global"},
        },
    )
    body = inert_fl_body(namespace, claim)
    grant_namespace(hub, namespace, **grant_for(body))
    yield hub.request("POST", fl_path(namespace), body)
    spoke.delete(f"{CLAIMS}/{claim}")
    spoke.close()


def fl_status(hub: Kube, namespace: str) -> dict[str, Any]:
    return (hub.get(f"{fl_path(namespace)}/digits") or {}).get("status") or {}


def cluster_row(hub: Kube, namespace: str, cluster: str) -> dict[str, Any] | None:
    rows = fl_status(hub, namespace).get("clusters") or []
    return next((r for r in rows if r["name"] == cluster), None)


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


async def post(agent: Agent, body: dict[str, Any], token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{agent.port}/v1/metrics", json=body, headers=headers) as r,
    ):
        return r.status


async def test_report_reaches_federatedlearning_status(
    hub: Kube,
    control_plane: ControlPlane,
    namespace: str,
    tpki: TestPKI,
    hub_process: HubProcess,
    fl: dict[str, Any],
) -> None:
    cluster1, cluster2 = control_plane.clusters[0], control_plane.clusters[1]
    await await_for(lambda: cluster_row(hub, namespace, cluster1), 60, "cluster1's row")
    port = hub_process.aggregator_port
    agents = [agent_for(c, port, tpki.client_dir(c)) for c in (cluster1, cluster2)]
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

        def reported() -> dict[str, Any] | None:
            row = cluster_row(hub, namespace, cluster1)
            return row if row and row.get("round") == 2 else None

        got = await await_for(reported, 30, "cluster1's report in status.clusters")
        assert (got["phase"], got["accuracy"], got["loss"]) == ("Running", 0.91, 0.31)
        assert got["lastReportTime"].endswith("Z")
        assert fl_status(hub, namespace)["accuracy"] == 0.91
        # cluster2 has no ManagedClusterAddOn: refused, never in status
        await await_for(
            lambda: hub_process.metric(
                "ocmfl_reports_rejected_total", {"reason": "not_registered"}
            ),
            15,
            "cluster2 refused",
        )
        assert agents[1].buffer.acked == 0 and len(agents[1].buffer) == 1
        assert cluster_row(hub, namespace, cluster2) is None
    finally:
        for a in agents:
            await a.stop()


# --- the CSR signer ----------------------------------------------------------------------


async def test_csr_signer_issues_identities_only_to_registered_clusters(
    hub: Kube,
    control_plane: ControlPlane,
    addon_on_cluster1: str,
    tmp_path: Path,
    tpki: TestPKI,
    hub_process: HubProcess,
) -> None:
    cluster1, cluster2 = control_plane.clusters[0], control_plane.clusters[1]
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
        # cluster1's agent credentials, as OCM's registration agent wrote them on cluster1
        as_agent1 = Kube(addon_hub_kubeconfig(control_plane, cluster1, tmp_path / "a1"))
        pair = await request_certificate(as_agent1, cluster1, expiration_seconds=3600, timeout_s=30)
        assert pki.cluster_from_certificate(pair.cert) == cluster1
        assert pki.verify_issued_by(pair.cert, tpki.ca.cert)
        life = pair.cert.not_valid_after_utc - pair.cert.not_valid_before_utc
        assert life <= pki.CLOCK_SKEW + dt.timedelta(hours=1)

        # cluster2's real agent credentials, from while the addon was enabled there: once it
        # is disabled, they get no agent identity
        clusteradm.addon_enable(hub, constants.ADDON_NAME, cluster2, constants.AGENT_NAMESPACE)
        try:
            as_agent2 = Kube(addon_hub_kubeconfig(control_plane, cluster2, tmp_path / "a2"))
        finally:
            hub.delete(f"{MCA_PATH.format(ns=cluster2)}/{constants.ADDON_NAME}")
        await await_for(
            lambda: hub.get(f"{MCA_PATH.format(ns=cluster2)}/{constants.ADDON_NAME}") is None,
            60,
            "cluster2's addon disabled",
        )
        # The hub's signer learns of the deletion through its watch (well under a second; more
        # on a loaded machine): from then on, cluster2's agent gets no identity.
        deadline = time.monotonic() + 30
        refusal = ""
        while not refusal:
            try:
                await request_certificate(as_agent2, cluster2, timeout_s=10)
            except RenewalError as e:
                refusal = str(e)
                break
            assert time.monotonic() < deadline, "an identity 30 s after the addon was disabled"
            await asyncio.sleep(1)
        assert "UnknownCluster" in refusal, refusal

        # the issued identity works end to end: it reports through the aggregator
        cert_dir = pki.save_tls_dir(tmp_path / "issued", pair, tpki.ca.cert)
        agent = agent_for(cluster1, hub_process.aggregator_port, cert_dir)
        await agent.start()
        try:
            body = {
                "round": 1,
                "phase": "fit",
                "loss": 0.5,
                "samples": 10,
                "duration_s": 0.1,
                "fl_namespace": "x",
                "fl_name": "y",
                "fl_uid": "0000-y",
            }
            assert await post(agent, body) == 202
            await await_for(lambda: agent.buffer.acked == 1, 15, "the report answered")
            # x/y has no ManifestWork on cluster1: answered (the identity was accepted) but
            # refused for good, so the agent dropped it (issue 12: reports are scoped)
            assert agent.streamer.rejected == 1 and len(agent.buffer) == 0
        finally:
            await agent.stop()

        current = hub.get(f"{CSRS}/{foreign['metadata']['name']}") or {}
        assert not (current.get("status") or {}).get("conditions")
        assert not (current.get("status") or {}).get("certificate")
    finally:
        hub.delete(f"{CSRS}/{foreign['metadata']['name']}")
        for item in (hub.get(CSRS) or {}).get("items", []):
            if item["spec"].get("signerName") == constants.SIGNER_NAME:
                hub.delete(f"{CSRS}/{item['metadata']['name']}")


async def test_agent_watches_a_real_client_job_and_delivers_its_final_report(
    hub: Kube,
    control_plane: ControlPlane,
    namespace: str,
    tpki: TestPKI,
    hub_process: HubProcess,
    fl: dict[str, Any],
) -> None:
    """A client Job run by the cluster's local node: Pending -> Running -> Succeeded, seen by
    the agent's watch; its final report is acknowledged and its metrics reach status. The
    metrics post carries the federation's token, which the agent checks against the Secret the
    resource's ManifestWork put on the cluster (issue 12)."""
    cluster = control_plane.clusters[0]
    spoke = Kube(control_plane.cluster_kubeconfigs[cluster])
    # The hub takes reports only for a federation with a work on the cluster: wait for it (its
    # token Secret on the cluster says the work agent applied it).
    token_path = (
        f"/api/v1/namespaces/{cluster_side_name(namespace, 'digits')}/secrets/"
        f"{constants.CLIENT_TOKEN_SECRET}"
    )
    secret = await await_for(lambda: spoke.get(token_path), 90, "the work's token Secret")
    token = base64.b64decode(secret["data"][constants.CLIENT_TOKEN_KEY]).decode()
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
            hub_address=f"127.0.0.1:{hub_process.aggregator_port}",
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

        key = (namespace, "digits")

        def phase() -> str | None:
            run = agent.state.runs.get(key)
            return reports.CLIENT_PHASE_NAMES[run.phase] if run else None

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
        assert await post(agent, body) == 401  # no token: refused
        assert await post(agent, body, token) == 202

        def delivered() -> bool:
            run = agent.state.runs.get(key)
            return bool(run and run.final_sent and len(agent.buffer) == 0)

        await await_for(delivered, 90, "the final report acknowledged by the hub")
        assert agent.state.runs[key].uid == fl["metadata"]["uid"]

        def row() -> dict[str, Any] | None:
            found = cluster_row(hub, namespace, cluster)
            return found if found and found.get("round") == 1 else None

        got = await await_for(row, 30, "the client's metrics in status.clusters")
        assert got["samples"] == 50 and got["loss"] == 0.4
    finally:
        await agent.stop()
        spoke.delete(f"/api/v1/namespaces/{namespace}")
        spoke.close()
