"""The agent's own identity: ask the hub's agent signer for a certificate, and renew it.

With its hub kubeconfig (OCM's KubeClient registration) the agent makes a key in its cert
directory and creates a CertificateSigningRequest for `constants.SIGNER_NAME` (subject
`CN=cluster:<c>, O=federated-learning:agents`, no SANs); the hub's signer
(hub_controller/signer) signs it with the agent CA once it has checked that the requester is
the cluster's addon agent with the hub credential OCM issued to it, and mirrors the outcome
into the cluster's own namespace on the hub (ocmfl.csroutcome), where the agent reads it: it
cannot read CSRs, so it sees no other cluster's. The agent writes the key
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

from ocmfl import certlife, constants, csroutcome, pki
from ocmfl.kube import Kube, KubeError, path_of

log = logging.getLogger(__name__)

RENEW_AT_REMAINING: Final = 0.2  # like OCM: renew with 20 % of the lifetime left
MAX_WAITS: Final = 3  # timed-out waits for one CSR before the agent asks with a new one
CSRS: Final = path_of(constants.CSR_API_VERSION, "CertificateSigningRequest")


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
        "apiVersion": constants.CSR_API_VERSION,
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


@dataclass
class PendingCSR:
    """A CSR this agent created on the hub and that is not signed yet, with what only the
    agent holds for it (the private key; for a Fleet CSR also the SuperNode key it names)."""

    name: str
    key: pki.PrivateKey
    node: bytes | None = None  # OpenSSH private SuperNode key (Fleet CSRs)
    timeouts: int = 0  # waits that ended without an outcome


async def await_signed(
    hub: Kube,
    cluster: str,
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

    The agent may create CSRs but not read them: it reads the outcome the hub's signer
    mirrors into its own cluster's namespace (ocmfl.csroutcome). A CSR not decided in time
    stays in `pending`, and the next call waits for that same CSR (the hub may sign it a
    moment later) instead of abandoning it for a new one, up to MAX_WAITS waits (an outcome
    the signer could not write never comes). A CSR signed, denied or failed leaves `pending`
    (RenewalError for the last two).
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
    path = csroutcome.configmap_path(cluster, mine.name)
    forbidden = ""
    while True:
        try:
            note = await asyncio.to_thread(hub.get, path)
        except KubeError as e:
            if e.status != 403:
                raise
            # The signer binds the reader role in this namespace with the first outcome it
            # writes here; until then (or for a requester it does not trust) it is refused.
            note, forbidden = None, f" (reading {path}: {e})"
        try:
            pem = csroutcome.read_outcome((note or {}).get("data"))
        except csroutcome.Refused as e:
            del pending[slot]
            raise RenewalError(str(e)) from None
        if pem is not None:
            del pending[slot]
            return pem, mine
        if loop.time() >= deadline:
            mine.timeouts += 1
            if mine.timeouts >= MAX_WAITS:
                del pending[slot]
                what = f"given up after {mine.timeouts} waits: the next attempt asks anew"
            else:
                what = "kept: the next attempt waits for this same CSR"
            raise RenewalError(
                f"{label} {mine.name} not signed within {timeout_s:.0f}s ({what}){forbidden}"
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
        hub, cluster, {} if pending is None else pending, "agent", create,
        timeout_s=timeout_s, poll_s=poll_s,
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
