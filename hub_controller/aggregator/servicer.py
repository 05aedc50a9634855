"""The hub's StatusService: mTLS gRPC (grpc.aio) that binds each report to its cluster.

The cluster is read from the client certificate, never from the message. Server
credentials reload the certificate files when they change, so rotation needs no restart.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import grpc
import grpc.aio

from hub_controller.aggregator.metrics import AggregatorMetrics
from hub_controller.aggregator.store import ReportStore
from hub_controller.membership import Registry
from ocmfl import pki
from ocmfl.reports import ReportInvalid, validate_report
from ocmfl.status.v1 import report_pb2, report_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES: Final = 256 * 1024
_FileSig = tuple[tuple[int, int, int], ...]


class ReloadingServerCredentials:
    """mTLS server credentials that pick up new cert/key/CA files on the next handshake.

    gRPC calls `fetch` before each handshake; it returns a new configuration only when a
    file changed (mtime, size or inode) and the new files parse and match.
    """

    def __init__(self, cert_file: str | Path, key_file: str | Path, ca_file: str | Path) -> None:
        self.paths = (Path(cert_file), Path(key_file), Path(ca_file))
        self._lock = threading.Lock()
        self._sig: _FileSig | None = None
        self.reloads = 0

    @classmethod
    def from_dir(cls, directory: str | Path) -> ReloadingServerCredentials:
        d = Path(directory)
        return cls(d / pki.CERT_FILE, d / pki.KEY_FILE, d / pki.CA_FILE)

    def _signature(self) -> _FileSig:
        out = []
        for p in self.paths:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    def _load(self) -> grpc.ServerCertificateConfiguration:
        cert, key, ca = (p.read_bytes() for p in self.paths)
        pki.load_cert_and_key(cert, key)  # refuse a mismatched pair (mid-rotation)
        pki.load_certs_pem(ca)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """New configuration when the files changed and are consistent, else None."""
        with self._lock:
            try:
                sig = self._signature()
                if sig == self._sig:
                    return None
                config = self._load()
            except (OSError, ValueError) as e:
                log.warning("keeping current server certificate: %s", e)
                return None
            if self._sig is not None:
                self.reloads += 1
                log.info("server certificate reloaded from %s", self.paths[0])
            self._sig = sig
            return config

    def credentials(self) -> grpc.ServerCredentials:
        with self._lock:
            initial = self._load()
            self._sig = self._signature()
        return grpc.dynamic_ssl_server_credentials(
            initial, self.fetch, require_client_authentication=True
        )


def peer_cluster(context: grpc.aio.ServicerContext[object, object]) -> str | None:
    """The cluster named by the peer's verified client certificate, or None."""
    auth = context.auth_context()
    pems = auth.get("x509_pem_cert") or []
    if len(pems) != 1:
        return None
    try:
        return pki.cluster_from_certificate(pems[0])
    except pki.IdentityError as e:
        log.info("peer %s: %s", context.peer(), e)
        return None


