"""The hub CSR signer's policy (decide_csr), its requester check, its kopf edge, and the
agent's CSR primitive, without a cluster (certificates made by ocmfl.pki, no crypto mocked)."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID
from hub_creds import HubCredential, issue_hub_credential, registration_agent, requested_with

from agent_addon.csr import RenewalError, csr_object, needs_renewal
from hub_controller.bootstrap.addon_template import (
    HUB_KUBECONFIG_PATH,
    addon_registrations,
    default_agent_subject,
)
from hub_controller.ca import CADir
from hub_controller.membership import StaticMembers
from hub_controller.signer import csr_events, csr_outcome
from hub_controller.signer.handlers import Signer
from hub_controller.signer.hub_identity import CREDENTIAL_ID, Forged, HubIdentity, classify
from hub_controller.signer.policy import (
    MAX_LIFETIME,
    UNVERIFIED_GRACE,
    WAITING_FOR_LEDGER,
    Approve,
    Deny,
    Ignore,
    agent_group,
    decide_csr,
    sign_request,
)
from ocmfl import constants, csroutcome, pki
from ocmfl.kube import KubeError

CREDS: dict[str, HubCredential] = {c: issue_hub_credential(c) for c in ("cluster-a", "cluster-b")}


def known(*clusters: str, trusted: bool = True) -> StaticMembers:
    """cluster-a and cluster-b registered, with their hub credentials in the ledger."""
    members = StaticMembers(clusters or ("cluster-a", "cluster-b"))
    for cluster in members.clusters:
        if trusted and cluster in CREDS:
            members.trust(CREDS[cluster].identity)
    return members


_DEFAULT: Any = object()


def outcome(csr: dict[str, Any]) -> bytes | None:
    """What the requesting agent reads of a CSR: its mirrored outcome (ocmfl.csroutcome)."""
    return csroutcome.read_outcome(csroutcome.outcome_data(csr))


def agent_csr(
    cluster: str = "cluster-a", credential: HubCredential | None = _DEFAULT, **spec: Any
) -> dict[str, Any]:
    """A CSR as the agent creates it, with the requester fields the API server fills (by
    default the cluster's own hub kubeconfig)."""
    body = csr_object(cluster, pki.generate_key())
    body["metadata"]["name"] = "x"
    csr: dict[str, Any] = requested_with(
        body, CREDS.get(cluster) if credential is _DEFAULT else credential
    )
    csr["spec"].update(spec)
    return csr


def with_request(csr: dict[str, Any], request: x509.CertificateSigningRequest) -> dict[str, Any]:
    csr["spec"]["request"] = base64.b64encode(pki.csr_to_pem(request)).decode()
    return csr


def test_agent_csr_for_a_known_cluster_is_approved() -> None:
    decision = decide_csr(agent_csr(expirationSeconds=3600), known())
    assert decision == Approve("cluster-a", dt.timedelta(hours=1))


def test_lifetime_is_capped() -> None:
    decision = decide_csr(agent_csr(expirationSeconds=30 * 24 * 3600), known())
    assert isinstance(decision, Approve) and decision.lifetime == MAX_LIFETIME


def test_unknown_cluster_is_denied() -> None:
    decision = decide_csr(agent_csr("cluster-z", CREDS["cluster-a"]), known())
    assert isinstance(decision, Deny) and decision.reason == "UnknownCluster"


def test_foreign_signer_is_ignored() -> None:
    csr = agent_csr(signerName="kubernetes.io/kube-apiserver-client")
    assert isinstance(decide_csr(csr, known()), Ignore)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"groups": [agent_group("cluster-b")]}, "RequesterMismatch"),
        ({"username": default_agent_subject("cluster-b")["user"]}, "RequesterMismatch"),
        ({"usages": ["server auth", "digital signature"]}, "BadUsages"),
        ({"request": base64.b64encode(b"junk").decode()}, "InvalidRequest"),
        ({"expirationSeconds": 60}, "BadExpiration"),
    ],
)
def test_mismatched_requests_are_denied(change: dict[str, Any], reason: str) -> None:
    decision = decide_csr(agent_csr(**change), known())
    assert isinstance(decision, Deny) and decision.reason == reason


def test_cluster_label_must_match_the_subject() -> None:
    csr = agent_csr()
    csr["metadata"]["labels"][constants.LABEL_CLUSTER] = "cluster-b"
    decision = decide_csr(csr, known())
    assert isinstance(decision, Deny) and decision.reason == "ClusterMismatch"


