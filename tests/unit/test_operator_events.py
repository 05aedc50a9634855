"""The Events a reconcile pass posts on the resource (hub_controller.operator.events)."""

from __future__ import annotations

from hub_controller.api import ClusterPhase, ClusterStatus, FederatedLearningStatus, Phase
from hub_controller.operator.events import NAMED_PER_EVENT, StoryEvent, story


def _status(phase: Phase, message: str = "", **rows: ClusterPhase) -> FederatedLearningStatus:
    clusters = [ClusterStatus(name=n, phase=p, reason=f"{n} is {p.value}") for n, p in rows.items()]
    return FederatedLearningStatus(phase=phase, message=message, clusters=clusters)


def test_the_first_pass_tells_the_phase_and_every_cluster_already_running() -> None:
    new = _status(Phase.RUNNING, "training", a=ClusterPhase.RUNNING, b=ClusterPhase.APPLIED)
    assert story(None, new) == [
        StoryEvent("Normal", "Running", "training"),
        StoryEvent(
            "Normal", "ClusterJoined", "cluster a: its client joined the training (a is Running)"
        ),
    ]


def test_nothing_changed_tells_nothing() -> None:
    same = _status(Phase.RUNNING, "training", a=ClusterPhase.RUNNING, b=ClusterPhase.LEFT)
    assert story(same, same) == []


def test_a_run_that_fails_as_a_cluster_leaves_is_told_as_warnings_and_the_leave() -> None:
    before = _status(Phase.RUNNING, "", a=ClusterPhase.RUNNING, b=ClusterPhase.RUNNING)
    after = _status(Phase.FAILED, "1 of 2 clients left", a=ClusterPhase.FAILED, b=ClusterPhase.LEFT)
    events = story(before, after)
    assert StoryEvent("Warning", "Failed", "1 of 2 clients left") in events
    assert (
        StoryEvent("Normal", "ClusterLeft", "cluster b: left the federation (b is Left)") in events
    )
    assert (
        StoryEvent("Warning", "ClusterFailed", "cluster a: its client failed (a is Failed)")
        in events
    )
    assert len(events) == 3


def test_a_blocked_cluster_is_a_warning_with_the_apply_error() -> None:
    before = _status(Phase.WAITING, "waiting", a=ClusterPhase.PENDING)
    after = FederatedLearningStatus(
        phase=Phase.WAITING,
        message="waiting",
        clusters=[
            ClusterStatus(
                name="a",
                phase=ClusterPhase.BLOCKED,
                reason="pods is forbidden: violates PodSecurity",
            )
        ],
    )
    assert story(before, after) == [
        StoryEvent(
            "Warning",
            "ClusterBlocked",
            "cluster a: refused to apply its work (pods is forbidden: violates PodSecurity)",
        )
    ]


def test_a_fan_out_posts_one_event_per_kind_of_change_naming_a_few() -> None:
    n = 3500
    before = FederatedLearningStatus(phase=Phase.RUNNING, message="m")
    after = FederatedLearningStatus(
        phase=Phase.RUNNING,
        message="m",
        clusters=[ClusterStatus(name=f"c{i}", phase=ClusterPhase.RUNNING) for i in range(n)],
    )
    [joined] = story(before, after)
    assert joined.reason == "ClusterJoined"
    assert joined.message.startswith(f"{n} clusters: its client joined the training: c0, c1")
    assert joined.message.endswith(f"and {n - NAMED_PER_EVENT} more")
    assert f"c{NAMED_PER_EVENT}," not in joined.message  # only the first few are named
