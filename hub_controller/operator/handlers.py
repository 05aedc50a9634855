"""kopf handlers for FederatedLearning: one reconcile loop per resource, woken by changes.

Each resource gets a kopf daemon (`run`) that loops: wait for a wake-up, then one pass of
`reconcile` (validate, check the namespace's FederationPolicy -> observe -> desire -> apply
-> fold status), in a worker thread. What wakes it:
- an event on the resource itself (spec change) or on an object it depends on (Placement,
  PlacementDecision, ManifestWork, server Job/Service/Pod, any ManagedCluster, its
  namespace's FederationPolicy): the `@kopf.on.event` handlers below call the resource's waker;
- a new agent report of its run (the report store calls the waker it subscribed by uid);
- a deadline the last pass asked for (the ClientsReady countdown, a periodic resync).
The pass itself is reconcile.py; this module is the kopf layer: settings, the loop, the
wake-ups, the deletion cleanup. The daemon is the only writer of the resource's status.

Process-wide handles (`reconcile.Operator`: the API client, the work writer, the wakers) live
in kopf's memo (`memo.operator`; the aggregator puts its report store at `memo.reports`). The
operator never uses the hub CA or the agent CA: each federation's Fleet CA is in its
credentials Secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
from collections.abc import Mapping
from typing import Any, Final

import kopf

from hub_controller import policy as policy_mod
from hub_controller.api import FLRef
from hub_controller.operator.desired import placement as placement_mod
from hub_controller.operator.desired import works as works_mod
from hub_controller.operator.indexes import (
    DECIDED,
    OWNED,
    SERVER_OWNED,
    Indexes,
    owner_key,
)
from hub_controller.operator.observed import signed_fleet_csr
from hub_controller.operator.reconcile import (
    BACKGROUND,
    FIELD_MANAGER,
    GROUP,
    PLURAL,
    VERSION,
    WRITE_CONCURRENCY,
    Operator,
    Run,
    agent_endpoints,
    delete_object,
    fl_namespaces,
    hostpath_root,
    reconcile,
)
from hub_controller.operator.writer import AioKube, Writer
from hub_controller.reports import NoReports, ReportSource
from hub_controller.signer.csr_events import CSR_RESOURCE, of_signer
from ocmfl import constants
from ocmfl.kube import Kube, KubeError, path_of

# Not "kopf.*": kopf then marks this prefix as its own and ignores all of it in diffs.
PERSISTENCE_PREFIX: Final = f"operator.{constants.LABEL_PREFIX}"
RETRY_DELAYS_S: Final = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
# Deletion looks again every CLEANUP_POLL_S, up to CLEANUP_WAIT_RETRIES times (about a
# minute), for the works to vanish: a work is usually gone seconds after its delete.
CLEANUP_POLL_S: Final = 1.0
CLEANUP_WAIT_RETRIES: Final = 60


# --- settings ------------------------------------------------------------------------------
# Event handlers that only wake a loop (or mark a scope): kopf would log "Handler 'x'
# succeeded." at INFO for each call, several lines per ManifestWork during a fan-out.
QUIET_HANDLERS: Final = frozenset(
    {
        "resource_changed",
        "owned_changed",
        "decision_changed",
        "cluster_changed",
        "policy_changed",
    }
)


class QuietEventHandlers(logging.Filter):
    """Drops kopf's success line of the QUIET_HANDLERS; their failures and every other line
    are kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if record.levelno != logging.INFO or not isinstance(msg, str):
            return True
        if not (msg.startswith("Handler '") and msg.endswith("' succeeded.")):
            return True
        return msg[len("Handler '") : -len("' succeeded.")] not in QUIET_HANDLERS


