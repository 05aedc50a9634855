"""Status fold: phases, gates, conditions and per-cluster rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fl_fixtures import spec

from hub_controller.api import ClusterPhase, FederatedLearningStatus, HistoryEntry, Phase
from hub_controller.membership import ClusterResolution
from hub_controller.operator.fold import (
    fold,
    invalid_status,
    parse_status,
    should_start_server,
    status_body,
    status_patch,
)
from hub_controller.operator.observed import (
    JobState,
    Observations,
    PlacementState,
    WorkState,
    observation_digest,
    work_state,
)
from hub_controller.reports import ClusterReport, RoundRow

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SATISFIED = PlacementState(exists=True, satisfied="True", reason="AllDecisionsScheduled")
A = ClusterResolution("a", "/srv/a", "why a")
B = ClusterResolution("b", "/srv/b", "why b")
C = ClusterResolution("c", None, "no claim")
ADDR = "127.0.0.1:9443"


def _applied(*names: str, active: int = 0) -> dict[str, WorkState]:
    job = JobState(exists=active > 0, active=active)
    return {n: WorkState(cluster=n, name="w", applied=True, job=job) for n in names}


def _obs(**kw: object) -> Observations:
    base: dict[str, object] = {
        "placement": SATISFIED,
        "resolutions": (A, B, C),
        "server_address": ADDR,
    }
    base.update(kw)
    return Observations(**base)  # type: ignore[arg-type]


def Report(
    cluster: str,
    when: datetime,
    phase: str = "Running",
    *,
    round: int = 0,
    samples: int | None = None,
    loss: float | None = None,
    accuracy: float | None = None,
    rounds: dict[tuple[int, str], RoundRow] | None = None,
) -> ClusterReport:
    """A cluster's report state as the aggregator's store would hold it."""
    report = ClusterReport(cluster, "uid", when, phase=phase, round=round, sample_count=samples)
    if loss is not None or accuracy is not None:
        report.add_row(RoundRow(round, "evaluate", loss=loss, accuracy=accuracy))
    for row in (rounds or {}).values():
        report.add_row(row)
    return report


def _cond(status: FederatedLearningStatus, type_: str) -> tuple[str, str]:
    [c] = [c for c in status.conditions if c.type == type_]
    return c.status.value, c.reason


def test_nothing_decided_yet_is_pending() -> None:
    st = fold(spec(), 1, Observations(), None, T0)
    assert st.phase == Phase.PENDING
    assert _cond(st, "Validated") == ("True", "Valid")


def test_waiting_until_enough_clusters_have_data_and_applied_works() -> None:
    st = fold(spec(), 1, _obs(works=_applied("a")), None, T0)
    assert st.phase == Phase.WAITING
    assert st.clients == "1/3"
    assert _cond(st, "ClientsReady") == ("False", "WaitingForClients")
    assert "without data: c" in st.message
    assert not should_start_server(spec(), _obs(works=_applied("a")), None, 1)


def test_gate_opens_when_min_clusters_are_applied() -> None:
    obs = _obs(works=_applied("a", "b"))
    assert should_start_server(spec(), obs, None, 1)
    st = fold(spec(), 1, obs, None, T0)
    assert _cond(st, "ClientsReady") == ("True", "EnoughClients")
    assert _cond(st, "ServerReady") == ("False", "NotStarted")


def test_server_does_not_start_without_an_address() -> None:
    obs = _obs(works=_applied("a", "b"), server_address=None)
    assert not should_start_server(spec(), obs, None, 1)
    st = fold(spec(), 1, obs, None, T0)
    assert _cond(st, "ServerReady") == ("False", "NoAddress")


def test_running_once_the_server_job_exists() -> None:
    obs = _obs(works=_applied("a", "b", active=1), server_job=JobState(exists=True, active=1))
    st = fold(spec(), 1, obs, None, T0)
    assert st.phase == Phase.RUNNING
    assert _cond(st, "ServerReady") == ("True", "Running")
    assert [r.phase for r in st.clusters] == [
        ClusterPhase.RUNNING,
        ClusterPhase.RUNNING,
        ClusterPhase.NO_DATA,
    ]
    assert st.clusters[2].reason == "no claim"
    assert st.clusters[0].work_applied and st.clusters[0].data_path == "/srv/a"
    assert not should_start_server(spec(), obs, None, 1)


def test_a_replaced_server_pod_keeps_the_run_running_and_says_so() -> None:
    # The killed pod failed (counted), the Job's new pod runs: not a failed run.
    obs = _obs(works=_applied("a", "b", active=1), server_job=JobState(exists=True, failed=1))
    st = fold(spec(), 1, obs, None, T0)
    assert st.phase == Phase.RUNNING
    assert _cond(st, "ServerReady") == ("True", "Restarted")
    server = next(c for c in st.conditions if c.type == "ServerReady")
    assert "replaced after 1 failure(s)" in server.message
    assert "resuming from the last checkpoint" in server.message
    # Once the Job gives up, the run fails as before.
    gave_up = JobState(exists=True, failed=4, failed_condition=True, message="BackoffLimitExceeded")
    st = fold(spec(), 1, _obs(works=_applied("a", "b"), server_job=gave_up), st, T0)
    assert st.phase == Phase.FAILED and "BackoffLimitExceeded" in st.message


def test_completed_and_failed_follow_the_server_job() -> None:
    done = _obs(works=_applied("a", "b"), server_job=JobState(exists=True, complete=True))
    st = fold(spec(), 1, done, None, T0)
    assert st.phase == Phase.COMPLETED
    assert _cond(st, "TrainingComplete") == ("True", "Succeeded")
    # the clients' Job feedback lags behind: a completed run's clients took part to the end
    assert [r.phase for r in st.clusters] == [
        ClusterPhase.SUCCEEDED,
        ClusterPhase.SUCCEEDED,
        ClusterPhase.NO_DATA,
    ]
    failed = _obs(
        works=_applied("a", "b"),
        server_job=JobState(exists=True, failed_condition=True, message="exit 1"),
    )
    st = fold(spec(), 1, failed, None, T0)
    assert st.phase == Phase.FAILED and "exit 1" in st.message


def test_completed_as_soon_as_the_server_pod_exits_with_a_completed_run() -> None:
    # The Job controller marks the Job Complete about a second after its pod exited 0; the
    # pod's own exit (with the launcher's "completed" verdict) is already final.
    running = JobState(exists=True, active=1)
    exited = _obs(works=_applied("a", "b"), server_job=running, server_succeeded=True)
    st = fold(spec(), 1, exited, None, T0)
    assert st.phase == Phase.COMPLETED
    assert _cond(st, "ServerReady") == ("True", "Completed")
    # Until then it is running.
    st = fold(spec(), 1, _obs(works=_applied("a", "b"), server_job=running), None, T0)
    assert st.phase == Phase.RUNNING


def test_an_app_without_the_sdk_shows_its_rounds_and_history_from_the_servers_log() -> None:
    """`kubectl get fl` reads 3/3 for a finished three-round app that posts no metrics."""
    server_rows = tuple(
        HistoryEntry(round=r, cluster="global", loss=1.0 / r, accuracy=a)
        for r, a in ((1, 0.3), (2, 0.6), (3, 0.9))
    )
    done = JobState(exists=True, complete=True)
    obs = _obs(works=_applied("a", "b"), server_job=done, server_rounds=3,
               server_history=server_rows)  # fmt: skip
    st = fold(spec(rounds=3), 1, obs, None, T0)
    assert (st.phase, st.round, st.total_rounds) == (Phase.COMPLETED, 3, 3)
    assert [(h.round, h.cluster, h.accuracy) for h in st.history] == [
        (1, "global", 0.3),
        (2, "global", 0.6),
        (3, "global", 0.9),
    ]
    # Kept once the server pod (its termination message) is gone.
    later = fold(spec(rounds=3), 1, _obs(works=_applied("a", "b"), server_job=done), st, T0)
    assert later.history == st.history and later.round == 3
    # While it runs, the log's round count does not claim rounds not yet done.
    running = _obs(works=_applied("a", "b"), server_job=JobState(exists=True, active=1),
                   server_rounds=2)  # fmt: skip
    assert fold(spec(rounds=3), 1, running, None, T0).round == 0


def test_too_few_clients_for_longer_than_the_timeout_fails() -> None:
    running = _obs(works=_applied("a", "b"), server_job=JobState(exists=True, active=1))
    s = spec(timeouts={"clientsReadySeconds": 60})
    st = fold(s, 1, running, None, T0)
    lost = _obs(works=_applied("a"), server_job=JobState(exists=True, active=1))
    st = fold(s, 1, lost, st, T0 + timedelta(seconds=10))
    assert st.phase == Phase.RUNNING and "failing in" in st.message
    st = fold(s, 1, lost, st, T0 + timedelta(seconds=30))
    assert st.phase == Phase.RUNNING
    st = fold(s, 1, lost, st, T0 + timedelta(seconds=75))
    assert st.phase == Phase.FAILED
    assert _cond(st, "TrainingComplete") == ("False", "ClientsLost")


def test_terminal_phase_sticks_for_the_generation() -> None:
    done = fold(spec(), 4, _obs(server_job=JobState(exists=True, complete=True)), None, T0)
    after = fold(spec(), 4, _obs(), done, T0 + timedelta(seconds=5))
    assert after.phase == Phase.COMPLETED
    assert not should_start_server(spec(), _obs(works=_applied("a", "b")), after, 4)


def test_condition_keeps_its_transition_time_while_unchanged() -> None:
    st1 = fold(spec(), 1, _obs(), None, T0)
    st2 = fold(spec(), 1, _obs(), st1, T0 + timedelta(minutes=5))
    assert [c.last_transition_time for c in st2.conditions] == [T0] * len(st2.conditions)


def test_missing_binding_is_the_message() -> None:
    blocked = PlacementState(exists=True, satisfied="False", reason="NoManagedClusterSetBindings")
    st = fold(spec(), 1, Observations(placement=blocked), None, T0, "team-a")
    assert st.phase == Phase.WAITING
    assert _cond(st, "PlacementSatisfied") == ("False", "NoManagedClusterSetBindings")
    assert "--namespace team-a" in st.message


def test_agent_reports_fill_rows_round_and_weighted_accuracy() -> None:
    reports = {
        "a": Report("a", T0, "Running", round=2, samples=300, loss=0.5, accuracy=0.9),
        "b": Report("b", T0, "Running", round=1, samples=100, loss=0.7, accuracy=0.5),
        "c": Report("c", T0, "Running", round=9, accuracy=0.0),  # no data: ignored
    }
    obs = _obs(works=_applied("a", "b"), server_job=JobState(exists=True), reports=reports)
    st = fold(spec(), 1, obs, None, T0)
    assert st.round == 2 and st.total_rounds == 3
    assert st.accuracy == 0.8
    assert st.clusters[0].samples == 300 and st.clusters[0].last_report_time == T0
    assert st.clusters[0].phase == ClusterPhase.RUNNING  # from the report: feedback lags


def test_invalid_spec_status_is_failed_with_validated_false() -> None:
    st = invalid_status(["spec.server.rounds: too small"], 2, None, T0)
    assert st.phase == Phase.FAILED
    assert _cond(st, "Validated") == ("False", "InvalidSpec")
    assert "spec.server.rounds" in st.message


def test_status_patch_is_empty_when_nothing_changed_and_removes_dropped_keys() -> None:
    st = fold(spec(), 1, _obs(), None, T0)
    body = status_body(st)
    assert status_patch(st, body) == {}
    assert status_patch(st, {**body, "model": {"path": "/x"}}) == {"model": None}
    assert parse_status(body) == st
    assert parse_status({"phase": "Nonsense"}) is None


def test_work_state_reads_conditions_and_job_feedback() -> None:
    work = {
        "metadata": {"name": "w", "namespace": "c1"},
        "status": {
            "conditions": [
                {"type": "Applied", "status": "True"},
                {"type": "Available", "status": "True"},
            ],
            "resourceStatus": {
                "manifests": [
                    {
                        "resourceMeta": {"kind": "Job", "name": "fl-client-1"},
                        "statusFeedback": {
                            "values": [
                                {"name": "active", "fieldValue": {"type": "Integer", "integer": 1}},
                                {
                                    "name": "JobComplete",
                                    "fieldValue": {"type": "String", "string": "False"},
                                },
                            ]
                        },
                    }
                ]
            },
        },
    }
    ws = work_state(work)
    assert ws.cluster == "c1" and ws.applied and ws.available
    assert ws.job.active == 1 and not ws.job.complete


def test_digest_changes_with_inputs_but_not_with_reports() -> None:
    base = _obs(works=_applied("a"))
    assert observation_digest(base) == observation_digest(_obs(works=_applied("a")))
    assert observation_digest(base) != observation_digest(_obs(works=_applied("a", "b")))
    with_reports = _obs(works=_applied("a"), reports={"a": Report("a", T0)})
    assert observation_digest(base) == observation_digest(with_reports)


def test_history_has_per_cluster_rounds_and_a_global_weighted_row() -> None:
    reports = {
        "a": Report(
            "a",
            T0,
            round=1,
            rounds={
                (1, "fit"): RoundRow(1, "fit", loss=0.9, samples=300),
                (1, "evaluate"): RoundRow(1, "evaluate", loss=0.4, accuracy=0.9, samples=30),
            },
        ),
        "b": Report(
            "b", T0, round=1, rounds={(1, "evaluate"): RoundRow(1, accuracy=0.5, samples=100)}
        ),
    }
    obs = _obs(works=_applied("a", "b"), server_job=JobState(exists=True), reports=reports)
    st = fold(spec(), 1, obs, None, T0)
    rows = {(h.round, h.cluster): h for h in st.history}
    assert rows[(1, "a")].loss == 0.4 and rows[(1, "a")].accuracy == 0.9
    assert rows[(1, "a")].samples == 300  # training samples come from the fit step
    assert rows[(1, "global")].accuracy == 0.8
    # a restarted aggregator (no reports) keeps what the status already recorded
    again = fold(spec(), 1, _obs(works=_applied("a", "b")), st, T0)
    assert again.history == st.history


def test_the_run_ended_rule_is_terminal_phase_for_the_current_generation() -> None:
    from hub_controller.api import run_finished

    assert run_finished("Completed", 3, 3) and run_finished("Failed", 3, 3)
    assert not run_finished("Running", 3, 3)
    assert not run_finished("Completed", 2, 3)  # a new spec generation: not decided yet
    assert run_finished("Completed", None, 3)  # a status that names no generation


REFUSED_WORK = {
    "metadata": {"name": "w", "namespace": "a"},
    "status": {
        "conditions": [
            {
                "type": "Applied",
                "status": "False",
                "reason": "AppliedManifestWorkFailed",
                "message": "Failed to apply manifest work",
            }
        ],
        "resourceStatus": {
            "manifests": [
                {
                    "resourceMeta": {"kind": "Namespace", "name": "fl-x"},
                    "conditions": [{"type": "Applied", "status": "True"}],
                },
                {
                    "resourceMeta": {"kind": "Job", "name": "fl-client"},
                    "conditions": [
                        {
                            "type": "Applied",
                            "status": "False",
                            "reason": "AppliedManifestFailed",
                            "message": 'Job.batch "fl-client" is invalid: metadata.labels: '
                            "Invalid value: must be no more than 63 characters",
                        }
                    ],
                },
            ]
        },
    },
}


def test_a_work_the_cluster_refuses_makes_its_row_blocked_and_the_message_names_it() -> None:
    refused = work_state(REFUSED_WORK)
    assert not refused.applied
    assert refused.refused.startswith('Job fl-client: Job.batch "fl-client" is invalid')
    assert "Namespace" not in refused.refused  # only what failed
    st = fold(spec(), 1, _obs(works={**_applied("b"), "a": refused}), None, T0)
    rows = {r.name: r for r in st.clusters}
    assert rows["a"].phase == ClusterPhase.BLOCKED
    assert "the cluster refused its work: Job fl-client:" in rows["a"].reason
    assert "63 characters" in rows["a"].reason
    assert rows["b"].phase == ClusterPhase.APPLIED
    assert st.phase == Phase.WAITING
    assert "work refused by a: Job fl-client:" in st.message
    assert "not yet applied" not in st.message


def test_blocked_rows_are_among_the_worst_kept_when_rows_are_bounded() -> None:
    from hub_controller.api import ClusterStatus
    from hub_controller.operator.fold import bounded_rows

    rows = [ClusterStatus(name=f"c{i}", phase=ClusterPhase.RUNNING) for i in range(5)]
    rows.append(ClusterStatus(name="z", phase=ClusterPhase.BLOCKED))
    kept, counts = bounded_rows(rows, limit=2)
    assert [r.name for r in kept] == ["c0", "z"] and counts == {"Running": 5, "Blocked": 1}


def test_a_work_not_yet_tried_is_pending_not_blocked() -> None:
    waiting = work_state({"metadata": {"name": "w", "namespace": "a"}, "status": {}})
    assert waiting.refused == ""
    st = fold(spec(), 1, _obs(works={"a": waiting}), None, T0)
    assert {r.name: r.phase for r in st.clusters}["a"] == ClusterPhase.PENDING
    assert "work not yet applied on: a" in st.message
