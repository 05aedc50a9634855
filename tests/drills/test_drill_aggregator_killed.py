"""Drill 7: the hub's aggregator SIGKILLed mid-stream, with reports it took but whose status
was never written (docs/reliability.md).

The aggregator runs in the hub process (as in the chart's hub Deployment), so that process is
killed. To put reports deterministically in the window between "the aggregator has them" and
"the resource's status holds them", the hub apiserver is frozen (SIGSTOP) after the first
round's rows: training goes on (Flower does not need it), the agents stream the later rounds
(the last one included) to the aggregator, which cannot write any status. Then the hub is
SIGKILLed, the apiserver resumed and the hub started again.

What must hold: the aggregator acknowledged none of those reports (each agent still holds all
it sent: an ack means "in the status"), and after the restart every round of every cluster,
the last included, reaches the status history; the run completes; the agents' buffers drain.
"""

from __future__ import annotations

import functools
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
from tests.drills.drills_support import (
    apiserver_pid,
    drained,
    hub_metrics,
    pending,
    restore,
    rounds_missing,
)

pytestmark = [pytest.mark.drill, pytest.mark.timeout(900)]

NS = "drill-aggregator"
NAME = "aggregator-kill"
ROUNDS = 3


def _series(fed: LocalFederation, metric: str, cluster: str) -> float | None:
    labels = (("cluster", cluster), ("name", NAME), ("namespace", NS))
    return hub_metrics(fed).get((metric, labels))


def test_drill_aggregator_killed_with_reports_not_yet_in_the_status(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    clusters = plane.clusters[:2]
    body = demo_resource(rounds=ROUNDS, min_clients=2)
    body["metadata"]["name"] = NAME
    prepare_data(plane, tmp_path / "data", clusters, body["spec"]["client"]["dataClaim"])
    create_fl(hub, NS, body)
    apiserver = apiserver_pid(plane.state_dir)
    frozen = False
    try:

        def first_round() -> bool:
            rows = ((get_fl(hub, NS, NAME) or {}).get("status") or {}).get("clusters") or []
            return len(rows) == 2 and all(r.get("round") for r in rows)

        wait_for(first_round, 600, "both clusters' rows with a round")
        os.kill(apiserver, signal.SIGSTOP)
        frozen, frozen_at = True, time.monotonic()

        # The later rounds reach the aggregator; no status can hold them, so none is acked.
        def streamed() -> dict[str, int] | None:
            held = {c: pending(fed, c) for c in clusters}
            awaiting = hub_metrics(fed).get(("ocmfl_reports_awaiting_status", ()))
            last = [_series(fed, "ocmfl_cluster_round", c) for c in clusters]
            done = all(r == ROUNDS for r in last) and awaiting == sum(held.values())
            return held if done else None

        held = wait_for(streamed, 600, f"round {ROUNDS} of both clusters at the aggregator")
        assert all(n > 0 for n in held.values()), held
        fed.kill("hub", signal.SIGKILL)
        killed_at = time.monotonic()
        os.kill(apiserver, signal.SIGCONT)
        frozen = False
        fed.start_hub()
        restarted = time.monotonic()
        for c in clusters:
            wait_for(functools.partial(drained, fed, c), 300, f"{c}'s reports acknowledged")
        caught_up = time.monotonic()
        final = wait_fl(hub, NS, NAME, 600, fed=fed)
        status: dict[str, Any] = final["status"]
        assert status["phase"] == "Completed", status.get("message")
        missing = rounds_missing(status, clusters, ROUNDS)
        assert not missing, missing
        rows = {r["name"]: r for r in status["clusters"]}
        assert all(rows[c].get("round") == ROUNDS for c in clusters), rows
        print(
            f"\nDRILL 7: apiserver frozen {killed_at - frozen_at:.1f}s while rounds 2-{ROUNDS} "
            f"streamed; {held} report(s) held unacknowledged by the agents when the hub was "
            f"SIGKILLed; all acknowledged {caught_up - restarted:.1f}s after the restart (hub "
            f"down {restarted - killed_at:.1f}s); run Completed "
            f"{time.monotonic() - restarted:.1f}s after the restart; 0 reports lost"
        )
    finally:
        if frozen:
            os.kill(apiserver, signal.SIGCONT)
        restore(fed)
        hub.delete(f"{FL_PATH.format(ns=NS)}/{NAME}")
        wait_for(lambda: get_fl(hub, NS, NAME) is None, 180, f"{NAME} deleted")
