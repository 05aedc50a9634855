"""One reconcile pass of a FederatedLearning (`reconcile`): validate, check the namespace's
FederationPolicy -> observe (the kopf indexes and the report store, never API reads) ->
desire -> apply -> fold status, with the process-wide handles it works through (`Operator`,
kept in kopf's memo). A pass applies objects only when its inputs (spec generation and
observations, reports excluded) changed since the last successful apply, or at the periodic
resync; it writes status only when the fold changed it. It returns when the next pass is due.
The kopf layer that runs one loop of passes per resource, and what wakes it, is handlers.py.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final, TypeVar, cast

import kopf

from hub_controller import credentials_layout
from hub_controller import policy as policy_mod
from hub_controller.api import (
    CONDITION_VALIDATED,
    FederatedLearningSpec,
    FederatedLearningStatus,
    FLRef,
    Quantity,
    SpecError,
    data_claim_of,
    parse_spec,
)
from hub_controller.membership import (
    AGENT_GRACE_S,
    DecisionView,
    agents_recovering,
    settle_decisions,
)
from hub_controller.operator.desired import client_token, credentials
from hub_controller.operator.desired import limits as limits_mod
from hub_controller.operator.desired import placement as placement_mod
from hub_controller.operator.desired import server as server_mod
from hub_controller.operator.desired import works as works_mod
from hub_controller.operator.events import StoryEvent, story
from hub_controller.operator.fold import (
    counting_down,
    finished,
    fold,
    invalid_status,
    parse_status,
    should_start_server,
    status_body,
    status_patch,
)
from hub_controller.operator.indexes import (
    Indexes,
    Key,
    gather,
)
from hub_controller.operator.metrics import FederationMetrics
from hub_controller.operator.observed import (
    JobState,
    Observations,
    observation_digest,
    ready_clusters,
)
from hub_controller.operator.workwatch import WorkStore
from hub_controller.operator.writer import AsyncKube, ThreadedKube, Writer
from hub_controller.reports import ReportSource
from ocmfl import constants
from ocmfl.kube import MERGE_PATCH, Kube, KubeError, object_path, path_of

GROUP, VERSION, PLURAL = constants.GROUP, constants.VERSION, constants.PLURAL
FIELD_MANAGER: Final = "ocm-fl-hub"
RESYNC_S: Final = 600.0  # apply everything again this often (credential renewal, drift)
COUNTDOWN_S: Final = 10.0  # re-fold this often while the ClientsReady countdown runs
KEYS_WAIT_S: Final = 2.0  # look again this soon while the server waits for SuperNode keys
REASON_POLICY: Final = "PolicyViolation"  # condition/event reason of a policy refusal
# ...and of a resource in a namespace outside the chart's rbac.flNamespaces.
REASON_NOT_SERVED: Final = "NamespaceNotServed"
# Delete dependents too (a Job's pods; without it the Job API orphans them).
BACKGROUND: Final = {"propagationPolicy": "Background"}
# Works are written with at most this many requests in flight (all resources together).
WRITE_CONCURRENCY: Final = 16
# A pass hands its work writes to the loop this many at a time (one wake-up each batch).
WRITE_BATCH: Final = WRITE_CONCURRENCY
REASON_REFUSED: Final = "ObjectRefused"  # the apiserver refused an object the controller built
REASON_NAME_TAKEN: Final = "NameTaken"  # an object of the name it needs belongs to another uid
DELETED: Final = "-"  # Run.sent: this loop deleted the work
T = TypeVar("T")


class ObjectRefused(Exception):
    """The apiserver refused (422/413) an object this controller wrote: which one, its size,
    and whether the tenant's spec can be the cause (else it is the controller's own object)."""

    def __init__(
        self,
        obj: Mapping[str, Any],
        exc: KubeError | None = None,
        *,
        detail: str = "",
        reason: str = "",
    ) -> None:
        self.reason = reason  # the status condition's reason, when not the default
        meta = obj.get("metadata") or {}
        self.what = f"{obj.get('kind')} {meta.get('namespace', '')}/{meta.get('name')}"
        self.size = len(json.dumps(obj))
        # No KubeError: the controller's own cap refused it (the spec is the cause).
        self.by = "the API server" if exc is not None else "the controller"
        self.status = exc.status if exc is not None else 0
        self.detail = exc.message if exc is not None else detail
        text = self.detail.lower()
        too_big = exc is not None and (
            exc.status == 413 or "too long" in text or "too large" in text
        )
        self.internal = too_big or (exc is not None and obj.get("kind") == "Secret")
        super().__init__(f"{self.what}: {self.detail}")

    @property
    def message(self) -> str:
        if self.internal:
            return (
                f"the API server refused {self.what} ({self.size} bytes), an object the "
                f"controller builds, not the spec: {self.detail}"
            )
        return f"{self.by} refused an object built from the spec ({self.what}): {self.detail}"


def _refusable(write: Callable[[], Any], obj: Mapping[str, Any]) -> Any:
    """Run `write` (of `obj`); a 413/422 answer becomes ObjectRefused naming `obj`."""
    try:
        return write()
    except KubeError as exc:
        if exc.status in (413, 422):
            raise ObjectRefused(obj, exc) from exc
        raise


@dataclass
class Operator:
    """The operator's process-wide handles, kept in kopf's memo as `memo.operator`."""

    kube: Kube
    agent_endpoints: dict[str, str] = field(default_factory=dict)
    # The admin's root for HostPath model stores ($OCMFL_HOSTPATH_ROOT).
    hostpath_root: str = constants.DEFAULT_HOSTPATH_ROOT
    # The namespaces where the hub may run FL servers ($OCMFL_FL_NAMESPACES, the chart's
    # namespaced grant); empty: any.
    fl_namespaces: frozenset[str] = frozenset()
    wakers: dict[Key, Callable[[], None]] = field(default_factory=dict)
    # Works are written through it by every resource's loop, so the requests in flight stay
    # bounded. On the hub: aiohttp on kopf's loop (`configure`); else (tests) the same
    # coroutines over `kube`, on a loop of its own.
    writer: Writer = None  # type: ignore[assignment]  # set in __post_init__
    # The controller's ManifestWorks, followed by a watch of its own (workwatch.py).
    works: WorkStore = field(default_factory=WorkStore)
    # Each resource's phase, rounds and progress for Prometheus (one registry with the
    # aggregator's series: the hub's /metrics).
    metrics: FederationMetrics = field(default_factory=FederationMetrics)
    # Resource -> how many SuperNode keys the Fleet signer (in this process or in its own
    # Deployment) has enrolled for it, from the signed Fleet CSRs it watches: part of a pass's
    # inputs, so a key that arrives while nothing else changes is copied to the server's
    # node-keys shards at once (not at the next resync, minutes later).
    enrolled: dict[Key, int] = field(default_factory=dict)
    signed_csrs: set[str] = field(default_factory=set)  # the CSR uids counted in `enrolled`
    keys_by_uid: dict[str, Key] = field(default_factory=dict)  # running resources' uids

    def key_enrolled(self, csr_uid: str, federation_uid: str) -> None:
        """The Fleet signer signed a CSR of this federation (having stored its SuperNode
        key): apply again now, once per CSR."""
        key = self.keys_by_uid.get(federation_uid)
        if key is None or csr_uid in self.signed_csrs:
            return
        self.signed_csrs.add(csr_uid)
        self.enrolled[key] = self.enrolled.get(key, 0) + 1
        self.wake(key)

    def __post_init__(self) -> None:
        if self.writer is None:
            self.writer = Writer.on_own_loop(ThreadedKube(self.kube), WRITE_CONCURRENCY)

    def wake(self, key: Key) -> None:
        waker = self.wakers.get(key)
        if waker is not None:
            waker()

    def wake_namespace(self, namespace: str) -> None:
        for (ns, _), waker in list(self.wakers.items()):
            if ns == namespace:
                waker()

    def wake_all(self) -> None:
        for waker in list(self.wakers.values()):
            waker()


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


def hostpath_root() -> str:
    """The admin's root for HostPath model stores: $OCMFL_HOSTPATH_ROOT, an absolute path."""
    root = os.environ.get(constants.ENV_HOSTPATH_ROOT, "") or constants.DEFAULT_HOSTPATH_ROOT
    if not root.startswith("/") or root.rstrip("/") == "":
        raise kopf.PermanentError(
            f"{constants.ENV_HOSTPATH_ROOT} must be an absolute directory other than /, "
            f"got {root!r}"
        )
    return root


