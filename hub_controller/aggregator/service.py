"""The aggregator as the hub runs it: the server certificate the signer keeps in a Secret
(server_cert.py; followed as it is renewed), client certificates verified against the agent
CA's certificate only (never the hub CA; no CA key here), the gRPC server, and Prometheus
/metrics. `handlers.py` starts it inside `ocm-fl-hub`."""

from __future__ import annotations

import asyncio
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
from hub_controller.aggregator.server_cert import ServerCertSource
from hub_controller.aggregator.servicer import AggregatorServer, ReloadingServerCredentials
from hub_controller.aggregator.store import ReportStore, StoreLimits
from hub_controller.ca import CADir, CAUnavailable
from hub_controller.membership import Registry
from ocmfl import constants, pki, tasks
from ocmfl.kube import KubeError

log = logging.getLogger(__name__)

CERT_CHECK_S = 5.0  # how often the server certificate's Secret is read (the signer renews it)
TRUST_CHECK_S = 30.0  # how often the agent CA's certificate is compared with the trusted one
CERT_WAIT_S = 120.0  # at start, how long to wait for the signer's first certificate


@dataclass
class AggregatorSettings:
    listen: str = f"0.0.0.0:{constants.AGGREGATOR_PORT}"
    metrics_port: int | None = constants.HUB_METRICS_PORT
    metrics_host: str = "0.0.0.0"
    # /metrics asks for this bearer token (metrics_http.ensure_token); None: not served.
    metrics_token: str | None = None
    max_message_bytes: int = 256 * 1024
    cert_wait_s: float = CERT_WAIT_S
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_env(cls) -> AggregatorSettings:
        """Settings from the hub Deployment's env (OCMFL_AGGREGATOR_LISTEN,
        OCMFL_METRICS_LISTEN, OCMFL_AGGREGATOR_<limit>)."""
        s = cls(limits=Limits.from_env())
        listen = os.environ.get(constants.ENV_AGGREGATOR_LISTEN, "")
        if listen:
            s.listen = listen
        metrics = os.environ.get(constants.ENV_METRICS_LISTEN, "")
        if metrics:
            host, _, port = metrics.rpartition(":")
            s.metrics_host, s.metrics_port = host.strip("[]") or "0.0.0.0", int(port)
        return s


class AggregatorService:
    """Owns the ReportStore and the server that feeds it."""

    def __init__(
        self,
        settings: AggregatorSettings,
        registry: Registry,
        server_cert: ServerCertSource,
        scope: Scope,
        client_ca: CADir,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        """`server_cert`: where the signer keeps the server certificate; `client_ca`: the
        agent CA (its certificate only: the only issuer of client certificates the server
        accepts); `metrics_registry`: the hub's Prometheus registry, shared with the
        controller's gauges (default: its own)."""
        self.settings = settings
        self.server_cert = server_cert
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
        self._server_pem: tuple[bytes, bytes] | None = None
        self._trust_lock = threading.Lock()
        self._renewer: asyncio.Task[None] | None = None
        self._trust: asyncio.Task[None] | None = None
        self._metrics_server: Any = None

    def _take_server_cert(self) -> bool:
        """Write the Secret's certificate and key as the server's when they changed and
        match (the servicer's credentials pick the files up for new connections); False
        while the Secret holds none."""
        assert self._tls_dir is not None
        pem = self.server_cert.read()
        if pem is None or pem == self._server_pem:
            return pem is not None
        pair = pki.load_cert_and_key(*pem)  # ValueError: a mismatched pair, kept out
        pki.write_atomic(self._tls_dir / pki.KEY_FILE, pem[1], mode=0o600)
        pki.write_atomic(self._tls_dir / pki.CERT_FILE, pem[0])
        self._server_pem = pem
        log.info("aggregator server certificate valid until %s", pair.cert.not_valid_after_utc)
        return True

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

    async def _cert_loop(self) -> None:
        """Follow the signer's renewals of the server certificate."""
        while True:
            await asyncio.sleep(CERT_CHECK_S)
            try:
                await asyncio.to_thread(self._take_server_cert)
            except (KubeError, OSError, ValueError):  # keep serving the current one
                log.exception("reading the aggregator certificate failed; keeping the current one")

    async def _first_server_cert(self, wait_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + wait_s
        while not await asyncio.to_thread(self._take_server_cert):
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(
                    f"no aggregator certificate in {self.server_cert.where()} after "
                    f"{wait_s:.0f} s: the signer issues it (ocm-fl-hub --role signer, the "
                    "chart's signer Deployment, with the hub CA mounted); is it running?"
                )
            await asyncio.sleep(1.0)

    async def start(self) -> int:
        """Take the signer's server certificate (waiting up to `CERT_WAIT_S` for the first),
        start serving; returns the gRPC port."""
        s = self.settings
        self._tls_dir = Path(tempfile.mkdtemp(prefix="ocmfl-aggregator-tls-"))
        await self._first_server_cert(s.cert_wait_s)
        self._write_client_trust()
        self._renewer = asyncio.create_task(self._cert_loop())
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
        await tasks.cancel(self._renewer, self._trust)
        if self.server is not None:
            await self.server.stop()
        if self._metrics_server is not None:
            server, _thread = self._metrics_server
            server.shutdown()
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir, ignore_errors=True)
