"""The aggregator as the hub runs it: server TLS issued from the hub CA and renewed,
gRPC server, Prometheus /metrics, optional standalone StatusWriter and CSR signer.

Embed it in the controller's event loop (kopf startup handler)::

    service = AggregatorService(AggregatorSettings.from_env())
    await service.start()
    hub_controller.operator.handlers.apply_status_reports(service.store)  # the fold reads it

or run it alone: ``python -m hub_controller.aggregator`` (then `--write-status` makes its
own coalescing StatusWriter patch status.clusters).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from hub_controller.aggregator.metrics import AggregatorMetrics
from hub_controller.aggregator.registry import (
    ClusterRegistry,
    InMemoryClusterRegistry,
    KubernetesClusterRegistry,
)
from hub_controller.aggregator.servicer import AggregatorServer, ReloadingServerCredentials
from hub_controller.aggregator.store import ReportStore
from hub_controller.aggregator.writer import KubernetesStatusClient, StatusWriter
from ocmfl import constants, pki

log = logging.getLogger(__name__)

SERVER_CERT_LIFETIME = dt.timedelta(days=7)
SERVER_CERT_RENEW_AT = 0.3  # renew with 30 % of the lifetime left


def _host_of(address: str) -> str:
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


@dataclass
class AggregatorSettings:
    listen: str = f"0.0.0.0:{constants.AGGREGATOR_PORT}"
    # Either a ready server cert dir (tls.crt, tls.key, ca.crt) ...
    server_cert_dir: Path | None = None
    # ... or the hub CA dir (tls.crt, tls.key) to issue and renew one from.
    ca_dir: Path | None = None
    server_names: list[str] = field(default_factory=lambda: ["localhost"])
    server_ips: list[str] = field(default_factory=lambda: ["127.0.0.1"])
    kubeconfig: str | None = None
    clusters: list[str] | None = None  # fixed registry instead of the hub API (dev only)
    metrics_port: int | None = constants.HUB_METRICS_PORT
    metrics_host: str = "0.0.0.0"
    write_status: bool = False
    status_interval_s: float = 2.0
    run_signer: bool = False
    signer_ca_secret: tuple[str, str] | None = None  # (namespace, name); default: ca_dir
    max_message_bytes: int = 256 * 1024

    @classmethod
    def from_env(cls) -> AggregatorSettings:
        """Settings from the hub Deployment's env (OCMFL_CA_DIR, OCMFL_HUB_AGGREGATOR_ADDRESS)."""
        s = cls(
            ca_dir=Path(os.environ.get(constants.ENV_CA_DIR, constants.HUB_CA_DIR)),
            kubeconfig=os.environ.get("KUBECONFIG") or None,
        )
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
    """Owns the ReportStore and everything that feeds it or reads it."""

    def __init__(self, settings: AggregatorSettings, registry: ClusterRegistry | None = None):
        self.settings = settings
        self.store = ReportStore()
        self.metrics = AggregatorMetrics()
        self.registry = registry or self._registry()
        self.server: AggregatorServer | None = None
        self.writer: StatusWriter | None = None
        self._tls_dir: Path | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._signer: Any = None
        self._signer_thread: threading.Thread | None = None
        self._metrics_server: Any = None

    def _registry(self) -> ClusterRegistry:
        if self.settings.clusters is not None:
            return InMemoryClusterRegistry(self.settings.clusters)
        return KubernetesClusterRegistry.from_kubeconfig(self.settings.kubeconfig)

    # --- server certificate ------------------------------------------------------------------
    def _load_ca(self) -> pki.CertAndKey:
        assert self.settings.ca_dir is not None
        d = self.settings.ca_dir
        return pki.load_cert_and_key(
            (d / pki.CERT_FILE).read_bytes(), (d / pki.KEY_FILE).read_bytes()
        )

    def _issue_server_cert(self) -> pki.CertAndKey:
        assert self._tls_dir is not None
        ca = self._load_ca()
        pair = pki.issue_server_cert(
            ca,
            dns_names=self.settings.server_names,
            ip_addresses=self.settings.server_ips,
            lifetime=SERVER_CERT_LIFETIME,
        )
        pki.save_tls_dir(self._tls_dir, pair, ca.cert)
        log.info(
            "aggregator server certificate issued, valid until %s", pair.cert.not_valid_after_utc
        )
        return pair

    async def _renew_loop(self, cert: Any) -> None:
        while True:
            left = cert.not_valid_after_utc - pki.utcnow()
            total = cert.not_valid_after_utc - cert.not_valid_before_utc
            wait = max(60.0, (left - total * SERVER_CERT_RENEW_AT).total_seconds())
            await asyncio.sleep(wait)
            try:
                cert = (await asyncio.to_thread(self._issue_server_cert)).cert
            except (OSError, ValueError):
                log.exception("renewing the aggregator certificate failed; retrying")

    def _credentials(self) -> ReloadingServerCredentials:
        if self.settings.server_cert_dir is not None:
            return ReloadingServerCredentials.from_dir(self.settings.server_cert_dir)
        if self.settings.ca_dir is None:
            raise ValueError("set server_cert_dir or ca_dir")
        self._tls_dir = Path(tempfile.mkdtemp(prefix="ocmfl-aggregator-tls-"))
        pair = self._issue_server_cert()
        self._renewer = asyncio.create_task(self._renew_loop(pair.cert))
        return ReloadingServerCredentials.from_dir(self._tls_dir)

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> int:
        """Start everything; returns the gRPC port."""
        s = self.settings
        self.server = AggregatorServer(
            self.store,
            self.registry,
            credentials=self._credentials(),
            address=s.listen,
            max_message_bytes=s.max_message_bytes,
            metrics=self.metrics,
        )
        port = await self.server.start()
        if s.metrics_port is not None:
            self._metrics_server = start_http_server(
                s.metrics_port, addr=s.metrics_host, registry=self.metrics.registry
            )
        if s.write_status:
            self.writer = StatusWriter(
                self.store,
                KubernetesStatusClient.from_kubeconfig(s.kubeconfig),
                interval_s=s.status_interval_s,
            )
            await self.writer.start()
        if s.run_signer:
            self._start_signer()
        return port

    def _start_signer(self) -> None:
        from hub_controller.signer.handlers import (
            CSRSigner,
            load_ca_from_secret,
            registered_clusters,
        )
        from ocmfl.kube import api_client

        client = api_client(self.settings.kubeconfig)
        from kubernetes import client as k8s

        custom = k8s.CustomObjectsApi(client)
        core = k8s.CoreV1Api(client)
        secret = self.settings.signer_ca_secret

        def ca() -> pki.CertAndKey:
            return load_ca_from_secret(core, *secret) if secret else self._load_ca()

        self._signer = CSRSigner(client, ca, lambda: registered_clusters(custom))
        self._signer_thread = threading.Thread(
            target=self._signer.run, daemon=True, name="csr-signer"
        )
        self._signer_thread.start()

    async def stop(self) -> None:
        if self._signer is not None:
            self._signer.stop()
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        if self.writer is not None:
            await self.writer.stop()
        if self.server is not None:
            await self.server.stop()
        if self._metrics_server is not None:
            server, _thread = self._metrics_server
            server.shutdown()
