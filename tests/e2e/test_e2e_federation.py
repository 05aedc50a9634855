"""A whole federation, headless: the demo's flow on a private local control plane.

Real kube-apiservers, OCM placement controller and work agents (hack/controlplane); the hub
controller, aggregator and CSR signer and one agent per cluster as processes
(hack/localfed.py); Flower server and clients as pods run by the local nodes, talking through
the mTLS Fleet gateway. Three clusters, two with data.
"""

from __future__ import annotations

import hashlib
import json
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.demo import demo_resource, held_out_scores
from hack import controlplane as cp
from hack import keyscan
from hack.controlplane import bootstrap
from hack.localfed import (
    FL_PATH,
    LocalFederation,
    create_fl,
    get_fl,
    prepare_data,
    set_cluster_claim,
    wait_fl,
)
from hack.testing import WaitTimeout, wait_for
from hub_controller import credentials_layout
from hub_controller.api import FLRef
from hub_controller.operator.desired.works import client_namespace, work_name
from ocmfl import constants, pki
from ocmfl.kube import Kube

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

NAMESPACE = "fl-e2e"
OWNER = f"{constants.LABEL_OWNER_NAMESPACE}={NAMESPACE}"


def _works(hub: Kube, cluster: str) -> list[dict[str, Any]]:
    path = f"/apis/{constants.WORK_GROUP}/v1/namespaces/{cluster}/manifestworks"
    items = (hub.get(path, {"labelSelector": OWNER}) or {}).get("items") or []
    return list(items)


def _post_when_up(address: str, ctx: ssl.SSLContext) -> httpx.Response:
    """POST to the gateway, waiting while its pod starts (the LB address exists before)."""

    def attempt() -> httpx.Response | None:
        try:
            with httpx.Client(verify=ctx, timeout=5) as client:
                return client.post(f"https://{address}/v1/fleet/pull-messages", content=b"")
        except httpx.ConnectError:
            return None

    return wait_for(attempt, 180, f"the Fleet gateway at {address}")