def _request(*attrs: tuple[x509.ObjectIdentifier, str]) -> x509.CertificateSigningRequest:
    name = x509.Name([pki.name_attribute(oid, v) for oid, v in attrs])
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(name)
        .sign(pki.generate_key(), hashes.SHA256())
    )


@pytest.mark.parametrize(
    "attrs",
    [
        ((NameOID.COMMON_NAME, "cluster-a"),),  # no cluster: prefix
        # OCM's default addon subject: no longer an agent identity anywhere
        (
            (NameOID.ORGANIZATION_NAME, agent_group("cluster-a")),
            (NameOID.COMMON_NAME, default_agent_subject("cluster-a")["user"]),
        ),
        # our form plus an attribute the certificate would not carry
        (
            (NameOID.ORGANIZATIONAL_UNIT_NAME, "admins"),
            (NameOID.ORGANIZATION_NAME, constants.CERT_ORGANIZATION),
            (NameOID.COMMON_NAME, "cluster:cluster-a"),
        ),
    ],
)
def test_subject_other_than_exactly_ours_is_denied(
    attrs: tuple[tuple[x509.ObjectIdentifier, str], ...],
) -> None:
    decision = decide_csr(with_request(agent_csr(), _request(*attrs)), known())
    assert isinstance(decision, Deny) and decision.reason == "BadSubject"


def test_a_request_asking_for_any_san_is_denied_naming_them() -> None:
    key = pki.generate_key()
    sans = [
        x509.DNSName("fl-aggregator.example.com"),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
    ]
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(pki.cluster_subject("cluster-a"))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )
    decision = decide_csr(with_request(agent_csr(), request), known())
    assert isinstance(decision, Deny) and decision.reason == "UnexpectedSANs"
    assert "DNS:fl-aggregator.example.com" in decision.message and "IP:10.0.0.1" in decision.message


def test_signing_copies_nothing_of_the_request_but_its_key() -> None:
    """pki.sign_csr sets the subject from the cluster name and adds no SAN or extension of
    the request (a CA:TRUE basic constraint asked for here)."""
    ca = pki.create_ca(key_kind="ec")
    key = pki.generate_key()
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(pki.cluster_subject("cluster-a"))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("evil")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert = pki.sign_csr(request, ca)
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert pki.subject_of(cert) == pki.cluster_subject("cluster-a")


def test_decided_csrs_are_left_alone() -> None:
    csr = agent_csr()
    csr["status"] = {"conditions": [{"type": "Denied", "status": "True"}]}
    assert isinstance(decide_csr(csr, known()), Ignore)
    csr["status"] = {"certificate": "abc", "conditions": [{"type": "Approved"}]}
    assert isinstance(decide_csr(csr, known()), Ignore)
    csr["status"] = {"conditions": [{"type": "Approved", "status": "True"}]}
    decision = decide_csr(csr, known())
    assert isinstance(decision, Approve) and decision.already_approved


def test_signed_certificate_names_the_cluster_and_is_short_lived() -> None:
    ca = pki.create_ca()
    csr = agent_csr(expirationSeconds=7200)
    decision = decide_csr(csr, known())
    assert isinstance(decision, Approve)
    csr["status"] = {"certificate": sign_request(csr, decision, ca)}
    pem = outcome(csr)
    assert pem is not None
    cert = pki.load_cert_pem(pem)
    assert pki.cluster_from_certificate(cert) == "cluster-a"
    assert pki.verify_issued_by(cert, ca.cert)
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert life <= dt.timedelta(hours=2) + pki.CLOCK_SKEW


# --- the requester: the exact hub credential OCM issued through the cluster's own agent -------


def test_a_credential_forged_through_a_prefix_cluster_is_never_trusted() -> None:
    """cluster10's registration agent passes OCM's HasPrefix check for cluster1 and gets a hub
    credential with cluster1's addon identity. It is classified forged, and an agent CSR sent
    with it is denied although user and groups are exactly cluster1's addon agent."""
    legit = issue_hub_credential("cluster1")
    forged = issue_hub_credential("cluster1", registration_agent("cluster10"))
    assert isinstance(classify(forged.csr), Forged)
    members = StaticMembers(["cluster1", "cluster10"])
    members.trust(legit.identity)
    assert isinstance(decide_csr(agent_csr("cluster1", legit), members), Approve)
    decision = decide_csr(agent_csr("cluster1", forged), members)
    assert isinstance(decision, Deny) and decision.reason == "UnverifiedRequester"
    assert f"X509SHA256={forged.fingerprint}" in decision.message
    assert legit.fingerprint in decision.message  # what the hub did see issued for cluster1
    assert "the agent retries" in decision.message


