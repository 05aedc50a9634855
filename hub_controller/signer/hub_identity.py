"""Which hub credentials OCM issued to each cluster's addon agent, and through whom (pure).

The project's signers trust a requester only with the exact client certificate OCM issued to
that cluster's addon agent *through that cluster's own registration agent*. OCM's approver of
those requests (addon-framework `utils.DefaultCSRApprover`) checks the requester with a bare
prefix, `strings.HasPrefix(username, "system:open-cluster-management:"+cluster)`, so the
registration agent of `cluster10` gets a hub credential for `cluster1`'s addon identity; the
identity (user, groups) alone proves nothing. The certificate does: kube-apiserver names an
x509 requester's credential in its user extra (`X509SHA256=<sha256 of the certificate DER>`),
and the CSR API copies that into every CSR's `spec.extra`.

`classify` reads one CSR of the addon's KubeClient registration (signer
kubernetes.io/kube-apiserver-client, labels addon-name and cluster-name):
- `HubIdentity`: issued, requested by the cluster's own registration agent (username exactly
  `system:open-cluster-management:<c>:<agent-id>`, group `system:open-cluster-management:<c>`);
- `Forged`: requested by anyone else (another cluster's registration agent, a bootstrap
  identity, another addon agent): never trusted;
- None: not such a CSR, or not issued yet.

Trusted records are kept (at most MAX_ENTRIES, unexpired) in an annotation on the cluster's
ManagedClusterAddOn (`ANNOTATION`, a JSON list), because OCM's hub deletes issued CSRs an
hour after approval; only the hub controller writes it.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ocmfl import constants, pki

ANNOTATION: Final = constants.ANNOTATION_HUB_IDENTITIES
CREDENTIAL_ID: Final = constants.CREDENTIAL_ID_EXTRA
CREDENTIAL_PREFIX: Final = "X509SHA256="
MAX_ENTRIES: Final = 4
REGISTRATION_PREFIX: Final = "system:open-cluster-management"
_FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")


class LedgerError(ValueError):
    """The annotation is not a list of hub-identity records."""


@dataclass(frozen=True)
class HubIdentity:
    """One hub client certificate OCM issued to `cluster`'s addon agent through the cluster's
    own registration agent."""

    cluster: str
    fingerprint: str  # lowercase hex SHA-256 of the certificate's DER
    not_after: dt.datetime
    csr: str  # the CSR it was issued through

    def valid(self, now: dt.datetime) -> bool:
        return now < self.not_after

    def describe(self, now: dt.datetime) -> str:
        state = "valid" if self.valid(now) else "expired"
        until = _ts(self.not_after)
        return f"X509SHA256={self.fingerprint} (CSR {self.csr}, {state} until {until})"


@dataclass(frozen=True)
class Forged:
    """An addon hub-credential CSR for `cluster` asked by someone other than the cluster's own
    registration agent."""

    csr: str
    cluster: str
    requester: str
    groups: tuple[str, ...]
    issued: bool

    def message(self) -> str:
        state = "and OCM issued it" if self.issued else "(not issued yet)"
        return (
            f"CSR {self.csr} asks for cluster {self.cluster!r}'s {constants.ADDON_NAME} addon hub "
            f"credential, but its requester {self.requester!r} (groups {list(self.groups)}) is "
            f"not that cluster's registration agent {state}: the hub's signers never trust this "
            "certificate. Find who holds that identity; OCM's addon approver matches the "
            "requester by prefix only."
        )


def _ts(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def addon_csr_cluster(csr: Mapping[str, Any]) -> str | None:
    """The cluster an addon hub-credential CSR (KubeClient registration) claims, else None."""
    spec = csr.get("spec") or {}
    labels = (csr.get("metadata") or {}).get("labels") or {}
    if spec.get("signerName") != constants.KUBE_APISERVER_CLIENT_SIGNER:
        return None
    if labels.get(constants.LABEL_OCM_ADDON_NAME) != constants.ADDON_NAME:
        return None
    cluster = labels.get(constants.LABEL_OCM_CLUSTER_NAME)
    return cluster if isinstance(cluster, str) and cluster else None


def is_registration_agent(username: str, groups: Iterable[str], cluster: str) -> bool:
    """Whether (username, groups) is `cluster`'s own registration agent: the user is exactly
    system:open-cluster-management:<cluster>:<agent-id> (four parts, the third the cluster
    itself, not a name it is a prefix of) and the group system:open-cluster-management:<cluster>
    is present."""
    parts = username.split(":")
    return (
        len(parts) == 4
        and parts[0] == "system"
        and parts[1] == "open-cluster-management"
        and parts[2] == cluster
        and bool(parts[3])
        and f"{REGISTRATION_PREFIX}:{cluster}" in set(groups)
    )


def issued_certificate(csr: Mapping[str, Any]) -> bytes | None:
    """The PEM in status.certificate, or None (not issued, or unreadable)."""
    raw = (csr.get("status") or {}).get("certificate")
    if not raw:
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return None


def classify(csr: Mapping[str, Any]) -> HubIdentity | Forged | None:
    """What one CSR says about a cluster's addon hub credential (see the module docstring)."""
    cluster = addon_csr_cluster(csr)
    if cluster is None:
        return None
    spec = csr.get("spec") or {}
    name = str((csr.get("metadata") or {}).get("name") or "")
    username = str(spec.get("username") or "")
    groups = tuple(str(g) for g in spec.get("groups") or [])
    pem = issued_certificate(csr)
    if not is_registration_agent(username, groups, cluster):
        return Forged(name, cluster, username, groups, issued=pem is not None)
    if pem is None:
        return None
    try:
        cert = pki.load_cert_pem(pem)
    except ValueError:
        return None
    return HubIdentity(cluster, pki.certificate_fingerprint(cert), cert.not_valid_after_utc, name)


