"""Seconds per round and peak memory for large models through the platform path, against the
copy floor measured in the same run.

    .venv/bin/python bench/bench_large_model.py [--params 1e7,1e8] [--rounds 2] [--layers 8]

Per size: ocm-fl-server + 2 x ocm-fl-client (the mTLS Fleet gateway and cluster-side tunnels,
SuperLink, SuperNodes, the ClientApp worker, the model store on disk) train
``tests/apps/large`` (float32 arrays of ``params`` numbers; each client adds a known step, and
the ServerApp checks every number of the final model, so a truncated or corrupted transfer
fails the run). A round moves the model four times: to each of the two clients and back.

The floor is those four transfers and nothing else: a TLS server on 127.0.0.1 with the same
kind of certificate sends the model's bytes to two client processes at once and reads the
same number back from each (1 MiB writes, no framing, no copies beyond the socket's). The
ratio is per-round seconds over floor seconds. Peak RSS and CPU come from
``bench_federation.ProcSampler`` (this bench's descendants only, sampled every 0.2 s).

Prints one JSON object: per size, ``per_round_s`` (median over the rounds), ``floor_s``
(median of 3), ``ratio``, ``model_mb``, ``peak_rss_mb`` per process kind, ``cpu_s``, and the
run's own ``ok``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # hack/ is not installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_federation import OURS, ProcSampler, run_ours, setup

from hack.testing import free_port

LARGE_APP = Path(__file__).resolve().parents[1] / "tests" / "apps" / "large"
WRITE = 1 << 20  # bytes per socket write in the floor


def _recv_exactly(conn: ssl.SSLSocket, size: int, buf: bytearray) -> None:
    view, got = memoryview(buf), 0
    while got < size:
        n = conn.recv_into(view[: min(len(buf), size - got)])
        if n == 0:
            raise ConnectionError(f"peer closed after {got} of {size} bytes")
        got += n


def _send(conn: ssl.SSLSocket, size: int, chunk: bytes) -> None:
    left = size
    while left > 0:
        n = min(left, len(chunk))
        conn.sendall(chunk[:n])
        left -= n


def _floor_client(port: int, ca: str, size: int) -> None:
    """Read `size` bytes from the server, then send as many back (one cluster's round)."""
    ctx = ssl.create_default_context(cafile=ca)
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as conn,
    ):
        buf = bytearray(WRITE)
        _recv_exactly(conn, size, buf)
        _send(conn, size, bytes(WRITE))
        conn.recv(1)  # the server's end-of-round byte


def copy_floor(size: int, certfile: Path, keyfile: Path, ca: Path, clients: int = 2) -> float:
    """Seconds to send `size` bytes to each of `clients` processes over TLS and read `size`
    bytes back from each, all clients at once (the server a thread per client)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certfile, keyfile)
    port = free_port()
    with socket.create_server(("127.0.0.1", port)) as listener:
        procs = [
            multiprocessing.get_context("spawn").Process(
                target=_floor_client, args=(port, str(ca), size)
            )
            for _ in range(clients)
        ]
        errors: list[BaseException] = []

        def serve(conn: ssl.SSLSocket) -> None:
            try:
                _send(conn, size, bytes(WRITE))
                _recv_exactly(conn, size, bytearray(WRITE))
                conn.sendall(b"k")
            except BaseException as exc:  # reported after the join
                errors.append(exc)
            finally:
                conn.close()

        for proc in procs:
            proc.start()
        started = time.monotonic()
        threads = []
        for _ in procs:
            raw, _ = listener.accept()
            thread = threading.Thread(target=serve, args=(ctx.wrap_socket(raw, server_side=True),))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        for proc in procs:
            proc.join()
        elapsed = time.monotonic() - started
    if errors or any(proc.exitcode != 0 for proc in procs):
        raise RuntimeError(f"floor transfer failed: {errors}, exit codes "
                           f"{[proc.exitcode for proc in procs]}")  # fmt: skip
    return elapsed


def measure(
    root: Path, p: dict[str, Path], params: int, rounds: int, layers: int
) -> dict[str, Any]:
    """One size: the platform run (sampled) and the floor, back to back."""
    size = params * 4
    floor = statistics.median(
        copy_floor(size, p["tls"] / "tls.crt", p["tls"] / "tls.key", p["tls"] / "ca.crt")
        for _ in range(3)
    )
    OURS["run_config"] = {"params": params, "layers": layers}
    sampler = ProcSampler()
    sampler.start()
    try:
        run = run_ours(root, p, rounds, f"p{params}", app=LARGE_APP)
    finally:
        sampler.stop.set()
        sampler.join()
    per_round = [r["total"] for r in run.pop("rounds")]
    median = statistics.median(per_round) if per_round else None
    return {
        "params": params,
        "model_mb": round(size / 2**20, 1),
        "ok": run["ok"],
        "per_round_s": round(median, 2) if median else None,
        "rounds_s": [round(r, 2) for r in per_round],
        "floor_s": round(floor, 3),
        "ratio": round(median / floor, 2) if median else None,
        "run_elapsed_s": run["run_elapsed_s"],
        **sampler.report(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", default="1e7", help="comma-separated sizes, e.g. 1e7,1e8")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ocmfl-large-"))
    p = setup(root)
    results = []
    for raw in args.params.split(","):
        result = measure(root, p, int(float(raw)), args.rounds, args.layers)
        print(json.dumps(result), file=sys.stderr, flush=True)
        results.append(result)
    print(json.dumps({"rounds": args.rounds, "load_avg": os.getloadavg()[0],
                      "sizes": results}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