def fl_namespaces() -> frozenset[str]:
    """The namespaces the chart granted server-side writes in ($OCMFL_FL_NAMESPACES); empty:
    any namespace (the chart's cluster-wide grant)."""
    raw = os.environ.get(constants.ENV_FL_NAMESPACES, "")
    return frozenset(n.strip() for n in raw.split(",") if n.strip())


def namespace_not_served(namespace: str, served: frozenset[str]) -> str | None:
    """Why the hub cannot run a FederatedLearning in `namespace` (None: it can)."""
    if not served or namespace in served:
        return None
    return (
        f"namespace {namespace}: the hub may run FL servers only in "
        f"{', '.join(sorted(served))} (Helm value rbac.flNamespaces); create the resource "
        f"there, or ask the hub admin to add {namespace} to rbac.flNamespaces"
    )


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


# --- one pass ------------------------------------------------------------------------------
@dataclass
class Run:
    """One resource's reconcile loop: what it last wrote and applied."""

    ref: FLRef
    status: dict[str, Any]  # as last written by this loop (seeded from the resource)
    # (generation, inputs digest, keys enrolled: Operator.enrolled) last applied
    applied: tuple[Any, ...] | None = None
    applied_at: float = float("-inf")  # monotonic time of that apply
    conflicts: dict[str, str] = field(default_factory=dict)  # found by that apply (see below)
    # REST path -> digest of the Secret body this loop last applied there (unchanged key
    # shards are not written again; forgotten at every resync).
    written: dict[str, str] = field(default_factory=dict)
    works: works_mod.WorkCache = field(default_factory=works_mod.WorkCache)
    # cluster -> spec hash of the work this loop wrote there (DELETED: deleted it) that the
    # index does not show yet (forgotten at every resync).
    sent: dict[str, str] = field(default_factory=dict)
    # The decided clusters this loop acts on: OCM's decisions read mid-rewrite are not
    # taken as they are (membership.settle_decisions).
    decisions: DecisionView = field(default_factory=DecisionView)
    # Clusters whose work stays although the decisions dropped them, because their agent is
    # briefly down (membership.agents_recovering) -> since when.
    recovering: dict[str, float] = field(default_factory=dict)


