"""Drills 3-4's pure part: a cluster that took part and leaves the placement keeps a row
that says it left (its last values kept); when it comes back it gets its ordinary row."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from fl_fixtures import spec
from test_fold_restart import A, _obs, _report

from hub_controller.api import ClusterPhase
from hub_controller.membership import ClusterResolution
from hub_controller.operator.fold import fold

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
    back = fold(s, 1, _obs({"a": _report("a"), "b": _report("b")}), again, T0 + timedelta(20))
    assert {r.name: r.phase for r in back.clusters}["b"] == ClusterPhase.RUNNING


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
