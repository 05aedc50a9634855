"""Forging agent identities on the real OCM registration path (issue 28).

Everything here runs on the local plane with OCM v1.2.0's registration controller, addon
manager and registration agents, the chart's AddOnTemplate deployed by OCM, and the hub process
(controller, aggregator, signers). The attacker holds one member cluster's real credentials:
the hub kubeconfig OCM's registration agent wrote for that cluster's addon agent, the
cluster's own registration identity, and the bootstrap kubeconfig every cluster is given.

On the code before issue 28 the chart declared a CustomSigner registration for the agent
signer: OCM's addon manager approved every CSR for it from anyone and signed the requested
subject and SANs with the hub CA, which both the aggregator and the agents trusted.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID

from agent_addon.csr import csr_object
from agent_addon.fleet_identity import fleet_csr_object
from hack.controlplane import clusteradm, plane
from hack.controlplane.processes import State
from hack.localfed import (
    LocalFederation,
    addon_hub_kubeconfig,
    create_fl,
    inert_fl_body,
    set_cluster_claim,
)
from hack.testing import ReportProbe, WaitTimeout, agent_accepts, wait_for
from hub_controller.api import FLRef
from hub_controller.bootstrap.addon_template import default_agent_subject
from hub_controller.operator.desired.works import client_namespace
from ocmfl import constants, csroutcome, nodekeys, pki
from ocmfl.kube import Kube, KubeError

pytestmark = [pytest.mark.attack, pytest.mark.integration, pytest.mark.timeout(600)]

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
MCS = f"/apis/{constants.CLUSTER_GROUP}/v1/managedclusters"
ROGUE = "cluster10"  # a name with "cluster1" as its prefix (OCM's requester check)


@pytest.fixture(scope="module")
def fed(
    control_plane: plane.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalFederation]:
    """The hub process and, on both clusters, the agent OCM deploys and registers."""
    with LocalFederation(
        control_plane, tmp_path_factory.mktemp("reg") / "federation", control_plane.clusters[:2]
    ) as f:
        yield f


@pytest.fixture(scope="module")
def hub(control_plane: plane.ControlPlane) -> Iterator[Kube]:
    k = Kube(control_plane.hub_kubeconfig)
    yield k
    k.close()


SUBMITTED: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def remove_submitted(hub: Kube) -> Iterator[None]:
    """The attacker's CSRs go at the end (the hub's csrcleaner would, later): OCM's
    registration agent stops asking for an addon's hub kubeconfig while 10 CSRs labelled for
    that addon and cluster exist."""
    yield
    for name in SUBMITTED:
        with contextlib.suppress(KubeError):
            hub.delete(f"{CSRS}/{name}")


def as_kube(kubeconfig: str) -> Kube:
    return Kube(kubeconfig, field_manager="attacker")


def submit(kube: Kube, body: dict[str, Any]) -> str:
    made = kube.create(CSRS, body, exist_ok=False)
    assert made is not None
    SUBMITTED.append(str(made["metadata"]["name"]))
    return str(made["metadata"]["name"])


def decided(hub: Kube, name: str, timeout: float = 30) -> dict[str, Any]:
    """The CSR's status once approved+signed or denied."""

    def done() -> dict[str, Any] | None:
        status = (hub.get(f"{CSRS}/{name}") or {}).get("status") or {}
        types = {c["type"] for c in status.get("conditions") or []}
        return status if "Denied" in types or status.get("certificate") else None

    return wait_for(done, timeout, f"a decision on CSR {name}")


def denial(hub: Kube, name: str) -> str:
    """The reason the CSR was denied; fails if it was approved or signed."""
    status = decided(hub, name)
    types = {c["type"]: c for c in status.get("conditions") or []}
    assert "Approved" not in types and not status.get("certificate"), status
    return str(types["Denied"]["reason"])


