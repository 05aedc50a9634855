"""Runs the aggregator inside the kopf hub process. Import this module to register it.

On startup: AggregatorService from the Deployment's env (server cert issued from
OCMFL_CA_DIR, gRPC on AGGREGATOR_PORT, /metrics on HUB_METRICS_PORT, CSR signer when
OCMFL_RUN_CSR_SIGNER=true), and its ReportStore handed to the controller's status fold
(`hub_controller.operator.handlers.apply_status_reports`). On cleanup: stopped.
"""

from __future__ import annotations

import os
from typing import Any

import kopf

from hub_controller.aggregator.service import AggregatorService, AggregatorSettings
from ocmfl import constants

_service: AggregatorService | None = None


@kopf.on.startup()
async def start_aggregator(logger: Any, **_: Any) -> None:
    global _service
    settings = AggregatorSettings.from_env()
    if settings.ca_dir is None or not (settings.ca_dir / "tls.key").exists():
        logger.warning("no hub CA at %s: the aggregator is not started", settings.ca_dir)
        return
    settings.run_signer = os.environ.get(constants.ENV_RUN_CSR_SIGNER, "").lower() == "true"
    _service = AggregatorService(settings)
    port = await _service.start()
    from hub_controller.operator.handlers import apply_status_reports

    apply_status_reports(_service.store)
    logger.info("aggregator listening on %d (signer: %s)", port, settings.run_signer)


@kopf.on.cleanup()
async def stop_aggregator(**_: Any) -> None:
    if _service is not None:
        await _service.stop()
