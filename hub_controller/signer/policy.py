"""Which agent CSRs the project's signer approves, and the certificate it signs (pure).

`decide_csr` is the whole policy: a CSR for our signer (signerName = constants.SIGNER_NAME)
is approved only when its subject is exactly `CN=cluster:<c>, O=federated-learning:agents`
for one cluster that is registered (accepted ManagedCluster with the addon enabled), it asks
for no SAN, the requester is that cluster's addon agent (`check_requester`, shared with the
Fleet signer) and it asks for client auth only. Certificates last at most `MAX_LIFETIME`
(spec.expirationSeconds honoured below that). CSRs for other signers are never touched. The
agent CA's private key stays on the hub.

`check_requester` is the one requester check of both project signers: the requester must
carry cluster <c>'s addon agent identity (OCM's default addon user and group for <c>) AND
present, as its credential (spec.extra, set by kube-apiserver), a client certificate that OCM
issued to <c>'s addon agent through <c>'s own registration agent (`hub_identity`). The
identity alone is not enough: OCM's addon CSR approver matches requesters by prefix, so
another cluster's registration agent can get a certificate with <c>'s addon identity.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from cryptography import x509

from hub_controller.bootstrap.addon_template import default_agent_subject
from hub_controller.signer import hub_identity
from hub_controller.signer.hub_identity import HubIdentity
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

# Deny reasons of the requester check (agents and tests match on them).
REQUESTER_MISMATCH: Final = "RequesterMismatch"
UNVERIFIED_REQUESTER: Final = "UnverifiedRequester"


class Members(Protocol):
    """What the signers need of the hub's membership (membership.Registry)."""

    def registered(self) -> set[str]: ...

    def hub_identities(self, cluster: str) -> list[HubIdentity]: ...


def agent_group(cluster: str, addon: str = constants.ADDON_NAME) -> str:
    """The group OCM gives the addon agent of `cluster` (its hub kubeconfig identity)."""
    return f"system:open-cluster-management:cluster:{cluster}:addon:{addon}"


def agent_user(cluster: str) -> str:
    """The user OCM gives the addon agent of `cluster` (its hub kubeconfig's CN)."""
    user: str = default_agent_subject(cluster)["user"]
    return user


def check_requester(
    csr: Mapping[str, Any],
    cluster: str,
    identities: Iterable[HubIdentity],
    now: dt.datetime,
) -> Deny | None:
    """None when the CSR's requester is `cluster`'s addon agent with a hub credential OCM
    issued to it through the cluster's own registration agent (`identities`: those the hub
    knows for the cluster); else the Deny saying why and what fixes it."""
    spec = csr.get("spec") or {}
    username = str(spec.get("username") or "")
    groups = list(spec.get("groups") or [])
    if username != agent_user(cluster) or agent_group(cluster) not in groups:
        return Deny(
            REQUESTER_MISMATCH,
            f"requester {username!r} is not the addon agent of cluster {cluster!r}: only "
            f"user {agent_user(cluster)!r} in group {agent_group(cluster)!r} (the hub "
            "kubeconfig OCM's KubeClient registration gives that cluster's agent) may ask",
        )
    presented = hub_identity.credential_fingerprint(csr)
    if presented is None:
        return Deny(
            UNVERIFIED_REQUESTER,
            f"the CSR names no client certificate of its requester (spec.extra "
            f"{hub_identity.CREDENTIAL_ID!r} must hold exactly one X509SHA256=...; "
            "kube-apiserver >= 1.32 sets it for x509 clients): only the agent's own hub "
            "kubeconfig from OCM's KubeClient registration may ask, not a token or a proxy",
        )
    known = [i for i in identities if i.cluster == cluster]
    if any(i.fingerprint == presented and i.valid(now) for i in known):
        return None
    seen = "; ".join(i.describe(now) for i in known) or "none"
    return Deny(
        UNVERIFIED_REQUESTER,
        f"the requester's client certificate X509SHA256={presented} was not issued to "
        f"cluster {cluster!r} through its own registration agent (issued certificates seen "
        f"for {cluster}: {seen}). If the addon was just enabled, the agent retries. A hub "
        "kubeconfig issued before the hub recorded it (older than an hour at this hub's "
        f"upgrade) is renewed by deleting Secret {constants.HUB_KUBECONFIG_SECRET} in "
        f"{constants.AGENT_NAMESPACE} on the cluster; OCM's registration agent then asks anew",
    )