def _tell(body: Mapping[str, Any], event: StoryEvent) -> None:
    """Post one Event on the resource. A Normal one goes through kopf.event: kopf.info is
    dropped below the hub's posting level (WARNING, which keeps kopf's own log lines off the
    API), and the story's Normal events are not log lines."""
    if event.type == "Warning":
        kopf.warn(cast(kopf.Body, body), reason=event.reason, message=event.message)
    else:
        kopf.event(cast(kopf.Body, body), type="Normal", reason=event.reason, message=event.message)


def _publish(
    op: Operator, run: Run, new: FederatedLearningStatus, spec: FederatedLearningSpec | None
) -> None:
    """Write the pass's status and set the resource's Prometheus gauges from it."""
    _write_status(op.kube, run, new)
    op.metrics.observe(run.ref.namespace, run.ref.name, new, spec, time.time())


def _write_status(kube: Kube, run: Run, new: Any) -> None:
    patch = status_patch(new, run.status)
    if not patch:
        return
    path = path_of(constants.API_VERSION, constants.KIND, run.ref.namespace, run.ref.name)
    kube.patch(f"{path}/status", {"status": patch}, MERGE_PATCH)
    run.status = status_body(new)


def ensure_credentials(
    kube: Kube,
    ref: FLRef,
    server_address: str,
    members: list[str],
    written: dict[str, str] | None = None,
    keys: bool = True,
) -> dict[str, bytes]:
    """Ask the signer for the resource's server certificates (its own Fleet CA, never the hub
    CA; the signer part holds the CA) by applying the credentials Secret's request, and, with
    `keys`, store each node-keys shard whose body differs from what `written` says this loop
    last applied there. Returned: the server certificates the signer has issued so far and,
    with `keys` only, members' public keys."""
    written = {} if written is None else written
    name = credentials_layout.server_name(ref)
    secret_path = path_of(
        "v1", "Secret", ref.namespace, credentials_layout.credentials_secret_name(name)
    )
    secret = kube.get(secret_path)
    owner = (((secret or {}).get("metadata") or {}).get("labels") or {}).get(
        constants.LABEL_OWNER_UID
    )
    if secret is not None and owner != ref.uid:
        # Never reuse (its certificates could be anyone's) nor overwrite another's credentials.
        raise ObjectRefused(
            secret,
            detail=f"a Secret of this name exists and belongs to {owner or 'no resource'} "
            f"(label {constants.LABEL_OWNER_UID}), not to this resource ({ref.uid}): it is "
            "never reused or overwritten; delete it, or give this resource another name",
            reason=REASON_NAME_TAKEN,
        )
    current = credentials_layout.secret_data(secret)
    # Members' keys go only into the node-keys shards: without `keys` the enrolled shards
    # (up to ~1.3 MB at N = 3,500) are neither listed nor decoded on every pass.
    shards = (
        kube.list_objects(
            path_of("v1", "Secret", ref.namespace), credentials_layout.enrolled_selector(ref.uid)
        )
        if keys
        else []
    )
    enrolled = credentials.enrolled_data(shards)
    data = credentials.credentials(current, clusters=members, enrolled=enrolled)
    gateway = server_mod.gateway_names(ref, server_address)
    meta = {
        "namespace": ref.namespace,
        "labels": ref.labels(server_mod.COMPONENT),
        "ownerReferences": [ref.owner_reference()],
    }
    secrets = credentials.hub_secrets(meta, name, gateway, data)
    for obj in secrets if keys else secrets[:1]:
        path = object_path(obj)
        digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()
        if path == secret_path and secret is None:
            written.pop(path, None)  # deleted meanwhile: ask again
        if written.get(path) == digest:
            continue
        _refusable(functools.partial(kube.apply, obj), obj)
        written[path] = digest
    return data


