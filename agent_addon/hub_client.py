"""Streams buffered reports to the hub aggregator over mTLS gRPC.

Reconnects with exponential backoff; re-sends every unacknowledged report on a new stream;
watches the client certificate files and, when they change, half-closes the current stream
(the hub acks what it got), opens a new channel with the new certificate and closes the old.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from agent_addon.buffer import ReportBuffer
from ocmfl import pki, tasks
from ocmfl.status.stream import hub_acks
from ocmfl.status.v1 import report_pb2, report_pb2_grpc

log = logging.getLogger(__name__)

_FileSig = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class ClientTLSFiles:
    """Where the agent's client certificate, key and the hub CA are mounted."""

    cert_file: Path
    key_file: Path
    ca_file: Path

    @classmethod
    def from_dir(cls, cert_dir: str | Path, ca_file: str | Path | None = None) -> ClientTLSFiles:
        d = Path(cert_dir)
        ca = Path(ca_file) if ca_file else d / pki.CA_FILE
        return cls(d / pki.CERT_FILE, d / pki.KEY_FILE, ca)

    def signature(self) -> _FileSig:
        out = []
        for p in (self.cert_file, self.key_file, self.ca_file):
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials from the current files; ValueError/OSError if unusable."""
        cert, key, ca = (p.read_bytes() for p in (self.cert_file, self.key_file, self.ca_file))
        pki.load_cert_and_key(cert, key)
        pki.load_certs_pem(ca)
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )


def backoff_delay(attempt: int, initial: float, maximum: float, rng: random.Random) -> float:
    """Exponential backoff with jitter: initial * 2^attempt, capped, times U(0.5, 1)."""
    return float(min(maximum, initial * (2 ** min(attempt, 30))) * rng.uniform(0.5, 1.0))


_CALL_ENDED = (asyncio.InvalidStateError, grpc.aio.AioRpcError, grpc.aio.UsageError)


def _raise_if_cancelling() -> None:
    """Honour a pending cancel of this task that a grpc.aio call turned into an RPC error."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class _Rotate(Exception):
    """The certificate files changed: reconnect with the new ones now."""


class HubStreamer:
    """Keeps one report stream open to the hub and drains the buffer into it."""

    def __init__(
        self,
        address: str,
        tls: ClientTLSFiles,
        buffer: ReportBuffer,
        *,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        cert_check_interval_s: float = 2.0,
        server_name: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.address = address
        self.tls = tls
        self.buffer = buffer
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.cert_check_interval_s = cert_check_interval_s
        self.server_name = server_name
        self.rng = rng or random.Random()
        self.connected = asyncio.Event()
        self.connects = 0
        self.rotations = 0
        self.rejected = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="hub-streamer")

    async def stop(self) -> None:
        await tasks.cancel(self._task)
        self._task = None

    async def run(self) -> None:
        """Connect, stream, reconnect; forever (until cancelled)."""
        attempt = 0
        while True:
            _raise_if_cancelling()
            try:
                sig = self.tls.signature()
                creds = self.tls.credentials()
            except (OSError, ValueError) as e:
                self.last_error = f"client certificate unusable: {e}"
                log.warning("%s", self.last_error)
                await asyncio.sleep(
                    backoff_delay(attempt, self.backoff_initial_s, self.backoff_max_s, self.rng)
                )
                attempt += 1
                continue
            if self.last_error and self.last_error.startswith("client certificate unusable"):
                self.last_error = None  # it has one now (e.g. just issued by the hub's signer)
            options: list[tuple[str, str | int]] = [
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                # our own backoff decides when to retry
                ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 2000),
            ]
            if self.server_name:
                options.append(("grpc.ssl_target_name_override", self.server_name))
            channel = grpc.aio.secure_channel(self.address, creds, options=options)
            progressed = False
            try:
                progressed = await self._stream(channel, sig)
                attempt = 0
                continue  # rotation or clean end: reconnect now with fresh files
            except grpc.aio.AioRpcError as e:
                self.last_error = f"{e.code().name}: {e.details()}"
                log.warning("hub stream ended: %s", self.last_error)
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    dropped = self.buffer.drop_first()
                    self.rejected += 1
                    log.error(
                        "hub refused report %s as malformed; dropped it",
                        dropped.sequence if dropped else None,
                    )
                    progressed = True
            finally:
                self.connected.clear()
                await channel.close(grace=None)
            _raise_if_cancelling()
            if progressed:
                attempt = 0
            await asyncio.sleep(
                backoff_delay(attempt, self.backoff_initial_s, self.backoff_max_s, self.rng)
            )
            attempt += 1

    # --- one stream --------------------------------------------------------------------------
    async def _stream(self, channel: grpc.aio.Channel, sig: _FileSig) -> bool:
        """Stream until error or rotation; True if an ack arrived. Raises AioRpcError (the
        hub's announced HubRefusal when it refused the stream)."""
        stub = report_pb2_grpc.StatusServiceStub(channel)
        call = stub.StreamReports()
        rotate = asyncio.Event()
        sender = asyncio.create_task(self._send(call, rotate))
        watcher = asyncio.create_task(self._watch_files(sig, rotate))
        acked = False
        try:
            async for ack in hub_acks(call):
                if not acked:
                    acked = True
                    self.connects += 1
                    self.connected.set()
                    self.last_error = None
                if ack.refused:
                    # refused for good (e.g. no work of that federation here): resending
                    # cannot help, so it leaves the buffer like a stored one
                    self.rejected += 1
                    log.warning("hub refused report %d: %s", ack.sequence, ack.refused)
                self.buffer.ack(ack.sequence)
            # the hub closed the stream cleanly (after our half-close on rotation)
            return acked
        finally:
            helpers = (sender, watcher)
            for task in helpers:
                task.cancel()
            try:
                # asyncio.wait neither raises the helpers' errors nor swallows a cancellation
                # of this task (stop() must end the run loop whenever it arrives)
                await asyncio.wait(helpers)
            finally:
                if not call.done():
                    call.cancel()
            for task in helpers:
                exc = None if task.cancelled() else task.exception()
                # writing to a call that has ended fails; the reader above has its real outcome
                if exc is not None and not isinstance(exc, _CALL_ENDED):
                    raise exc

    async def _send(
        self,
        call: grpc.aio.StreamStreamCall[report_pb2.Report, report_pb2.Ack],
        rotate: asyncio.Event,
    ) -> None:
        """Write every pending report once (in order), then new ones as they come."""
        sent = 0
        while not rotate.is_set():
            batch = self.buffer.pending(after=sent)
            if not batch:
                waiter = asyncio.create_task(self.buffer.wait_changed(1.0))
                rot = asyncio.create_task(rotate.wait())
                try:
                    await asyncio.wait({waiter, rot}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                    rot.cancel()
                continue
            for report in batch:
                await call.write(report)
                sent = report.sequence
        self.rotations += 1
        log.info("client certificate changed: closing this stream to reconnect")
        await call.done_writing()

    async def _watch_files(self, sig: _FileSig, rotate: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self.cert_check_interval_s)
            try:
                now = self.tls.signature()
                if now == sig:
                    continue
                self.tls.credentials()  # only rotate to a usable pair
            except (OSError, ValueError):
                continue
            rotate.set()
            return
