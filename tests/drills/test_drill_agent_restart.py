"""Drill 8: a cluster's agent SIGKILLed while it holds reports the hub has not acknowledged.

The hub process is killed first, so the agents cannot deliver and buffer what their clients
post (training goes on: Flower does not need the hub controller). Then one agent is SIGKILLed
and started again on the same state directory, and the hub comes back. What must hold
(docs/reliability.md): no report is lost (every round of every cluster reaches the status
history) and the run completes.
"""

from __future__ import annotations

import functools
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
from tests.drills.drills_support import drained, restore, rounds_missing
from tests.drills.drills_support import pending as _pending

pytestmark = [pytest.mark.drill, pytest.mark.timeout(900)]

NS = "drill-agent"
NAME = "agent-kill"
ROUNDS = 3


def test_drill_agent_killed_with_reports_buffered(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    clusters = plane.clusters[:2]
    victim = clusters[0]
    body = demo_resource(rounds=ROUNDS, min_clients=2)
    body["metadata"]["name"] = NAME
    prepare_data(plane, tmp_path / "data", clusters, body["spec"]["client"]["dataClaim"])
    create_fl(hub, NS, body)
    try:

        def training() -> bool:
            status = (get_fl(hub, NS, NAME) or {}).get("status") or {}
            return status.get("phase") == "Running" and any(
                r.get("round") for r in status.get("clusters") or []
            )

        wait_for(training, 600, "a first report on the status")
        fed.kill("hub", signal.SIGKILL)
        hub_down = time.monotonic()
        # The victim's client posts the next metrics; its agent cannot deliver them.
        buffered = wait_for(lambda: _pending(fed, victim), 300, f"{victim}'s agent buffering")
        fed.kill(f"agent-{victim}", signal.SIGKILL)
        fed.start_agent(victim)
        requeued = _pending(fed, victim)
        assert requeued >= buffered, (requeued, buffered)
        fed.start_hub()
        hub_up = time.monotonic()
        # Acknowledged means folded into the status; the server may have finished while the
        # hub was down, so Completed can come first and the history only after it.
        for c in clusters:
            wait_for(functools.partial(drained, fed, c), 300, f"{c}'s reports acknowledged")
        final = wait_fl(hub, NS, NAME, 600, fed=fed)
        status: dict[str, Any] = final["status"]
        assert status["phase"] == "Completed", status.get("message")
        # No report lost: every round of every cluster is in the history, with a loss.
        missing = rounds_missing(status, clusters, ROUNDS)
        assert not missing, missing
        print(
            f"\nDRILL 8: {buffered} report(s) buffered at {victim}'s agent when it was killed, "
            f"{requeued} re-queued after its restart, all delivered; hub down "
            f"{hub_up - hub_down:.1f}s; run Completed {time.monotonic() - hub_up:.1f}s after "
            "the hub came back"
        )
    finally:
        restore(fed)
        hub.delete(f"{FL_PATH.format(ns=NS)}/{NAME}")
        wait_for(lambda: get_fl(hub, NS, NAME) is None, 180, f"{NAME} deleted")