def ensure_client_token(kube: Kube, ref: FLRef, logger: kopf.Logger | logging.Logger) -> str | None:
    """The resource's local-API token from its hub Secret, made on first use. None when a
    Secret of that name belongs to another resource (it is never overwritten; this
    federation's metrics posts are then refused by the agents, training goes on)."""
    path = path_of("v1", "Secret", ref.namespace, client_token.token_secret_name(ref))
    secret = kube.get(path)
    token = client_token.token_from_secret(secret, ref)
    if token is not None:
        return token
    if client_token.owned_by_other(secret, ref):
        logger.warning("Secret %s belongs to another resource: no client token", path)
        return None
    token = client_token.new_token()
    kube.apply(client_token.desired_token_secret(ref, token))
    return token


def apply_desired(
    op: Operator,
    ref: FLRef,
    fl: Any,
    obs: Observations,
    done: bool,
    logger: kopf.Logger | logging.Logger,
    written: dict[str, str] | None = None,
    cache: works_mod.WorkCache | None = None,
    generation: int | None = None,
    sent: dict[str, str] | None = None,
    keys: bool = True,
    caps: Mapping[str, Quantity] | None = None,
) -> tuple[dict[str, str], dict[str, bytes] | None]:
    """Apply the Placement, the server Service (and PVC), the credentials (with `keys`, the
    node-keys shards too) and the works; delete the works of clusters that left. A finished
    run takes no new clusters.

    A work whose name is taken on a cluster by a ManifestWork of another uid (or of no owner)
    is never applied over it. Returns those clusters -> the other owner's uid, and the
    credentials (None before the server address is known). `caps`: the namespace policy's
    maxPodResources, which each work's client namespace is held to on its cluster."""
    kube = op.kube
    placement = placement_mod.desired_placement(ref, fl)
    _refusable(lambda: kube.apply(placement), placement)
    service = server_mod.desired_service(ref)
    _refusable(lambda: kube.apply(service), service)
    claim = server_mod.desired_model_claim(ref, fl)
    if claim is not None:
        pvc_path = path_of("v1", "PersistentVolumeClaim", ref.namespace)
        _refusable(lambda: kube.create(pvc_path, claim), claim)
    if obs.server_address is None:
        return {}, None
    members = [r.name for r in obs.resolutions if r.has_data]
    creds = ensure_credentials(kube, ref, obs.server_address, members, written, keys)
    token = ensure_client_token(kube, ref, logger)
    # Only works the index shows missing or different are written, concurrently (at most
    # WRITE_CONCURRENCY requests in flight), each sent as soon as it is built (the first
    # requests are answered while the rest are built); an unchanged one costs no request.
    # `sent` holds what this loop wrote that the index does not show yet (its watch lags
    # behind our writes): not written again meanwhile.
    sent = {} if sent is None else sent
    for cluster in list(sent):
        current = obs.works.get(cluster)
        shown = current.spec_hash if current is not None and not current.deleting else DELETED
        if shown == sent[cluster]:
            del sent[cluster]  # the index caught up: it is the truth again
    desired: dict[str, dict[str, Any]] = {}
    writes: list[tuple[str, dict[str, Any]]] = []
    futures: list[concurrent.futures.Future[str | None]] = []
    # Handed to the loop WRITE_BATCH at a time (one wake-up per batch, not per work).
    batch: list[Callable[[AsyncKube], Awaitable[str | None]]] = []
    for cluster, work in (cache or works_mod.WorkCache()).each(
        generation,
        ref,
        fl,
        obs.resolutions,
        obs.server_address,
        op.agent_endpoints,
        server_name=server_mod.gateway_server_name(ref, obs.server_address),
        client_token=token,
        caps=caps,
    ):
        current = obs.works.get(cluster)
        if done and current is None:
            continue  # a finished run takes no new clusters
        desired[cluster] = work
        if cluster in obs.conflicts:
            continue  # the index shows another uid's work there
        # desired_work stamped the hash on it: not computed again per pass
        wanted = works_mod.stamped_hash(work)
        if sent.get(cluster) == wanted:
            continue
        if current is None or current.spec_hash != wanted:
            writes.append((cluster, work))
            batch.append(functools.partial(_write_work, ref, work, current is None))
            if len(batch) >= WRITE_BATCH:
                futures += op.writer.submit_many(batch)
                batch = []
    futures += op.writer.submit_many(batch)
    conflicts: dict[str, str] = {}
    concurrent.futures.wait(futures)
    failure: BaseException | None = None
    for (cluster, work), future in zip(writes, futures, strict=True):
        try:
            owner = future.result()
        except (KubeError, ObjectRefused) as exc:
            failure = failure or exc  # the others have finished; report the first
            continue
        if owner is None:
            sent[cluster] = works_mod.stamped_hash(work)
        else:
            conflicts[cluster] = owner
            logger.warning(
                "not applying ManifestWork %s/%s: it belongs to uid %r, not %s",
                cluster,
                work["metadata"]["name"],
                owner,
                ref.uid,
            )
    if failure is not None:
        raise failure
    # A work already being deleted (or whose delete this loop sent) is not deleted again.
    existing = [
        (w.cluster, w.name)
        for w in obs.works.values()
        if not w.deleting and sent.get(w.cluster) != DELETED
    ]
    gone = works_mod.works_to_delete(existing, desired)
    for namespace, name in gone:
        logger.info("deleting ManifestWork %s/%s: cluster left", namespace, name)
    paths = [path_of(works_mod.WORK_API_VERSION, "ManifestWork", ns, n) for ns, n in gone]
    op.writer.run_all([functools.partial(delete_object, p) for p in paths])
    for namespace, _name in gone:
        sent[namespace] = DELETED
    return conflicts, creds


