"""Drill 10: one cluster's SuperNode process SIGKILLed mid-training, above the minimum
(docs/reliability.md).

The fault is a real SIGKILL of the `flower-supernode` process of one cluster's client pod
(not a ClientApp exception). The client launcher in that pod starts a new SuperNode (same
key, so the SuperLink knows it as the same node). If the killed one held a round's message,
that round gets no reply from it: the round ends at `timeouts.roundSeconds` with the other
cluster's result (enough: minAvailableClients is 1). What must hold: the run continues to
Completed with every round once, and the restarted SuperNode is running.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from examples.demo import demo_resource
from hack import controlplane as cp
from hack.localfed import FL_PATH, LocalFederation, create_fl, get_fl, prepare_data, wait_fl
from hack.testing import wait_for
from ocmfl import constants
from ocmfl.kube import Kube

pytestmark = [pytest.mark.drill, pytest.mark.timeout(900)]

NS = "drill-supernode"
NAME = "supernode-kill"
ROUNDS = 3
ROUND_S = 20  # timeouts.roundSeconds: how long a round waits for a reply that never comes


def supernodes(fed: LocalFederation, cluster: str) -> list[int]:
    """Pids of the `flower-supernode` processes of this plane's client pods on `cluster`."""
    found = []
    endpoint = fed.agent_host(cluster)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(a.endswith(b"flower-supernode") for a in argv[:2]):
                continue
            env = dict(
                kv.split("=", 1)
                for kv in (entry / "environ").read_bytes().decode(errors="replace").split("\0")
                if "=" in kv
            )
        except OSError:
            continue
        if env.get(constants.ENV_CLUSTER_NAME) == cluster and endpoint in env.get(
            constants.ENV_AGENT_ENDPOINT, ""
        ):
            found.append(int(entry.name))
    return found


def test_drill_supernode_killed_above_the_minimum(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    clusters = plane.clusters[:2]
    victim = clusters[1]
    body = demo_resource(rounds=ROUNDS, min_clients=1)
    body["metadata"]["name"] = NAME
    body["spec"]["server"]["timeouts"]["roundSeconds"] = ROUND_S
    prepare_data(plane, tmp_path / "data", clusters, body["spec"]["client"]["dataClaim"])
    create_fl(hub, NS, body)
    try:

        def first_round() -> bool:
            rows = ((get_fl(hub, NS, NAME) or {}).get("status") or {}).get("clusters") or []
            return len(rows) == 2 and all(r.get("round") for r in rows)

        wait_for(first_round, 600, "both clusters' rows with a round")
        [pid] = wait_for(lambda: supernodes(fed, victim), 30, f"{victim}'s SuperNode")
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        again = wait_for(
            lambda: [p for p in supernodes(fed, victim) if p != pid], 60, "a new SuperNode"
        )
        restarted = time.monotonic()
        final = wait_fl(hub, NS, NAME, 600, fed=fed)
        status = final["status"]
        assert status["phase"] == "Completed", status.get("message")
        rounds = sorted(h["round"] for h in status.get("history") or [] if h["cluster"] == "global")
        assert rounds == list(range(1, ROUNDS + 1)), status.get("history")
        got = {(h["round"], h["cluster"]) for h in status.get("history") or []}
        missed = [r for r in range(1, ROUNDS + 1) if (r, victim) not in got]
        print(
            f"\nDRILL 10: {victim}'s SuperNode (pid {pid}) SIGKILLed; pod's launcher started "
            f"pid {again[0]} {restarted - killed_at:.1f}s later; run Completed "
            f"{time.monotonic() - killed_at:.1f}s after the kill; rounds without a "
            f"{victim} result: {missed or 'none'}"
        )
    finally:
        hub.delete(f"{FL_PATH.format(ns=NS)}/{NAME}")
        wait_for(lambda: get_fl(hub, NS, NAME) is None, 180, f"{NAME} deleted")