def quiet_event_handlers(logger: logging.Logger | None = None) -> None:
    """Install QuietEventHandlers on kopf's object logger (once)."""
    target = logger or logging.getLogger("kopf.objects")
    if not any(isinstance(f, QuietEventHandlers) for f in target.filters):
        target.addFilter(QuietEventHandlers())


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Finalizer and bookkeeping under our own names; warnings as Events; the memo; the
    work writer on this (kopf's) event loop."""
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
    quiet_event_handlers()
    kube = Kube(field_manager=FIELD_MANAGER)
    writer = Writer(AioKube(kube, WRITE_CONCURRENCY), asyncio.get_running_loop(), WRITE_CONCURRENCY)
    op = Operator(
        kube=kube,
        agent_endpoints=agent_endpoints(),
        hostpath_root=hostpath_root(),
        fl_namespaces=fl_namespaces(),
        writer=writer,
    )
    memo.operator = op
    # ManifestWorks are not watched through kopf (its per-event machinery cost about 40 % of
    # the hub's CPU during a fan-out): one stream of our own, with its own connection.
    op.works.on_change = op.wake
    op.works.start(Kube(field_manager=FIELD_MANAGER), memo.get("namespaces") or ())


@kopf.on.cleanup()
async def stop_works(memo: kopf.Memo, **_: Any) -> None:
    """Stop the ManifestWork streams and close the writer's connections."""
    op: Operator | None = memo.get("operator")
    if op is not None:
        op.works.close()
        if isinstance(op.writer.kube, AioKube):
            await op.writer.kube.close()


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account, else the kubeconfig KUBECONFIG names (read at login time,
    unlike the kubernetes library's default path, which is fixed at import)."""
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(
        **kwargs
    ) or kopf.login_with_kubeconfig(**kwargs)
    return info


WORKS_SYNC_WARN_S = 10.0


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=30.0)
async def run(
    body: kopf.Body, meta: kopf.Meta, memo: kopf.Memo, logger: kopf.Logger, **kwargs: Any
) -> None:
    """The resource's reconcile loop (see the module docstring); kopf cancels it when the
    resource is being deleted or the operator stops."""
    op: Operator = memo.operator
    reports: ReportSource = memo.get("reports") or NoReports()
    ref = FLRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
    key = (ref.namespace, ref.name)
    idx = Indexes.of(kwargs, works=op.works.works)
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    # Wake-ups from other threads are coalesced: while one is queued on the loop, another is
    # not queued again (the work watch calls this once per work event, 3,500 times in a
    # fan-out at N = 3,500). None is lost: a change made before `waker()` finds one queued
    # is made before that one sets the event.
    queued = False

    def wake_now() -> None:
        nonlocal queued
        queued = False
        wake.set()

    def waker() -> None:
        nonlocal queued
        if not queued:
            queued = True
            loop.call_soon_threadsafe(wake_now)

    op.wakers[key] = waker
    op.keys_by_uid[ref.uid] = key
    unsubscribe = reports.subscribe(ref.uid, waker)
    state = Run(ref, status=copy.deepcopy(dict(body.get("status") or {})))
    failures = 0
    try:
        # Until every work stream has listed, missing works are unknown, not absent. A wait
        # that lasts is said (it holds every resource's first pass back).
        began = loop.time()
        warned = False
        while not op.works.synced.is_set():
            await asyncio.sleep(0.1)
            if not warned and loop.time() - began > WORKS_SYNC_WARN_S:
                warned = True
                streams = ", ".join(sorted(op.works.pending)) or "?"
                logger.warning("waiting for the ManifestWork streams to list (%s) before "
                               "the first pass", streams)  # fmt: skip
        while True:
            wake.clear()
            snapshot = copy.deepcopy(dict(body))
            try:
                delay = await asyncio.to_thread(
                    reconcile, op, reports, snapshot, idx, state, logger
                )
                failures = 0
            except KubeError as exc:
                delay = RETRY_DELAYS_S[min(failures, len(RETRY_DELAYS_S) - 1)]
                failures += 1
                logger.warning("reconcile failed (%s); retrying in %.0fs", exc, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), delay)
    finally:
        unsubscribe()
        if op.wakers.get(key) is waker:
            del op.wakers[key]
            op.keys_by_uid.pop(ref.uid, None)