@pytest.mark.parametrize(
    "requester",
    [
        ("system:serviceaccount:open-cluster-management:cluster-bootstrap", []),
        ("system:bootstrap:abcdef", ["system:bootstrappers"]),
        registration_agent("cluster-a"),  # the registration agent itself, not the addon agent
    ],
)
def test_a_requester_that_is_not_the_addon_agent_is_denied(
    requester: tuple[str, list[str]],
) -> None:
    csr = agent_csr(username=requester[0], groups=requester[1])
    decision = decide_csr(csr, known())
    assert isinstance(decision, Deny) and decision.reason == "RequesterMismatch"
    assert default_agent_subject("cluster-a")["user"] in decision.message


def test_a_requester_without_a_client_certificate_credential_is_denied() -> None:
    csr = agent_csr()
    del csr["spec"]["extra"]
    decision = decide_csr(csr, known())
    assert isinstance(decision, Deny) and decision.reason == "UnverifiedRequester"
    assert CREDENTIAL_ID in decision.message
    csr["spec"]["extra"] = {CREDENTIAL_ID: ["X509SHA256=" + "a" * 64, "X509SHA256=" + "b" * 64]}
    assert isinstance(decide_csr(csr, known()), Deny)  # two credentials: none


def test_an_expired_ledger_entry_trusts_nothing() -> None:
    cred = CREDS["cluster-a"]
    members = StaticMembers(["cluster-a"])
    members.trust(
        HubIdentity("cluster-a", cred.fingerprint, pki.utcnow() - dt.timedelta(seconds=1), "old")
    )
    decision = decide_csr(agent_csr(), members)
    assert isinstance(decision, Deny) and decision.reason == "UnverifiedRequester"
    assert "expired" in decision.message


def test_a_credential_trusted_for_another_cluster_does_not_count() -> None:
    members = StaticMembers(["cluster-a", "cluster-b"])
    b = CREDS["cluster-b"].identity
    members.trust(HubIdentity("cluster-a", b.fingerprint, b.not_after, b.csr))  # misfiled
    decision = decide_csr(agent_csr(), members)
    assert isinstance(decision, Deny) and decision.reason == "UnverifiedRequester"


# --- the signer's kopf edge ---------------------------------------------------------------------


