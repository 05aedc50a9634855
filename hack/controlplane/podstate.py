"""Runtime state of pods on the local node and the pod status it reports (TEST INFRASTRUCTURE).

Pure: no processes are started here; `LocalNode` owns the processes and updates this state.
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from hack.controlplane import podplan
from hack.controlplane.bootstrap import now
from ocmfl.kube import Obj


@dataclass
class Ctr:
    """Runtime state of one container."""

    name: str
    image: str
    log: Path
    plan: podplan.ContainerPlan | None = None
    popen: subprocess.Popen[bytes] | None = None
    restart_count: int = 0
    started_at: str | None = None
    terminated: Obj | None = None
    last_state: Obj | None = None
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    fatal: bool = False  # can never run (e.g. unknown image)
    next_start: float = 0.0
    done: bool = False  # exited and will not be restarted
    message_file: Path | None = None  # bound at terminationMessagePath

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.returncode is None


@dataclass
class PodRun:
    """Runtime state of one pod on this node."""

    uid: str
    ns: str
    name: str
    ip: str
    dir: Path
    init: list[Ctr]
    main: list[Ctr]
    restart_policy: str
    host_ip: str = "127.0.0.1"  # the node's address (status.hostIP)
    host_network: bool = False  # spec.hostNetwork: no network namespace of its own
    netns: str | None = None  # name of the pod's network namespace while it exists
    start_time: str = field(default_factory=now)
    prepared: bool = False
    next_prepare: float = 0.0
    next_volume_sync: float = 0.0  # when Secret/ConfigMap volume files are next refreshed
    kill_deadline: float | None = None
    deleting: bool = False
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)
    last_status: Obj | None = None

    def all(self) -> list[Ctr]:
        return self.init + self.main

    @property
    def init_done(self) -> bool:
        return all(c.done and c.terminated and c.terminated["exitCode"] == 0 for c in self.init)

    @property
    def ready(self) -> bool:
        return self.init_done and bool(self.main) and all(c.running for c in self.main)


def exit_info(rc: int) -> tuple[int, str]:
    if rc < 0:
        return 128 - rc, "Error" if -rc != signal.SIGKILL else "Killed"
    return rc, "Completed" if rc == 0 else "Error"


def ctr_status(c: Ctr, ready: bool) -> Obj:
    """One containerStatuses entry."""
    if c.running:
        state: Obj = {"running": {"startedAt": c.started_at}}
    elif c.waiting is not None and not (c.done and c.terminated):
        state = {
            "waiting": {"reason": c.waiting[0], "message": c.waiting[1]}
            if c.waiting[1]
            else {"reason": c.waiting[0]}
        }
    elif c.terminated is not None:
        state = {"terminated": c.terminated}
    else:
        state = {"waiting": {"reason": "ContainerCreating"}}
    st: Obj = {
        "name": c.name,
        "image": c.image,
        "imageID": f"local://{c.image}",
        "ready": ready and c.running,
        "started": c.running,
        "restartCount": c.restart_count,
        "state": state,
    }
    if c.popen is not None:
        st["containerID"] = f"local://{c.popen.pid}"
    if c.last_state:
        st["lastState"] = c.last_state
    return st


def pod_phase(run: PodRun) -> str:
    """Pod phase from container states and the restart policy (kubelet rules)."""
    if any(c.fatal for c in run.all()) or not run.prepared:
        return "Pending"
    if not run.init_done:
        if run.restart_policy == "Never" and any(
            c.done and c.terminated and c.terminated["exitCode"] != 0 for c in run.init
        ):
            return "Failed"
        return "Pending"
    if all(c.done for c in run.main):
        ok = all(c.terminated and c.terminated["exitCode"] == 0 for c in run.main)
        return "Succeeded" if ok else "Failed"
    if any(c.running or c.terminated or c.last_state for c in run.main):
        return "Running"
    return "Pending"


def cond(run: PodRun, ctype: str, ok: bool, reason: str = "") -> Obj:
    """A pod condition; lastTransitionTime changes only when the status flips."""
    status = "True" if ok else "False"
    prev = run.transitions.get(ctype)
    if prev is None or prev[0] != status:
        run.transitions[ctype] = (status, now())
    cond: Obj = {
        "type": ctype,
        "status": status,
        "lastTransitionTime": run.transitions[ctype][1],
        "lastProbeTime": None,
    }
    if reason and not ok:
        cond["reason"] = reason
    return cond


def pod_status(run: PodRun) -> Obj:
    """The whole pod .status the local node reports."""
    phase = pod_phase(run)
    ready = run.ready and phase == "Running"
    reason = "PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady"
    status: Obj = {
        "phase": phase,
        "conditions": [
            cond(run, "PodScheduled", True),
            cond(run, "Initialized", run.init_done, "ContainersNotInitialized"),
            cond(run, "ContainersReady", ready, reason),
            cond(run, "Ready", ready, reason),
        ],
        "hostIP": run.host_ip,
        "hostIPs": [{"ip": run.host_ip}],
        "podIP": run.ip,
        "podIPs": [{"ip": run.ip}],
        "startTime": run.start_time,
        "containerStatuses": [ctr_status(c, ready) for c in run.main],
    }
    if run.init:
        status["initContainerStatuses"] = [ctr_status(c, False) for c in run.init]
    if any(c.fatal for c in run.all()):
        bad = next(c for c in run.all() if c.fatal)
        status["message"] = f"container {bad.name}: {bad.waiting[1] if bad.waiting else ''}"
        status["reason"] = bad.waiting[0] if bad.waiting else "Error"
    return status
