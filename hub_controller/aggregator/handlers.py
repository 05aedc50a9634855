"""Runs the aggregator inside the kopf hub process. Import this module to register it.

On startup: the AggregatorService from the Deployment's env (server certificate issued from the
hub CA at OCMFL_CA_DIR, gRPC on AGGREGATOR_PORT, /metrics on HUB_METRICS_PORT, limits from
OCMFL_AGGREGATOR_*); it accepts reports from the addon's member clusters (the operator's
ManagedCluster and ManagedClusterAddOn indexes), for the federations that have a ManifestWork
on the reporting cluster (`indexes.work_owner_idx`), and its report store goes to
`memo.reports`, where the operator's reconcile loops read and subscribe to it. On cleanup:
stopped.
"""

from __future__ import annotations

from typing import Any

import kopf

from hub_controller.aggregator.scope import WorkScope
from hub_controller.aggregator.service import AggregatorService, AggregatorSettings
from hub_controller.ca import HubCA
from hub_controller.operator.indexes import OWNED, Indexes
from ocmfl import constants


@kopf.on.startup()
async def start_aggregator(memo: kopf.Memo, logger: Any, **kwargs: Any) -> None:
    ca: HubCA = memo.setdefault("ca", HubCA())
    if not ca.available():
        logger.warning("no hub CA at %s: the aggregator is not started", ca.directory)
        return
    scope = WorkScope(kwargs["work_owner_idx"])
    memo.report_scope = scope
    service = AggregatorService(
        AggregatorSettings.from_env(), Indexes.of(kwargs).members(), ca, scope
    )
    port = await service.start()
    memo.aggregator = service
    memo.reports = service.store
    logger.info("aggregator listening on %d", port)


def _scope_unmarked(memo: kopf.Memo, **_: Any) -> bool:
    """Whether `works_seen` still has something to do: once the scope is marked, kopf skips
    the handler (a filter costs far less than a handler call, its bookkeeping and its log
    line, on every one of thousands of work events during a fan-out)."""
    scope: WorkScope | None = memo.get("report_scope")
    return scope is not None and not scope.seen


@kopf.on.event(constants.WORK_GROUP, "v1", "manifestworks", labels=OWNED, when=_scope_unmarked)
@kopf.on.event(constants.CLUSTER_GROUP, "v1", "managedclusters", when=_scope_unmarked)
async def works_seen(memo: kopf.Memo, **_: Any) -> None:
    """kopf calls handlers only once every index is filled, so the first event of any kind
    means the work index is complete: the scope is now final. ManagedClusters too, because a
    hub may have no ManifestWorks yet (and every member cluster has a ManagedCluster)."""
    scope: WorkScope | None = memo.get("report_scope")
    if scope is not None:
        scope.mark_ready()


@kopf.on.cleanup()
async def stop_aggregator(memo: kopf.Memo, **_: Any) -> None:
    service: AggregatorService | None = memo.get("aggregator")
    if service is not None:
        await service.stop()
