"""The hub's StatusService: mTLS gRPC (grpc.aio) that binds each report to its cluster.

The cluster is read from the client certificate, never from the message. A report is stored
only for a federation that has a ManifestWork on that cluster (`scope.py`, uid match); others
are acked with `Ack.refused` naming why, so the agent drops them instead of resending. A
stored report is acked only once the store says it is durable (on the hub: the resource's
status holds it), so an agent keeps it across a hub crash; reading goes on meanwhile. Each
cluster has a bounded number of open streams and a report rate (`limits.py`), and the store
is bounded (`store.StoreLimits`). Server credentials reload the certificate files when they
change, so rotation needs no restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import grpc
import grpc.aio

from hub_controller.aggregator.limits import Limits, TokenBucket
from hub_controller.aggregator.metrics import AggregatorMetrics
from hub_controller.aggregator.scope import AnyScope, Scope
from hub_controller.aggregator.store import ReportStore, StoreFull
from hub_controller.membership import Registry
from ocmfl import pki
from ocmfl.reports import ReportInvalid, validate_report
from ocmfl.status.v1 import report_pb2, report_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES: Final = 256 * 1024
# After an agent half-closes (to rotate its certificate), how long its stream stays open for
# the acks of reports not durable yet; it resends the rest on its new stream.
HALF_CLOSE_ACK_WAIT_S: Final = 5.0
SCOPE_RECHECK_S: Final = 0.2  # how often `_in_scope` looks again during its grace
_FileSig = tuple[tuple[int, int, int], ...]


def _resolve(outcome: asyncio.Future[str], metrics: AggregatorMetrics) -> None:
    """A stored report became durable: its ack ("" = not refused) may leave."""
    metrics.awaiting.dec()
    if not outcome.done():
        outcome.set_result("")


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
        cert = pki.load_cert_pem(pems[0])
        cluster = pki.cluster_from_certificate(cert)
    except ValueError as e:  # IdentityError, or an unreadable certificate
        log.info("peer %s: %s", context.peer(), e)
        return None
    # Which certificate a cluster's agent streams with (its rotation shows in the log).
    log.info("stream from cluster %s, certificate serial %x", cluster, cert.serial_number)
    return cluster


class StatusServicer(report_pb2_grpc.StatusServiceServicer):
    """Validates, authorizes and stores reports; acks each refused one, and each stored one
    once the store says it is durable."""

    def __init__(
        self,
        store: ReportStore,
        registry: Registry,
        metrics: AggregatorMetrics,
        scope: Scope | None = None,
        limits: Limits | None = None,
    ) -> None:
        """`scope=None` accepts reports for any federation: only for benchmarks and tests."""
        self.store = store
        self.registry = registry
        self.metrics = metrics
        self.scope: Scope = scope if scope is not None else AnyScope()
        self.limits = limits or Limits()
        self._streams: dict[str, int] = {}
        self._buckets: dict[str, TokenBucket] = {}

    async def _in_scope(self, cluster: str, report: report_pb2.Report, until: float) -> bool:
        """Whether `cluster` has a ManifestWork of the report's federation, looked up again
        until `until` (loop time) before the answer is no: the client that sent it started from
        that work, so a miss is either a report out of scope or the hub's watch of works a
        moment behind. Only this cluster's stream waits (its acks stay in order)."""
        loop = asyncio.get_running_loop()
        while not self.scope.allows(cluster, report.fl_namespace, report.fl_name, report.fl_uid):
            if loop.time() >= until:
                return False
            await asyncio.sleep(SCOPE_RECHECK_S)
        return True

    def _refusal(self, cluster: str, report: report_pb2.Report, reason: str, details: str) -> str:
        """The Ack.refused text of a report refused for good (counted by reason, never
        stored)."""
        self.metrics.rejected.labels(reason).inc()
        log.debug("refused report %d from %s: %s", report.sequence, cluster, details)
        return f"{reason}: {details}"

    def identify(self, context: grpc.aio.ServicerContext[object, object]) -> str | None:
        """The authenticated cluster of this call (override only in benchmarks)."""
        return peer_cluster(context)

    async def _refuse(
        self,
        context: grpc.aio.ServicerContext[object, object],
        code: grpc.StatusCode,
        reason: str,
        details: str,
    ) -> AsyncIterator[report_pb2.Ack]:
        """End the stream with `code`: first an Ack that carries the status, because a status
        that lands while the agent is writing reaches it as INTERNAL (grpc/grpc#36066)."""
        self.metrics.rejected.labels(reason).inc()
        log.info("refused %s: %s", context.peer(), details)
        yield report_pb2.Ack(closing_code=code.name, closing_details=details)
        await context.abort(code, details)

    async def StreamReports(  # gRPC method name
        self,
        request_iterator: AsyncIterator[report_pb2.Report],
        context: grpc.aio.ServicerContext[report_pb2.Report, report_pb2.Ack],
    ) -> AsyncIterator[report_pb2.Ack]:
        ctx: grpc.aio.ServicerContext[object, object] = context
        cluster = self.identify(ctx)
        if cluster is None:
            async for ack in self._refuse(
                ctx,
                grpc.StatusCode.UNAUTHENTICATED,
                "no_identity",
                "client certificate does not name a cluster",
            ):
                yield ack
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
            if not self.registry.complete():
                async for ack in self._refuse(
                    ctx,
                    grpc.StatusCode.UNAVAILABLE,
                    "hub_starting",
                    "the hub has not listed its clusters yet: retry shortly",
                ):
                    yield ack
                return
            async for ack in self._refuse(
                ctx,
                grpc.StatusCode.PERMISSION_DENIED,
                "not_registered",
                f"cluster {cluster!r} is not an accepted ManagedCluster with the addon enabled",
            ):
                yield ack
            return
        limits = self.limits
        if self._streams.get(cluster, 0) >= limits.max_streams_per_cluster:
            async for ack in self._refuse(
                ctx,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "too_many_streams",
                f"cluster {cluster!r} already has {limits.max_streams_per_cluster} open streams",
            ):
                yield ack
            return
        bucket = self._buckets.get(cluster)
        if bucket is None:
            bucket = self._buckets[cluster] = TokenBucket(limits.reports_per_s, limits.report_burst)
        self._streams[cluster] = self._streams.get(cluster, 0) + 1
        self.metrics.streams.inc()
        # Acks leave in report order, each once its report is durable (the store says when:
        # on the hub, once the resource's status holds it); reading goes on meanwhile.
        loop, on_loop = asyncio.get_running_loop(), threading.get_ident()
        unacked: deque[tuple[int, asyncio.Future[str]]] = deque()
        reports = aiter(request_iterator)
        reading: asyncio.Future[report_pb2.Report] | None = asyncio.ensure_future(anext(reports))
        closing_at: float | None = None  # when the agent half-closed
        # One grace per stream for reports out of scope (`_in_scope`), from its first miss: a
        # stream of reports for other federations waits once, not once per report.
        scope_grace_until: float | None = None
        try:
            while reading is not None or unacked:
                waits: set[asyncio.Future[Any]] = {unacked[0][1]} if unacked else set()
                timeout = None
                if reading is not None:
                    waits.add(reading)
                elif closing_at is not None:
                    timeout = closing_at + HALF_CLOSE_ACK_WAIT_S - loop.time()
                    if timeout <= 0:
                        break  # the agent resends the unacked ones on its next stream
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                while unacked and unacked[0][1].done():
                    sequence, done = unacked.popleft()
                    yield report_pb2.Ack(sequence=sequence, refused=done.result())
                if reading is None or not reading.done():
                    continue
                try:
                    report = reading.result()
                except StopAsyncIteration:  # the agent half-closed: ack what is left
                    reading, closing_at = None, loop.time()
                    continue
                reading = None
                wait = bucket.reserve(limits.max_wait_s)
                if wait is None:
                    async for ack in self._refuse(
                        ctx,
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "rate_limited",
                        f"cluster {cluster!r} sends more than {limits.reports_per_s:g} "
                        "reports/s: slow down and resend",
                    ):
                        yield ack
                    return
                if wait > 0:
                    await asyncio.sleep(wait)
                if report.cluster != cluster:
                    async for ack in self._refuse(
                        ctx,
                        grpc.StatusCode.PERMISSION_DENIED,
                        "cluster_mismatch",
                        f"report for cluster {report.cluster!r} on a certificate for {cluster!r}",
                    ):
                        yield ack
                    return
                if not self.registry.is_registered(cluster):
                    async for ack in self._refuse(
                        ctx,
                        grpc.StatusCode.PERMISSION_DENIED,
                        "not_registered",
                        f"cluster {cluster!r} is no longer registered",
                    ):
                        yield ack
                    return
                try:
                    validate_report(report)
                except ReportInvalid as e:
                    async for ack in self._refuse(
                        ctx, grpc.StatusCode.INVALID_ARGUMENT, "invalid", str(e)
                    ):
                        yield ack
                    return
                if not self.scope.ready():
                    async for ack in self._refuse(
                        ctx,
                        grpc.StatusCode.UNAVAILABLE,
                        "hub_starting",
                        "the hub has not loaded its ManifestWorks yet: retry shortly",
                    ):
                        yield ack
                    return
                outcome: asyncio.Future[str] = loop.create_future()
                unacked.append((report.sequence, outcome))
                reading = asyncio.ensure_future(anext(reports))
                if scope_grace_until is None and not self.scope.allows(
                    cluster, report.fl_namespace, report.fl_name, report.fl_uid
                ):
                    scope_grace_until = loop.time() + limits.scope_grace_s
                if not await self._in_scope(cluster, report, scope_grace_until or 0.0):
                    outcome.set_result(
                        self._refusal(
                            cluster,
                            report,
                            "not_in_scope",
                            f"cluster {cluster!r} has no ManifestWork of FederatedLearning "
                            f"{report.fl_namespace}/{report.fl_name} uid {report.fl_uid}",
                        )
                    )
                    continue
                try:
                    state = self.store.apply(cluster, report)
                except StoreFull as e:
                    outcome.set_result(self._refusal(cluster, report, e.reason, e.message))
                    continue
                self._observe(cluster, report, state.accuracy, state.loss, state.round)
                if report.final:
                    labels = self.metrics.series(cluster, report.fl_namespace, report.fl_name)
                    self.metrics.final.labels(*labels).set(1)
                self.metrics.awaiting.inc()

                def durable(outcome: asyncio.Future[str] = outcome) -> None:
                    if threading.get_ident() == on_loop:  # durable at once (no status writer)
                        _resolve(outcome, self.metrics)
                    else:  # the status writer's thread
                        loop.call_soon_threadsafe(_resolve, outcome, self.metrics)

                self.store.when_durable(report.fl_uid, state.version, durable)
        finally:
            if reading is not None:
                reading.cancel()
            for _, outcome in unacked:  # the agent resends these on its next stream
                if not outcome.done():
                    outcome.cancel()
            self.metrics.streams.dec()
            left = self._streams.get(cluster, 1) - 1
            if left > 0:
                self._streams[cluster] = left
            else:
                self._streams.pop(cluster, None)

    def _observe(
        self,
        cluster: str,
        report: report_pb2.Report,
        accuracy: float | None,
        loss: float | None,
        round_: int,
    ) -> None:
        labels = self.metrics.series(cluster, report.fl_namespace, report.fl_name)
        self.metrics.reports.labels(*labels).inc()
        self.metrics.last_round.labels(*labels).set(round_)
        self.metrics.last_report.labels(*labels).set_to_current_time()
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
        scope: Scope | None = None,
        limits: Limits | None = None,
    ) -> None:
        """`credentials=None` serves without TLS, `scope=None` takes reports for any
        federation: both only for benchmarks and local debugging."""
        self.store = store
        self.metrics = metrics or AggregatorMetrics()
        self.servicer = servicer or StatusServicer(store, registry, self.metrics, scope, limits)
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
