"""What the operator observes, read from API objects (pure; no I/O).

Each reader turns one kind of object, as the API returns it, into a small frozen value: the
Placement's status, a ManifestWork's conditions and client Job feedback, the server Job, the
server Service's address and the model in the server pod's termination message.
`Observations` bundles everything one resource's reconcile has seen.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hub_controller.api import (
    GLOBAL_HISTORY,
    FederatedLearningSpec,
    HistoryEntry,
    ModelArtifact,
    PrivacySpent,
)
from hub_controller.membership import ClusterResolution
from hub_controller.operator.desired.works import (
    FEEDBACK_ACTIVE,
    FEEDBACK_FAILED,
    FEEDBACK_SUCCEEDED,
    SPEC_HASH_ANNOTATION,
)
from hub_controller.reports import ClusterReport
from ocmfl import constants, pki
from ocmfl.podproblem import pod_problem


@dataclass(frozen=True)
class PlacementState:
    """What the Placement's status says (all empty before the placement controller ran)."""

    exists: bool = False
    satisfied: str | None = None  # "True" | "False" | None (no condition yet)
    uid: str = ""  # the Placement's own metadata.uid: its PlacementDecisions point to it
    reason: str = ""
    message: str = ""
    selected: int | None = None

    @property
    def missing_binding(self) -> bool:
        return self.reason == "NoManagedClusterSetBindings"


def placement_state(placement: Mapping[str, Any] | None) -> PlacementState:
    """Read a Placement object's status into a PlacementState."""
    if placement is None:
        return PlacementState()
    status = placement.get("status") or {}
    uid = str((placement.get("metadata") or {}).get("uid") or "")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PlacementSatisfied":
            return PlacementState(
                exists=True,
                satisfied=str(cond.get("status")),
                reason=str(cond.get("reason") or ""),
                message=str(cond.get("message") or ""),
                selected=status.get("numberOfSelectedClusters"),
                uid=uid,
            )
    return PlacementState(exists=True, selected=status.get("numberOfSelectedClusters"), uid=uid)


@dataclass(frozen=True)
class DecisionState:
    """One PlacementDecision: its clusters, the uid of the Placement that controls it (its
    controller ownerReference; "" when it has none) and its slice number (from its name)."""

    owner_uid: str
    clusters: tuple[str, ...]
    index: int = 0


def controller_uid(obj: Mapping[str, Any], kind: str, name: str) -> str:
    """The uid of `obj`'s controller ownerReference when it is the `kind` named `name`."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == kind and ref.get("name") == name:
            return str(ref.get("uid") or "")
    return ""


def server_address(spec: FederatedLearningSpec, service: Mapping[str, Any] | None) -> str | None:
    """host:port clients dial: spec.server.advertiseAddress, else the LoadBalancer ingress."""
    if spec.server.advertise_address:
        return spec.server.advertise_address
    if service is None:
        return None
    ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    for entry in ingress:
        host = entry.get("hostname") or entry.get("ip")
        if host:
            host = f"[{host}]" if ":" in host else host
            return f"{host}:{constants.FLEET_PROXY_PORT}"
    return None


@dataclass(frozen=True)
class JobState:
    """Counters and terminal conditions of a Job (server Job or, via feedback, client Job)."""

    exists: bool = False
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    complete: bool = False
    failed_condition: bool = False
    message: str = ""
    started: str = ""  # status.startTime (else creationTimestamp), RFC 3339

    @property
    def done(self) -> bool:
        return self.complete or self.failed_condition


def job_state(job: Mapping[str, Any] | None) -> JobState:
    """Read a Job object's status."""
    if job is None:
        return JobState()
    status = job.get("status") or {}
    complete = failed = False
    message = ""
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            complete = True
        elif cond.get("type") == "Failed":
            failed = True
            message = str(cond.get("message") or cond.get("reason") or "")
    return JobState(
        exists=True,
        active=int(status.get("active") or 0),
        succeeded=int(status.get("succeeded") or 0),
        failed=int(status.get("failed") or 0),
        complete=complete,
        failed_condition=failed,
        message=message,
        started=str(
            status.get("startTime") or (job.get("metadata") or {}).get("creationTimestamp") or ""
        ),
    )


@dataclass(frozen=True)
class ServerOutcome:
    """What the server container said when it ended (its termination message), and why the
    server pod cannot run while it is stuck (the kubelet's or scheduler's reason)."""

    ok: bool | None = None
    reason: str = ""
    model: ModelArtifact | None = None
    problem: str = ""
    # The server container exited 0 saying the run completed: the Job can only succeed now
    # (its one pod succeeded), so the run is Completed without waiting for the Job
    # controller to notice (about a second).
    succeeded: bool = False
    # Rounds done and the per-round history the run's log showed (any app, with or without
    # the SDK): history rows are the run's "global" values.
    rounds: int | None = None
    history: tuple[HistoryEntry, ...] = ()
    privacy: PrivacySpent | None = None