class _Kube:
    """What the signer writes: approvals (PUT) and certificates (PATCH)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, dict[str, Any]]] = []

    def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.writes.append((path, body))
        return body

    def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.writes.append((path, body))
        return body


def _stamp(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_signer_signs_with_the_agent_ca_only(tmp_path: Path) -> None:
    agent_ca, hub_ca = pki.create_ca("agent", key_kind="ec"), pki.create_ca("hub", key_kind="ec")
    pki.save_tls_dir(tmp_path / "agent-ca", agent_ca, None)
    kube = _Kube()
    signer = Signer(kube, CADir.agent(tmp_path / "agent-ca"))  # type: ignore[arg-type]
    decision = signer.handle(agent_csr(), known())
    assert isinstance(decision, Approve)
    (approval, _), (status, patch) = kube.writes
    assert approval.endswith("/approval") and status.endswith("/status")
    cert = pki.load_cert_pem(base64.b64decode(patch["status"]["certificate"]))
    assert pki.verify_issued_by(cert, agent_ca.cert)
    assert not pki.verify_issued_by(cert, hub_ca.cert)


def test_an_unverified_requester_is_waited_for_briefly_then_denied(tmp_path: Path) -> None:
    pki.save_tls_dir(tmp_path, pki.create_ca(key_kind="ec"), None)
    now = pki.utcnow()
    kube = _Kube()
    signer = Signer(kube, CADir.agent(tmp_path), clock=lambda: now)  # type: ignore[arg-type]
    csr = agent_csr()
    untrusted = known(trusted=False)
    csr["metadata"]["creationTimestamp"] = _stamp(now - dt.timedelta(seconds=1))
    assert signer.handle(csr, untrusted) == Ignore(WAITING_FOR_LEDGER)
    assert not kube.writes
    # The credential's CSR reached the hub's index meanwhile: approved.
    assert isinstance(signer.handle(csr, known()), Approve)
    late = agent_csr()
    late["metadata"]["creationTimestamp"] = _stamp(now - UNVERIFIED_GRACE)
    decision = signer.handle(late, untrusted)
    assert isinstance(decision, Deny) and decision.reason == "UnverifiedRequester"
    assert kube.writes[-1][1]["status"]["conditions"][-1]["reason"] == "UnverifiedRequester"


def test_without_the_agent_ca_a_csr_is_left_pending(tmp_path: Path) -> None:
    kube = _Kube()
    signer = Signer(kube, CADir.agent(tmp_path / "missing"))  # type: ignore[arg-type]
    decision = signer.handle(agent_csr(), known())
    assert isinstance(decision, Ignore) and "OCMFL_AGENT_CA_DIR" in decision.why
    assert not kube.writes


# --- the AddOnTemplate side ---------------------------------------------------------------------


def test_the_addon_registers_only_a_kube_client_hub_kubeconfig() -> None:
    """No CustomSigner, and no hubPermissions (OCM binds them to every cluster's agent)."""
    assert addon_registrations() == [{"type": "KubeClient"}]
    assert HUB_KUBECONFIG_PATH == "/managed/hub-kubeconfig/kubeconfig"
    assert constants.HUB_KUBECONFIG_SECRET == "federated-learning-hub-kubeconfig"


def test_ocm_default_subject_is_no_agent_identity() -> None:
    subject = default_agent_subject("cluster-a")
    name = x509.Name(
        [pki.name_attribute(NameOID.ORGANIZATION_NAME, g) for g in subject["groups"]]
        + [pki.name_attribute(NameOID.COMMON_NAME, subject["user"])]
    )
    with pytest.raises(pki.IdentityError):
        pki.cluster_from_subject(name)


class OutcomeKube:
    """The ConfigMap create the outcome mirror makes (409 when it exists)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def create(self, path: str, body: dict[str, Any], exist_ok: bool = True) -> Any:
        full = f"{path}/{body['metadata']['name']}"
        if full in self.objects:
            return None
        self.objects[full] = body
        return body


def test_an_outcome_goes_only_to_the_genuine_requesters_cluster_namespace() -> None:
    ca, kube = pki.create_ca(), OutcomeKube()
    csr = agent_csr()
    csr["metadata"]["uid"] = "u1"
    assert not csr_outcome.mirror(kube, csr, known(), pki.utcnow())  # type: ignore[arg-type]
    decision = decide_csr(csr, known())
    assert isinstance(decision, Approve)
    csr["status"] = {"certificate": sign_request(csr, decision, ca)}
    assert csr_outcome.mirror(kube, csr, known(), pki.utcnow())  # type: ignore[arg-type]
    assert not csr_outcome.mirror(kube, csr, known(), pki.utcnow())  # type: ignore[arg-type]
    note = kube.objects[csroutcome.configmap_path("cluster-a", "x")]
    assert note["immutable"] is True
    assert note["metadata"]["ownerReferences"][0]["uid"] == "u1"
    pem = csroutcome.read_outcome(note["data"])
    assert pem is not None and pki.cluster_from_certificate(pki.load_cert_pem(pem)) == "cluster-a"
    # Readable there by cluster-a's agent user alone: not by the group all agents share.
    binding = kube.objects[
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/cluster-a/rolebindings/"
        f"{csroutcome.READER_BINDING}"
    ]
    assert binding["roleRef"]["name"] == csroutcome.READER_ROLE
    assert binding["subjects"] == [
        {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "User",
            "name": default_agent_subject("cluster-a")["user"],
        }
    ]
    assert len(kube.objects) == 2

    # cluster-b's agent asking in cluster-a's name is refused, and nothing reaches either
    # namespace: the refusal is none of cluster-a's business, and b gets no answer to read.
    forged, other = agent_csr(credential=CREDS["cluster-b"]), OutcomeKube()
    refused = decide_csr(forged, known())
    assert isinstance(refused, Deny)
    forged["status"] = {"conditions": [{"type": "Denied", "reason": refused.reason}]}
    assert not csr_outcome.mirror(other, forged, known(), pki.utcnow())  # type: ignore[arg-type]
    assert not other.objects


def test_a_denied_csrs_outcome_is_a_refusal_naming_the_reason() -> None:
    with pytest.raises(csroutcome.Refused, match="CSR denied: UnknownCluster"):
        outcome({"status": {"conditions": [{"type": "Denied", "reason": "UnknownCluster"}]}})
    assert outcome({"status": {}}) is None


def test_renewal_is_due_with_a_fifth_of_the_lifetime_left() -> None:
    ca = pki.create_ca()
    now = pki.utcnow()
    cert = pki.issue_client_cert("cluster-a", ca, lifetime=dt.timedelta(hours=10), now=now).cert
    assert not needs_renewal(cert, now + dt.timedelta(hours=7))
    assert needs_renewal(cert, now + dt.timedelta(hours=9))


class FakeHub:
    """The agent's hub client (ocmfl.kube.Kube) whose CSRs the signer's policy decides at once;
    each cluster's agent asks with its own hub credential."""

    def __init__(self, ca: pki.CertAndKey, known: StaticMembers) -> None:
        self.ca, self.known = ca, known
        self.csrs: dict[str, dict[str, Any]] = {}

    def create(self, path: str, body: dict[str, Any], exist_ok: bool = True) -> dict[str, Any]:
        name = f"csr-{len(self.csrs)}"
        cluster = body["metadata"]["labels"][constants.LABEL_CLUSTER]
        credential = CREDS.get(cluster) or issue_hub_credential(cluster)
        csr: dict[str, Any] = requested_with(
            {**body, "metadata": {**body["metadata"], "name": name}}, credential
        )
        decision = decide_csr(csr, self.known)
        if isinstance(decision, Approve):
            csr["status"] = {"certificate": sign_request(csr, decision, self.ca)}
        elif isinstance(decision, Deny):
            csr["status"] = {"conditions": [{"type": "Denied", "reason": decision.reason}]}
        self.csrs[name] = csr
        return csr

    def get(self, path: str) -> dict[str, Any] | None:
        """The agent may read only outcomes, in the namespace of the cluster it asked for."""
        _, _, _, namespace, kind, name = path.strip("/").split("/")
        assert kind == "configmaps", path
        csr = self.csrs.get(name)
        if csr is None or csr["metadata"]["labels"][constants.LABEL_CLUSTER] != namespace:
            return None
        data = csroutcome.outcome_data(csr)
        return {"data": data} if data else None


async def test_agent_renews_its_certificate_when_due(tmp_path: Any) -> None:
    from agent_addon.csr import renew_if_due

    ca = pki.create_ca(key_kind="ec")
    api: Any = FakeHub(ca, known())
    old = pki.issue_client_cert(
        "cluster-a", ca, lifetime=dt.timedelta(hours=1), now=pki.utcnow() - dt.timedelta(minutes=55)
    )
    pki.save_tls_dir(tmp_path, old, None)
    assert await renew_if_due(api, "cluster-a", tmp_path, poll_s=0.01)
    new, _ = pki.load_tls_dir(tmp_path)
    assert new.cert.serial_number != old.cert.serial_number
    assert pki.cluster_from_certificate(new.cert) == "cluster-a"
    assert not await renew_if_due(api, "cluster-a", tmp_path)  # fresh: nothing to do
    with pytest.raises(RenewalError, match="UnknownCluster"):
        await renew_if_due(api, "cluster-z", tmp_path / "z", poll_s=0.01)


class _CSRs:
    """The CSR as the apiserver has it now (`get`), and the paths asked for."""

    def __init__(self, now: dict[str, Any] | None) -> None:
        self.now, self.gets = now, 0

    def get(self, path: str) -> dict[str, Any] | None:
        assert path.endswith("/certificatesigningrequests/c1")
        self.gets += 1
        return self.now


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, fmt: str, *args: Any) -> None:
        self.lines.append("warning " + fmt % args)

    def error(self, fmt: str, *args: Any) -> None:
        self.lines.append("error " + fmt % args)


