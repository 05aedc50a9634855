"""Drill 9: the hub apiserver stopped for 30 s mid-run (docs/reliability.md).

The hub's kube-apiserver is frozen with SIGSTOP after round 1's rows reached the status and
resumed with SIGCONT 30 s later (the local plane has no way to restart one apiserver on its
own; a frozen one is the harder case anyway: connections open, nothing answers, so every
client must time out rather than fail fast). Everything else keeps running: the hub
controller and its aggregator, the agents, the server pod, the SuperNodes.

What must hold: training goes on while the apiserver is stopped (the server checkpoints at
least one more round into the model store, and the aggregator receives the clusters' reports
of it); afterwards the status catches up: every round of every cluster is in the history and
the run is Completed.
"""

from __future__ import annotations

import json
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
from tests.drills.drills_support import apiserver_pid, hub_metrics, rounds_missing

pytestmark = [pytest.mark.drill, pytest.mark.timeout(900)]

NS = "drill-apiserver"
NAME = "apiserver-stop"
ROUNDS = 4  # the outage (about 2 rounds) ends before the training does
OUTAGE_S = 30.0


def _checkpointed(store: Path) -> int:
    """The newest round checkpointed in the model store (0 when none)."""
    try:
        manifest = json.loads((store / "manifest.json").read_text())
    except (OSError, ValueError):
        return 0
    return max((int(c["round"]) for c in manifest.get("checkpoints") or []), default=0)


def _aggregated(fed: LocalFederation, cluster: str) -> int:
    """The newest round of the cluster the hub's aggregator has received (0 when none)."""
    labels = (("cluster", cluster), ("name", NAME), ("namespace", NS))
    return int(hub_metrics(fed).get(("ocmfl_cluster_round", labels)) or 0)


def test_drill_hub_apiserver_stopped_30s_training_goes_on_status_catches_up(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    clusters = plane.clusters[:2]
    body = demo_resource(rounds=ROUNDS, min_clients=2)
    body["metadata"]["name"] = NAME
    prepare_data(plane, tmp_path / "data", clusters, body["spec"]["client"]["dataClaim"])
    store = fed.store_dir(create_fl(hub, NS, body))
    apiserver = apiserver_pid(plane.state_dir)
    stopped = False
    try:

        def first_round() -> bool:
            rows = ((get_fl(hub, NS, NAME) or {}).get("status") or {}).get("clusters") or []
            return len(rows) == 2 and all(r.get("round") for r in rows)

        wait_for(first_round, 600, "both clusters' rows with a round")
        os.kill(apiserver, signal.SIGSTOP)
        stopped, stopped_at = True, time.monotonic()
        at_stop = _checkpointed(store)
        before = {c: _aggregated(fed, c) for c in clusters}
        aggregated = dict(before)

        def outage_over() -> bool:
            # Training watched meanwhile: the newest round each cluster reported to the hub.
            for c in clusters:
                aggregated[c] = max(aggregated[c], _aggregated(fed, c))
            return time.monotonic() - stopped_at >= OUTAGE_S

        # The outage lasts OUTAGE_S: the fault itself, not a wait for some state.
        wait_for(outage_over, OUTAGE_S + 10, f"{OUTAGE_S:.0f}s of outage", interval=0.5)
        during = _checkpointed(store)
        os.kill(apiserver, signal.SIGCONT)
        stopped, resumed_at = False, time.monotonic()
        assert during > at_stop, f"no round checkpointed while stopped ({at_stop} -> {during})"
        assert all(aggregated[c] > before[c] for c in clusters), (before, aggregated)

        final = wait_fl(hub, NS, NAME, 600, fed=fed)
        status: dict[str, Any] = final["status"]
        assert status["phase"] == "Completed", status.get("message")
        missing = rounds_missing(status, clusters, ROUNDS)
        assert not missing, missing
        rows = {r["name"]: r for r in status["clusters"]}
        assert all(rows[c].get("round") == ROUNDS for c in clusters), rows
        print(
            f"\nDRILL 9: hub apiserver stopped {resumed_at - stopped_at:.1f}s; the server "
            f"checkpointed rounds {at_stop + 1}-{during} meanwhile, the aggregator's rounds "
            f"went {before} -> {aggregated}; run Completed "
            f"{time.monotonic() - resumed_at:.1f}s after the apiserver resumed, every round of "
            "every cluster in the history; 0 reports lost"
        )
    finally:
        if stopped:
            os.kill(apiserver, signal.SIGCONT)
        hub.delete(f"{FL_PATH.format(ns=NS)}/{NAME}")
        wait_for(lambda: get_fl(hub, NS, NAME) is None, 180, f"{NAME} deleted")