def ocm_style_csr(
    cluster: str, signer: str, *, sans: list[x509.GeneralName] | None = None
) -> tuple[dict[str, Any], pki.PrivateKey]:
    """A CSR shaped as OCM's registration agent makes one for the addon of `cluster` (its
    default subject, the addon's labels, a name OCM's approver looks at)."""
    subject = default_agent_subject(cluster)
    key = pki.generate_key()
    with warnings.catch_warnings():  # OCM's user is longer than X.509's 64-char CN bound
        warnings.simplefilter("ignore", UserWarning)
        name = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, subject["user"], _validate=False)]
            + [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in subject["groups"]]
        )
    builder = x509.CertificateSigningRequestBuilder().subject_name(name)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    request = builder.sign(key, hashes.SHA256())
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {
            "generateName": f"addon-{cluster}-{constants.ADDON_NAME}-",
            "labels": {
                constants.LABEL_OCM_CLUSTER_NAME: cluster,
                constants.LABEL_OCM_ADDON_NAME: constants.ADDON_NAME,
            },
        },
        "spec": {
            "signerName": signer,
            "request": base64.b64encode(pki.csr_to_pem(request)).decode(),
            "usages": ["digital signature", "key encipherment", "client auth"],
        },
    }, key


def agent_csr_with_sans(cluster: str, sans: list[x509.GeneralName]) -> dict[str, Any]:
    """Our agent CSR for `cluster`, with SANs added (the aggregator's name)."""
    key = pki.generate_key()
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(pki.cluster_subject(cluster))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )
    body = csr_object(cluster, key)
    body["spec"]["request"] = base64.b64encode(pki.csr_to_pem(request)).decode()
    return body


def fleet_csr(cluster: str, uid: str) -> dict[str, Any]:
    _, public = nodekeys.generate_keypair(f"attack-{cluster}")
    return fleet_csr_object(cluster, uid, pki.generate_key(), public)


def federation_on(
    hub: Kube, control_plane: plane.ControlPlane, cluster: str, namespace: str
) -> dict[str, Any]:
    """A FederatedLearning whose data claim only `cluster` carries, once its ManifestWork is
    there. Its clients never run (an image no node has): the works are what matters."""
    claim = f"{namespace}.data.ocmfl.io"
    set_cluster_claim(control_plane, cluster, claim, f"/srv/data/{cluster}")
    body = inert_fl_body(namespace, claim)
    created = create_fl(hub, namespace, body)
    uid = created["metadata"]["uid"]
    works = f"/apis/{constants.WORK_GROUP}/v1/namespaces/{cluster}/manifestworks"

    def has_work() -> bool:
        items = (hub.get(works) or {}).get("items") or []
        return any(
            (w["metadata"].get("labels") or {}).get(constants.LABEL_OWNER_UID) == uid for w in items
        )

    try:
        wait_for(has_work, 90, f"the work of {namespace}/digits on {cluster}")
    except WaitTimeout:
        path = f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{constants.PLURAL}/digits"
        status = (hub.get(path) or {}).get("status")
        raise AssertionError(f"no work; the resource's status: {status}") from None
    return created


def remove_federation(hub: Kube, control_plane: plane.ControlPlane, fl: dict[str, Any]) -> None:
    meta = fl["metadata"]
    path = f"/apis/{constants.API_VERSION}/namespaces/{meta['namespace']}/{constants.PLURAL}"
    hub.delete(f"{path}/{meta['name']}")
    wait_for(lambda: hub.get(f"{path}/{meta['name']}") is None, 120, "the federation deleted")
    for c in control_plane.clusters:
        set_cluster_claim(control_plane, c, f"{meta['namespace']}.data.ocmfl.io", None)


