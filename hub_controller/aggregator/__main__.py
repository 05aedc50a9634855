"""`python -m hub_controller.aggregator`: run the aggregator alone (dev, benchmarks, tests)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from pathlib import Path

from hub_controller.aggregator.service import AggregatorService, AggregatorSettings
from ocmfl import constants


def parse_args(argv: list[str] | None = None) -> AggregatorSettings:
    p = argparse.ArgumentParser(prog="python -m hub_controller.aggregator")
    p.add_argument("--listen", default=f"0.0.0.0:{constants.AGGREGATOR_PORT}")
    p.add_argument("--server-cert-dir", type=Path, help="tls.crt, tls.key, ca.crt")
    p.add_argument("--ca-dir", type=Path, help="hub CA (tls.crt, tls.key) to issue from")
    p.add_argument("--server-name", action="append", default=[], help="DNS SAN (repeatable)")
    p.add_argument("--kubeconfig", default=None)
    p.add_argument(
        "--cluster",
        action="append",
        default=None,
        help="accept only these clusters, without asking the hub API (dev)",
    )
    p.add_argument("--metrics-port", type=int, default=constants.HUB_METRICS_PORT)
    p.add_argument(
        "--write-status",
        action="store_true",
        help="patch FederatedLearning status.clusters (when no controller folds)",
    )
    p.add_argument("--status-interval", type=float, default=2.0)
    p.add_argument("--run-signer", action="store_true", help="also run the CSR signer")
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    logging.basicConfig(
        level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not a.server_cert_dir and not a.ca_dir:
        p.error("--server-cert-dir or --ca-dir is required")
    return AggregatorSettings(
        listen=a.listen,
        server_cert_dir=a.server_cert_dir,
        ca_dir=a.ca_dir,
        server_names=["localhost", *a.server_name],
        kubeconfig=a.kubeconfig,
        clusters=a.cluster,
        metrics_port=a.metrics_port or None,
        write_status=a.write_status,
        status_interval_s=a.status_interval,
        run_signer=a.run_signer,
    )


async def _amain(settings: AggregatorSettings) -> None:
    service = AggregatorService(settings)
    port = await service.start()
    logging.getLogger(__name__).info("aggregator on port %d", port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await service.stop()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_amain(parse_args(argv)))


if __name__ == "__main__":
    main()
