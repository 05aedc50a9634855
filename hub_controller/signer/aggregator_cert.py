"""The aggregator's server certificate: the signer part issues it from the hub CA into the
Secret `ocm-fl-aggregator-tls` (kubernetes.io/tls) in the hub's namespace and renews it
there; the aggregator reads that Secret (aggregator/server_cert.py). So the hub CA's key is
only in the process that runs this module (`ocm-fl-hub --role signer`, the chart's signer
Deployment), never in the one that parses tenant specs and serves gRPC.

`problem` is pure: why the Secret's certificate must be (re)issued, or None. The names come
from OCMFL_HUB_AGGREGATOR_ADDRESS (the address agents dial), plus localhost.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from ipaddress import ip_address
from typing import Any, Final

import kopf
from cryptography import x509

from hub_controller.aggregator.server_cert import secret_data
from hub_controller.ca import CADir, CAUnavailable
from ocmfl import certlife, constants, pki, tasks
from ocmfl.kube import Kube, KubeError, path_of

log = logging.getLogger(__name__)

LIFETIME: Final = dt.timedelta(days=7)
RENEW_BELOW: Final = 0.3  # renew with 30 % of the lifetime left
RECHECK_S: Final = 300.0  # look again at least this often (a rotated hub CA, a deleted Secret)
RETRY_S: Final = 5.0  # after a failed issue
FIELD_MANAGER: Final = "ocm-fl-aggregator-cert"


@dataclass(frozen=True)
class ServerNames:
    """The DNS names and IP addresses the aggregator's certificate names."""

    dns: tuple[str, ...] = ("localhost",)
    ips: tuple[str, ...] = ("127.0.0.1",)

    @classmethod
    def for_address(cls, address: str) -> ServerNames:
        """localhost plus the host of `address` (host:port, [v6]:port or a bare host)."""
        host = address.rsplit(":", 1)[0] if address.count(":") == 1 else address
        if address.startswith("["):
            host = address[1:].split("]", 1)[0]
        host = host.strip()
        if not host:
            return cls()
        try:
            ip_address(host)
        except ValueError:
            return cls(dns=tuple(dict.fromkeys(("localhost", host))))
        return cls(ips=tuple(dict.fromkeys(("127.0.0.1", host))))

    @classmethod
    def from_env(cls) -> ServerNames:
        return cls.for_address(os.environ.get(constants.ENV_HUB_AGGREGATOR_ADDRESS, ""))