async def delete_object(path: str, kube: AsyncKube) -> None:
    await kube.delete(path, BACKGROUND)


async def _refusable_async(write: Awaitable[T], obj: Mapping[str, Any]) -> T:
    """`_refusable` for a coroutine."""
    try:
        return await write
    except KubeError as exc:
        if exc.status in (413, 422):
            raise ObjectRefused(obj, exc) from exc
        raise


async def _write_work(ref: FLRef, work: dict[str, Any], new: bool, kube: AsyncKube) -> str | None:
    """Write one work: create it where the index shows none (one request; a name already
    taken answers 409 and is then checked), else apply it. Returns the uid of another owner
    whose work holds the name (never overwritten), else None."""
    meta = work["metadata"]
    size = len(json.dumps(work))
    if size > works_mod.MAX_WORK_BYTES:
        raise ObjectRefused(
            work,
            detail=f"it would be {size} bytes, over the cap of {works_mod.MAX_WORK_BYTES} bytes "
            "on one ManifestWork (each selected cluster gets one on the hub): shorten "
            "spec.client.runConfig, spec.client.overrides or the pod settings",
        )
    if new:
        collection = path_of(works_mod.WORK_API_VERSION, "ManifestWork", meta["namespace"])
        if await _refusable_async(kube.create(collection, work), work):
            return None
        owner = await _foreign_owner(kube, work, ref)
        if owner is not None:
            return owner
    await _refusable_async(kube.apply(work), work)
    return None


