"""The aggregator as the hub runs it: a server certificate issued from the hub CA and renewed,
client certificates verified against the agent CA only (never the hub CA), the gRPC server,
and Prometheus /metrics. `handlers.py` starts it inside `ocm-fl-hub`."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from hub_controller.aggregator.limits import Limits
from hub_controller.aggregator.metrics import AggregatorMetrics
from hub_controller.aggregator.metrics_http import serve_metrics
from hub_controller.aggregator.scope import Scope
from hub_controller.aggregator.servicer import AggregatorServer, ReloadingServerCredentials
from hub_controller.aggregator.store import ReportStore, StoreLimits
from hub_controller.ca import CADir, CAUnavailable
from hub_controller.membership import Registry
from ocmfl import certlife, constants, pki

log = logging.getLogger(__name__)

SERVER_CERT_LIFETIME = dt.timedelta(days=7)
SERVER_CERT_RENEW_AT = 0.3  # renew with 30 % of the lifetime left
RENEW_RETRY_S = 5.0  # after a failed renewal
TRUST_CHECK_S = 30.0  # how often the agent CA's certificate is compared with the trusted one


def _host_of(address: str) -> str:
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


@dataclass
class AggregatorSettings:
    listen: str = f"0.0.0.0:{constants.AGGREGATOR_PORT}"
    server_names: list[str] = field(default_factory=lambda: ["localhost"])
    server_ips: list[str] = field(default_factory=lambda: ["127.0.0.1"])
    metrics_port: int | None = constants.HUB_METRICS_PORT
    metrics_host: str = "0.0.0.0"
    # /metrics asks for this bearer token (metrics_http.ensure_token); None: not served.
    metrics_token: str | None = None
    max_message_bytes: int = 256 * 1024
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_env(cls) -> AggregatorSettings:
        """Settings from the hub Deployment's env (OCMFL_AGGREGATOR_LISTEN,
        OCMFL_METRICS_LISTEN, OCMFL_HUB_AGGREGATOR_ADDRESS, OCMFL_AGGREGATOR_<limit>)."""
        s = cls(limits=Limits.from_env())
        listen = os.environ.get(constants.ENV_AGGREGATOR_LISTEN, "")
        if listen:
            s.listen = listen
        metrics = os.environ.get(constants.ENV_METRICS_LISTEN, "")
        if metrics:
            host, _, port = metrics.rpartition(":")
            s.metrics_host, s.metrics_port = host.strip("[]") or "0.0.0.0", int(port)
        address = os.environ.get(constants.ENV_HUB_AGGREGATOR_ADDRESS, "")
        if address:
            host = _host_of(address)
            if host.replace(".", "").isdigit() or ":" in host:
                s.server_ips.append(host)
            else:
                s.server_names.append(host)
        return s


class AggregatorService:
    """Owns the ReportStore and the server that feeds it."""

    def __init__(
        self,
        settings: AggregatorSettings,
        registry: Registry,
        ca: CADir,
        scope: Scope,
        client_ca: CADir,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        """`ca`: the hub CA (issues the server certificate); `client_ca`: the agent CA (the
        only issuer of client certificates the server accepts); `metrics_registry`: the
        hub's Prometheus registry, shared with the controller's gauges (default: its own)."""
        self.settings = settings
        self.ca = ca
        self.client_ca = client_ca
        lim = settings.limits
        self.store = ReportStore(
            StoreLimits(
                max_rows_per_cluster=lim.max_rows_per_cluster,
                max_rows_per_run=lim.max_rows_per_run,
                max_rows=lim.max_rows,
                max_runs=lim.max_runs,
            ),
            wait_for_status=True,  # ack a report once the resource's status holds it
        )
        self.metrics = AggregatorMetrics(metrics_registry, max_series=lim.max_metric_series)
        self.registry = registry
        self.scope = scope
        self.server: AggregatorServer | None = None
        self._tls_dir: Path | None = None
        self._client_bundle: bytes | None = None
        self._trust_lock = threading.Lock()
        self._renewer: asyncio.Task[None] | None = None
        self._trust: asyncio.Task[None] | None = None
        self._metrics_server: Any = None

    def _issue_server_cert(self) -> pki.CertAndKey:
        assert self._tls_dir is not None
        ca = self.ca.get()
        pair = pki.issue_server_cert(
            ca,
            dns_names=self.settings.server_names,
            ip_addresses=self.settings.server_ips,
            lifetime=certlife.leaf_lifetime(SERVER_CERT_LIFETIME),
        )
        pki.save_tls_dir(self._tls_dir, pair, None)
        self._write_client_trust()
        log.info(
            "aggregator server certificate issued, valid until %s", pair.cert.not_valid_after_utc
        )
        return pair

    def _write_client_trust(self) -> bool:
        """Write the agent CA's certificates as the server's client trust (ca.crt) when they
        changed (the servicer's credentials pick the file up for new connections)."""
        assert self._tls_dir is not None
        with self._trust_lock:
            bundle = self.client_ca.trust_bundle()
            if bundle == self._client_bundle:
                return False
            pki.write_atomic(self._tls_dir / pki.CA_FILE, bundle)
            if self._client_bundle is not None:
                log.info("agent CA changed: client certificates are verified against the new one")
            self._client_bundle = bundle
            return True

    async def _trust_loop(self) -> None:
        """Follow a rotated agent CA Secret (the mount changes; nothing else tells us)."""
        while True:
            await asyncio.sleep(TRUST_CHECK_S)
            try:
                await asyncio.to_thread(self._write_client_trust)
            except (OSError, CAUnavailable):
                log.exception("reading the agent CA failed; keeping the current client trust")

    async def _renew_loop(self, cert: Any) -> None:
        """Renew the server certificate when SERVER_CERT_RENEW_AT of its lifetime is left
        (the servicer's credentials pick the new files up for new connections)."""
        while True:
            await asyncio.sleep(certlife.renew_in(cert, SERVER_CERT_RENEW_AT, pki.utcnow()))
            try:
                cert = (await asyncio.to_thread(self._issue_server_cert)).cert
            except (OSError, ValueError, CAUnavailable):
                log.exception("renewing the aggregator certificate failed; retrying")
                await asyncio.sleep(RENEW_RETRY_S)

    async def start(self) -> int:
        """Issue the server certificate, start serving; returns the gRPC port."""
        s = self.settings
        self._tls_dir = Path(tempfile.mkdtemp(prefix="ocmfl-aggregator-tls-"))
        pair = self._issue_server_cert()
        self._renewer = asyncio.create_task(self._renew_loop(pair.cert))
        self._trust = asyncio.create_task(self._trust_loop())
        self.server = AggregatorServer(
            self.store,
            self.registry,
            credentials=ReloadingServerCredentials.from_dir(self._tls_dir),
            address=s.listen,
            max_message_bytes=s.max_message_bytes,
            metrics=self.metrics,
            scope=self.scope,
            limits=s.limits,
        )
        port = await self.server.start()
        if s.metrics_port is not None and s.metrics_token:
            self._metrics_server = serve_metrics(
                self.metrics.registry, s.metrics_host, s.metrics_port, s.metrics_token
            )
        elif s.metrics_port is not None:
            log.warning("no /metrics token: /metrics is not served (it would be open to all)")
        return port

    async def stop(self) -> None:
        for task in (self._renewer, self._trust):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.server is not None:
            await self.server.stop()
        if self._metrics_server is not None:
            server, _thread = self._metrics_server
            server.shutdown()
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir, ignore_errors=True)