# --- another cluster's identity ------------------------------------------------------------
def test_a_cluster_cannot_get_an_agent_identity_naming_another_cluster(
    control_plane: plane.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    c1, c2 = control_plane.clusters[:2]
    before = fed.agent_health(c2)
    # cluster1's root: its addon agent's hub kubeconfig, its registration agent's, and the
    # bootstrap kubeconfig it joined with.
    addon_creds = as_kube(addon_hub_kubeconfig(control_plane, c1, tmp_path / "addon"))
    registration = as_kube(control_plane.hub_access[c1])
    boot = tmp_path / "bootstrap.kubeconfig"
    boot.write_text(
        (
            plane.klusterlet_dir(Path(control_plane.state_dir), c1) / "bootstrap.kubeconfig"
        ).read_text()
    )
    bootstrap = as_kube(str(boot))

    # Our signer's CSR naming cluster2 (CN=cluster:cluster2, its label), from each identity.
    for who in (addon_creds, registration, bootstrap):
        assert denial(hub, submit(who, csr_object(c2, pki.generate_key()))) == "RequesterMismatch"
    # The CSR the old CustomSigner path signed for anyone: OCM's default subject of cluster2,
    # for the agent signer. OCM no longer approves it; our signer refuses its subject.
    body, _ = ocm_style_csr(c2, constants.SIGNER_NAME)
    for who in (addon_creds, registration, bootstrap):
        assert denial(hub, submit(who, body)) == "BadSubject"

    # cluster2 is untouched: its agent keeps the identity it had.
    after = fed.agent_health(c2)
    assert before and after and after["certificateNotAfter"] == before["certificateNotAfter"]


def _agent_csr_of(hub: Kube, cluster: str) -> str:
    """The name of the newest agent-identity CSR that `cluster`'s agent sent."""
    found = hub.get(CSRS, {"labelSelector": f"{constants.LABEL_CLUSTER}={cluster}"}) or {}
    mine = [
        c
        for c in found.get("items") or []
        if c["spec"]["signerName"] == constants.SIGNER_NAME
        and c["spec"]["username"] == default_agent_subject(cluster)["user"]
        and (c.get("status") or {}).get("certificate")
    ]
    assert mine, f"no signed agent CSR of {cluster}"
    return str(max(mine, key=lambda c: c["metadata"]["creationTimestamp"])["metadata"]["name"])


def test_a_cluster_reads_the_outcome_of_its_own_csrs_and_of_no_other_clusters(
    control_plane: plane.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    """CSRs are cluster-scoped: an agent that could read them would see every cluster's
    certificates and refusals. It may only create them, and reads each outcome in its own
    cluster namespace, where OCM bound the chart's role for it alone."""
    c1, c2 = control_plane.clusters[:2]
    creds = as_kube(addon_hub_kubeconfig(control_plane, c1, tmp_path / "addon"))
    own, other = _agent_csr_of(hub, c1), _agent_csr_of(hub, c2)
    note = creds.get(csroutcome.configmap_path(c1, own))
    assert note is not None, f"{c1}'s agent finds no outcome of its CSR {own}"
    pem = csroutcome.read_outcome(note["data"])
    assert pem is not None and pki.cluster_from_certificate(pki.load_cert_pem(pem)) == c1
    refused_paths = [
        f"{CSRS}/{other}",  # another cluster's CSR
        CSRS,  # every CSR
        csroutcome.configmap_path(c2, other),  # another cluster's outcome
        f"/api/v1/namespaces/{c1}/configmaps",  # a list (names are all it needs)
    ]
    answers = {}
    for path in refused_paths:
        try:
            answers[path] = f"answered: {str(creds.get(path))[:200]}"
        except KubeError as e:
            answers[path] = f"HTTP {e.status}"
    allowed = {p: a for p, a in answers.items() if a != "HTTP 403"}
    assert not allowed, allowed


def test_a_cluster_cannot_get_a_certificate_the_agents_accept_as_the_aggregator(
    control_plane: plane.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    c1 = control_plane.clusters[0]
    creds = as_kube(addon_hub_kubeconfig(control_plane, c1, tmp_path / "addon"))
    host = fed.hub_host  # the address the agents dial (in the aggregator's certificate)
    sans: list[x509.GeneralName] = [
        x509.DNSName("fl-aggregator.example.com"),
        x509.IPAddress(ipaddress.ip_address(host)),
    ]
    # Its own name, plus the aggregator's names: refused, naming them.
    made = submit(creds, agent_csr_with_sans(c1, sans))
    assert denial(hub, made) == "UnexpectedSANs"
    # The OCM-shaped CustomSigner request with the aggregator's names: nothing approves it.
    body, _ = ocm_style_csr(c1, constants.SIGNER_NAME, sans=sans)
    assert denial(hub, submit(creds, body)) in {"BadSubject", "UnexpectedSANs"}

    # Unusable even if a signer were tricked: the agents trust only the hub CA for the
    # aggregator (the bundle OCM deployed with them), and agent identities come from the
    # agent CA. A server certificate for the aggregator's address issued by the agent CA:
    agent_ca = pki.load_cert_and_key(
        (fed.agent_ca_dir / pki.CERT_FILE).read_bytes(),
        (fed.agent_ca_dir / pki.KEY_FILE).read_bytes(),
    )
    forged = pki.issue_server_cert(agent_ca, dns_names=[], ip_addresses=[host])
    spoke = Kube(control_plane.cluster_kubeconfigs[c1])
    try:
        deployed = spoke.get(
            f"/api/v1/namespaces/{constants.AGENT_NAMESPACE}/secrets/{constants.ADDON_NAME}-agent-hub-ca"
        )
    finally:
        spoke.close()
    assert deployed is not None
    trust = base64.b64decode(deployed["data"]["ca.crt"])
    assert trust == (fed.ca_dir / pki.CERT_FILE).read_bytes()
    assert not agent_accepts(pki.cert_to_pem(forged.cert), pki.key_to_pem(forged.key), trust, host)
    hub_ca = pki.load_cert_and_key(
        (fed.ca_dir / pki.CERT_FILE).read_bytes(), (fed.ca_dir / pki.KEY_FILE).read_bytes()
    )
    genuine = pki.issue_server_cert(hub_ca, dns_names=[], ip_addresses=[host])
    assert agent_accepts(pki.cert_to_pem(genuine.cert), pki.key_to_pem(genuine.key), trust, host)


# --- Fleet identities --------------------------------------------------------------------
def test_a_cluster_cannot_get_a_fleet_identity_for_a_federation_without_work_there(
    control_plane: plane.ControlPlane,
    fed: LocalFederation,
    hub: Kube,
    namespace: str,
    tmp_path: Path,
) -> None:
    c1, c2 = control_plane.clusters[:2]
    fl = federation_on(hub, control_plane, c2, namespace)
    uid = fl["metadata"]["uid"]
    try:
        creds = as_kube(addon_hub_kubeconfig(control_plane, c1, tmp_path / "addon"))
        assert denial(hub, submit(creds, fleet_csr(c1, uid))) == "NoWork"
        assert denial(hub, submit(creds, fleet_csr(c2, uid))) == "RequesterMismatch"
        # Nothing of cluster1 reached that federation.
        status = (
            hub.get(
                f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{constants.PLURAL}/digits"
            )
            or {}
        ).get("status") or {}
        assert c1 not in {r["name"] for r in status.get("clusters") or []}
    finally:
        remove_federation(hub, control_plane, fl)


def test_a_namespace_with_a_federations_labels_gets_no_client_identity(
    control_plane: plane.ControlPlane,
    fed: LocalFederation,
    hub: Kube,
    namespace: str,
) -> None:
    """Someone who may create namespaces on cluster2 copies a federation's labels onto their
    own namespace: the agent writes that federation's client identity (Fleet key and
    certificate) only into the client namespace OCM's work agent applied from the
    federation's ManifestWork (issue 29 item 4)."""
    c2 = control_plane.clusters[1]
    fl = federation_on(hub, control_plane, c2, namespace)
    ref = FLRef(namespace, "digits", fl["metadata"]["uid"])
    spoke = Kube(control_plane.cluster_kubeconfigs[c2])
    spoof = f"spoof-{namespace}"
    secret = f"secrets/{constants.CLIENT_IDENTITY_SECRET}"
    try:
        labels = {**ref.labels("client"), constants.LABEL_CLUSTER: c2}
        spoke.create("/api/v1/namespaces", {"metadata": {"name": spoof, "labels": labels}})
        real = f"/api/v1/namespaces/{client_namespace(ref)}/{secret}"
        wait_for(lambda: spoke.get(real), 90, "the real client namespace's identity")
        log = fed.log_file(f"agent-{c2}")
        wait_for(
            lambda: f"namespace {spoof} carries the labels of federation" in log.read_text(),
            30,
            "the agent refusing the copied labels",
        )
        assert spoke.get(f"/api/v1/namespaces/{spoof}/{secret}") is None
    finally:
        spoke.delete(f"/api/v1/namespaces/{spoof}")
        spoke.close()
        remove_federation(hub, control_plane, fl)


# --- OCM's prefix flaw ----------------------------------------------------------------------
def test_a_hub_credential_ocm_issues_to_another_cluster_gets_nothing_from_our_signers(
    control_plane: plane.ControlPlane,
    fed: LocalFederation,
    hub: Kube,
    namespace: str,
    tmp_path: Path,
) -> None:
    """cluster10, an accepted (and compromised) cluster, asks OCM for cluster1's addon hub
    credential. OCM v1.2.0 checks the requester with a prefix
    (addon-framework utils/csr_helpers.go, `strings.HasPrefix(username,
    "system:open-cluster-management:"+cluster.Name)`), so it approves and the hub signs. Our
    signers refuse to act on that credential: it was not issued through cluster1's own
    registration agent."""
    c1 = control_plane.clusters[0]
    state = State.load(Path(control_plane.state_dir))
    assert state is not None
    rogue = plane.start_registration_agent(
        state,
        ROGUE,
        bootstrap=plane.bootstrap_kubeconfig(state),
        spoke=control_plane.clusters[1],
        hub_kubeconfig_secret=f"hub-kubeconfig-{ROGUE}",
    )
    fl: dict[str, Any] | None = None
    try:
        clusteradm.accept(hub, ROGUE, 60, why_not=lambda: plane.log_errors(rogue.log))
        plane.wait_joined(hub, state, ROGUE, 60)
        fl = federation_on(hub, control_plane, c1, namespace)
        rogue_kc = plane.klusterlet_dir(Path(state.dir), ROGUE) / "hub-kubeconfig" / "kubeconfig"
        as_rogue = as_kube(str(rogue_kc))
        body, key = ocm_style_csr(c1, constants.KUBE_APISERVER_CLIENT_SIGNER)
        name = submit(as_rogue, body)
        status = decided(hub, name, timeout=60)
        # The flaw is real: OCM approved cluster1's addon credential for cluster10.
        approved = [c for c in status.get("conditions") or [] if c["type"] == "Approved"]
        assert approved and status.get("certificate"), status
        forged_pem = base64.b64decode(status["certificate"])

        forged_dir = tmp_path / "forged"
        forged_dir.mkdir()
        (forged_dir / "tls.crt").write_bytes(forged_pem)
        (forged_dir / "tls.key").write_bytes(pki.key_to_pem(key))
        cfg = yaml.safe_load(rogue_kc.read_text())
        cfg["users"][0]["user"] = {"client-certificate": "tls.crt", "client-key": "tls.key"}
        (forged_dir / "kubeconfig").write_text(yaml.safe_dump(cfg))
        as_forged = as_kube(str(forged_dir / "kubeconfig"))

        # With it: neither cluster1's agent identity nor its Fleet identity.
        assert denial(hub, submit(as_forged, csr_object(c1, pki.generate_key()))) == (
            "UnverifiedRequester"
        )
        uid = fl["metadata"]["uid"]
        assert denial(hub, submit(as_forged, fleet_csr(c1, uid))) == "UnverifiedRequester"
        # The genuine credential of cluster1 still works (the ledger is per certificate).
        genuine = as_kube(addon_hub_kubeconfig(control_plane, c1, tmp_path / "genuine"))
        assert decided(hub, submit(genuine, fleet_csr(c1, uid))).get("certificate")
        # The hub said what happened, and did not record the forged credential.
        fingerprint = pki.load_cert_pem(forged_pem).fingerprint(hashes.SHA256()).hex()
        mca = (
            hub.get(
                f"/apis/{constants.ADDON_GROUP}/v1alpha1/namespaces/{c1}/managedclusteraddons/"
                f"{constants.ADDON_NAME}"
            )
            or {}
        )
        ledger = (mca["metadata"].get("annotations") or {}).get(
            constants.ANNOTATION_HUB_IDENTITIES, "[]"
        )
        assert fingerprint not in ledger and json.loads(ledger), ledger

        def warned() -> bool:
            events = (
                hub.get("/api/v1/events", query={"fieldSelector": f"involvedObject.name={name}"})
                or {}
            )
            return any(e.get("reason") == "ForgedAddonIdentity" for e in events.get("items", []))

        wait_for(warned, 30, "a ForgedAddonIdentity event on the forged CSR")
    finally:
        if fl is not None:
            remove_federation(hub, control_plane, fl)
        plane.stop_component(state, rogue.name)
        with contextlib.suppress(KubeError):
            hub.delete(f"{MCS}/{ROGUE}")
        spoke = Kube(control_plane.cluster_kubeconfigs[control_plane.clusters[1]])
        with contextlib.suppress(KubeError):
            spoke.delete(
                f"/api/v1/namespaces/open-cluster-management-agent/secrets/hub-kubeconfig-{ROGUE}"
            )
        spoke.close()
        wait_for(lambda: hub.get(f"{MCS}/{ROGUE}") is None, 120, f"{ROGUE} deleted")


# --- revocation -------------------------------------------------------------------------
def test_a_denied_cluster_loses_its_addon_identity_at_once(
    control_plane: plane.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    c2 = control_plane.clusters[1]
    cert_dir = fed.agent_cert_dir(c2)
    ca = (fed.ca_dir / pki.CERT_FILE).read_bytes()
    creds = as_kube(addon_hub_kubeconfig(control_plane, c2, tmp_path / "addon"))
    probe = ReportProbe(fed.aggregator_address, cert_dir, ca, c2)
    assert probe.ask() == "accepted"
    try:
        clusteradm.set_hub_accepts(hub, c2, False)  # the hub admin denies the cluster
        refusal, took = probe.until_refused(60)
        assert refusal.startswith("PERMISSION_DENIED") and "not an accepted" in refusal, refusal
        # Its credentials get no new identity either, and its addon says why.
        assert denial(hub, submit(creds, csr_object(c2, pki.generate_key()))) == "UnknownCluster"
        mca_path = (
            f"/apis/{constants.ADDON_GROUP}/v1alpha1/namespaces/{c2}/managedclusteraddons/"
            f"{constants.ADDON_NAME}"
        )

        def says_not_accepted() -> bool:
            conds = ((hub.get(mca_path) or {}).get("status") or {}).get("conditions") or []
            return any(c.get("reason") == "ClusterNotAccepted" for c in conds)

        wait_for(says_not_accepted, 30, f"{c2}'s addon condition ClusterNotAccepted")
        print(f"\nDENIED: {c2}'s agent reports refused {took:.2f}s after hubAcceptsClient=false")
    finally:
        clusteradm.set_hub_accepts(hub, c2, True)
    wait_for(lambda: probe.ask() == "accepted", 60, f"{c2} accepted again")