async def _foreign_owner(kube: AsyncKube, work: Mapping[str, Any], ref: FLRef) -> str | None:
    """The owner uid of an existing ManifestWork where `work` would go, when it is not `ref`'s
    (None: free, or ours). Asked only for works the index does not show as ours."""
    meta = work["metadata"]
    path = path_of(works_mod.WORK_API_VERSION, "ManifestWork", meta["namespace"], meta["name"])
    existing = await kube.get(path)
    if existing is None:
        return None
    uid = str(
        ((existing.get("metadata") or {}).get("labels") or {}).get(constants.LABEL_OWNER_UID, "")
    )
    return None if uid == ref.uid else uid


def _refused_by_policy(status: FederatedLearningStatus | None) -> bool:
    return status is not None and any(
        c.type == CONDITION_VALIDATED and c.reason == REASON_POLICY for c in status.conditions
    )


def namespace_policy(idx: Indexes, namespace: str) -> policy_mod.FederationPolicySpec | str | None:
    """The namespace's FederationPolicy, parsed once per pass: None when it has none, or why
    it cannot be read (an unreadable policy refuses everything)."""
    raw = idx.policy(namespace)
    if raw is None:
        return None
    try:
        return policy_mod.parse_policy(raw)
    except ValueError as exc:
        return f"{exc}: the hub admin must fix the policy"


def policy_problems(
    fl: FederatedLearningSpec, policy: policy_mod.FederationPolicySpec | str | None, namespace: str
) -> list[str]:
    """What the namespace's FederationPolicy (`namespace_policy`) refuses in `fl` (empty:
    allowed), each naming the field and the fix."""
    if isinstance(policy, str):
        return [policy]
    return [str(v) for v in policy_mod.violations(fl, policy, namespace)]


