"""Which agent CSRs the project's signer approves, and the certificate it signs (pure).

`decide_csr` is the whole policy: a CSR for our signer (signerName = constants.SIGNER_NAME)
is approved only when its subject names exactly one cluster that is registered (accepted
ManagedCluster with the addon enabled), the requester is that cluster's addon agent, and it
asks for client auth only. Certificates last at most `MAX_LIFETIME` (spec.expirationSeconds
honoured below that). CSRs for other signers are never touched. The CA private key stays on
the hub.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

from cryptography import x509

from ocmfl import constants, pki

MAX_LIFETIME: Final = dt.timedelta(hours=24)


MIN_LIFETIME: Final = dt.timedelta(minutes=10)


ALLOWED_USAGES: Final = frozenset({"client auth", "digital signature", "key encipherment"})


@dataclass(frozen=True)
class Approve:
    cluster: str
    lifetime: dt.timedelta
    already_approved: bool = False


@dataclass(frozen=True)
class Deny:
    reason: str  # CamelCase condition reason
    message: str


@dataclass(frozen=True)
class Ignore:
    why: str


Decision = Approve | Deny | Ignore


def agent_group(cluster: str, addon: str = constants.ADDON_NAME) -> str:
    """The group OCM gives the addon agent of `cluster` (its hub kubeconfig identity)."""
    return f"system:open-cluster-management:cluster:{cluster}:addon:{addon}"


def conditions_of(csr: Mapping[str, Any]) -> set[str]:
    """The types of a CSR's status conditions (Approved, Denied, Failed)."""
    status = csr.get("status") or {}
    return {c.get("type", "") for c in status.get("conditions") or []}


def open_request(
    csr: Mapping[str, Any], signer_name: str
) -> Ignore | Deny | x509.CertificateSigningRequest:
    """The verified request of a CSR still open for `signer_name`; else why to leave it
    alone (another signer's, already signed, denied or failed) or to deny it (not a valid
    signed CSR)."""
    spec = csr.get("spec") or {}
    if spec.get("signerName") != signer_name:
        return Ignore(f"not for {signer_name}")
    if (csr.get("status") or {}).get("certificate"):
        return Ignore("already signed")
    if conditions_of(csr) & {"Denied", "Failed"}:
        return Ignore("already denied or failed")
    try:
        request = pki.load_csr_pem(base64.b64decode(spec.get("request") or "", validate=True))
        pki.verify_csr(request)
    except (ValueError, pki.CSRError) as e:
        return Deny("InvalidRequest", f"spec.request is not a valid signed CSR: {e}")
    return request


def decide_csr(
    csr: Mapping[str, Any], known_clusters: Collection[str], cap: dt.timedelta | None = None
) -> Decision:
    """What to do with one CertificateSigningRequest (a camelCase dict); `cap`: the hub's
    lifetime cap (ocmfl.certlife)."""
    spec = csr.get("spec") or {}
    request = open_request(csr, constants.SIGNER_NAME)
    if isinstance(request, Ignore | Deny):
        return request
    try:
        cluster = pki.cluster_from_subject(pki.subject_of(request))
    except pki.IdentityError as e:
        return Deny("BadSubject", str(e))
    if cluster not in known_clusters:
        return Deny(
            "UnknownCluster",
            f"cluster {cluster!r} is not an accepted ManagedCluster with the addon enabled",
        )
    labels = (csr.get("metadata") or {}).get("labels") or {}
    label = constants.LABEL_OCM_CLUSTER_NAME
    if labels.get(label) != cluster:
        return Deny("ClusterMismatch", f"label {label} must be {cluster!r}")
    if agent_group(cluster) not in (spec.get("groups") or []):
        return Deny(
            "RequesterMismatch",
            f"requester {spec.get('username')!r} is not the addon agent of cluster {cluster!r}",
        )
    usages = set(spec.get("usages") or [])
    if "client auth" not in usages or not usages <= ALLOWED_USAGES:
        return Deny(
            "BadUsages",
            f"usages must be client auth (+ digital signature, key "
            f"encipherment), got {sorted(usages)}",
        )
    lifetime = requested_lifetime(spec, cap)
    if isinstance(lifetime, Deny):
        return lifetime
    return Approve(cluster, lifetime, already_approved="Approved" in conditions_of(csr))


def sign_request(csr: Mapping[str, Any], decision: Approve, ca: pki.CertAndKey) -> str:
    """Base64 PEM certificate for an approved CSR (what status.certificate holds)."""
    request = pki.load_csr_pem(base64.b64decode(csr["spec"]["request"]))
    cert = pki.sign_csr(request, ca, lifetime=decision.lifetime, max_lifetime=MAX_LIFETIME)
    return base64.b64encode(pki.cert_to_pem(cert)).decode()


def approval_condition(decision: Approve | Deny, now: dt.datetime) -> dict[str, Any]:
    ts = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(decision, Approve):
        return {
            "type": "Approved",
            "status": "True",
            "reason": "AgentIdentity",
            "message": f"addon agent of cluster {decision.cluster}",
            "lastUpdateTime": ts,
            "lastTransitionTime": ts,
        }
    return {
        "type": "Denied",
        "status": "True",
        "reason": decision.reason,
        "message": decision.message,
        "lastUpdateTime": ts,
        "lastTransitionTime": ts,
    }


def requested_lifetime(
    spec: Mapping[str, Any], cap: dt.timedelta | None = None
) -> dt.timedelta | Deny:
    """A CSR's certificate lifetime: its expirationSeconds capped at MAX_LIFETIME (default
    MAX_LIFETIME) and at `cap` (the hub's OCMFL_CERT_LIFETIME_SECONDS, ocmfl.certlife: the
    signer may issue shorter than asked); Deny when it asks for less than MIN_LIFETIME or for
    a non-integer."""
    seconds = spec.get("expirationSeconds")
    if seconds is None:
        lifetime = MAX_LIFETIME
    elif not isinstance(seconds, int) or seconds < MIN_LIFETIME.total_seconds():
        return Deny(
            "BadExpiration",
            f"expirationSeconds must be at least {int(MIN_LIFETIME.total_seconds())}",
        )
    else:
        lifetime = min(MAX_LIFETIME, dt.timedelta(seconds=seconds))
    return lifetime if cap is None else min(lifetime, cap)