def _sans(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    return set(ext.get_values_for_type(x509.DNSName)), {
        str(ip) for ip in ext.get_values_for_type(x509.IPAddress)
    }


def problem(
    data: Mapping[str, bytes],
    names: ServerNames,
    ca: x509.Certificate,
    now: dt.datetime,
    lifetime: dt.timedelta = LIFETIME,
) -> str | None:
    """Why the certificate in `data` (tls.crt, tls.key) must be issued again, or None.
    `lifetime`: the longest one may have left (a lowered certificates.lifetimeSeconds
    applies at once)."""
    cert_pem, key_pem = data.get(pki.CERT_FILE), data.get(pki.KEY_FILE)
    if not cert_pem or not key_pem:
        return "no certificate yet"
    try:
        pair = pki.load_cert_and_key(cert_pem, key_pem)
    except ValueError as e:
        return f"unreadable ({e})"
    if not pki.verify_issued_by(pair.cert, ca):
        return "not issued by the current hub CA"
    if _sans(pair.cert) != (set(names.dns), set(names.ips)):
        return f"names {sorted(_sans(pair.cert)[0] | _sans(pair.cert)[1])} are not the address's"
    if certlife.renew_in(pair.cert, RENEW_BELOW, now) <= 0:
        return "due for renewal"
    if pair.cert.not_valid_after_utc - now > lifetime + dt.timedelta(seconds=1):
        return f"valid longer than the configured lifetime ({lifetime.total_seconds():.0f} s)"
    return None


def issue(ca: pki.CertAndKey, names: ServerNames, now: dt.datetime) -> dict[str, bytes]:
    """A new server certificate and key for `names`, as the Secret's data."""
    pair = pki.issue_server_cert(
        ca,
        dns_names=names.dns,
        ip_addresses=names.ips,
        lifetime=certlife.leaf_lifetime(LIFETIME),
        now=now,
    )
    return {pki.CERT_FILE: pair.cert_pem, pki.KEY_FILE: pki.key_to_pem(pair.key)}


@dataclass
class AggregatorCertIssuer:
    """Keeps the Secret's certificate current (`ensure`); `memo.aggregator_cert`."""

    kube: Kube
    ca: CADir
    names: ServerNames
    namespace: str
    clock: Callable[[], dt.datetime] = pki.utcnow
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def path(self) -> str:
        return path_of("v1", "Secret", self.namespace, constants.AGGREGATOR_TLS_SECRET)

    def ensure(self) -> float:
        """Issue when `problem` says so; seconds until the certificate is due (at most
        RECHECK_S)."""
        ca, now = self.ca.get(), self.clock()
        secret = self.kube.get(self.path)
        data = secret_data(secret)
        why = problem(data, self.names, ca.cert, now, certlife.leaf_lifetime(LIFETIME))
        if why is not None:
            data = issue(ca, self.names, now)
            encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
            if secret is None:
                body = {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "kubernetes.io/tls",
                    "metadata": {
                        "name": constants.AGGREGATOR_TLS_SECRET,
                        "namespace": self.namespace,
                        "labels": {"app.kubernetes.io/part-of": "ocm-federated-learning"},
                    },
                    "data": encoded,
                }
                self.kube.create(path_of("v1", "Secret", self.namespace), body, exist_ok=False)
            else:  # resourceVersion kept: a concurrent writer makes this fail, then retry
                self.kube.put(self.path, {**secret, "data": encoded})
            log.info("aggregator certificate issued (%s) for %s", why, self.names)
        cert = pki.load_cert_pem(data[pki.CERT_FILE])
        return min(RECHECK_S, certlife.renew_in(cert, RENEW_BELOW, self.clock()))

    async def keep(self) -> None:
        """Renew when due, for the life of the process."""
        while True:
            try:
                delay = await asyncio.to_thread(self.ensure)
            except (CAUnavailable, KubeError, OSError, ValueError):
                log.exception("issuing the aggregator certificate failed; retrying")
                delay = RETRY_S
            await asyncio.sleep(max(delay, 0.5))


@kopf.on.startup()
async def start_aggregator_cert(memo: kopf.Memo, logger: Any, **_: Any) -> None:
    ca: CADir = memo.setdefault("ca", CADir.hub())
    if not ca.available():
        logger.warning(
            "no hub CA at %s (set %s): the aggregator gets no certificate", ca.directory, ca.env
        )
        return
    namespace = os.environ.get(constants.ENV_POD_NAMESPACE) or constants.HUB_NAMESPACE
    issuer = AggregatorCertIssuer(Kube(field_manager=FIELD_MANAGER), ca, ServerNames.from_env(),
                                  namespace)  # fmt: skip
    # Once before the aggregator's own startup handler (same process) looks for it.
    try:
        await asyncio.to_thread(issuer.ensure)
    except (CAUnavailable, KubeError, OSError, ValueError) as e:
        logger.warning("issuing the aggregator certificate failed (%s); retrying", e)
    issuer.task = asyncio.create_task(issuer.keep())
    memo.aggregator_cert = issuer


@kopf.on.cleanup()
async def stop_aggregator_cert(memo: kopf.Memo, **_: Any) -> None:
    issuer: AggregatorCertIssuer | None = memo.get("aggregator_cert")
    if issuer is not None:
        await tasks.cancel(issuer.task)
