"""Drill 11's pure parts: the kubelet's reason from a pod, on the server condition and on a
cluster's row, and the run failing at timeouts.clientsReadySeconds naming it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fl_fixtures import spec

from agent_addon.phase import phases_by_run
from agent_addon.state import AgentState
from hub_controller.api import Phase
from hub_controller.membership import ClusterResolution
from hub_controller.operator.fold import fold
from hub_controller.operator.observed import (
    JobState,
    Observations,
    PlacementState,
    WorkState,
    server_pod_state,
)
from hub_controller.reports import ClusterReport
from ocmfl import constants
from ocmfl.podproblem import first_problem, pod_problem
from ocmfl.reports import validate_report
from ocmfl.status.v1 import report_pb2

T0 = datetime(2026, 1, 1, tzinfo=UTC)
A = ClusterResolution("a", "/srv/a", "why a")
B = ClusterResolution("b", "/srv/b", "why b")
SATISFIED = PlacementState(exists=True, satisfied="True", reason="AllDecisionsScheduled")


def _pod(
    waiting: str = "",
    message: str = "",
    *,
    unschedulable: bool = False,
    phase: str = "Pending",
    created: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if unschedulable:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/1 nodes are available"}
        ]  # fmt: skip
    if waiting:
        status["containerStatuses"] = [
            {"name": "server", "state": {"waiting": {"reason": waiting, "message": message}}}
        ]
    labels = {
        constants.LABEL_OWNER_NAMESPACE: "ns",
        constants.LABEL_OWNER_NAME: "fl",
        constants.LABEL_OWNER_UID: "u1",
    }
    return {"metadata": {"labels": labels, "creationTimestamp": created}, "status": status}


def test_the_kubelets_and_schedulers_reasons_are_problems_progress_is_not() -> None:
    assert pod_problem(_pod("ErrImagePull", "image 'x' not found")) == (
        "ErrImagePull: container server: image 'x' not found"
    )
    assert pod_problem(_pod("CrashLoopBackOff")).startswith("CrashLoopBackOff")
    assert pod_problem(_pod(unschedulable=True)) == "Unschedulable: 0/1 nodes are available"
    assert pod_problem(_pod("ContainerCreating")) == ""
    assert pod_problem(_pod("ErrImagePull", phase="Failed")) == ""  # ended: not stuck
    newest = first_problem([_pod("ErrImagePull"), _pod("ImagePullBackOff", created="2026-02-01")])
    assert newest.startswith("ImagePullBackOff")
    assert len(pod_problem(_pod("ErrImagePull", "x" * 5000))) == 512


def test_the_agent_reports_a_client_problem_and_its_clearing() -> None:
    from agent_addon.buffer import ReportBuffer

    state = AgentState("c1", ReportBuffer())
    [stuck] = state.on_phases(phases_by_run([_pod("ImagePullBackOff", "back-off")], []))
    assert stuck.client_problem == "ImagePullBackOff: container server: back-off"
    validate_report(stuck)
    [cleared] = state.on_phases(phases_by_run([_pod(phase="Running")], []))
    assert cleared.client_problem == ""
    long = report_pb2.Report()
    long.CopyFrom(stuck)
    long.client_problem = "x" * 513
    with pytest.raises(ValueError, match="client_problem"):
        validate_report(long)


def _server_obs(problem: str, started: datetime) -> Observations:
    works = {n: WorkState(cluster=n, name="w", applied=True) for n in ("a", "b")}
    job = JobState(exists=True, active=1, started=started.isoformat().replace("+00:00", "Z"))
    return Observations(
        placement=SATISFIED, resolutions=(A, B), works=works, server_job=job,
        server_address="10.0.0.1:9443", server_problem=problem,
    )  # fmt: skip


def test_a_server_pod_that_cannot_run_shows_the_reason_then_fails_at_the_timeout() -> None:
    s = spec(timeouts={"clientsReadySeconds": 30})
    pod = _pod("ImagePullBackOff", 'Back-off pulling image "nope"')
    problem = server_pod_state(pod)
    assert problem is not None and problem.problem.startswith("ImagePullBackOff")
    early = fold(s, 1, _server_obs(problem.problem, T0), None, T0 + timedelta(seconds=5))
    [cond] = [c for c in early.conditions if c.type == "ServerReady"]
    assert (cond.status.value, cond.reason) == ("False", "ImagePullBackOff")
    assert "nope" in cond.message
    assert early.phase == Phase.RUNNING
    late = fold(s, 1, _server_obs(problem.problem, T0), early, T0 + timedelta(seconds=31))
    assert late.phase == Phase.FAILED
    assert "ImagePullBackOff" in late.message and "30s" in late.message


def test_a_cluster_whose_client_cannot_run_is_named_on_its_row_and_in_the_failure() -> None:
    s = spec(timeouts={"clientsReadySeconds": 30})
    works = {n: WorkState(cluster=n, name="w", applied=True) for n in ("a", "b")}
    stuck = ClusterReport("b", "u1", T0, phase="Pending", problem="Unschedulable: 0/1 nodes")
    obs = Observations(
        placement=SATISFIED, resolutions=(A, B), works=works,
        server_job=JobState(exists=True, active=1), server_address="10.0.0.1:9443",
        reports={"b": stuck},
    )  # fmt: skip
    first = fold(s, 1, obs, None, T0)
    rows = {r.name: r for r in first.clusters}
    assert "Unschedulable: 0/1 nodes" in rows["b"].reason
    assert "Unschedulable" not in rows["a"].reason
    assert first.clients == "1/2"
    later = fold(s, 1, obs, first, T0 + timedelta(seconds=31))
    assert later.phase == Phase.FAILED
    assert "b: Unschedulable: 0/1 nodes" in later.message


def test_the_loop_folds_again_while_a_stuck_pod_counts_down() -> None:
    from hub_controller.operator.fold import counting_down

    s = spec(timeouts={"clientsReadySeconds": 30})
    assert counting_down(s, _server_obs("ErrImagePull: x", T0), Phase.RUNNING)
    assert not counting_down(s, _server_obs("", T0), Phase.RUNNING)
    assert not counting_down(s, _server_obs("ErrImagePull: x", T0), Phase.FAILED)