def unexpected_sans(request: x509.CertificateSigningRequest) -> Deny | None:
    """Deny a request that asks for any subject alternative name (none is ever issued)."""
    sans = pki.requested_sans(request)
    if not sans:
        return None
    return Deny(
        "UnexpectedSANs",
        f"an agent certificate carries no subject alternative names; the request asks for "
        f"{', '.join(sans)}",
    )


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
    csr: Mapping[str, Any],
    members: Members,
    cap: dt.timedelta | None = None,
    now: dt.datetime | None = None,
) -> Decision:
    """What to do with one CertificateSigningRequest (a camelCase dict); `members`: who is
    registered and the hub credentials issued to each; `cap`: the hub's lifetime cap
    (ocmfl.certlife)."""
    spec = csr.get("spec") or {}
    request = open_request(csr, constants.SIGNER_NAME)
    if isinstance(request, Ignore | Deny):
        return request
    try:
        cluster = pki.cluster_from_subject(pki.subject_of(request))
    except pki.IdentityError as e:
        return Deny("BadSubject", str(e))
    if pki.subject_of(request) != pki.cluster_subject(cluster):
        return Deny(
            "BadSubject",
            f"subject must be exactly O={constants.CERT_ORGANIZATION}, "
            f"CN={constants.CERT_CN_PREFIX}{cluster}",
        )
    sans = unexpected_sans(request)
    if sans is not None:
        return sans
    if cluster not in members.registered():
        return Deny(
            "UnknownCluster",
            f"cluster {cluster!r} is not an accepted ManagedCluster with the addon enabled",
        )
    labels = (csr.get("metadata") or {}).get("labels") or {}
    label = constants.LABEL_CLUSTER
    if labels.get(label) != cluster:
        return Deny("ClusterMismatch", f"label {label} must be {cluster!r}")
    requester = check_requester(csr, cluster, members.hub_identities(cluster), now or pki.utcnow())
    if requester is not None:
        return requester
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


def csr_age(csr: Mapping[str, Any], now: dt.datetime) -> dt.timedelta | None:
    """How long ago the CSR was created (metadata.creationTimestamp), None if unknown."""
    stamp = (csr.get("metadata") or {}).get("creationTimestamp")
    try:
        created = dt.datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    return now - created


# A requester whose credential is not (yet) known is denied only after this: the hub may not
# have seen the CSR that issued the credential (the agent asks 1-3 s after getting it).
UNVERIFIED_GRACE: Final = dt.timedelta(seconds=8)
WAITING_FOR_LEDGER: Final = "waiting for the hub to see the requester's hub credential issued"


def defer_unverified(csr: Mapping[str, Any], decision: Any, now: dt.datetime) -> Ignore | None:
    """Ignore(WAITING_FOR_LEDGER) for an UnverifiedRequester Deny of a CSR younger than
    UNVERIFIED_GRACE (the caller looks again), else None (write the decision)."""
    if not (isinstance(decision, Deny) and decision.reason == UNVERIFIED_REQUESTER):
        return None
    if hub_identity.credential_fingerprint(csr) is None:
        return None  # nothing to wait for
    age = csr_age(csr, now)
    return Ignore(WAITING_FOR_LEDGER) if age is not None and age < UNVERIFIED_GRACE else None


def sign_request(csr: Mapping[str, Any], decision: Approve, ca: pki.CertAndKey) -> str:
    """Base64 PEM certificate for an approved CSR (what status.certificate holds)."""
    request = pki.load_csr_pem(base64.b64decode(csr["spec"]["request"]))
    cert = pki.sign_csr(request, ca, lifetime=decision.lifetime, max_lifetime=MAX_LIFETIME)
    return base64.b64encode(pki.cert_to_pem(cert)).decode()


def csr_condition(kind: str, reason: str, message: str, now: dt.datetime) -> dict[str, Any]:
    """A signer's condition on a CSR (`kind` Approved or Denied), stamped `now`."""
    ts = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastUpdateTime": ts,
        "lastTransitionTime": ts,
    }


def approval_condition(decision: Approve | Deny, now: dt.datetime) -> dict[str, Any]:
    """The agent signer's condition for `decision`."""
    if isinstance(decision, Approve):
        message = f"addon agent of cluster {decision.cluster}"
        return csr_condition("Approved", "AgentIdentity", message, now)
    return csr_condition("Denied", decision.reason, decision.message, now)


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
