"""How many reports per second one aggregator takes from N concurrent mTLS streams.

The aggregator runs in its own process (the real servicer: identity from the client
certificate, registry check, validation, ReportStore); this process drives N streams, each
pipelining M reports and reading the M acks. The baseline, measured in the same run, is the
same load over an insecure channel (the servicer then trusts the report's cluster field), so
the printed ratio is the cost of mTLS + per-stream identity on this machine.

    .venv/bin/python bench/bench_aggregator.py --streams 16 --reports 500

Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from google.protobuf.timestamp_pb2 import Timestamp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hack.testing import TestPKI
from hub_controller.aggregator.limits import Limits
from hub_controller.aggregator.servicer import (
    AggregatorServer,
    ReloadingServerCredentials,
    StatusServicer,
)
from hub_controller.aggregator.store import ReportStore
from hub_controller.membership import StaticMembers
from ocmfl import pki
from ocmfl.status.v1 import report_pb2, report_pb2_grpc


class _Baseline(StatusServicer):
    """Baseline only: no certificate, so the first report's cluster is believed."""

    async def StreamReports(
        self,
        request_iterator: AsyncIterator[report_pb2.Report],
        context: grpc.aio.ServicerContext[report_pb2.Report, report_pb2.Ack],
    ) -> AsyncIterator[report_pb2.Ack]:
        it = request_iterator.__aiter__()
        first = await anext(it)

        async def chained() -> AsyncIterator[report_pb2.Report]:
            yield first
            async for r in it:
                yield r

        async for ack in self.serve_cluster(first.cluster, chained(), context):
            yield ack


def _serve(
    secure: bool, cert_dir: str, clusters: list[str], port_q: mp.Queue[int], stop_ev: Any
) -> None:
    async def run() -> None:
        store, registry = ReportStore(), StaticMembers(clusters)
        servicer = None
        if not secure:
            from hub_controller.aggregator.metrics import AggregatorMetrics

            servicer = _Baseline(store, registry, AggregatorMetrics())
        server = AggregatorServer(
            store,
            registry,
            address="127.0.0.1:0",
            servicer=servicer,
            credentials=ReloadingServerCredentials.from_dir(cert_dir) if secure else None,
            # the aggregator's own cost, not the per-cluster rate limit (limits.py)
            limits=Limits(reports_per_s=1e9, report_burst=10**9),
        )
        port_q.put(await server.start())
        while not stop_ev.is_set():
            await asyncio.sleep(0.1)
        await server.stop(None)

    asyncio.run(run())


def _report(cluster: str, seq: int) -> report_pb2.Report:
    ts = Timestamp()
    ts.FromDatetime(dt.datetime.now(dt.UTC))
    return report_pb2.Report(
        cluster=cluster,
        fl_namespace="bench",
        fl_name="fl",
        fl_uid="u",
        client_phase=report_pb2.CLIENT_PHASE_RUNNING,
        round=seq,
        timestamp=ts,
        sequence=seq,
        metrics=[
            report_pb2.RoundMetrics(
                round=seq,
                phase=report_pb2.ROUND_PHASE_FIT,
                loss=0.1,
                accuracy=0.9,
                samples=100,
                duration_s=1.0,
            )
        ],
    )


async def _drive(
    port: int, secure: bool, tpki: TestPKI, clusters: list[str], per_stream: int
) -> float:
    ca = pki.cert_to_pem(tpki.ca.cert)
    channels = []
    for c in clusters:
        if secure:
            d = tpki.root / f"client-{c}"
            creds = grpc.ssl_channel_credentials(
                ca, (d / pki.KEY_FILE).read_bytes(), (d / pki.CERT_FILE).read_bytes()
            )
            channels.append(grpc.aio.secure_channel(f"127.0.0.1:{port}", creds))
        else:
            channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
    for ch in channels:
        await ch.channel_ready()
    reports = {c: [_report(c, s) for s in range(1, per_stream + 1)] for c in clusters}

    async def one(ch: grpc.aio.Channel, c: str) -> None:
        call = report_pb2_grpc.StatusServiceStub(ch).StreamReports()

        async def write() -> None:
            for r in reports[c]:
                await call.write(r)
            await call.done_writing()

        w = asyncio.create_task(write())
        n = 0
        async for _ack in call:
            n += 1
        await w
        assert n == per_stream, f"{c}: {n} acks"

    t0 = time.perf_counter()
    await asyncio.gather(*(one(ch, c) for ch, c in zip(channels, clusters, strict=True)))
    elapsed = time.perf_counter() - t0
    for ch in channels:
        await ch.close()
    return len(clusters) * per_stream / elapsed


def measure(secure: bool, tpki: TestPKI, clusters: list[str], per_stream: int) -> float:
    ctx = mp.get_context("spawn")
    port_q: mp.Queue[int] = ctx.Queue()
    stop_ev = ctx.Event()
    proc = ctx.Process(
        target=_serve, args=(secure, str(tpki.root / "server"), clusters, port_q, stop_ev)
    )
    proc.start()
    try:
        port = port_q.get(timeout=30)
        return asyncio.run(_drive(port, secure, tpki, clusters, per_stream))
    finally:
        stop_ev.set()
        proc.join(10)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--reports", type=int, default=500, help="reports per stream")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tpki = TestPKI(tmp)
        tpki.server_dir()
        clusters = [f"bench-{i}" for i in range(a.streams)]
        for c in clusters:
            tpki.client_dir(c)
        secure, plain = [], []
        for _ in range(a.repeat):  # interleave, so drifting machine load hits both alike
            plain.append(measure(False, tpki, clusters, a.reports))
            secure.append(measure(True, tpki, clusters, a.reports))
    s, b = statistics.median(secure), statistics.median(plain)
    print(f"streams={a.streams} reports/stream={a.reports} repeat={a.repeat}")
    runs_b = ", ".join(f"{x:.0f}" for x in plain)
    runs_s = ", ".join(f"{x:.0f}" for x in secure)
    print(f"insecure baseline : {b:10.0f} reports/s  (runs: {runs_b})")
    print(f"mTLS + identity   : {s:10.0f} reports/s  (runs: {runs_s})")
    print(f"ratio mTLS/baseline: {s / b:.2f}")


if __name__ == "__main__":
    main()
