"""The hub CSR signer's policy (decide_csr) and the agent's CSR primitive, without a cluster."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID

from agent_addon.csr import RenewalError, csr_object, needs_renewal, outcome
from hub_controller.bootstrap.addon_template import (
    agent_cert_dir,
    agent_cert_secret_name,
    custom_signer_registration,
    default_agent_subject,
)
from hub_controller.signer import csr_events
from hub_controller.signer.policy import (
    MAX_LIFETIME,
    Approve,
    Deny,
    Ignore,
    agent_group,
    decide_csr,
    sign_request,
)
from ocmfl import constants, pki
from ocmfl.kube import KubeError

KNOWN = {"cluster-a", "cluster-b"}


def agent_csr(cluster: str = "cluster-a", **spec: Any) -> dict[str, Any]:
    """A CSR as the agent creates it, with the requester fields the API server fills."""
    csr = csr_object(cluster, pki.generate_key())
    csr["metadata"]["name"] = "x"
    csr["spec"].update(
        username=f"system:open-cluster-management:cluster:{cluster}:addon:"
        f"{constants.ADDON_NAME}:agent:{constants.ADDON_NAME}-agent",
        groups=[agent_group(cluster), "system:authenticated"],
    )
    csr["spec"].update(spec)
    return csr


def test_agent_csr_for_a_known_cluster_is_approved() -> None:
    decision = decide_csr(agent_csr(expirationSeconds=3600), KNOWN)
    assert decision == Approve("cluster-a", dt.timedelta(hours=1))


def test_lifetime_is_capped() -> None:
    decision = decide_csr(agent_csr(expirationSeconds=30 * 24 * 3600), KNOWN)
    assert isinstance(decision, Approve) and decision.lifetime == MAX_LIFETIME


def test_unknown_cluster_is_denied() -> None:
    decision = decide_csr(agent_csr("cluster-z"), KNOWN)
    assert isinstance(decision, Deny) and decision.reason == "UnknownCluster"


def test_foreign_signer_is_ignored() -> None:
    csr = agent_csr(signerName="kubernetes.io/kube-apiserver-client")
    assert isinstance(decide_csr(csr, KNOWN), Ignore)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"groups": [agent_group("cluster-b")]}, "RequesterMismatch"),
        ({"usages": ["server auth", "digital signature"]}, "BadUsages"),
        ({"request": base64.b64encode(b"junk").decode()}, "InvalidRequest"),
        ({"expirationSeconds": 60}, "BadExpiration"),
    ],
)
def test_mismatched_requests_are_denied(change: dict[str, Any], reason: str) -> None:
    decision = decide_csr(agent_csr(**change), KNOWN)
    assert isinstance(decision, Deny) and decision.reason == reason


def test_cluster_label_must_match_the_subject() -> None:
    csr = agent_csr()
    csr["metadata"]["labels"]["open-cluster-management.io/cluster-name"] = "cluster-b"
    decision = decide_csr(csr, KNOWN)
    assert isinstance(decision, Deny) and decision.reason == "ClusterMismatch"


def test_subject_without_a_cluster_is_denied() -> None:
    key = pki.generate_key()
    req = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cluster-a")]))
        .sign(key, hashes.SHA256())
    )
    csr = agent_csr(request=base64.b64encode(pki.csr_to_pem(req)).decode())
    decision = decide_csr(csr, KNOWN)
    assert isinstance(decision, Deny) and decision.reason == "BadSubject"


def test_decided_csrs_are_left_alone() -> None:
    csr = agent_csr()
    csr["status"] = {"conditions": [{"type": "Denied", "status": "True"}]}
    assert isinstance(decide_csr(csr, KNOWN), Ignore)
    csr["status"] = {"certificate": "abc", "conditions": [{"type": "Approved"}]}
    assert isinstance(decide_csr(csr, KNOWN), Ignore)
    csr["status"] = {"conditions": [{"type": "Approved", "status": "True"}]}
    decision = decide_csr(csr, KNOWN)
    assert isinstance(decision, Approve) and decision.already_approved


def test_signed_certificate_names_the_cluster_and_is_short_lived() -> None:
    ca = pki.create_ca()
    csr = agent_csr(expirationSeconds=7200)
    decision = decide_csr(csr, KNOWN)
    assert isinstance(decision, Approve)
    csr["status"] = {"certificate": sign_request(csr, decision, ca)}
    pem = outcome(csr)
    assert pem is not None
    cert = pki.load_cert_pem(pem)
    assert pki.cluster_from_certificate(cert) == "cluster-a"
    assert pki.verify_issued_by(cert, ca.cert)
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert life <= dt.timedelta(hours=2) + pki.CLOCK_SKEW


def test_denied_csr_is_a_renewal_error() -> None:
    with pytest.raises(RenewalError, match="UnknownCluster"):
        outcome({"status": {"conditions": [{"type": "Denied", "reason": "UnknownCluster"}]}})
    assert outcome({"status": {}}) is None


def test_renewal_is_due_with_a_fifth_of_the_lifetime_left() -> None:
    ca = pki.create_ca()
    now = pki.utcnow()
    cert = pki.issue_client_cert("cluster-a", ca, lifetime=dt.timedelta(hours=10), now=now).cert
    assert not needs_renewal(cert, now + dt.timedelta(hours=7))
    assert needs_renewal(cert, now + dt.timedelta(hours=9))


def test_addon_template_registration_has_no_shared_subject() -> None:
    [reg] = custom_signer_registration("ocm-fl-ca", "ocm-fl")
    assert reg == {
        "type": "CustomSigner",
        "customSigner": {
            "signerName": constants.SIGNER_NAME,
            "signingCA": {"name": "ocm-fl-ca", "namespace": "ocm-fl"},
        },
    }
    assert agent_cert_dir() == constants.AGENT_CERT_DIR
    assert agent_cert_dir() == "/managed/federated-learning.open-cluster-management.io-agent"
    assert agent_cert_secret_name().endswith("-client-cert")


def test_ocm_default_subject_maps_to_its_cluster() -> None:
    subject = default_agent_subject("cluster-a")
    name = x509.Name(
        [pki.name_attribute(NameOID.ORGANIZATION_NAME, g) for g in subject["groups"]]
        + [pki.name_attribute(NameOID.COMMON_NAME, subject["user"])]
    )
    assert pki.cluster_from_subject(name) == "cluster-a"


class FakeHub:
    """The agent's hub client (ocmfl.kube.Kube) whose CSRs the signer's policy decides at once."""

    def __init__(self, ca: pki.CertAndKey, known: set[str]) -> None:
        self.ca, self.known = ca, known
        self.csrs: dict[str, dict[str, Any]] = {}

    def create(self, path: str, body: dict[str, Any], exist_ok: bool = True) -> dict[str, Any]:
        name = f"csr-{len(self.csrs)}"
        cluster = body["metadata"]["labels"]["open-cluster-management.io/cluster-name"]
        csr = {**body, "metadata": {**body["metadata"], "name": name}}
        csr["spec"] = {**body["spec"], "groups": [agent_group(cluster)]}
        decision = decide_csr(csr, self.known)
        if isinstance(decision, Approve):
            csr["status"] = {"certificate": sign_request(csr, decision, self.ca)}
        elif isinstance(decision, Deny):
            csr["status"] = {"conditions": [{"type": "Denied", "reason": decision.reason}]}
        self.csrs[name] = csr
        return csr

    def get(self, path: str) -> dict[str, Any] | None:
        return self.csrs.get(path.rsplit("/", 1)[-1])


async def test_agent_renews_its_certificate_when_due(tmp_path: Any) -> None:
    from agent_addon.csr import renew_if_due

    ca = pki.create_ca(key_kind="ec")
    api: Any = FakeHub(ca, KNOWN)
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

    def __init__(self, ca: pki.CertAndKey, known: set[str], delay: int) -> None:
        super().__init__(ca, known)
        self.delay, self.reads, self.decided = delay, 0, {}  # type: ignore[var-annotated]

    def create(self, path: str, body: dict[str, Any], exist_ok: bool = True) -> dict[str, Any]:
        decided = super().create(path, body, exist_ok)
        name = decided["metadata"]["name"]
        self.decided[name] = decided.pop("status", {})
        return decided

    def get(self, path: str) -> dict[str, Any] | None:
        csr = super().get(path)
        self.reads += 1
        if csr is not None and self.reads > self.delay:
            csr["status"] = self.decided[csr["metadata"]["name"]]
        return csr


async def test_a_csr_not_signed_in_time_is_waited_for_again_not_replaced() -> None:
    from agent_addon.csr import PendingCSR, request_certificate

    ca = pki.create_ca(key_kind="ec")
    hub: Any = SlowHub(ca, KNOWN, delay=3)
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
    denied: Any = SlowHub(ca, KNOWN, delay=1)
    with pytest.raises(RenewalError, match="not signed"):
        await request_certificate(denied, "cluster-z", timeout_s=0, poll_s=0, pending=pending)
    with pytest.raises(RenewalError, match="UnknownCluster"):
        await request_certificate(denied, "cluster-z", timeout_s=5, poll_s=0, pending=pending)
    assert not pending