def _csr(version: str) -> dict[str, Any]:
    return {"metadata": {"name": "c1", "resourceVersion": version}}


def test_a_csr_event_is_retried_on_the_csr_as_it_is_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hub_controller.signer.csr_events.time.sleep", lambda s: None)
    kube, log, seen = _CSRs(_csr("2")), _Log(), []

    def handle(csr: dict[str, Any]) -> str | None:
        seen.append(csr["metadata"]["resourceVersion"])
        if len(seen) == 1:
            raise KubeError(409, "Conflict", "the object has been modified")
        return None

    csr_events.handle_with_retries(kube, _csr("1"), handle, log, "CSR")  # type: ignore[arg-type]
    assert seen == ["1", "2"] and kube.gets == 1 and not log.lines


def test_a_lasting_failure_or_wait_is_logged_once_and_left_to_the_next_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hub_controller.signer.csr_events.time.sleep", lambda s: None)
    kube, log = _CSRs(_csr("2")), _Log()

    def refused(csr: dict[str, Any]) -> str | None:
        raise KubeError(403, "Forbidden", "no")

    csr_events.handle_with_retries(kube, _csr("1"), refused, log, "CSR")  # type: ignore[arg-type]
    assert kube.gets == 0 and log.lines == ["error CSR c1: HTTP 403 Forbidden: no"]

    calls: list[int] = []

    def waiting(csr: dict[str, Any]) -> str | None:
        calls.append(1)
        return "no CA yet"

    csr_events.handle_with_retries(kube, _csr("1"), waiting, log, "Fleet CSR")  # type: ignore[arg-type]
    assert len(calls) == csr_events.ATTEMPTS and log.lines[-1] == "warning Fleet CSR c1: no CA yet"

    gone = _CSRs(None)
    csr_events.handle_with_retries(gone, _csr("1"), waiting, log, "CSR")  # type: ignore[arg-type]
    assert gone.gets == 1 and len(log.lines) == 2  # deleted meanwhile: nothing more to do