MAX_SERVER_HISTORY = 200  # rows taken from one termination message (it holds about 40)


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None


def _server_history(raw: Any) -> tuple[HistoryEntry, ...]:
    """The termination message's `history` as "global" rows; anything malformed is left out
    (the message is the server's, next to the tenant's app)."""
    rows: list[HistoryEntry] = []
    for item in raw[:MAX_SERVER_HISTORY] if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        loss, accuracy = (_number(item.get(k)) for k in ("loss", "accuracy"))
        rnd = item.get("round")
        if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 1:
            continue
        if loss is not None or accuracy is not None:
            rows.append(
                HistoryEntry(round=rnd, cluster=GLOBAL_HISTORY, loss=loss, accuracy=accuracy)
            )
    return tuple(rows)


def server_pod_state(pod: Mapping[str, Any] | None) -> ServerOutcome | None:
    """The server pod's outcome (termination message) and its current problem, if any."""
    if pod is None:
        return None
    outcome = outcome_from_termination_message(pod)
    problem = pod_problem(pod)
    if outcome is None:
        return ServerOutcome(problem=problem) if problem else None
    return dataclasses.replace(outcome, problem=problem)


def outcome_from_termination_message(pod: Mapping[str, Any] | None) -> ServerOutcome | None:
    """The outcome the server container left in its termination message, if any: the final
    model on success, the launcher's one-line reason (the app's own error) either way."""
    if pod is None:
        return None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated") or {}
        text = terminated.get("message")
        if cs.get("name") != "server" or not text:
            continue
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        model: ModelArtifact | None = None
        if data.get("path"):
            metrics = data.get("metrics") or {}
            try:
                model = ModelArtifact(
                    path=str(data["path"]),
                    round=data.get("round"),
                    sha256=data.get("sha256"),
                    metrics={
                        str(k): float(v)
                        for k, v in (metrics.items() if isinstance(metrics, dict) else [])
                        if isinstance(v, int | float) and not isinstance(v, bool)
                    },
                )
            except ValueError:
                model = None
        ok = data.get("ok")
        rounds = data.get("round")
        return ServerOutcome(
            ok=ok if isinstance(ok, bool) else None,
            reason=str(data.get("reason") or "")[:1000],
            model=model,
            succeeded=ok is True and terminated.get("exitCode") == 0,
            rounds=rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else None,
            history=_server_history(data.get("history")),
            privacy=_privacy(data.get("privacy")),
        )
    return None


def _privacy(data: Any) -> PrivacySpent | None:
    """The termination message's privacy spent (workloads.sdk.privacy.spent); None when
    absent or malformed."""
    if not isinstance(data, dict):
        return None
    try:
        return PrivacySpent.model_validate(
            {
                "mode": data.get("mode"),
                "epsilon": data.get("epsilon"),
                "delta": data.get("delta"),
                "roundEpsilon": data.get("round-epsilon"),
                "rounds": data.get("rounds"),
            }
        )
    except ValueError:
        return None


def model_from_termination_message(pod: Mapping[str, Any] | None) -> ModelArtifact | None:
    """The final model described by the server container's termination message, if any."""
    outcome = outcome_from_termination_message(pod)
    return outcome.model if outcome is not None else None


@dataclass(frozen=True)
class WorkState:
    """A ManifestWork as the hub sees it: conditions plus the client Job's feedback."""

    cluster: str
    name: str
    applied: bool = False
    available: bool = False
    deleting: bool = False
    message: str = ""
    # Applied is False and manifests failed: "Kind name: the cluster's error; ..." (empty
    # while the work agent has not tried, or when it applied everything).
    refused: str = ""
    job: JobState = field(default_factory=JobState)
    spec_hash: str = ""
    uid: str = ""  # the owning resource's uid (label): another uid's work is never ours