def reconcile(
    op: Operator,
    reports: ReportSource,
    body: Mapping[str, Any],
    idx: Indexes,
    run: Run,
    logger: kopf.Logger | logging.Logger,
    now: datetime | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> float | None:
    """One pass for one resource: validate, observe, apply what changed, fold and write status.

    Returns the seconds after which a pass is due even without a wake-up (None: only on one).
    KubeError (transient) propagates: the caller retries later.
    """
    now = now or _now()
    ref = run.ref
    meta = body.get("metadata") or {}
    generation = meta.get("generation")
    previous = parse_status(run.status)
    try:
        fl = parse_spec(dict(body.get("spec") or {}), ref.name)
    except SpecError as exc:
        kopf.warn(cast(kopf.Body, body), reason="InvalidSpec", message=str(exc))
        _publish(op, run, invalid_status(exc.problems, generation, previous, now), None)
        return None
    # The chart's grant: outside its namespaces the hub may not write the server's objects.
    unserved = namespace_not_served(ref.namespace, op.fl_namespaces)
    if unserved is not None:
        kopf.warn(cast(kopf.Body, body), reason=REASON_NOT_SERVED, message=unserved)
        status = invalid_status([unserved], generation, previous, now, reason=REASON_NOT_SERVED)
        _publish(op, run, status, fl)
        return None
    # The admin's policy, checked before anything is applied (the admission policy checked
    # the same at create time; this also covers a policy changed since then). A run that
    # ended otherwise keeps its outcome: it takes no new clusters anyway.
    policy = namespace_policy(idx, ref.namespace)
    check = not finished(previous, generation) or _refused_by_policy(previous)
    refused = policy_problems(fl, policy, ref.namespace) if check else []
    if refused:
        message = "; ".join(refused)
        kopf.warn(cast(kopf.Body, body), reason=REASON_POLICY, message=message)
        status = invalid_status(refused, generation, previous, now, reason=REASON_POLICY)
        _publish(op, run, status, fl)
        return None
    seen = reports.version(ref.uid)  # before the snapshot: the status holds at least these

    key = (ref.namespace, ref.name)

    def settle(slices: list[tuple[int, tuple[str, ...]]], selected: int | None) -> frozenset[str]:
        now = clock()
        run.decisions = settle_decisions(slices, selected, run.decisions, now)
        decided = run.decisions.decided
        own = {w.cluster for w in idx.works.get(key, []) if w.uid == ref.uid and not w.deleting}
        if not run.decisions.started:
            # No complete decision set yet (this loop just started: a restarted controller):
            # nothing new is decided, and nothing the run already has is taken away.
            return decided | own
        dropped = own - decided
        infos = {c: info for c in dropped for info in idx.clusters.get(c, [])}
        claim = data_claim_of(fl)[0] or ""
        run.recovering = agents_recovering(dropped, infos, claim, run.recovering, now)
        return decided | run.recovering.keys()

    obs = gather(ref, fl, idx, reports, hostpath_root=op.hostpath_root, settle=settle)
    # The policy's per-pod caps (none without a readable policy: a run is then refused, or
    # has finished and takes no new clusters). A changed cap changes every work: inputs too.
    caps = policy.max_pod_resources if isinstance(policy, policy_mod.FederationPolicySpec) else {}
    inputs = (
        generation,
        observation_digest(obs),
        op.enrolled.get((ref.namespace, ref.name), 0),
        limits_mod.caps_key(caps),
    )
    waiting_for_keys = False
    try:
        if inputs != run.applied or clock() - run.applied_at >= RESYNC_S:
            if clock() - run.applied_at >= RESYNC_S:
                run.written.clear()  # write every key shard again (drift)
                run.sent.clear()
            run.conflicts, creds = apply_desired(
                op,
                ref,
                fl,
                obs,
                finished(previous, generation),
                logger,
                run.written,
                run.works,
                generation,
                run.sent,
                # Only the server reads the node keys: written once it is to start, and kept
                # current after (not rewritten on every pass while thousands join).
                keys=obs.server_job.exists or should_start_server(fl, obs, previous, generation),
                caps=caps,
            )
            keys_missing = False
            if should_start_server(fl, obs, previous, generation):
                # The server registers SuperNode keys once, at start: wait until enough
                # clusters' agents have sent theirs (through the Fleet signer), and for the
                # server certificates the signer part issues.
                have = len(credentials.server_node_keys(creds or {}))
                gateway = server_mod.gateway_names(ref, obs.server_address)
                unready = credentials.tls_ready(creds or {}, gateway, now)
                keys_missing = have < fl.server.min_available_clients or unready is not None
                if have < fl.server.min_available_clients:
                    logger.info("waiting for SuperNode keys: %d of %d clusters have sent one",
                                have, fl.server.min_available_clients)  # fmt: skip
                elif unready is not None:
                    logger.info("waiting for the server certificates: %s", unready)
                else:
                    logger.info("%d clusters ready: starting the server", len(ready_clusters(obs)))
                    job = server_mod.desired_job(ref, fl, op.hostpath_root)
                    jobs = path_of("batch/v1", "Job", ref.namespace)
                    _refusable(lambda: op.kube.create(jobs, job), job)
                    obs = replace(obs, server_job=JobState(exists=True))
            # Waiting for keys: look again soon (a signed Fleet CSR also wakes the loop:
            # Operator.key_enrolled).
            run.applied, run.applied_at = (None if keys_missing else inputs), clock()
            if keys_missing:
                waiting_for_keys = True
    except ObjectRefused as exc:
        # Said as it is: the object, its size, and whether the spec can be the cause.
        reason = exc.reason or (REASON_REFUSED if exc.internal else "InvalidSpec")
        kopf.warn(cast(kopf.Body, body), reason="Refused", message=exc.message)
        status = invalid_status([exc.message], generation, previous, now, reason=reason)
        _publish(op, run, status, fl)
        return None
    if run.conflicts:
        obs = replace(obs, conflicts={**run.conflicts, **obs.conflicts})
    new = fold(fl, generation, obs, previous, now, ref.namespace)
    for event in story(previous, new):
        _tell(body, event)
    _publish(op, run, new, fl)
    # Written (or unchanged since the last write): the aggregator may ack these reports.
    reports.persisted(ref.uid, seen)
    if waiting_for_keys:
        return KEYS_WAIT_S
    delay = COUNTDOWN_S if counting_down(fl, obs, new.phase) else RESYNC_S
    # Back when a decided cluster's hold ends (no event may come then).
    held = run.decisions.recheck_in(clock())
    if held is not None:
        delay = min(delay, held + 0.05)
    # ... and when a recovering agent's grace ends (its label changing back wakes it sooner).
    if run.recovering:
        grace_end = min(run.recovering.values()) + AGENT_GRACE_S - clock()
        delay = min(delay, max(0.0, grace_end) + 0.05)
    return delay
