"""Runs the aggregator inside the kopf hub process. Import this module to register it.

On startup: the AggregatorService from the Deployment's env (the server certificate from the
Secret the signer keeps, signer/aggregator_cert.py; client certificates verified against the
agent CA's certificate at OCMFL_AGENT_CA_DIR only; gRPC on AGGREGATOR_PORT, /metrics on
HUB_METRICS_PORT, limits from OCMFL_AGGREGATOR_*); it accepts reports from the addon's member
clusters (the ManagedCluster and ManagedClusterAddOn indexes of membership_indexes), for the
federations that have a ManifestWork on the reporting cluster (`workwatch.WorkStore.owners`),
and its report store goes to
`memo.reports`, where the operator's reconcile loops read and subscribe to it. On cleanup:
stopped.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import kopf

from hub_controller.aggregator.metrics_http import ensure_token
from hub_controller.aggregator.scope import WorkScope
from hub_controller.aggregator.server_cert import SecretServerCert
from hub_controller.aggregator.service import AggregatorService, AggregatorSettings
from hub_controller.ca import CADir
from hub_controller.membership import AddonMembers
from hub_controller.membership_indexes import members_of
from ocmfl import constants
from ocmfl.kube import KubeError


@kopf.on.startup()
async def start_aggregator(memo: kopf.Memo, logger: Any, **kwargs: Any) -> None:
    agent_ca: CADir = memo.setdefault("agent_ca", CADir.agent())
    if not agent_ca.has_certificate():
        logger.warning(
            "no %s certificate at %s (set %s): the aggregator is not started",
            agent_ca.what,
            agent_ca.directory,
            agent_ca.env,
        )
        return
    # The operator's own ManifestWork streams (configure, a startup handler registered
    # before this one): the scope is final once they have listed.
    works = memo.operator.works
    scope = WorkScope(works.owners)
    works.when_synced(scope.mark_ready)
    memo.report_scope = scope
    members = memo.report_members = members_of(kwargs)
    settings = AggregatorSettings.from_env()
    namespace = os.environ.get(constants.ENV_POD_NAMESPACE) or constants.HUB_NAMESPACE
    if settings.metrics_port is not None:
        try:
            settings.metrics_token = await asyncio.to_thread(
                ensure_token, memo.operator.kube, namespace
            )
        except (KubeError, ValueError) as e:
            logger.warning("no /metrics token (%s): /metrics is not served", e)
    # One /metrics for the hub: the controller's per-resource gauges and the aggregator's.
    registry = memo.operator.metrics.registry
    server_cert = SecretServerCert(memo.operator.kube, namespace)
    service = AggregatorService(settings, members, server_cert, scope, agent_ca, registry)
    port = await service.start()
    memo.aggregator = service
    memo.reports = service.store
    logger.info("aggregator listening on %d", port)


@kopf.on.event(constants.CLUSTER_GROUP, "v1", "managedclusters")
async def clusters_listed(memo: kopf.Memo, **_: Any) -> None:
    """kopf calls resource handlers only once every index has listed: from the first call on,
    a cluster the registry does not know is not a member (before, the aggregator answers
    "hub starting" rather than "not registered")."""
    members: AddonMembers | None = memo.get("report_members")
    if members is not None:
        members.mark_listed()


@kopf.on.cleanup()
async def stop_aggregator(memo: kopf.Memo, **_: Any) -> None:
    service: AggregatorService | None = memo.get("aggregator")
    if service is not None:
        await service.stop()