# --- waking the owner up when related objects change ---------------------------------------
@kopf.on.event(GROUP, VERSION, PLURAL)
async def resource_changed(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.operator.wake((namespace or "", name))


@kopf.on.event(constants.CLUSTER_GROUP, "v1beta1", "placements", labels=OWNED)
@kopf.on.event("batch", "v1", "jobs", labels=SERVER_OWNED)
@kopf.on.event("", "v1", "services", labels=SERVER_OWNED)
@kopf.on.event("", "v1", "pods", labels=SERVER_OWNED)
async def owned_changed(labels: Mapping[str, str], memo: kopf.Memo, **_: Any) -> None:
    key = owner_key(labels)
    if key is not None:
        memo.operator.wake(key)


@kopf.on.event(constants.CLUSTER_GROUP, "v1beta1", "placementdecisions", labels=DECIDED)
async def decision_changed(
    namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any
) -> None:
    memo.operator.wake((namespace or "", labels[placement_mod.PLACEMENT_LABEL]))


@kopf.on.event(constants.CLUSTER_GROUP, "v1", "managedclusters")
async def cluster_changed(memo: kopf.Memo, **_: Any) -> None:
    memo.operator.wake_all()


@kopf.on.event(*CSR_RESOURCE, **of_signer(constants.FLEET_SIGNER_NAME))
async def fleet_csr_signed(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A cluster's SuperNode key was enrolled (its Fleet CSR signed): the server needs it."""
    signed = None if type == "DELETED" else signed_fleet_csr(body)
    if signed is not None:
        memo.operator.key_enrolled(*signed)


@kopf.on.event(
    GROUP, VERSION, policy_mod.PLURAL, when=lambda name, **_: name == policy_mod.POLICY_NAME
)
async def policy_changed(namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """The admin changed a namespace's policy: its resources are checked again."""
    memo.operator.wake_namespace(namespace or "")


# --- deletion ------------------------------------------------------------------------------
@kopf.on.delete(GROUP, VERSION, PLURAL)
def cleanup(meta: kopf.Meta, memo: kopf.Memo, retry: int, logger: kopf.Logger, **_: Any) -> None:
    """Delete what this resource created (by owner labels), on the hub and, through the
    ManifestWorks, on every cluster; forget its reports; wait a while for the works to go."""
    ns, name = meta["namespace"], meta["name"]
    selector = f"{constants.LABEL_OWNER_NAMESPACE}={ns},{constants.LABEL_OWNER_NAME}={name}"
    op: Operator = memo.operator
    kube = op.kube
    all_works = path_of(works_mod.WORK_API_VERSION, "ManifestWork")
    try:
        works = kube.list_objects(all_works, selector)
        paths = [
            path_of(works_mod.WORK_API_VERSION, "ManifestWork", w["metadata"]["namespace"],
                    w["metadata"]["name"])
            for w in works
            if not w["metadata"].get("deletionTimestamp")
        ]  # fmt: skip
        # Concurrently, like the writes (WRITE_CONCURRENCY in flight): thousands of works.
        op.writer.run_all([functools.partial(delete_object, p) for p in paths])
        for api_version, kind in (
            (placement_mod.PLACEMENT_API_VERSION, "Placement"),
            ("batch/v1", "Job"),
            ("v1", "Service"),
            ("v1", "PersistentVolumeClaim"),
            ("v1", "Secret"),
        ):
            for obj in kube.list_objects(path_of(api_version, kind, ns), selector):
                kube.delete(
                    path_of(api_version, kind, ns, obj["metadata"]["name"]), body=BACKGROUND
                )
        left = kube.list_objects(all_works, selector) if works else []
    except KubeError as exc:
        if exc.transient:
            raise kopf.TemporaryError(str(exc), delay=5) from exc
        raise
    (memo.get("reports") or NoReports()).forget(meta["uid"])
    op.metrics.forget(ns, name)
    if left and retry < CLEANUP_WAIT_RETRIES:
        raise kopf.TemporaryError(
            f"waiting for {len(left)} ManifestWork(s) to go", delay=CLEANUP_POLL_S
        )
    logger.info("cleaned up %s/%s", ns, name)