def work_state(work: Mapping[str, Any]) -> WorkState:
    """Read a ManifestWork object (namespace = cluster)."""
    meta = work.get("metadata") or {}
    status = work.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or []}

    def is_true(kind: str) -> bool:
        return bool(conds.get(kind, {}).get("status") == "True")

    message = ""
    applied_cond = conds.get("Applied")
    if applied_cond is not None and applied_cond.get("status") != "True":
        message = str(applied_cond.get("message") or applied_cond.get("reason") or "")
    refused = []
    manifests = (status.get("resourceStatus") or {}).get("manifests") or []
    if applied_cond is not None and applied_cond.get("status") == "False":
        for manifest in manifests:
            for c in manifest.get("conditions") or []:
                if c.get("type") == "Applied" and c.get("status") == "False":
                    res = manifest.get("resourceMeta") or {}
                    what = f"{res.get('kind', '?')} {res.get('name', '?')}"
                    refused.append(f"{what}: {c.get('message') or c.get('reason') or ''}")
    values: dict[str, Any] = {}
    for manifest in manifests:
        if (manifest.get("resourceMeta") or {}).get("kind") != "Job":
            continue
        for value in (manifest.get("statusFeedback") or {}).get("values") or []:
            field_value = value.get("fieldValue") or {}
            values[str(value.get("name"))] = (
                field_value.get("integer")
                if "integer" in field_value
                else field_value.get("string", field_value.get("boolean"))
            )
    job = JobState(
        exists=bool(values),
        active=int(values.get(FEEDBACK_ACTIVE) or 0),
        succeeded=int(values.get(FEEDBACK_SUCCEEDED) or values.get("JobSucceeded") or 0),
        failed=int(values.get(FEEDBACK_FAILED) or 0),
        complete=str(values.get("JobComplete")) == "True",
    )
    return WorkState(
        cluster=str(meta.get("namespace")),
        name=str(meta.get("name")),
        applied=is_true("Applied"),
        available=is_true("Available"),
        deleting=bool(meta.get("deletionTimestamp")) or is_true("Deleting"),
        message=message,
        refused="; ".join(refused),
        job=job,
        spec_hash=str((meta.get("annotations") or {}).get(SPEC_HASH_ANNOTATION, "")),
        uid=str((meta.get("labels") or {}).get(constants.LABEL_OWNER_UID, "")),
    )


@dataclass(frozen=True)
class Observations:
    """Everything the fold needs besides the spec and the previous status."""

    placement: PlacementState = field(default_factory=PlacementState)
    resolutions: Sequence[ClusterResolution] = ()
    works: Mapping[str, WorkState] = field(default_factory=dict)
    server_job: JobState = field(default_factory=JobState)
    server_address: str | None = None
    model: ModelArtifact | None = None
    server_reason: str = ""  # the server's own one-line outcome (the app's error on failure)
    server_problem: str = ""  # why the server pod cannot run (ocmfl.podproblem), "" if none
    server_succeeded: bool = False  # a server pod exited 0 with a completed run (ServerOutcome)
    server_rounds: int | None = None  # rounds done, as the server's own log showed them
    server_history: tuple[HistoryEntry, ...] = ()  # per-round values from that log
    privacy: PrivacySpent | None = None  # spent, from the server's termination message
    reports: Mapping[str, ClusterReport] = field(default_factory=dict)
    # cluster -> uid of the other resource whose ManifestWork holds this resource's work name
    # there (never overwritten; "" when the work names no owner)
    conflicts: Mapping[str, str] = field(default_factory=dict)


def observation_digest(obs: Observations) -> str:
    """Short stable digest of the observed inputs, reports excluded (they are folded by time).

    Made from the values' reprs (frozen dataclasses, mappings sorted by key), not asdict +
    JSON: at 3,500 clusters this runs on every pass, and asdict alone took about a second."""

    def sorted_repr(m: Mapping[str, Any]) -> str:
        return repr(sorted(m.items()))

    resolutions = [
        (r.name, r.data_path, r.reason, sorted(r.labels.items())) for r in obs.resolutions
    ]
    text = "\n".join(
        (
            repr(obs.placement),
            repr(resolutions),
            sorted_repr(obs.works),
            repr(obs.server_job),
            repr(obs.server_address),
            repr(obs.model),
            repr(obs.server_reason),
            repr(obs.server_succeeded),
            repr(obs.server_rounds),
            repr(obs.server_history),
            sorted_repr(obs.conflicts),
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ready_clusters(obs: Observations) -> list[str]:
    """Decided clusters with data whose work is Applied (and not being deleted)."""
    out = []
    for r in obs.resolutions:
        work = obs.works.get(r.name)
        if r.has_data and work is not None and work.applied and not work.deleting:
            out.append(r.name)
    return out


def signed_fleet_csr(csr: Mapping[str, Any]) -> tuple[str, str] | None:
    """(CSR uid, federation uid) of a Fleet CSR that holds its certificate, else None. The
    Fleet signer stores the cluster's SuperNode key before it writes the certificate, so a
    signed one means a key to copy to that federation's server; only a signer may write
    `status.certificate`, so one a requester forged never holds it."""
    if not (csr.get("status") or {}).get("certificate"):
        return None
    try:
        request = pki.load_csr_pem(base64.b64decode((csr.get("spec") or {}).get("request", "")))
    except (ValueError, binascii.Error):
        return None
    for uri in pki.uris_of(request):
        try:
            federation, _cluster = pki.parse_fleet_uri(uri)
        except pki.IdentityError:
            continue
        return str((csr.get("metadata") or {}).get("uid", "")), federation
    return None
