"""Helpers shared by the tests, the benchmarks and the local demo (never by product code):
`wait_for` / `await_for` (poll until something is there), `free_port`, a throwaway CA writing
mounted-Secret-style cert directories (`TestPKI`), and `kopf_registry` (hub handlers
registered afresh for one in-process kopf run).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import importlib
import ssl
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hack.controlplane.processes import free_port
from ocmfl import pki

T = TypeVar("T")
__all__ = ["TestPKI", "WaitTimeout", "await_for", "free_port", "kopf_registry", "wait_for"]


class WaitTimeout(AssertionError):
    """What was waited for did not come in time (an AssertionError: tests fail, not error)."""


def wait_for(
    fn: Callable[[], T | None],
    timeout: float = 60.0,
    what: str = "it",
    *,
    interval: float = 0.3,
    error: Callable[[str], Exception] = WaitTimeout,
) -> T:
    """Poll `fn` until it returns something truthy, and return that; raise `error` naming
    `what` and the last value otherwise. `fn` may raise to give up early."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = fn()
        if last:
            return last  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


async def await_for(
    fn: Callable[[], T | None], timeout: float = 60.0, what: str = "it", *, interval: float = 0.3
) -> T:
    """`wait_for` for coroutines: `fn` (blocking) runs in a thread between sleeps."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = await asyncio.to_thread(fn)
        if last:
            return last  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval)


def kopf_registry(*modules: str) -> Any:
    """A kopf registry holding the handlers of `modules` (and the membership and operator
    indexes), for kopf.testing.KopfRunner(..., registry=...): each in-process run gets exactly
    the hub parts it asks for, whatever an earlier test in the same process registered."""
    import kopf

    registry = kopf.OperatorRegistry()
    previous = kopf.get_default_registry()
    kopf.set_default_registry(registry)
    try:
        for name in (
            "hub_controller.membership_indexes",
            "hub_controller.operator.indexes",
            *modules,
        ):
            if name in sys.modules:
                importlib.reload(sys.modules[name])
            else:
                importlib.import_module(name)
    finally:
        kopf.set_default_registry(previous)
    return registry


class TestPKI:
    """A CA plus helpers that write tls.crt/tls.key/ca.crt directories under `root`."""

    __test__ = False  # not a pytest class

    def __init__(self, root: str | Path, *, key_kind: pki.KeyKind = "ec") -> None:
        self.root = Path(root)
        self.ca = pki.create_ca("ocm-fl-test-ca", key_kind=key_kind)

    def server_dir(
        self, name: str = "server", *, lifetime: dt.timedelta = pki.DEFAULT_SERVER_LIFETIME
    ) -> Path:
        pair = pki.issue_server_cert(
            self.ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"], lifetime=lifetime
        )
        return pki.save_tls_dir(self.root / name, pair, self.ca.cert)

    def client_dir(
        self,
        cluster: str,
        name: str | None = None,
        *,
        lifetime: dt.timedelta = pki.DEFAULT_CLIENT_LIFETIME,
        now: dt.datetime | None = None,
    ) -> Path:
        pair = pki.issue_client_cert(cluster, self.ca, lifetime=lifetime, now=now)
        return pki.save_tls_dir(self.root / (name or f"client-{cluster}"), pair, self.ca.cert)

    def rotate_client(self, directory: Path, cluster: str) -> pki.CertAndKey:
        """Overwrite a client directory with a fresh key and certificate."""
        pair = pki.issue_client_cert(cluster, self.ca)
        pki.save_tls_dir(directory, pair, self.ca.cert)
        return pair

    def rotate_server(self, directory: Path) -> pki.CertAndKey:
        pair = pki.issue_server_cert(self.ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
        pki.save_tls_dir(directory, pair, self.ca.cert)
        return pair


def agent_accepts(server_cert: bytes, server_key: bytes, trust: bytes, host: str) -> bool:
    """Whether a TLS client trusting `trust` (as an agent trusts the hub CA) completes a
    handshake with a server presenting `server_cert` for `host` (in memory, no sockets)."""
    d = Path(tempfile.mkdtemp())
    (d / "s.crt").write_bytes(server_cert)
    (d / "s.key").write_bytes(server_key)
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(d / "s.crt", d / "s.key")
    cctx = ssl.create_default_context(cadata=trust.decode())
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = cctx.wrap_bio(c_in, c_out, server_hostname=host)
    server = sctx.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for end, out, peer_in in ((client, c_out, s_in), (server, s_out, c_in)):
            try:
                end.do_handshake()
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                return False
            peer_in.write(out.read())
        try:
            client.do_handshake()
            return True
        except ssl.SSLWantReadError:
            continue
        except ssl.SSLError:
            return False
    return False


async def report_probe(address: str, cert_dir: Path, ca: bytes, cluster: str, seq: int) -> str:
    """One report on one stream to the aggregator at `address`, with the client certificate
    in `cert_dir` and `ca` trusted for the server: "accepted" when the aggregator took the
    stream (it answers the made-up federation with a not_in_scope refusal in the ack), else
    the gRPC error's code and details."""
    import grpc
    import grpc.aio
    from google.protobuf.timestamp_pb2 import Timestamp

    from ocmfl.status.stream import first_ack
    from ocmfl.status.v1 import report_pb2, report_pb2_grpc

    ts = Timestamp()
    ts.FromDatetime(dt.datetime.now(dt.UTC))
    report = report_pb2.Report(
        cluster=cluster, fl_namespace="probe", fl_name="probe", fl_uid="probe-uid",
        client_phase=report_pb2.CLIENT_PHASE_RUNNING, round=1, timestamp=ts, sequence=seq,
    )  # fmt: skip
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=(cert_dir / pki.KEY_FILE).read_bytes(),
        certificate_chain=(cert_dir / pki.CERT_FILE).read_bytes(),
    )
    async with grpc.aio.secure_channel(address, creds) as ch:
        call = report_pb2_grpc.StatusServiceStub(ch).StreamReports()
        # A refused stream can end while the report is written: its reason comes from the read.
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await call.write(report)
        try:
            ack = await first_ack(call)
        except grpc.aio.AioRpcError as e:
            return f"{e.code().name}: {e.details()}"
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await call.done_writing()
        return "accepted" if ack.refused.startswith("not_in_scope") else str(ack)


class ReportProbe:
    """Asks the aggregator, report by report on fresh streams, whether it takes a cluster's
    agent certificate (`report_probe`)."""

    def __init__(self, address: str, cert_dir: Path, ca: bytes, cluster: str) -> None:
        self.address, self.cert_dir, self.ca, self.cluster = address, cert_dir, ca, cluster
        self.seq = 0

    def ask(self) -> str:
        self.seq += 1
        return asyncio.run(
            report_probe(self.address, self.cert_dir, self.ca, self.cluster, self.seq)
        )

    def until_refused(self, timeout: float) -> tuple[str, float]:
        """Ask until refused: the refusal and the seconds it took from this call."""
        start = time.monotonic()

        def refused() -> str | None:
            got = self.ask()
            return None if got == "accepted" else got

        refusal = wait_for(refused, timeout, f"{self.cluster}'s reports refused")
        return refusal, time.monotonic() - start
