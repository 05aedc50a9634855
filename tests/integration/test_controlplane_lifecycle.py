"""Lifecycle of a private local control plane: reuse, clear failures, no orphans after down.

Uses its own state dir (Kubernetes + local nodes only, one cluster), not the shared plane.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from hack.controlplane import plane, podnet, processes
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
        assert podnet.leftovers(first.slot)  # bridges, the pod's namespace, the local route
        assert plane.down(d)
        pids = [p.pid for p in first.procs] + pod_group
        assert not [p for p in pids if processes.alive(p)]
        assert processes.State.load(d) is None
        assert podnet.leftovers(first.slot) == []
    finally:
        plane.down(d)
        shutil.rmtree(d, ignore_errors=True)
        Path(f"{d}.lock").unlink(missing_ok=True)


def test_down_after_a_supervisor_crash_removes_pod_networks_and_their_processes() -> None:
    """A crashed local node leaves namespaces, veths, bridges and processes that escaped its
    pods' process groups; `down` finds them by the plane's address slot."""
    d = Path("/dev/shm") / f"ocmfl-cp-crash-{os.getpid()}"
    marker = str(8000 + os.getpid() % 1000)
    try:
        state = plane.up(1, state_dir=d, ocm=False)
        k = Kube(state.kubeconfigs["cluster1"])
        k.create(
            "/api/v1/namespaces/default/pods",
            {
                "metadata": {"name": "bg"},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "command": ["sh", "-c", f"setsid sleep {marker} & exec sleep 600"],
                        }
                    ]
                },
            },
        )

        def escaped() -> list[int]:
            out = []
            for p in os.listdir("/proc"):
                try:
                    if Path(f"/proc/{p}/cmdline").read_bytes() == f"sleep\0{marker}\0".encode():
                        out.append(int(p))
                except OSError:
                    continue
            return out

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not escaped():
            time.sleep(0.2)
        k.close()
        [child] = escaped()
        netns = [x for x in podnet.leftovers(state.slot) if x.startswith("netns ")]
        assert len(netns) == 1
        [sup] = [p for p in state.procs if p.name == "supervisor"]
        os.kill(sup.pid, 9)
        time.sleep(1.0)
        assert processes.alive(child)  # outside every process group the plane knows
        assert podnet.leftovers(state.slot)
        assert plane.down(d)
        assert not processes.alive(child)
        assert podnet.leftovers(state.slot) == []
    finally:
        plane.down(d)
        shutil.rmtree(d, ignore_errors=True)
        Path(f"{d}.lock").unlink(missing_ok=True)
