"""Lifecycle of a private local control plane: reuse, clear failures, no orphans after down.

Uses its own state dir (Kubernetes + local nodes only, one cluster), not the shared plane.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from hack.controlplane import plane, processes
from ocmfl.kube import Kube

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _pgid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return -1


def test_up_reuses_and_down_leaves_no_processes() -> None:
    d = Path("/dev/shm") / f"ocmfl-cp-test-{os.getpid()}"
    try:
        first = plane.up(1, state_dir=d, ocm=False)
        again = plane.up(1, state_dir=d, ocm=False)
        assert [p.pid for p in again.procs] == [p.pid for p in first.procs]
        k = Kube(first.kubeconfigs["cluster1"])
        k.create(
            "/api/v1/namespaces/default/pods",
            {
                "metadata": {"name": "bg"},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "command": ["sh", "-c", "sleep 600 & sleep 600"],
                        }
                    ]
                },
            },
        )
        deadline = time.monotonic() + 30
        leader = 0
        while time.monotonic() < deadline and not leader:
            pod = k.get("/api/v1/namespaces/default/pods/bg") or {}
            for cs in pod.get("status", {}).get("containerStatuses") or []:
                if "running" in cs["state"]:
                    leader = int(cs["containerID"].removeprefix("local://"))
            time.sleep(0.2)
        k.close()
        assert leader
        pod_group = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == leader]
        assert len(pod_group) >= 2
        with pytest.raises(plane.PlaneError):
            plane.up(2, state_dir=d, ocm=False)  # a different shape is refused, not replaced
        assert plane.down(d)
        pids = [p.pid for p in first.procs] + pod_group
        assert not [p for p in pids if processes.alive(p)]
        assert processes.State.load(d) is None
    finally:
        plane.down(d)
        shutil.rmtree(d, ignore_errors=True)
        Path(f"{d}.lock").unlink(missing_ok=True)
