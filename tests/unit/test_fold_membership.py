"""Drills 3-4's pure part: a cluster that took part and leaves the placement keeps a row
that says it left (its last values kept); when it comes back it gets its ordinary row."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from fl_fixtures import spec
from test_fold_restart import A, _obs, _report

from hub_controller.api import ClusterPhase, Phase
from hub_controller.membership import ClusterResolution
from hub_controller.operator.fold import BACK, fold
from hub_controller.operator.observed import JobState, Observations
from hub_controller.reports import RoundRow

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_cluster_that_left_keeps_a_left_row_and_gets_its_row_back_when_it_returns() -> None:
    s = spec()
    both = fold(s, 1, _obs({"a": _report("a"), "b": _report("b")}), None, T0)
    only_a = replace(_obs({"a": _report("a")}), resolutions=(A,))
    left = fold(s, 1, only_a, both, T0 + timedelta(seconds=5))
    rows = {r.name: r for r in left.clusters}
    assert rows["b"].phase == ClusterPhase.LEFT
    assert "left after round 2 (no longer selected by the placement)" in rows["b"].reason
    assert (rows["b"].round, rows["b"].loss, rows["b"].samples) == (2, 0.5, 40)
    assert left.clients == "1/1"
    # Still Left on the next pass (the previous status holds the Left row).
    again = fold(s, 1, only_a, left, T0 + timedelta(seconds=10))
    assert {r.name: r.phase for r in again.clusters}["b"] == ClusterPhase.LEFT
    newer = _report("b")
    newer.add_row(RoundRow(3, "evaluate", loss=0.4, accuracy=0.85))
    back = fold(s, 1, _obs({"a": _report("a"), "b": newer}), again, T0 + timedelta(20))
    row = {r.name: r for r in back.clusters}["b"]
    assert (row.phase, row.round, row.loss) == (ClusterPhase.RUNNING, 3, 0.4)


def _completed(obs: Observations) -> Observations:
    return replace(obs, server_job=JobState(exists=True, succeeded=1, complete=True))


def test_a_cluster_back_without_a_new_round_stays_left_even_at_completed() -> None:
    """Selected again (work applied, client running) but no round after the one it left
    after: its row stays Left, at Completed too (not Succeeded with its old round)."""
    s = spec()
    both = fold(s, 1, _obs({"a": _report("a"), "b": _report("b")}), None, T0)
    left = fold(s, 1, replace(_obs({"a": _report("a")}), resolutions=(A,)), both, T0)
    # Back: the store still holds its report of round 2 (the round it left after).
    back = fold(s, 1, _obs({"a": _report("a"), "b": _report("b")}), left, T0)
    row = {r.name: r for r in back.clusters}["b"]
    assert (row.phase, row.round, row.work_applied) == (ClusterPhase.LEFT, 2, True)
    assert f"left after round 2, {BACK}" in row.reason, row.reason
    assert "now Running" in row.reason, row.reason
    done = fold(s, 1, _completed(_obs({"a": _report("a"), "b": _report("b")})), back, T0)
    assert done.phase == Phase.COMPLETED
    rows = {r.name: r.phase for r in done.clusters}
    assert rows == {"a": ClusterPhase.SUCCEEDED, "b": ClusterPhase.LEFT}
    # And leaving again from there: an ordinary Left row again, its work deleted.
    gone = fold(s, 1, replace(_obs({"a": _report("a")}), resolutions=(A,)), back, T0)
    row = {r.name: r for r in gone.clusters}["b"]
    assert row.phase == ClusterPhase.LEFT and BACK not in row.reason and not row.work_applied


def test_a_left_row_stays_left_at_completed() -> None:
    s = spec()
    both = fold(s, 1, _obs({"a": _report("a"), "b": _report("b")}), None, T0)
    only_a = replace(_obs({"a": _report("a")}), resolutions=(A,))
    left = fold(s, 1, only_a, both, T0)
    done = fold(s, 1, _completed(only_a), left, T0)
    assert done.phase == Phase.COMPLETED
    assert {r.name: r.phase for r in done.clusters}["b"] == ClusterPhase.LEFT


def test_a_cluster_that_never_trained_leaves_no_row() -> None:
    s = spec()
    before = fold(s, 1, _obs({"a": _report("a")}), None, T0)
    assert {r.name for r in before.clusters} == {"a", "b"}
    after = fold(s, 1, replace(_obs({"a": _report("a")}), resolutions=(A,)), before, T0)
    assert [r.name for r in after.clusters] == ["a"]


def test_a_cluster_whose_data_claim_goes_is_left_while_the_placement_still_selects_it() -> None:
    """The claim goes before the placement drops the cluster: the row is Left at once (not
    NoData without values)."""
    s = spec()
    both = fold(s, 1, _obs({"a": _report("a"), "b": _report("b")}), None, T0)
    no_claim = ClusterResolution("b", None, "no ClusterClaim fl-data")
    obs = replace(_obs({"a": _report("a")}), resolutions=(A, no_claim))
    rows = {r.name: r for r in fold(s, 1, obs, both, T0 + timedelta(seconds=5)).clusters}
    assert rows["b"].phase == ClusterPhase.LEFT
    assert "no ClusterClaim fl-data" in rows["b"].reason
    assert (rows["b"].round, rows["b"].loss) == (2, 0.5)