class SlowHub(FakeHub):
    """FakeHub whose signer answers only after `delay` reads of a CSR."""

    def __init__(self, ca: pki.CertAndKey, known: StaticMembers, delay: int) -> None:
        super().__init__(ca, known)
        self.delay, self.reads, self.decided = delay, 0, {}  # type: ignore[var-annotated]

    def create(self, path: str, body: dict[str, Any], exist_ok: bool = True) -> dict[str, Any]:
        decided = super().create(path, body, exist_ok)
        name = decided["metadata"]["name"]
        self.decided[name] = decided.pop("status", {})
        return decided

    def get(self, path: str) -> dict[str, Any] | None:
        self.reads += 1
        name = path.rsplit("/", 1)[-1]
        if name in self.csrs and self.reads > self.delay:
            self.csrs[name]["status"] = self.decided[name]
        return super().get(path)


async def test_a_csr_not_signed_in_time_is_waited_for_again_not_replaced() -> None:
    from agent_addon.csr import PendingCSR, request_certificate

    ca = pki.create_ca(key_kind="ec")
    hub: Any = SlowHub(ca, known(), delay=3)
    pending: dict[str, PendingCSR] = {}
    with pytest.raises(RenewalError, match=r"not signed within 0s .*same CSR"):
        await request_certificate(hub, "cluster-a", timeout_s=0, poll_s=0, pending=pending)
    [kept] = pending.values()
    # The hub signs it a moment later: the next attempt takes that certificate, no new CSR.
    pair = await request_certificate(hub, "cluster-a", timeout_s=5, poll_s=0, pending=pending)
    assert list(hub.csrs) == [kept.name] and not pending
    assert pki.cluster_from_certificate(pair.cert) == "cluster-a"
    assert pki.key_to_pem(pair.key) == pki.key_to_pem(kept.key)

    # A denied one is final: it is not kept, the next attempt asks anew.
    denied: Any = SlowHub(ca, known(), delay=1)
    with pytest.raises(RenewalError, match="not signed"):
        await request_certificate(denied, "cluster-z", timeout_s=0, poll_s=0, pending=pending)
    with pytest.raises(RenewalError, match="UnknownCluster"):
        await request_certificate(denied, "cluster-z", timeout_s=5, poll_s=0, pending=pending)
    assert not pending


async def test_a_csr_whose_outcome_never_comes_is_given_up_after_a_few_waits() -> None:
    """An outcome the signer could not write never arrives: after MAX_WAITS waits the agent
    drops that CSR, and its next attempt asks with a new one."""
    from agent_addon.csr import MAX_WAITS, PendingCSR, request_certificate

    hub: Any = SlowHub(pki.create_ca(key_kind="ec"), known(), delay=10**6)
    pending: dict[str, PendingCSR] = {}
    for wait in range(1, MAX_WAITS + 1):
        with pytest.raises(RenewalError) as err:
            await request_certificate(hub, "cluster-a", timeout_s=0, poll_s=0, pending=pending)
        assert ("given up" in str(err.value)) == (wait == MAX_WAITS), str(err.value)
    assert not pending and len(hub.csrs) == 1
    with pytest.raises(RenewalError, match="same CSR"):
        await request_certificate(hub, "cluster-a", timeout_s=0, poll_s=0, pending=pending)
    assert len(hub.csrs) == 2
