"""The agent's view of local FL runs, turned into Report messages for the hub.

Pure apart from the clock: the local HTTP API and the pod/job watcher feed it, and every
change becomes one Report added to the ReportBuffer.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from agent_addon.buffer import ReportBuffer
from agent_addon.phase import RunKey
from ocmfl.reports import (
    MAX_ROUND,
    ROUND_PHASES_BY_NAME,
    ClientPhase,
    ReportInvalid,
    client_log_tail,
    is_valid_namespace,
    is_valid_object_name,
    validate_report,
)
from ocmfl.status.v1 import report_pb2

TERMINAL = (report_pb2.CLIENT_PHASE_SUCCEEDED, report_pb2.CLIENT_PHASE_FAILED)


class BadRequest(ValueError):
    """A POST /v1/metrics body the agent refuses (HTTP 400 with this message)."""


class Forbidden(BadRequest):
    """A client pod posting for a run it does not belong to (HTTP 403 with this message)."""


class Unauthorized(BadRequest):
    """A post without the federation's token (HTTP 401 with this message)."""


@dataclass(frozen=True)
class MetricsPost:
    """One local fit/evaluate result posted by the FL client on this cluster."""

    cluster: str
    round: int
    phase: str  # fit | evaluate
    loss: float | None
    accuracy: float | None
    samples: int
    duration_s: float
    fl_namespace: str
    fl_name: str
    fl_uid: str


def _number(body: Mapping[str, Any], key: str, *, required: bool) -> float | None:
    value = body.get(key)
    if value is None:
        if required:
            raise BadRequest(f"{key}: is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{key}: must be a number")
    f = float(value)
    if math.isnan(f):
        return None  # e.g. a fit step without accuracy
    if math.isinf(f):
        raise BadRequest(f"{key}: must be finite")
    return f


