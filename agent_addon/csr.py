"""The agent's own identity: ask the hub's agent signer for a certificate, and renew it.

With its hub kubeconfig (OCM's KubeClient registration) the agent makes a key in its cert
directory and creates a CertificateSigningRequest for `constants.SIGNER_NAME` (subject
`CN=cluster:<c>, O=federated-learning:agents`, no SANs); the hub's signer
(hub_controller/signer) signs it with the agent CA once it has checked that the requester is
the cluster's addon agent with the hub credential OCM issued to it. The agent writes the key
and certificate into the cert directory and renews before expiry; HubStreamer then reconnects
with them. The private key never leaves the cluster.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ocmfl import certlife, constants, pki
from ocmfl.kube import Kube, path_of

log = logging.getLogger(__name__)

RENEW_AT_REMAINING: Final = 0.2  # like OCM: renew with 20 % of the lifetime left
CSR_API_VERSION: Final = "certificates.k8s.io/v1"
CSRS: Final = path_of(CSR_API_VERSION, "CertificateSigningRequest")


class RenewalError(RuntimeError):
    """The CSR was denied, failed, or not signed in time."""


def needs_renewal(
    cert: Any, now: dt.datetime | None = None, threshold: float = RENEW_AT_REMAINING
) -> bool:
    """True when less than `threshold` of the certificate's lifetime is left."""
    return pki.remaining_fraction(cert, now) < threshold


def next_check_s(
    cert_dir: Path,
    interval_s: float,
    now: dt.datetime | None = None,
    threshold: float = RENEW_AT_REMAINING,
    floor_s: float = 1.0,
) -> float:
    """Seconds until the next renewal check: when the certificate in `cert_dir` becomes due,
    at most `interval_s`, at least `floor_s` (also when there is no readable certificate)."""
    try:
        cert = pki.load_cert_pem((cert_dir / pki.CERT_FILE).read_bytes())
    except (OSError, ValueError):
        return floor_s
    due = certlife.renew_in(cert, threshold, now or pki.utcnow())
    return max(floor_s, min(interval_s, due))


def csr_object(
    cluster: str, key: pki.PrivateKey, expiration_seconds: int | None = 24 * 3600
) -> dict[str, Any]:
    """The CertificateSigningRequest (camelCase dict) asking for `cluster`'s agent cert."""
    request = pki.csr_to_pem(pki.create_csr(cluster, key))
    spec: dict[str, Any] = {
        "signerName": constants.SIGNER_NAME,
        "request": base64.b64encode(request).decode(),
        "usages": ["digital signature", "key encipherment", "client auth"],
    }
    if expiration_seconds is not None:
        spec["expirationSeconds"] = expiration_seconds
    return {
        "apiVersion": CSR_API_VERSION,
        "kind": "CertificateSigningRequest",
        "metadata": {
            "generateName": f"{constants.ADDON_NAME}-{cluster}-",
            # Not OCM's cluster-name/addon-name labels: OCM's registration agent counts every
            # CSR carrying both toward its limit of 10 per addon and cluster, past which it
            # stops renewing the addon's hub kubeconfig (register/csr/options.go).
            "labels": {constants.LABEL_CLUSTER: cluster},
        },
        "spec": spec,
    }


def outcome(csr: dict[str, Any]) -> bytes | None:
    """The signed certificate PEM, None while pending; RenewalError if denied/failed."""
    status = csr.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("type") in ("Denied", "Failed"):
            raise RenewalError(
                f"CSR {c.get('type').lower()}: {c.get('reason')}: {c.get('message')}"
            )
    cert = status.get("certificate")
    return base64.b64decode(cert) if cert else None


@dataclass
class PendingCSR:
    """A CSR this agent created on the hub and that is not signed yet, with what only the
    agent holds for it (the private key; for a Fleet CSR also the SuperNode key it names)."""

    name: str
    key: pki.PrivateKey
    node: bytes | None = None  # OpenSSH private SuperNode key (Fleet CSRs)


async def await_signed(
    hub: Kube,
    pending: dict[str, PendingCSR],
    slot: str,
    create: Callable[[], tuple[dict[str, Any], PendingCSR]],
    *,
    timeout_s: float,
    poll_s: float,
    label: str = "CSR",
) -> tuple[bytes, PendingCSR]:
    """The signed PEM of the CSR waiting in `pending[slot]`, else of a new one (`create`
    gives its object and what to keep); waits up to `timeout_s`.

    A CSR not signed in time stays in `pending`, and the next call waits for that same CSR
    (the hub may sign it a moment later) instead of abandoning it for a new one. A CSR
    signed, denied, failed or deleted leaves `pending` (RenewalError for the last three).
    """
    mine = pending.get(slot)
    if mine is None:
        body, mine = create()
        created = await asyncio.to_thread(hub.create, CSRS, body, False)
        assert created is not None
        mine.name = created["metadata"]["name"]
        pending[slot] = mine
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        current = await asyncio.to_thread(hub.get, f"{CSRS}/{mine.name}")
        if current is None:
            del pending[slot]
            raise RenewalError(f"{label} {mine.name} was deleted before it was signed")
        try:
            pem = outcome(current)
        except RenewalError:
            del pending[slot]
            raise
        if pem is not None:
            del pending[slot]
            return pem, mine
        if loop.time() >= deadline:
            raise RenewalError(
                f"{label} {mine.name} not signed within {timeout_s:.0f}s "
                "(kept: the next attempt waits for this same CSR)"
            )
        await asyncio.sleep(poll_s)


async def request_certificate(
    hub: Kube,
    cluster: str,
    *,
    expiration_seconds: int | None = 24 * 3600,
    timeout_s: float = 60.0,
    poll_s: float = 0.5,
    pending: dict[str, PendingCSR] | None = None,
) -> pki.CertAndKey:
    """Create a CSR on the hub and wait for its certificate (`hub`: the agent's hub client);
    with `pending` (the caller's, kept between calls) a CSR that timed out is waited for
    again rather than replaced."""

    def create() -> tuple[dict[str, Any], PendingCSR]:
        key = pki.generate_key()
        return csr_object(cluster, key, expiration_seconds), PendingCSR("", key)

    pem, mine = await await_signed(
        hub, {} if pending is None else pending, "agent", create, timeout_s=timeout_s,
        poll_s=poll_s,
    )  # fmt: skip
    cert = pki.load_cert_pem(pem)
    if pki.cluster_from_certificate(cert) != cluster:
        raise RenewalError(f"CSR {mine.name}: certificate names another cluster")
    return pki.CertAndKey(cert, mine.key)


async def renew_if_due(
    hub: Kube,
    cluster: str,
    cert_dir: Path,
    *,
    threshold: float = RENEW_AT_REMAINING,
    **kw: Any,
) -> bool:
    """Renew the certificate in `cert_dir` when due (or missing); True if renewed."""
    try:
        current = pki.load_cert_pem((cert_dir / pki.CERT_FILE).read_bytes())
        if not needs_renewal(current, threshold=threshold):
            return False
    except (OSError, ValueError):
        log.info("no usable certificate in %s: requesting one", cert_dir)
    pair = await request_certificate(hub, cluster, **kw)
    pki.save_tls_dir(cert_dir, pair, None)
    log.info("renewed agent certificate, valid until %s", pair.cert.not_valid_after_utc)
    return True
