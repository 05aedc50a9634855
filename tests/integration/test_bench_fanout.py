"""bench/bench_fanout.py at a small N on the real local control plane: the real hub process
(controller, signers) fans one federation out to 120 simulated clusters, so the placement
controller splits its decision over two PlacementDecision objects (OCM's 100 per object)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.bench_fanout import phase
from hack.controlplane.plane import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

N = 120
BOUND = 256 * 1024


@pytest.mark.rotation(
    turn=1,
    covered_by=(
        "tests/unit/test_fl_scale.py::test_decisions_spanning_many_placementdecision_objects_are_all_read",
        "tests/unit/test_decision_settling.py::test_a_join_that_shifts_slices_never_drops_a_cluster_that_stays",
        "tests/unit/test_fl_scale.py::test_status_at_3500_clusters_keeps_the_worst_rows_counts_all_and_stays_small",
    ),
)
def test_fanout_creates_every_work_and_writes_nothing_big(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    result = phase(N, control_plane, tmp_path, prefix="fanci")
    print(result)
    assert result["works_created"] == N
    assert result["phase"] not in (None, "Failed")
    # Decisions over several PlacementDecision objects are all read: N works exist, the
    # status counts N clusters, and every member's public key reached the node-keys shards.
    assert result["placement_decisions"] >= 2
    assert sum(result["cluster_counts"].values()) == N
    assert result["node_keys"] == N - 1  # all enrolled members (one key held back)
    too_big = {k: v for k, v in result["objects"].items() if v >= BOUND}
    assert not too_big and result["max_object_bytes"] < BOUND
    # One cluster leaving and one joining were each handled (their work deleted / created).
    assert result["leave_s"] > 0 and result["join_s"] > 0
    # The joiner sorts into the first decision: while OCM moved one cluster from the first
    # slice into the second (two writes), no other cluster's work was deleted.
    assert result["join_deleted_others"] == 0