def _gateway_refuses(address: str, ca_file: Path, tmp: Path) -> None:
    """No certificate, or one from another CA: the Fleet API is out of reach. `ca_file` is
    the federation's Fleet CA (the gateway's certificate is not under the hub CA)."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.check_hostname = False  # the point here is the client side of the handshake
    r = _post_when_up(address, ctx)
    assert r.status_code == 400, r.text  # nginx: "No required SSL certificate was sent"
    other = pki.issue_client_cert("cluster1", pki.create_ca("not-the-hub"))
    pki.save_tls_dir(tmp / "foreign", other, None)
    ctx.load_cert_chain(str(tmp / "foreign" / "tls.crt"), str(tmp / "foreign" / "tls.key"))
    with httpx.Client(verify=ctx, timeout=5) as client:
        r = client.post(f"https://{address}/v1/fleet/pull-messages", content=b"")
    assert r.status_code == 400, r.text  # certificate not from the federation's Fleet CA
    assert "fleet" not in r.text.lower()


def test_federation_trains_to_completion_over_mtls_and_cleans_up(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    workdir = fed.workdir.parent
    body = demo_resource(rounds=2, min_clients=2, test_dir=workdir / "data" / "test")
    claim = body["spec"]["client"]["dataClaim"]
    with_data, without = plane.clusters[:2], plane.clusters[2]
    paths = prepare_data(plane, workdir / "data", with_data, claim)
    name = body["metadata"]["name"]
    created = create_fl(hub, NAMESPACE, body)
    ref = FLRef(namespace=NAMESPACE, name=name, uid=created["metadata"]["uid"])

    # While it trains: the gateway refuses clients without a hub-issued certificate.
    def running() -> dict[str, Any] | None:
        obj = get_fl(hub, NAMESPACE, name) or {}
        return obj if (obj.get("status") or {}).get("phase") in ("Running", "Completed") else None

    wait_for(running, 600, "phase Running")
    svc_path = f"/api/v1/namespaces/{NAMESPACE}/services"
    [svc] = (hub.get(svc_path, {"labelSelector": OWNER}) or {})["items"]
    lb = svc["status"]["loadBalancer"]["ingress"][0]["ip"]
    # The gateway's certificate comes from the federation's own Fleet CA (never the hub CA
    # agents trust for the aggregator): verify it with that.
    creds = hub.get(
        f"/api/v1/namespaces/{NAMESPACE}/secrets/"
        + credentials_layout.credentials_secret_name(credentials_layout.server_name(ref))
    )
    assert creds is not None
    fleet_ca = tmp_path / "fleet-ca.crt"
    fleet_ca.write_bytes(credentials_layout.secret_data(creds)[credentials_layout.CA])
    _gateway_refuses(f"{lb}:{constants.FLEET_PROXY_PORT}", fleet_ca, tmp_path)

    final = wait_fl(hub, NAMESPACE, name, 900, fed=fed)
    status = final["status"]
    assert status["phase"] == "Completed", status.get("message")
    assert status["round"] == status["totalRounds"] == 2

    # `kubectl describe fl` tells the story: the phases and each cluster that joined.
    def story_told() -> list[dict[str, Any]] | None:
        events = _events(hub, final)
        reasons = {e["reason"] for e in events}
        joined = " ".join(e["message"] for e in events if e["reason"] == "ClusterJoined")
        told = {"Running", "Completed"} <= reasons and all(c in joined for c in with_data)
        return events if told else None

    try:
        events = wait_for(story_told, 60, "the run's Events")
    except WaitTimeout:
        told = [(e["type"], e["reason"], e["message"]) for e in _events(hub, final)]
        raise AssertionError(f"the run's Events are not all there: {told}") from None
    bad = {"Failed", "ClusterFailed", "ClusterBlocked", "ClusterLeft"}
    assert not [e for e in events if e["reason"] in bad], events
    assert not any(without in e["message"] for e in events), events

    # Only clusters whose ClusterClaim points at data got a work; each got its own path.
    assert _works(hub, without) == []
    for cluster in with_data:
        [work] = _works(hub, cluster)
        assert work["metadata"]["name"] == work_name(ref)
        # The data path is a PV's hostPath, mounted through its pre-bound claim.
        pv = next(
            m for m in work["spec"]["workload"]["manifests"] if m["kind"] == "PersistentVolume"
        )
        assert pv["spec"]["hostPath"]["path"] == str(paths[cluster])

    # Per-cluster rows come from the agents' reports; each client saw only its partition.
    rows = {r["name"]: r for r in status["clusters"]}
    assert set(rows) == set(with_data)
    for cluster in with_data:
        manifest = json.loads((paths[cluster] / "manifest.json").read_text())
        row = rows[cluster]
        assert row["samples"] == manifest["samples"], row
        assert row["lastReportTime"], row
        assert row["accuracy"] is not None and row["round"] == 2, row
    assert status.get("history"), "per-round metrics missing"

    # The model exists and beats the initial one on held-out data (scored by the app).
    model = Path(status["model"]["path"])
    assert model.is_file() and model.parent.parent == fed.store_dir(final)
    before, after = held_out_scores(final, fed.store_dir(final))
    assert after["test-accuracy"] > before["test-accuracy"] + 0.3, (before, after)
    assert status["model"]["metrics"]["test-accuracy"] == after["test-accuracy"]

    # Keys were born where they are used: each cluster's agent wrote its client's identity
    # there, and no object on the hub (Secrets, ConfigMaps, works, CSRs) holds a private key
    # of any cluster.
    for cluster in with_data:
        spoke = Kube(plane.cluster_kubeconfigs[cluster])
        try:
            ns = client_namespace(ref)
            identity = spoke.get(
                f"/api/v1/namespaces/{ns}/secrets/{constants.CLIENT_IDENTITY_SECRET}"
            )
        finally:
            spoke.close()
        assert identity is not None and "node.key" in identity["data"]
    findings = keyscan.scan(keyscan.read_hub(hub))
    assert findings == [], [str(f) for f in findings]

    # Deleting the resource cleans the hub and every cluster, and nothing else.
    hub.delete(f"{FL_PATH.format(ns=NAMESPACE)}/{name}")
    wait_for(lambda: get_fl(hub, NAMESPACE, name) is None, 180, "FederatedLearning deleted")
    for cluster in with_data:

        def works_gone(c: str = cluster) -> bool:
            return not _works(hub, c)

        wait_for(works_gone, 120, f"work on {cluster} gone")
        spoke = Kube(plane.cluster_kubeconfigs[cluster])
        try:
            ns = f"/api/v1/namespaces/{client_namespace(ref)}"

            def ns_gone(s: Kube = spoke, n: str = ns) -> bool:
                return s.get(n) is None

            wait_for(ns_gone, 180, f"client ns on {cluster} gone")
        finally:
            spoke.close()
    for kind in ("services", "secrets"):
        items = hub.get(f"/api/v1/namespaces/{NAMESPACE}/{kind}", {"labelSelector": OWNER}) or {}
        assert not items.get("items"), kind
    placements = f"/apis/{constants.CLUSTER_GROUP}/v1beta1/namespaces/{NAMESPACE}/placements"
    assert not (hub.get(placements) or {}).get("items")
    binding = f"/apis/{constants.CLUSTER_GROUP}/v1beta2/namespaces/{NAMESPACE}"
    assert hub.get(f"{binding}/managedclustersetbindings/global") is not None  # the admin's
    for cluster in with_data:
        set_cluster_claim(plane, cluster, claim, None)


def _events(hub: Kube, fl: dict[str, Any]) -> list[dict[str, Any]]:
    """The Events posted on this FederatedLearning (by uid), oldest first."""
    meta = fl["metadata"]
    items = (hub.get(f"/api/v1/namespaces/{meta['namespace']}/events") or {}).get("items") or []
    mine = [e for e in items if (e.get("involvedObject") or {}).get("uid") == meta["uid"]]
    return sorted(mine, key=lambda e: e.get("firstTimestamp") or e["metadata"]["creationTimestamp"])


def test_a_resource_that_says_nothing_about_storage_keeps_its_model_on_a_provisioned_claim(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube
) -> None:
    """The default store is a claim on the hub's default StorageClass (issue 29 item 8), so a
    resource that says nothing about storage needs no HostPath grant in its policy. On the
    plane Kubernetes' own hostPath provisioner binds it; the model lands there."""
    workdir = fed.workdir.parent
    body = demo_resource(rounds=1, min_clients=2)
    body["metadata"]["name"] = "pvc-default"
    del body["spec"]["server"]["storage"]
    claim = body["spec"]["client"]["dataClaim"]
    with_data = plane.clusters[:2]
    prepare_data(plane, workdir / "data-pvc", with_data, claim)
    create_fl(hub, NAMESPACE, body)
    try:
        final = wait_fl(hub, NAMESPACE, "pvc-default", 600, fed=fed)
        status = final["status"]
        assert status["phase"] == "Completed", status.get("message")
        model = status["model"]
        assert model["path"].startswith("pvc://"), model
        claim_name, _, file = model["path"].removeprefix("pvc://").partition("/")
        pvc = hub.get(f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{claim_name}")
        assert pvc is not None and pvc["status"]["phase"] == "Bound", pvc
        assert pvc["spec"]["storageClassName"] == bootstrap.DEFAULT_STORAGE_CLASS
        pv = hub.get(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}") or {}
        stored = Path(pv["spec"]["hostPath"]["path"]) / file
        assert hashlib.sha256(stored.read_bytes()).hexdigest() == model["sha256"]
    finally:
        hub.delete(f"{FL_PATH.format(ns=NAMESPACE)}/pvc-default")
        wait_for(lambda: get_fl(hub, NAMESPACE, "pvc-default") is None, 180, "deleted")
        for c in with_data:
            set_cluster_claim(plane, c, claim, None)


def test_a_cluster_leaving_below_the_minimum_fails_the_run_with_a_clear_reason(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube
) -> None:
    workdir = fed.workdir.parent
    body = demo_resource(rounds=20, min_clients=2)
    body["metadata"]["name"] = "leaver"
    body["spec"]["server"]["timeouts"] = {"clientsReadySeconds": 30, "roundSeconds": 60}
    claim = body["spec"]["client"]["dataClaim"]
    with_data = plane.clusters[:2]
    prepare_data(plane, workdir / "data-leave", with_data, claim)
    create_fl(hub, NAMESPACE, body)

    def training() -> bool:
        status = (get_fl(hub, NAMESPACE, "leaver") or {}).get("status") or {}
        return int(status.get("round") or 0) >= 1

    wait_for(training, 600, "first round done")
    leaving = with_data[1]
    set_cluster_claim(plane, leaving, claim, None)  # the cluster no longer offers its data
    # wait_fl raises after 400 s: the run must fail well before its own round timeouts.
    final = wait_fl(hub, NAMESPACE, "leaver", 400, fed=fed)
    status = final["status"]
    assert status["phase"] == "Failed"

    def failure_told() -> bool:
        return any(
            (e["type"], e["reason"], e["message"]) == ("Warning", "Failed", status["message"])
            for e in _events(hub, final)
        )

    wait_for(failure_told, 60, "a Warning Event with the failure's reason")
    rows = {r["name"]: r for r in status["clusters"]}
    assert leaving not in rows or rows[leaving]["phase"] != "Running"
    # The reason says what happened, not just "failed".
    assert "1 of 2" in status["message"] or "minimum" in status["message"].lower(), status
    wait_for(lambda: not _works(hub, leaving), 120, f"work on {leaving} deleted")
    hub.delete(f"{FL_PATH.format(ns=NAMESPACE)}/leaver")
    wait_for(lambda: get_fl(hub, NAMESPACE, "leaver") is None, 180, "leaver deleted")
    set_cluster_claim(plane, with_data[0], claim, None)