class StatusServicer(report_pb2_grpc.StatusServiceServicer):
    """Validates, authorizes and stores reports; acks each stored one."""

    def __init__(self, store: ReportStore, registry: Registry, metrics: AggregatorMetrics) -> None:
        self.store = store
        self.registry = registry
        self.metrics = metrics

    def identify(self, context: grpc.aio.ServicerContext[object, object]) -> str | None:
        """The authenticated cluster of this call (override only in benchmarks)."""
        return peer_cluster(context)

    async def _refuse(
        self,
        context: grpc.aio.ServicerContext[object, object],
        code: grpc.StatusCode,
        reason: str,
        details: str,
    ) -> None:
        self.metrics.rejected.labels(reason).inc()
        log.info("refused %s: %s", context.peer(), details)
        await context.abort(code, details)

    async def StreamReports(  # gRPC method name
        self,
        request_iterator: AsyncIterator[report_pb2.Report],
        context: grpc.aio.ServicerContext[report_pb2.Report, report_pb2.Ack],
    ) -> AsyncIterator[report_pb2.Ack]:
        ctx: grpc.aio.ServicerContext[object, object] = context
        cluster = self.identify(ctx)
        if cluster is None:
            await self._refuse(
                ctx,
                grpc.StatusCode.UNAUTHENTICATED,
                "no_identity",
                "client certificate does not name a cluster",
            )
            return
        async for ack in self.serve_cluster(cluster, request_iterator, ctx):
            yield ack

    async def serve_cluster(
        self,
        cluster: str,
        request_iterator: AsyncIterator[report_pb2.Report],
        ctx: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[report_pb2.Ack]:
        """Handle one stream whose peer has been authenticated as `cluster`."""
        if not self.registry.is_registered(cluster):
            await self._refuse(
                ctx,
                grpc.StatusCode.PERMISSION_DENIED,
                "not_registered",
                f"cluster {cluster!r} is not an accepted ManagedCluster with the addon enabled",
            )
            return
        self.metrics.streams.inc()
        try:
            async for report in request_iterator:
                if report.cluster != cluster:
                    await self._refuse(
                        ctx,
                        grpc.StatusCode.PERMISSION_DENIED,
                        "cluster_mismatch",
                        f"report for cluster {report.cluster!r} on a certificate for {cluster!r}",
                    )
                    return
                if not self.registry.is_registered(cluster):
                    await self._refuse(
                        ctx,
                        grpc.StatusCode.PERMISSION_DENIED,
                        "not_registered",
                        f"cluster {cluster!r} is no longer registered",
                    )
                    return
                try:
                    validate_report(report)
                except ReportInvalid as e:
                    await self._refuse(ctx, grpc.StatusCode.INVALID_ARGUMENT, "invalid", str(e))
                    return
                state = self.store.apply(cluster, report)
                self._observe(cluster, report, state.accuracy, state.loss, state.round)
                yield report_pb2.Ack(sequence=report.sequence)
        finally:
            self.metrics.streams.dec()

    def _observe(
        self,
        cluster: str,
        report: report_pb2.Report,
        accuracy: float | None,
        loss: float | None,
        round_: int,
    ) -> None:
        labels = (cluster, report.fl_namespace, report.fl_name)
        self.metrics.reports.labels(*labels).inc()
        self.metrics.last_round.labels(*labels).set(round_)
        if accuracy is not None:
            self.metrics.accuracy.labels(*labels).set(accuracy)
        if loss is not None:
            self.metrics.loss.labels(*labels).set(loss)


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


class AggregatorServer:
    """A grpc.aio server hosting StatusService on one address."""

    def __init__(
        self,
        store: ReportStore,
        registry: Registry,
        *,
        credentials: ReloadingServerCredentials | None,
        address: str = "127.0.0.1:0",
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        metrics: AggregatorMetrics | None = None,
        servicer: StatusServicer | None = None,
    ) -> None:
        """`credentials=None` serves without TLS: only for benchmarks and local debugging."""
        self.store = store
        self.metrics = metrics or AggregatorMetrics()
        self.servicer = servicer or StatusServicer(store, registry, self.metrics)
        self.credentials = credentials
        self.address = address
        self.max_message_bytes = max_message_bytes
        self.port = 0
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Bind and start; returns the bound port."""
        server = grpc.aio.server(options=server_options(self.max_message_bytes))
        report_pb2_grpc.add_StatusServiceServicer_to_server(self.servicer, server)
        if self.credentials is not None:
            self.port = server.add_secure_port(self.address, self.credentials.credentials())
        else:
            self.port = server.add_insecure_port(self.address)
        if not self.port:
            raise OSError(f"cannot bind {self.address}")
        await server.start()
        self._server = server
        log.info("aggregator listening on port %d", self.port)
        return self.port

    async def stop(self, grace: float | None = 1.0) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()
