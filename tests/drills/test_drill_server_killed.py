"""Drill 1: the server pod's processes SIGKILLed mid-round (docs/reliability.md).

After round 1's checkpoint is in the model store, every process of the server pod (launcher,
SuperLink, ServerApp, gateway: everything in the pod's network namespace, as when the kubelet
kills a container's cgroup or the node's OOM killer strikes) is SIGKILLed. The container exits
137, the pod fails, and the Job controller (the plane's real kube-controller-manager) starts a
new pod, which resumes from the last checkpoint in the HostPath model store; the SuperNodes
reach it through the same Service address.

What must hold: the Job's pod comes back (a second pod, one failure counted); the run reaches
Completed; the new server started from the last checkpoint written before the kill; every
round is in the model store's checkpoints and in the status history exactly once; every round
of every cluster has its report (none lost).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from examples.demo import demo_resource
from hack import controlplane as cp
from hack.localfed import FL_PATH, LocalFederation, create_fl, get_fl, prepare_data, wait_fl
from hack.testing import wait_for
from ocmfl import constants
from ocmfl.kube import Kube
from tests.drills.drills_support import kill_pod_processes

pytestmark = [pytest.mark.drill, pytest.mark.timeout(900)]

NS = "drill-server"
NAME = "server-kill"
ROUNDS = 3


def _server_pods(hub: Kube, uid: str) -> list[dict[str, Any]]:
    selector = f"{constants.LABEL_OWNER_UID}={uid},{constants.LABEL_COMPONENT}=server"
    got = hub.get(f"/api/v1/namespaces/{NS}/pods", {"labelSelector": selector}) or {}
    return list(got.get("items") or [])


def _manifest(store: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((store / "manifest.json").read_text()))
    except (OSError, ValueError):  # not written yet, or being replaced
        return {}


def test_drill_server_pod_killed_mid_round_resumes_from_the_checkpoint(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    clusters = plane.clusters[:2]
    body = demo_resource(rounds=ROUNDS, min_clients=2)
    body["metadata"]["name"] = NAME
    prepare_data(plane, tmp_path / "data", clusters, body["spec"]["client"]["dataClaim"])
    created = create_fl(hub, NS, body)
    uid = created["metadata"]["uid"]
    store = fed.store_dir(created)
    try:
        # Round 1 checkpointed: round 2 is under way (the server sends it right after).
        wait_for(
            lambda: any(c["round"] == 1 for c in _manifest(store).get("checkpoints") or []),
            600,
            "round 1's checkpoint in the model store",
        )
        pods = [p for p in _server_pods(hub, uid) if (p.get("status") or {}).get("podIP")]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        victim = pods[0]
        killed = kill_pod_processes(victim["status"]["podIP"])
        kill_at = time.monotonic()
        assert killed, "no process of the server pod found"
        # Nothing writes to the store any more: the round the new pod must resume from.
        at_kill = max(c["round"] for c in _manifest(store)["checkpoints"])
        assert at_kill < ROUNDS, "the server finished before it could be killed"

        def replaced() -> dict[str, Any] | None:
            for p in _server_pods(hub, uid):
                fresh = p["metadata"]["uid"] != victim["metadata"]["uid"]
                if fresh and (p.get("status") or {}).get("phase") == "Running":
                    return p
            return None

        new_pod = wait_for(replaced, 300, "a new server pod Running")
        back_at = time.monotonic()
        old = next(
            p for p in _server_pods(hub, uid) if p["metadata"]["uid"] == victim["metadata"]["uid"]
        )
        assert old["status"]["phase"] == "Failed", old["status"]
        terminated = old["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 137, terminated

        final = wait_fl(hub, NS, NAME, 600, fed=fed)
        done_at = time.monotonic()
        status: dict[str, Any] = final["status"]
        assert status["phase"] == "Completed", status.get("message")
        assert status["round"] == status["totalRounds"] == ROUNDS
        job_name = new_pod["metadata"]["labels"]["job-name"]
        job = hub.get(f"/apis/batch/v1/namespaces/{NS}/jobs/{job_name}")
        assert job is not None and job["status"].get("failed") == 1, (job or {}).get("status")

        # The new server resumed from the last checkpoint (it did not start over).
        manifest = _manifest(store)
        starts = (manifest.get("info") or {}).get("starts") or []
        assert len(starts) >= 2 and starts[0]["round"] == 0, starts
        assert starts[1]["round"] == at_kill, (at_kill, starts)
        assert f"checkpoint of round {at_kill}" in starts[1]["from"], starts[1]
        # Every round once: in the store and in the status history.
        assert [c["round"] for c in manifest["checkpoints"]] == list(range(1, ROUNDS + 1))
        history = status.get("history") or []
        rounds = [h["round"] for h in history if h["cluster"] == "global"]
        assert rounds == list(range(1, ROUNDS + 1)), history
        # No report lost: every round of every cluster, with its loss.
        have = [(h["round"], h["cluster"]) for h in history
                if h["cluster"] != "global" and h.get("loss") is not None]  # fmt: skip
        assert sorted(have) == [(r, c) for r in range(1, ROUNDS + 1) for c in sorted(clusters)]
        print(
            f"\nDRILL 1: {len(killed)} server pod process(es) SIGKILLed after round {at_kill}'s "
            f"checkpoint; new pod Running {back_at - kill_at:.1f}s later; run Completed "
            f"{done_at - kill_at:.1f}s after the kill; resumed from round {at_kill}'s checkpoint; "
            f"rounds in history {rounds}; 0 reports lost"
        )
    finally:
        hub.delete(f"{FL_PATH.format(ns=NS)}/{NAME}")
        wait_for(lambda: get_fl(hub, NS, NAME) is None, 180, f"{NAME} deleted")
