"""Fold everything observed about one resource into its status (pure; no I/O).

Inputs: the spec and the observations (observed.py): the Placement's state, the per-cluster
resolutions (decisions + claims), the ManifestWorks' status (with client Job feedback), the
server Job, the server address, the model artifact and the agents' reports. Output: phase,
conditions, one row per selected cluster. Gates:
- Waiting until >= minAvailableClients clusters are decided with data AND their works are
  Applied; then the server starts (gang admission) and the phase is Running.
- Completed / Failed follow the server Job (Completed already when its pod exited 0 with a
  completed run).
- Failed (ClientsLost) when, after the server started, fewer than minAvailableClients clusters
  stay ready for longer than timeouts.clientsReadySeconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from hub_controller.api import (
    CONDITION_CLIENTS_READY,
    CONDITION_PLACEMENT_SATISFIED,
    CONDITION_SERVER_READY,
    CONDITION_TRAINING_COMPLETE,
    CONDITION_VALIDATED,
    GLOBAL_HISTORY,
    TERMINAL_PHASES,
    ClusterPhase,
    ClusterStatus,
    Condition,
    ConditionStatus,
    FederatedLearningSpec,
    FederatedLearningStatus,
    HistoryEntry,
    Phase,
    data_claim_of,
    run_finished,
)
from hub_controller.membership import ClusterResolution
from hub_controller.operator.desired.server import SERVER_BACKOFF_LIMIT
from hub_controller.operator.observed import Observations, PlacementState, ready_clusters

GLOBAL = GLOBAL_HISTORY  # history rows of the federation as a whole
MAX_HISTORY = 500
# Status stays small at any cluster count (docs/scale.md): at most this many per-cluster rows
# (the worst first beyond it; clusterCounts counts all), at most this many names per message.
MAX_CLUSTER_ROWS = 200
# At most this many rows carry their client log (4 KiB each) in one status.
MAX_ROWS_WITH_LOG = 20
MAX_NAMES = 5
# In the reason of a Left row whose cluster is selected again but has not trained since.
BACK = "back in the placement since"
# Which rows a bounded status keeps first: the clusters that need someone's attention.
_ROW_ORDER = {
    ClusterPhase.FAILED: 0,
    ClusterPhase.BLOCKED: 1,
    ClusterPhase.PENDING: 2,
    ClusterPhase.NO_DATA: 3,
    ClusterPhase.RUNNING: 4,
    ClusterPhase.APPLIED: 5,
    ClusterPhase.SUCCEEDED: 6,
    ClusterPhase.LEFT: 7,
}


def some_names(names: Sequence[str], limit: int = MAX_NAMES) -> str:
    """The first `limit` names, then how many more: a message's size does not grow with N."""
    shown = ", ".join(names[:limit])
    rest = len(names) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown


def bounded_rows(
    rows: Sequence[ClusterStatus], limit: int = MAX_CLUSTER_ROWS
) -> tuple[list[ClusterStatus], dict[str, int]]:
    """(rows to keep, count of all rows by phase): all rows up to `limit`, beyond it the worst
    (Failed, then Blocked, Pending, NoData, ...) `limit` rows, kept in name order."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.phase.value] = counts.get(row.phase.value, 0) + 1
    if len(rows) <= limit:
        return list(rows), counts
    worst = sorted(rows, key=lambda r: (_ROW_ORDER[r.phase], r.name))[:limit]
    return sorted(worst, key=lambda r: r.name), counts


TRACEBACK_START = "Traceback (most recent call last):"


def log_headline(log: str, limit: int = 200) -> str:
    """What a client log says went wrong: the exception line of its last Python traceback
    (the first unindented line after it), else its last non-empty line; cut at `limit`."""
    lines = log.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.strip().endswith(TRACEBACK_START)]
    after = lines[starts[-1] + 1 :] if starts else []
    line = next((ln.strip() for ln in after if ln.strip() and not ln[:1].isspace()), "")
    if not line:
        line = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
    return line if len(line) <= limit else line[:limit] + "..."


def bounded_logs(
    rows: Sequence[ClusterStatus], limit: int = MAX_ROWS_WITH_LOG
) -> list[ClusterStatus]:
    """`rows` with a client log kept on the first `limit` rows that have one (each is up to
    4 KiB of the status; the reason keeps every row's last log line)."""
    out, logs = [], 0
    for row in rows:
        if row.client_log:
            logs += 1
            if logs > limit:
                row = row.model_copy(update={"client_log": None})
        out.append(row)
    return out


def gate_open(spec: FederatedLearningSpec, obs: Observations) -> bool:
    """True when enough clusters are ready for the server to start."""
    return len(ready_clusters(obs)) >= spec.server.min_available_clients


def finished(previous: FederatedLearningStatus | None, generation: int | None) -> bool:
    """The run of this generation ended (api.run_finished on the stored status)."""
    return previous is not None and run_finished(
        previous.phase, previous.observed_generation, generation
    )


def should_start_server(
    spec: FederatedLearningSpec,
    obs: Observations,
    previous: FederatedLearningStatus | None,
    generation: int | None,
) -> bool:
    """Start the server Job once the gate opens; never restart a finished run."""
    if obs.server_job.exists or finished(previous, generation):
        return False
    return obs.server_address is not None and gate_open(spec, obs)


def _condition(
    previous: Iterable[Condition],
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> Condition:
    """A condition that keeps its lastTransitionTime while its status does not change."""
    since = now
    for cond in previous:
        if cond.type == type_ and cond.status.value == status:
            since = cond.last_transition_time
    return Condition(
        type=type_,
        status=ConditionStatus(status),
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def conflict_message(cluster: str, owner_uid: str) -> str:
    """Why a cluster gets no work: its name there belongs to another resource."""
    owner = f"resource uid {owner_uid}" if owner_uid else "no FederatedLearning (no owner uid)"
    return (
        f"WorkConflict: on cluster {cluster} the ManifestWork of this name belongs to {owner}; "
        "it is not overwritten: delete it (or wait for its resource's cleanup)"
    )


def client_problems(obs: Observations) -> dict[str, str]:
    """Cluster -> why its client pod cannot run (the kubelet's or scheduler's reason, from
    its agent's latest report), for clusters with data whose client has not ended."""
    with_data = {r.name for r in obs.resolutions if r.has_data}
    return {
        cluster: report.problem
        for cluster, report in sorted(obs.reports.items())
        if cluster in with_data and report.problem and report.phase not in ("Succeeded", "Failed")
    }


def refused_works(obs: Observations) -> dict[str, str]:
    """Cluster -> the error its cluster gave applying its work, for clusters with data whose
    work was refused (phase Blocked)."""
    with_data = {r.name for r in obs.resolutions if r.has_data}
    return {
        cluster: work.refused
        for cluster, work in sorted(obs.works.items())
        if cluster in with_data and work.refused and not work.applied
    }


def problems_text(problems: Mapping[str, str]) -> str:
    """'c1: ImagePullBackOff: ...; c2: ...' (the first three clusters)."""
    shown = [f"{c}: {p}" for c, p in list(problems.items())[:3]]
    more = len(problems) - len(shown)
    return "; ".join(shown) + (f" (and {more} more cluster(s))" if more > 0 else "")


def counting_down(spec: FederatedLearningSpec, obs: Observations, phase: Phase) -> bool:
    """A running run that fails at a deadline unless things change (too few usable clusters,
    or a server pod that cannot run): the loop must fold again before that deadline."""
    if phase != Phase.RUNNING:
        return False
    job = obs.server_job
    if job.exists and not job.done and obs.server_problem:
        return True
    problems = client_problems(obs)
    usable = [c for c in ready_clusters(obs) if c not in problems]
    return len(usable) < spec.server.min_available_clients


def _since(stamp: str, now: datetime) -> float:
    """Seconds from an RFC 3339 time to now (0 when it cannot be read)."""
    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return max(0.0, (now - then).total_seconds())


def _cluster_row(
    r: ClusterResolution,
    obs: Observations,
    address_known: bool,
    previous: ClusterStatus | None = None,
) -> ClusterStatus:
    """One cluster's row; what the report store lacks (the hub restarted and the agent has not
    sent it since) stays as in `previous`, the row of the same resource's last status."""
    work = obs.works.get(r.name)
    report = obs.reports.get(r.name)
    reason = r.reason
    if report is not None and r.has_data and report.problem:
        reason += f"; client pod cannot run: {report.problem}"
    client_log = (report.client_log if report is not None else "") or (
        previous.client_log if previous is not None else None
    )
    if client_log and r.has_data:
        reason += f"; its client's log says: {log_headline(client_log)} (ocm-fl logs)"
    if not r.has_data:
        phase = ClusterPhase.NO_DATA
    elif work is None:
        phase = ClusterPhase.PENDING
        if r.name in obs.conflicts:
            reason += "; " + conflict_message(r.name, obs.conflicts[r.name])
        elif not address_known:
            reason += "; work waits for the server address"
    elif work.job.failed > 0 and work.job.active == 0 and work.job.succeeded == 0:
        phase = ClusterPhase.FAILED
    elif work.job.succeeded > 0 or work.job.complete:
        phase = ClusterPhase.SUCCEEDED
    elif work.job.active > 0:
        phase = ClusterPhase.RUNNING
    elif work.applied:
        phase = ClusterPhase.APPLIED
    elif work.refused:
        phase = ClusterPhase.BLOCKED
        reason += f"; the cluster refused its work: {work.refused}"
    else:
        phase = ClusterPhase.PENDING
        if work.message:
            reason += f"; work not applied: {work.message}"
    if report is not None and r.has_data and phase in (ClusterPhase.APPLIED, ClusterPhase.PENDING):
        # The agent sees the client before the work's feedback (polled) does.
        reported = {p.value: p for p in ClusterPhase}.get(report.phase)
        if reported in (ClusterPhase.RUNNING, ClusterPhase.SUCCEEDED, ClusterPhase.FAILED):
            phase = reported
    row = ClusterStatus(
        name=r.name,
        phase=phase,
        data_path=r.data_path,
        reason=reason,
        work_applied=bool(work and work.applied),
        client_log=(client_log or None) if r.has_data else None,
    )
    if r.has_data and (report is not None or previous is not None):
        # A restarted hub's store holds only what agents sent since (e.g. an evaluate row
        # without the sample count): what it lacks comes from the last status.
        values = {
            "samples": report.samples if report else None,
            "round": report.round if report else None,
            "loss": report.loss if report else None,
            "accuracy": report.accuracy if report else None,
            "last_report_time": report.last_report_time if report else None,
        }
        if previous is not None:
            values = {k: getattr(previous, k) if v is None else v for k, v in values.items()}
        row = row.model_copy(update=values)
    return row


def _took_part(row: ClusterStatus | None) -> bool:
    """The row of a cluster that trained in this run (it reported a round) or had left."""
    return row is not None and (row.round is not None or row.phase == ClusterPhase.LEFT)


def _as_left(row: ClusterStatus, why: str) -> ClusterStatus:
    """`row` as a Left row, its last values kept."""
    if row.phase == ClusterPhase.LEFT and BACK not in row.reason:
        return row
    return row.model_copy(
        update={
            "phase": ClusterPhase.LEFT,
            "reason": f"left after round {row.round} ({why}); its work is deleted",
            "work_applied": False,
        }
    )


def back_row(left: ClusterStatus, row: ClusterStatus) -> ClusterStatus:
    """The row of a cluster selected again after it left (`left`, its previous row) while
    it has reported no round after the one it left after: still Left, its last values kept,
    the reason saying it is back (`row`, its ordinary row now, gives the work and client
    state). Shown as running, or at Completed as Succeeded, it would claim rounds it did not
    train."""
    return left.model_copy(
        update={
            "reason": f"left after round {left.round}, {BACK}: Left until "
            f"it trains a round of this run again (now {row.phase.value}: {row.reason})",
            "work_applied": row.work_applied,
        }
    )


def _trained_since(row: ClusterStatus, left: ClusterStatus) -> bool:
    """`row` (built from the latest report) has a round after the one `left` was left at."""
    return row.round is not None and (left.round is None or row.round > left.round)


def left_rows(previous: Iterable[ClusterStatus], selected: set[str]) -> list[ClusterStatus]:
    """Rows of clusters that took part in the run (they reported a round) and are no longer
    selected, or still selected but without their data claim: phase Left, their last values
    kept, so the user sees who left and when. A cluster that comes back gets its ordinary row
    again."""
    return [
        _as_left(row, "no longer selected by the placement")
        for row in previous
        if row.name not in selected and _took_part(row)
    ]


def _history(previous: Iterable[HistoryEntry], obs: Observations) -> list[HistoryEntry]:
    """Per-round metrics per cluster (evaluate values over fit values), kept across restarts
    of the report source by merging with the previous status; "global" rows are the
    sample-weighted mean of the clusters' rows of that round. The last MAX_HISTORY rows."""
    previous = list(previous)
    entries = {(e.round, e.cluster): e for e in previous if e.cluster != GLOBAL}
    with_data = {r.name for r in obs.resolutions if r.has_data}
    for cluster, report in obs.reports.items():
        if cluster not in with_data:
            continue
        by_round: dict[int, dict[str, Any]] = {}
        for (rnd, phase), row in sorted(report.rounds.items()):
            cur = by_round.setdefault(rnd, {})
            for metric in ("loss", "accuracy"):
                value = getattr(row, metric)
                if value is not None and (phase == "evaluate" or metric not in cur):
                    cur[metric] = value
            if phase == "fit" or "samples" not in cur:
                cur["samples"] = row.samples or None
        for rnd, values in by_round.items():
            entries[(rnd, cluster)] = HistoryEntry(round=rnd, cluster=cluster, **values)
    rounds: dict[int, list[HistoryEntry]] = {}
    for entry in entries.values():
        rounds.setdefault(entry.round, []).append(entry)
    for rnd, rows in rounds.items():
        mean: dict[str, Any] = {}
        for metric in ("loss", "accuracy"):
            pairs = [(getattr(e, metric), float(e.samples or 1)) for e in rows]
            pairs = [(v, w) for v, w in pairs if v is not None]
            if pairs:
                total = sum(w for _, w in pairs)
                mean[metric] = round(sum(v * w for v, w in pairs) / total, 6)
        samples = sum(e.samples or 0 for e in rows) or None
        if mean:
            entries[(rnd, GLOBAL)] = HistoryEntry(
                round=rnd, cluster=GLOBAL, samples=samples, **mean
            )
    # Rounds no cluster reported (an app without the SDK's metrics): the values of the
    # server's own log (its termination message), kept after the server pod is gone.
    reported = {rnd for rnd, cluster in entries if cluster != GLOBAL}
    from_server = {e.round: e for e in previous if e.cluster == GLOBAL}
    from_server.update({e.round: e for e in obs.server_history})
    for rnd, entry in from_server.items():
        if rnd not in reported:
            entries[(rnd, GLOBAL)] = entry
    ordered = sorted(entries.values(), key=lambda e: (e.round, e.cluster))
    return ordered[-MAX_HISTORY:]


def _accuracy(rows: Iterable[ClusterStatus]) -> float | None:
    """Sample-weighted mean of the clusters' latest accuracy."""
    total = weight = 0.0
    for row in rows:
        if row.accuracy is None:
            continue
        w = float(row.samples or 1)
        total += row.accuracy * w
        weight += w
    return round(total / weight, 4) if weight else None


def fold(
    spec: FederatedLearningSpec,
    generation: int | None,
    obs: Observations,
    previous: FederatedLearningStatus | None,
    now: datetime,
    namespace: str = "",
) -> FederatedLearningStatus:
    """The resource's status from its spec and observations."""
    prev_conds = previous.conditions if previous else []
    min_clients = spec.server.min_available_clients
    problems = client_problems(obs)
    # A cluster whose client pod cannot run (kubelet/scheduler reason) is not ready for
    # training, whatever its work says; the gate to start the server still counts works.
    ready = [c for c in ready_clusters(obs) if c not in problems]
    with_data = [r for r in obs.resolutions if r.has_data]

    def cond(type_: str, status: str, reason: str, message: str) -> Condition:
        return _condition(prev_conds, type_, status, reason, message, now, generation)

    claim, inferred = data_claim_of(spec)
    valid = (
        ("True", "DataClaimFromPlacement", f"spec is valid; spec.client.dataClaim is unset, so "
         f"the data directory comes from ClusterClaim {claim}, the one key the placement "
         "selects with Exists")
        if inferred
        else ("True", "Valid", "spec is valid")
    )  # fmt: skip
    conditions = [cond(CONDITION_VALIDATED, *valid)]
    p_status, p_reason, p_message = placement_condition(obs.placement, spec, namespace)
    conditions.append(cond(CONDITION_PLACEMENT_SATISFIED, p_status, p_reason, p_message))

    missing = [r for r in obs.resolutions if not r.has_data]
    detail = f"{len(ready)}/{min_clients} required clusters ready"
    if missing:
        detail += f"; without data: {some_names([r.name for r in missing])}"
    ready_set = set(ready)
    refused = refused_works(obs)
    not_applied = [
        r.name
        for r in with_data
        if r.name not in ready_set and r.name not in problems and r.name not in refused
    ]
    if not_applied:
        detail += f"; work not yet applied on: {some_names(not_applied)}"
    if refused:
        detail += f"; work refused by {problems_text(refused)}"
    if problems:
        detail += f"; client pod cannot run on {problems_text(problems)}"
    with_data_names = {r.name for r in with_data}
    taken = sorted(c for c in obs.conflicts if c in with_data_names)
    if taken:
        detail += f"; {conflict_message(taken[0], obs.conflicts[taken[0]])}"
        if len(taken) > 1:
            detail += f" (and on {len(taken) - 1} more cluster(s))"
    enough = len(ready) >= min_clients
    clients_ready = cond(
        CONDITION_CLIENTS_READY,
        "True" if enough else "False",
        "EnoughClients" if enough else "WaitingForClients",
        detail,
    )
    conditions.append(clients_ready)

    job = obs.server_job
    # Its pod's exit says it first; the Job's Complete condition follows about a second later.
    complete = job.complete or obs.server_succeeded
    failure = obs.server_reason or job.message or "server Job failed"
    if problems:
        failure += f"; client pod cannot run on {problems_text(problems)}"
    # The server pod cannot run (ErrImagePull, Unschedulable, ...): shown at once, and the run
    # fails once it has not started for timeouts.clientsReadySeconds (clients cannot connect).
    stuck = job.exists and not job.done and bool(obs.server_problem)
    stuck_limit = spec.server.timeouts.clients_ready_seconds
    stuck_too_long = stuck and _since(job.started, now) > stuck_limit
    if obs.server_address is None:
        server = (
            "False",
            "NoAddress",
            "waiting for a LoadBalancer ingress on the server "
            "Service; set spec.server.advertiseAddress if the hub has no load balancer",
        )
    elif complete:
        server = ("True", "Completed", f"server finished; clients dial {obs.server_address}")
    elif job.failed_condition:
        server = ("False", "ServerFailed", failure)
    elif stuck:
        server = (
            "False",
            obs.server_problem.split(":", 1)[0],
            f"server pod cannot run: {obs.server_problem}",
        )
    elif job.exists and job.failed:
        # A server pod died without a verdict (killed, OOM, node lost): the Job replaces it
        # and the new pod resumes from the last checkpoint.
        server = (
            "True",
            "Restarted",
            f"server pod replaced after {job.failed} failure(s) (the Job retries up to "
            f"{SERVER_BACKOFF_LIMIT}); resuming from the last checkpoint; clients dial "
            f"{obs.server_address}",
        )
    elif job.exists:
        server = ("True", "Running", f"server Job running; clients dial {obs.server_address}")
    else:
        server = ("False", "NotStarted", f"server starts when {min_clients} cluster(s) are ready")
    conditions.append(cond(CONDITION_SERVER_READY, *server))

    phase: Phase
    message: str
    if complete:
        phase, message = Phase.COMPLETED, "training completed"
        training = ("True", "Succeeded", message)
    elif job.failed_condition:
        phase, message = Phase.FAILED, f"server failed: {failure}"
        training = ("False", "ServerFailed", message)
    elif stuck_too_long:
        phase = Phase.FAILED
        message = (
            f"server pod did not start within {stuck_limit}s (timeouts.clientsReadySeconds): "
            f"{obs.server_problem}"
        )
        training = ("False", "ServerNotRunning", message)
    elif job.exists:
        lost_for = (now - clients_ready.last_transition_time).total_seconds()
        limit = spec.server.timeouts.clients_ready_seconds
        # What keeps the missing clusters away, for both messages of too few clusters.
        blocked = ""
        if problems:
            blocked += f"; client pod cannot run on {problems_text(problems)}"
        if refused:
            blocked += f"; work refused by {problems_text(refused)}"
        if enough:
            phase, message = Phase.RUNNING, f"training with {len(ready)} cluster(s)"
            training = ("False", "InProgress", message)
        elif lost_for > limit:
            phase = Phase.FAILED
            message = (
                f"only {len(ready)} of {min_clients} required clusters ready for over {limit}s "
                "(timeouts.clientsReadySeconds): bring clusters back or lower "
                "minAvailableClients, then recreate the resource"
            )
            message += blocked
            training = ("False", "ClientsLost", message)
        else:
            phase = Phase.RUNNING
            message = (
                f"only {len(ready)} of {min_clients} required clusters ready; failing in "
                f"{int(limit - lost_for)}s unless clusters return"
            )
            message += blocked
            training = ("False", "InProgress", message)
    else:
        started = obs.placement.satisfied is not None or bool(obs.resolutions)
        phase = Phase.WAITING if started else Phase.PENDING
        message = f"waiting: {detail}" if started else "waiting for the placement decision"
        if obs.placement.missing_binding:
            message = p_message
        training = ("False", "NotStarted", message)

    # Terminal phases stick for a generation (a Job that disappears does not undo them).
    if previous is not None and finished(previous, generation) and phase not in TERMINAL_PHASES:
        phase, message = previous.phase, previous.message
        for c in prev_conds:
            if c.type == CONDITION_TRAINING_COMPLETE:
                training = (c.status.value, c.reason, c.message)
    conditions.append(cond(CONDITION_TRAINING_COMPLETE, *training))

    prev_rows = {row.name: row for row in previous.clusters} if previous else {}
    rows = []
    for r in obs.resolutions:
        prev_row = prev_rows.get(r.name)
        if not r.has_data and _took_part(prev_row):
            assert prev_row is not None
            rows.append(_as_left(prev_row, r.reason))
            continue
        row = _cluster_row(r, obs, obs.server_address is not None, prev_row)
        if (
            prev_row is not None
            and prev_row.phase == ClusterPhase.LEFT
            and not _trained_since(row, prev_row)
        ):
            row = back_row(prev_row, row)
        rows.append(row)
    rows += left_rows(prev_rows.values(), {r.name for r in obs.resolutions})
    if phase == Phase.COMPLETED:
        # The run ended well: a client still seen running (its Job feedback and the agent's
        # last report lag behind) took part to the end.
        rows = [
            r.model_copy(update={"phase": ClusterPhase.SUCCEEDED})
            if r.phase in (ClusterPhase.RUNNING, ClusterPhase.APPLIED)
            else r
            for r in rows
        ]
    kept, counts = bounded_rows(rows)
    kept = bounded_logs(kept)
    rounds = [row.round for row in rows if row.round is not None]
    model = obs.model or (previous.model if previous else None)
    current_round = max(rounds, default=previous.round if previous else 0)
    if model is not None and model.round is not None:
        current_round = max(current_round, model.round)
    if obs.server_rounds is not None and phase in TERMINAL_PHASES:  # an app without the SDK's store
        current_round = max(current_round, obs.server_rounds)
    return FederatedLearningStatus(
        phase=phase,
        conditions=conditions,
        observed_generation=generation,
        round=current_round,
        total_rounds=spec.server.rounds,
        clients=f"{len(ready)}/{len(obs.resolutions)}",
        accuracy=_accuracy(rows),
        clusters=kept,
        cluster_counts=counts,
        clusters_omitted=len(rows) - len(kept),
        model=model,
        privacy=obs.privacy or (previous.privacy if previous else None),
        history=_history(previous.history if previous else [], obs),
        message=message,
    )


def invalid_status(
    problems: Sequence[str],
    generation: int | None,
    previous: FederatedLearningStatus | None,
    now: datetime,
    reason: str = "InvalidSpec",
) -> FederatedLearningStatus:
    """Status of a resource whose spec the controller refuses (reason InvalidSpec, or
    PolicyViolation: the namespace's FederationPolicy refuses it), or whose run stopped
    because the apiserver refused an object the controller built (ObjectRefused): Failed."""
    what = {
        "InvalidSpec": "invalid spec: ",
        "ObjectRefused": "",  # the message names the object
        "NamespaceNotServed": "",  # the message names the namespace and the Helm value
    }.get(reason, "refused by the namespace's policy: ")
    message = what + "; ".join(problems)
    prev_conds = previous.conditions if previous else []
    return FederatedLearningStatus(
        phase=Phase.FAILED,
        conditions=[
            _condition(prev_conds, CONDITION_VALIDATED, "False", reason, message, now, generation)
        ],
        observed_generation=generation,
        message=message,
    )


def status_body(status: FederatedLearningStatus) -> dict[str, Any]:
    """The status as JSON for the API (camelCase, unset fields left out)."""
    body: dict[str, Any] = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    return body


def status_patch(new: FederatedLearningStatus, current: Mapping[str, Any] | None) -> dict[str, Any]:
    """JSON merge patch turning `current` into `new`: keys that disappear are set to None, at
    every depth (a merge patch merges objects: clusterCounts {"Pending": 3} patched with
    {"Applied": 3} would keep the Pending count).

    Empty when nothing changes, so callers can skip the write.
    """
    return _merge_diff(dict(current or {}), status_body(new))


def _merge_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if before == value:
            continue
        both = isinstance(before, Mapping) and isinstance(value, Mapping)
        patch[key] = _merge_diff(before, value) if both else value  # type: ignore[arg-type]
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def parse_status(raw: Mapping[str, Any] | None) -> FederatedLearningStatus | None:
    """The stored status, or None when absent or unreadable (e.g. written by an older version)."""
    if not raw:
        return None
    try:
        return FederatedLearningStatus.model_validate(dict(raw))
    except ValueError:
        return None


def placement_condition(
    state: PlacementState, spec: FederatedLearningSpec, namespace: str
) -> tuple[str, str, str]:
    """(status, reason, message) for the resource's PlacementSatisfied condition."""
    if not state.exists:
        return "Unknown", "PlacementPending", "Placement not created yet"
    if state.satisfied is None:
        return "Unknown", "PlacementPending", "waiting for the OCM placement controller"
    if state.missing_binding:
        sets = spec.client.placement.cluster_sets or ["<any set>"]
        return (
            "False",
            "NoManagedClusterSetBindings",
            f"no ManagedClusterSetBinding in namespace {namespace} for cluster set(s) "
            f"{', '.join(sets)}: a hub admin must bind them (e.g. `clusteradm clusterset bind "
            f"{sets[0]} --namespace {namespace}`); the controller never creates bindings",
        )
    reason = state.reason or ("Satisfied" if state.satisfied == "True" else "NotSatisfied")
    return state.satisfied, reason, state.message