def _int(body: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    value = body.get(key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key}: must be an integer")
    if not lo <= value <= hi:
        raise BadRequest(f"{key}: must be within [{lo}, {hi}]")
    return value


@dataclass(frozen=True)
class PostScope:
    """What a client pod's post is checked against: this agent's `cluster`, the runs active
    here (`runs`: run -> uid, from the watcher) and, when the watcher knows the pod's
    address, the run (and uid) of the pod that sent it (`sender`)."""

    cluster: str
    runs: Mapping[RunKey, str]
    sender: tuple[RunKey, str] | None = None


def run_of_post(body: Mapping[str, Any], scope: PostScope) -> tuple[str, str, str]:
    """(fl_namespace, fl_name, fl_uid) a post from a client pod counts for (see
    parse_metrics_post); BadRequest or Forbidden names the field."""
    cluster, runs, sender = scope.cluster, scope.runs, scope.sender
    sent_cluster = body.get("cluster")
    if sent_cluster is not None and sent_cluster != cluster:
        raise BadRequest(f"cluster: {sent_cluster!r} is not this agent's cluster {cluster!r}")
    ns, name, uid = body.get("fl_namespace"), body.get("fl_name"), body.get("fl_uid") or ""
    if sender is not None:
        (own_ns, own_name), own_uid = sender
        if (ns is not None and ns != own_ns) or (name is not None and name != own_name):
            raise Forbidden(
                f"fl_namespace, fl_name: this client pod belongs to {own_ns}/{own_name}, "
                f"not {ns}/{name}"
            )
        if uid and own_uid and uid != own_uid:
            raise Forbidden(f"fl_uid: this client pod belongs to {own_ns}/{own_name} {own_uid}")
        ns, name, uid = own_ns, own_name, own_uid or uid
    elif ns is None and name is None:
        if len(runs) != 1:
            raise BadRequest(
                "fl_namespace, fl_name: required when this cluster does not run exactly one "
                f"FL client (it runs {len(runs)})"
            )
        (ns, name), uid = next(iter(runs.items()))
        uid = body.get("fl_uid") or uid
    if not isinstance(ns, str) or not is_valid_namespace(ns):
        raise BadRequest("fl_namespace: must be a namespace name")
    if not isinstance(name, str) or not is_valid_object_name(name):
        raise BadRequest("fl_name: must be an object name")
    if not isinstance(uid, str):
        raise BadRequest("fl_uid: must be a string")
    return ns, name, uid


def parse_metrics_post(body: Any, scope: PostScope) -> MetricsPost:
    """Validate a POST /v1/metrics JSON body; BadRequest names the bad field.

    With a `scope.sender`, the post counts for that run only, and naming another is
    Forbidden (one tenant's client cannot write another tenant's status). Otherwise
    `fl_namespace`/`fl_name` may be left out when exactly one run is active here
    (`scope.runs`). `cluster`, when sent, must be this agent's cluster.
    """
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    phase = body.get("phase")
    if phase not in ROUND_PHASES_BY_NAME:
        raise BadRequest("phase: must be 'fit' or 'evaluate'")
    accuracy = _number(body, "accuracy", required=False)
    if accuracy is not None and not 0.0 <= accuracy <= 1.0:
        raise BadRequest("accuracy: must be within [0, 1]")
    duration = _number(body, "duration_s", required=False) or 0.0
    if duration < 0:
        raise BadRequest("duration_s: must not be negative")
    ns, name, uid = run_of_post(body, scope)
    return MetricsPost(
        cluster=scope.cluster,
        round=_int(body, "round", 1, MAX_ROUND),
        phase=phase,
        loss=_number(body, "loss", required=False),
        accuracy=accuracy,
        samples=_int(body, "samples", 0, 2**53),
        duration_s=duration,
        fl_namespace=ns,
        fl_name=name,
        fl_uid=uid,
    )


@dataclass(frozen=True)
class ClientLogPost:
    """The last lines of a client's log, posted by its launcher when its ClientApp raised
    or the client failed (already cut and escaped: ocmfl.reports.client_log_tail)."""

    fl_namespace: str
    fl_name: str
    fl_uid: str
    log: str


def parse_client_log_post(body: Any, scope: PostScope) -> ClientLogPost:
    """Validate a POST /v1/client-log JSON body ({"log": text} plus the run, as for
    metrics); BadRequest names the bad field."""
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    text = body.get("log")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("log: must be a non-empty string")
    ns, name, uid = run_of_post(body, scope)
    return ClientLogPost(ns, name, uid, client_log_tail(text.splitlines()))


@dataclass
class RunState:
    uid: str
    phase: ClientPhase = report_pb2.CLIENT_PHASE_PENDING
    round: int = 0
    final_sent: bool = False
    watched: bool = False  # seen by the pod/job watcher
    problem: str = ""  # why the client pod cannot run (kubelet/scheduler reason)


def _timestamp(now: dt.datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(now)
    return ts


class AgentState:
    """Local runs; each change adds one Report to the buffer."""

    def __init__(
        self,
        cluster: str,
        buffer: ReportBuffer,
        *,
        agent_version: str = "",
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.cluster = cluster
        self.buffer = buffer
        self.agent_version = agent_version
        self.clock = clock
        self.runs: dict[RunKey, RunState] = {}

    def active_runs(self) -> dict[RunKey, str]:
        """Runs whose client has not finished: run -> uid."""
        return {k: r.uid for k, r in self.runs.items() if r.phase not in TERMINAL}

    def _report(self, key: RunKey, run: RunState, **fields: Any) -> report_pb2.Report:
        report = report_pb2.Report(
            cluster=self.cluster,
            fl_namespace=key[0],
            fl_name=key[1],
            fl_uid=run.uid,
            client_phase=run.phase,
            client_problem=run.problem,
            round=run.round,
            agent_version=self.agent_version,
            timestamp=_timestamp(self.clock()),
            sequence=1,
            **fields,
        )
        validate_report(report)  # never queue what the hub would refuse
        return self.buffer.add(report)

    def _run_of(self, post: MetricsPost | ClientLogPost) -> tuple[RunKey, RunState]:
        """The run `post` counts for, and its state: new when the run is unknown here or the
        post names another uid (a run of the same name made again)."""
        key = (post.fl_namespace, post.fl_name)
        run = self.runs.get(key)
        if run is None or (post.fl_uid and run.uid and post.fl_uid != run.uid):
            run = self.runs[key] = RunState(uid=post.fl_uid)
        run.uid = run.uid or post.fl_uid
        return key, run

    def on_metrics(self, post: MetricsPost) -> report_pb2.Report:
        """A client posted local metrics: the run is running; report the row."""
        key, run = self._run_of(post)
        if run.phase not in TERMINAL:
            run.phase = report_pb2.CLIENT_PHASE_RUNNING
        run.round = max(run.round, post.round)
        row = report_pb2.RoundMetrics(
            round=post.round,
            phase=ROUND_PHASES_BY_NAME[post.phase],
            samples=post.samples,
            duration_s=post.duration_s,
        )
        if post.loss is not None:
            row.loss = post.loss
        if post.accuracy is not None:
            row.accuracy = post.accuracy
        extra: dict[str, Any] = {"metrics": [row]}
        if post.phase == "fit":
            extra["data"] = report_pb2.DataSummary(sample_count=post.samples)
        try:
            return self._report(key, run, **extra)
        except ReportInvalid as e:
            raise BadRequest(str(e)) from e

    def on_client_log(self, post: ClientLogPost) -> report_pb2.Report:
        """A client's launcher posted its log tail: report it with the run's current state."""
        key, run = self._run_of(post)
        try:
            return self._report(key, run, client_log=post.log)
        except ReportInvalid as e:
            raise BadRequest(str(e)) from e

    def on_phases(
        self, observed: Mapping[RunKey, tuple[str, ClientPhase, str]]
    ) -> list[report_pb2.Report]:
        """The watcher's full view (run -> (uid, phase, problem)); report what changed.

        A run reaching Succeeded/Failed gets its final report; a run whose client objects
        vanished before finishing gets a final report with its last phase.
        """
        out: list[report_pb2.Report] = []
        for key, (uid, phase, problem) in observed.items():
            run = self.runs.get(key)
            if run is None or (uid and run.uid and uid != run.uid):
                run = self.runs[key] = RunState(uid, report_pb2.CLIENT_PHASE_UNSPECIFIED)
            run.uid = run.uid or uid
            run.watched = True
            if (run.phase, run.problem) == (phase, problem):
                continue
            run.phase, run.problem = phase, problem
            final = phase in TERMINAL and not run.final_sent
            run.final_sent = run.final_sent or final
            out.append(self._report(key, run, final=final))
        for key in [k for k in self.runs if k not in observed]:
            run = self.runs[key]
            if not run.watched or run.final_sent:
                continue  # only known from metrics posts, or already closed
            run.final_sent = True
            out.append(self._report(key, run, final=True))
        return out
