"""kopf handlers for FederatedLearning: they only read indexes, apply objects and patch status.

Observed state comes from the indexes (indexes.py, observed.py), desired objects from
desired/, status from fold.py; all of them pure.

How related objects wake a resource up (watch, not poll):
- `@kopf.index` keeps PlacementDecisions, Placements, ManagedClusters, ManifestWorks and the
  server Job/Service/Pod in memory, keyed by the owning resource.
- An `@kopf.on.event` handler per related kind computes, from the indexes, a digest of
  everything the resource's desired state and status depend on, and when it differs from the
  resource's `INPUTS_ANNOTATION`, patches that annotation. kopf sees an annotation change as
  an update, so the one reconcile handler runs with kopf's retries, patch and finalizer
  machinery; unchanged inputs (e.g. a ManagedCluster heartbeat) write nothing.
- A slow timer re-folds status from the indexes and the agents' reports (in memory, no API
  reads): it picks up new reports and turns "too few clients for too long" into Failed.
kopf's own bookkeeping annotations use PERSISTENCE_PREFIX, a different prefix from
INPUTS_ANNOTATION, because kopf ignores changes to annotations under its own prefix.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final

import kopf

from hub_controller.api import FLRef, SpecError, parse_spec
from hub_controller.kube import Kube, KubeError
from hub_controller.operator.desired import credentials
from hub_controller.operator.desired import placement as placement_mod
from hub_controller.operator.desired import server as server_mod
from hub_controller.operator.desired import works as works_mod
from hub_controller.operator.fold import (
    fold,
    invalid_status,
    parse_status,
    should_start_server,
    status_patch,
)
from hub_controller.operator.indexes import (
    INPUTS_ANNOTATION,
    OWNED,
    SERVER_OWNED,
    Indexes,
    Key,
    gather,
    owner_key,
)
from hub_controller.operator.observed import JobState, observation_digest, ready_clusters
from hub_controller.reports import NoReports, ReportSource
from ocmfl import constants

GROUP, VERSION, PLURAL = constants.GROUP, constants.VERSION, constants.PLURAL
# Not "kopf.*": kopf then marks this prefix as its own and ignores all of it in diffs.
PERSISTENCE_PREFIX: Final = f"operator.{constants.LABEL_PREFIX}"
REFOLD_INTERVAL_S: Final = 10.0
CLEANUP_WAIT_RETRIES: Final = 12  # x 5 s: how long deletion waits for works to vanish


class _State:
    """Process-wide handles set at startup (the API client and the report source)."""

    kube: Kube | None = None
    reports: ReportSource = NoReports()


STATE = _State()


def apply_status_reports(source: ReportSource) -> None:
    """Hook for the aggregator: fold the agents' reports from `source` into status.

    `source.snapshot(namespace, name)` must return the latest report per cluster (the
    aggregator's ReportStore does). The status timer reads it every REFOLD_INTERVAL_S.
    """
    STATE.reports = source


def agent_endpoints() -> dict[str, str]:
    """Per-cluster agent endpoint overrides from $OCMFL_AGENT_ENDPOINTS (JSON object)."""
    raw = os.environ.get(constants.ENV_AGENT_ENDPOINTS, "")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise kopf.PermanentError(f"{constants.ENV_AGENT_ENDPOINTS} is not JSON: {exc}") from exc
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise kopf.PermanentError(f"{constants.ENV_AGENT_ENDPOINTS} must map cluster -> URL")
    return {str(k): v for k, v in value.items()}


def ensure_credentials(
    kube: Kube, ref: FLRef, server_address: str, members: list[str]
) -> dict[str, bytes]:
    """Issue/renew the resource's credentials (hub CA) and store them in its hub Secrets."""
    try:
        ca = credentials.load_hub_ca()
    except credentials.HubCAUnavailable as exc:
        raise kopf.TemporaryError(str(exc), delay=30) from exc
    name = server_mod.server_name(ref)
    secret = kube.get("v1", "Secret", ref.namespace, credentials.credentials_secret_name(name))
    current = credentials.secret_data(secret)
    data = credentials.reconcile_credentials(
        current,
        clusters=members,
        gateway=server_mod.gateway_names(ref, server_address),
        ca=ca,
    )
    if data != current or secret is None:
        meta = {
            "namespace": ref.namespace,
            "labels": ref.labels(server_mod.COMPONENT),
            "ownerReferences": [ref.owner_reference()],
        }
        for obj in credentials.hub_secrets(meta, name, data):
            kube.apply(obj)
    return data


def _kube() -> Kube:
    if STATE.kube is None:
        from ocmfl.kube import api_client

        kubeconfig = os.environ.get("KUBECONFIG")
        if not kubeconfig and os.path.exists(os.path.expanduser("~/.kube/config")):
            kubeconfig = os.path.expanduser("~/.kube/config")
        STATE.kube = Kube(api_client(kubeconfig or None))
    return STATE.kube


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


# --- settings ------------------------------------------------------------------------------
@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Finalizer and bookkeeping under our own names; post warnings as Events."""
    settings.persistence.finalizer = constants.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=PERSISTENCE_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PERSISTENCE_PREFIX, key="last-handled-configuration"
    )
    settings.posting.enabled = True
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.batching.error_delays = [1, 2, 5, 10, 30, 60]


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account, else the kubeconfig KUBECONFIG names (read at login time,
    unlike the kubernetes library's default path, which is fixed at import)."""
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(
        **kwargs
    ) or kopf.login_with_kubeconfig(**kwargs)
    return info


# --- indexes -------------------------------------------------------------------------------


# --- the reconcile handler -----------------------------------------------------------------
def _ref(meta: Mapping[str, Any]) -> FLRef:
    return FLRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def _write_status(patch: kopf.Patch, new: Any, current: Mapping[str, Any] | None) -> None:
    for key, value in status_patch(new, current).items():
        patch.status[key] = value


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile(
    body: kopf.Body,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    """Validate, then apply Placement, server Service, ManifestWorks, server Job; fold status."""
    ref = _ref(meta)
    generation = meta.get("generation")
    previous = parse_status(status)
    try:
        fl = parse_spec(dict(spec), ref.name)
    except SpecError as exc:
        kopf.warn(body, reason="InvalidSpec", message=str(exc))
        _write_status(patch, invalid_status(exc.problems, generation, previous, _now()), status)
        return
    idx = Indexes.of(kwargs)
    kube = _kube()
    try:
        kube.apply(placement_mod.desired_placement(ref, fl))
        kube.apply(server_mod.desired_service(ref))
        claim = server_mod.desired_model_claim(ref, fl)
        if claim is not None:
            kube.create(claim)
        obs = gather(ref, fl, idx, STATE.reports)
        terminal = previous is not None and previous.phase.value in ("Completed", "Failed")
        terminal = terminal and previous is not None and previous.observed_generation == generation
        if obs.server_address is not None:
            members = [r.name for r in obs.resolutions if r.has_data]
            creds = ensure_credentials(kube, ref, obs.server_address, members)
            desired = works_mod.desired_works(
                ref,
                fl,
                obs.resolutions,
                obs.server_address,
                agent_endpoints(),
                tls={c: credentials.client_bundle(creds, c) for c in members},
                server_name=server_mod.gateway_server_name(ref, obs.server_address),
            )
            if terminal:  # a finished run takes no new clusters
                desired = {c: w for c, w in desired.items() if c in obs.works}
            for cluster, work in desired.items():
                current = obs.works.get(cluster)
                if current is None or current.spec_hash != works_mod.spec_hash(work):
                    kube.apply(work)
            existing = [(w.cluster, w.name) for w in obs.works.values()]
            for namespace, name in works_mod.works_to_delete(existing, desired):
                logger.info("deleting ManifestWork %s/%s: cluster left", namespace, name)
                kube.delete(works_mod.WORK_API_VERSION, "ManifestWork", namespace, name)
        if should_start_server(fl, obs, previous):
            logger.info("%d clusters ready: starting the server", len(ready_clusters(obs)))
            kube.create(server_mod.desired_job(ref, fl))
            obs = replace(obs, server_job=JobState(exists=True))
    except KubeError as exc:
        if exc.status == 422:  # the API refuses an object built from this spec
            message = f"the API server refused an object built from the spec: {exc}"
            kopf.warn(body, reason="Refused", message=message)
            _write_status(patch, invalid_status([message], generation, previous, _now()), status)
            return
        raise kopf.TemporaryError(str(exc), delay=15) from exc
    new = fold(fl, generation, obs, previous, _now(), ref.namespace)
    if previous is None or new.phase != previous.phase:
        kopf.info(body, reason=new.phase.value, message=new.message)
    _write_status(patch, new, status)


@kopf.timer(GROUP, VERSION, PLURAL, interval=REFOLD_INTERVAL_S, idle=REFOLD_INTERVAL_S)
def refold(
    meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status, patch: kopf.Patch, **kwargs: Any
) -> None:
    """Re-fold status from indexes and reports (deadlines, new metrics); no API reads."""
    ref = _ref(meta)
    try:
        fl = parse_spec(dict(spec), ref.name)
    except SpecError:
        return
    previous = parse_status(status)
    obs = gather(ref, fl, Indexes.of(kwargs), STATE.reports)
    new = fold(fl, meta.get("generation"), obs, previous, _now(), ref.namespace)
    _write_status(patch, new, status)


# --- waking the owner up when related objects change ---------------------------------------
def touch(keys: Iterable[Key], idx: Indexes, logger: kopf.Logger | logging.Logger) -> None:
    """Patch INPUTS_ANNOTATION on each resource whose observed inputs changed."""
    for key in set(keys):
        for entry in idx.fls.get(key, []):
            if entry.spec is None:
                continue
            ref = FLRef(namespace=key[0], name=key[1], uid=entry.uid)
            digest = observation_digest(gather(ref, entry.spec, idx, STATE.reports))
            if digest == entry.inputs:
                continue
            try:
                _kube().merge_patch(
                    constants.API_VERSION,
                    constants.KIND,
                    key[0],
                    key[1],
                    {"metadata": {"annotations": {INPUTS_ANNOTATION: digest}}},
                )
            except (KubeError, kopf.TemporaryError) as exc:
                # The resource is gone, or the API hiccups: the timer and the next event
                # still reach it.
                logger.debug("could not touch %s/%s: %s", key[0], key[1], exc)


@kopf.on.event(constants.CLUSTER_GROUP, "v1beta1", "placements", labels=OWNED)
@kopf.on.event(constants.WORK_GROUP, "v1", "manifestworks", labels=OWNED)
@kopf.on.event("batch", "v1", "jobs", labels=SERVER_OWNED)
@kopf.on.event("", "v1", "services", labels=SERVER_OWNED)
@kopf.on.event("", "v1", "pods", labels=SERVER_OWNED)
def owned_changed(labels: Mapping[str, str], logger: kopf.Logger, **kwargs: Any) -> None:
    key = owner_key(labels)
    if key is not None:
        touch([key], Indexes.of(kwargs), logger)


@kopf.on.event(
    constants.CLUSTER_GROUP,
    "v1beta1",
    "placementdecisions",
    labels={placement_mod.PLACEMENT_LABEL: kopf.PRESENT},
)
def decision_changed(
    namespace: str | None, labels: Mapping[str, str], logger: kopf.Logger, **kwargs: Any
) -> None:
    touch([(namespace or "", labels[placement_mod.PLACEMENT_LABEL])], Indexes.of(kwargs), logger)


@kopf.on.event(constants.CLUSTER_GROUP, "v1", "managedclusters")
def cluster_changed(logger: kopf.Logger, **kwargs: Any) -> None:
    idx = Indexes.of(kwargs)
    touch(list(idx.fls.keys()), idx, logger)


# --- deletion ------------------------------------------------------------------------------
@kopf.on.delete(GROUP, VERSION, PLURAL)
def cleanup(meta: kopf.Meta, retry: int, logger: kopf.Logger, **_: Any) -> None:
    """Delete what this resource created (by owner labels), on the hub and, through the
    ManifestWorks, on every cluster; wait a while for the works to go."""
    ns, name = meta["namespace"], meta["name"]
    selector = f"{constants.LABEL_OWNER_NAMESPACE}={ns},{constants.LABEL_OWNER_NAME}={name}"
    kube = _kube()
    works = kube.list(works_mod.WORK_API_VERSION, "ManifestWork", None, selector)
    for work in works:
        wmeta = work["metadata"]
        if not wmeta.get("deletionTimestamp"):
            kube.delete(
                works_mod.WORK_API_VERSION, "ManifestWork", wmeta["namespace"], wmeta["name"]
            )
    for api_version, kind in (
        (placement_mod.PLACEMENT_API_VERSION, "Placement"),
        ("batch/v1", "Job"),
        ("v1", "Service"),
        ("v1", "PersistentVolumeClaim"),
        ("v1", "Secret"),
    ):
        for obj in kube.list(api_version, kind, ns, selector):
            kube.delete(api_version, kind, ns, obj["metadata"]["name"])
    if works and retry < CLEANUP_WAIT_RETRIES:
        left = kube.list(works_mod.WORK_API_VERSION, "ManifestWork", None, selector)
        if left:
            raise kopf.TemporaryError(f"waiting for {len(left)} ManifestWork(s) to go", delay=5)
    logger.info("cleaned up %s/%s", ns, name)