def credential_fingerprint(csr: Mapping[str, Any]) -> str | None:
    """The fingerprint of the client certificate the CSR's requester authenticated with
    (spec.extra[CREDENTIAL_ID] = ["X509SHA256=<hex>"]); None unless exactly one is there."""
    extra = (csr.get("spec") or {}).get("extra") or {}
    values = extra.get(CREDENTIAL_ID) if isinstance(extra, Mapping) else None
    if not isinstance(values, list):
        return None
    found = {
        v[len(CREDENTIAL_PREFIX) :].lower()
        for v in values
        if isinstance(v, str) and v.startswith(CREDENTIAL_PREFIX)
    }
    if len(found) != 1:
        return None
    (fingerprint,) = found
    return fingerprint if _FINGERPRINT.match(fingerprint) else None


# --- the ledger annotation on the ManagedClusterAddOn -----------------------------------------


def parse_ledger(cluster: str, text: str) -> list[HubIdentity]:
    """The records of one cluster's annotation value; LedgerError when it is malformed."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise LedgerError(f"not JSON: {e}") from e
    if not isinstance(data, list):
        raise LedgerError("not a JSON list")
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, Mapping):
            raise LedgerError(f"entry {i} is not an object")
        fingerprint, not_after, csr = item.get("sha256"), item.get("notAfter"), item.get("csr")
        if not isinstance(fingerprint, str) or not _FINGERPRINT.match(fingerprint):
            raise LedgerError(f"entry {i}: sha256 must be 64 lowercase hex digits")
        if not isinstance(csr, str):
            raise LedgerError(f"entry {i}: csr must be a string")
        try:
            when = dt.datetime.strptime(str(not_after), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
        except ValueError as e:
            raise LedgerError(f"entry {i}: notAfter: {e}") from e
        out.append(HubIdentity(cluster, fingerprint, when, csr))
    return out


def ledger_of(
    cluster: str, annotations: Mapping[str, Any] | None
) -> tuple[list[HubIdentity], str | None]:
    """The records in a ManagedClusterAddOn's annotations, and the problem when the annotation
    is malformed (then no records: a bad ledger trusts nothing, it never crashes)."""
    text = (annotations or {}).get(ANNOTATION)
    if text is None:
        return [], None
    try:
        return parse_ledger(cluster, str(text)), None
    except LedgerError as e:
        return [], f"annotation {ANNOTATION} of cluster {cluster!r} is malformed ({e}): ignored"


def render_ledger(entries: Iterable[HubIdentity]) -> str:
    """The annotation value (compact JSON) for these records."""
    return json.dumps(
        [{"sha256": e.fingerprint, "notAfter": _ts(e.not_after), "csr": e.csr} for e in entries],
        separators=(",", ":"),
    )


def merge_ledger(
    entries: Iterable[HubIdentity],
    new: HubIdentity,
    now: dt.datetime,
    limit: int = MAX_ENTRIES,
) -> list[HubIdentity]:
    """`entries` with `new`: unexpired only, one per fingerprint, the `limit` that expire
    last, latest expiry first."""
    by_fingerprint: dict[str, HubIdentity] = {}
    for e in [new, *entries]:
        if e.valid(now) and e.fingerprint not in by_fingerprint:
            by_fingerprint[e.fingerprint] = e
    return sorted(by_fingerprint.values(), key=lambda e: e.not_after, reverse=True)[:limit]
