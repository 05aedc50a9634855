"""Drill 10: one cluster's SuperNode process SIGKILLed mid-training (not a ClientApp
exception) (docs/reliability.md).

The fault is a real SIGKILL of the `flower-supernode` process of one cluster's client pod for
the drill's own resource (selected by the resource's uid in the process's environment). The
client launcher in that pod starts a new SuperNode (same key, so the SuperLink knows it as
the same node).

- Above the minimum (minAvailableClients 1): the run continues to Completed with every round
  once, and the restarted SuperNode is running.
- Below the minimum (minAvailableClients 2): the SuperNode is killed while it holds a round's
  message (its ClientApp process is running), so that round can never have two results: the
  run goes Failed with a reason that names the cluster.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from examples.demo import demo_resource
from hack import controlplane as cp
from hack.localfed import FL_PATH, LocalFederation, create_fl, get_fl, prepare_data, wait_fl
from hack.testing import wait_for
from ocmfl.kube import Kube
from tests.drills.drills_support import flower_pids

pytestmark = [pytest.mark.drill, pytest.mark.timeout(900)]

NS = "drill-supernode"
ROUNDS = 3
ROUND_S = 20  # timeouts.roundSeconds: how long a round waits for a reply that never comes
SUPERNODE = "flower-supernode"
CLIENTAPP = "flwr-clientapp"


def _start(
    plane: cp.ControlPlane, hub: Kube, tmp_path: Path, name: str, min_clients: int
) -> tuple[list[str], str]:
    clusters = plane.clusters[:2]
    body = demo_resource(rounds=ROUNDS, min_clients=min_clients)
    body["metadata"]["name"] = name
    body["spec"]["server"]["timeouts"]["roundSeconds"] = ROUND_S
    prepare_data(plane, tmp_path / "data", clusters, body["spec"]["client"]["dataClaim"])
    uid = str(create_fl(hub, NS, body)["metadata"]["uid"])

    def first_round() -> bool:
        rows = ((get_fl(hub, NS, name) or {}).get("status") or {}).get("clusters") or []
        return len(rows) == 2 and all(r.get("round") for r in rows)

    wait_for(first_round, 600, "both clusters' rows with a round")
    return clusters, uid


def _delete(hub: Kube, name: str) -> None:
    hub.delete(f"{FL_PATH.format(ns=NS)}/{name}")
    wait_for(lambda: get_fl(hub, NS, name) is None, 180, f"{name} deleted")


def _history(status: dict[str, Any]) -> set[tuple[int, str]]:
    return {(h["round"], h["cluster"]) for h in status.get("history") or []}


@pytest.mark.rotation(
    turn=1,
    covered_by=(
        "tests/drills/test_drill_membership.py::test_drill_clusters_join_leave_and_come_back",
        "tests/drills/test_drill_agent_restart.py::test_drill_agent_killed_with_reports_buffered",
    ),
)
def test_drill_supernode_killed_above_the_minimum(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    name = "supernode-kill"
    try:
        clusters, uid = _start(plane, hub, tmp_path, name, min_clients=1)
        victim = clusters[1]
        [pid] = wait_for(
            lambda: flower_pids(fed, victim, uid, SUPERNODE), 30, f"{victim}'s SuperNode"
        )
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        again = wait_for(
            lambda: [p for p in flower_pids(fed, victim, uid, SUPERNODE) if p != pid],
            60,
            "a new SuperNode",
        )
        restarted = time.monotonic()
        final = wait_fl(hub, NS, name, 600, fed=fed)
        status = final["status"]
        assert status["phase"] == "Completed", status.get("message")
        rounds = sorted(h["round"] for h in status.get("history") or [] if h["cluster"] == "global")
        assert rounds == list(range(1, ROUNDS + 1)), status.get("history")
        got = _history(status)
        missed = [r for r in range(1, ROUNDS + 1) if (r, victim) not in got]
        print(
            f"\nDRILL 10 (above): {victim}'s SuperNode (pid {pid}) SIGKILLed; pod's launcher "
            f"started pid {again[0]} {restarted - killed_at:.1f}s later; run Completed "
            f"{time.monotonic() - killed_at:.1f}s after the kill; rounds without a "
            f"{victim} result: {missed or 'none'}"
        )
    finally:
        _delete(hub, name)


@pytest.mark.rotation(
    turn=0,
    covered_by=(
        "tests/e2e/test_e2e_federation.py::test_a_cluster_leaving_below_the_minimum_fails_the_run_with_a_clear_reason",
        "tests/integration/test_federation.py::test_crashing_client_below_minimum_fails_the_run",
    ),
)
def test_drill_supernode_killed_below_the_minimum(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    name = "supernode-kill-min"
    try:
        clusters, uid = _start(plane, hub, tmp_path, name, min_clients=2)
        victim = clusters[1]

        def holding() -> list[int] | None:
            # A ClientApp process of the victim's pod runs: its SuperNode holds a message.
            if not flower_pids(fed, victim, uid, CLIENTAPP):
                return None
            return flower_pids(fed, victim, uid, SUPERNODE) or None

        [pid] = wait_for(holding, 300, f"{victim}'s SuperNode holding a message", interval=0.05)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        final = wait_fl(hub, NS, name, 600, fed=fed)
        status = final["status"]
        message = str(status.get("message") or "")
        print(
            f"\nDRILL 10 (below): {victim}'s SuperNode (pid {pid}) SIGKILLed holding a "
            f"message; phase {status['phase']} {time.monotonic() - killed_at:.1f}s after the "
            f"kill: {message[:300]}"
        )
        assert status["phase"] == "Failed", message
        assert victim in message, message
    finally:
        _delete(hub, name)
