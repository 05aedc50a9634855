"""Helpers the drills share: record every status a resource goes through (a watch, so no
transient state is missed between polls)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hack.controlplane.processes import State
from hack.localfed import FL_PATH, LocalFederation
from ocmfl import constants
from ocmfl.kube import LIST, Kube, list_watch


class StatusRecorder:
    """Every version of the FederatedLearning objects in one hub namespace, in order."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        self.versions: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._kube = Kube(kubeconfig)
        self._path = FL_PATH.format(ns=namespace)
        self._thread = threading.Thread(target=self._run, daemon=True, name="status-recorder")

    def __enter__(self) -> StatusRecorder:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._kube.close()

    def _run(self) -> None:
        for kind, obj in list_watch(self._kube, self._path, stop=self._stop, chunk_seconds=5):
            items = obj.get("items") or [] if kind == LIST else [obj]
            with self._lock:
                self.versions.extend(items)

    def of(self, uid: str) -> list[dict[str, Any]]:
        """The recorded versions of the resource with this uid."""
        with self._lock:
            return [v for v in self.versions if v["metadata"]["uid"] == uid]


def restore(fed: LocalFederation) -> None:
    """Start again whatever a drill killed and did not restart (the next drill needs it)."""
    names = {p.name for p in fed.procs}
    if not {"hub", "signer"} <= names:
        fed.start_hub()
    for cluster in fed.clusters:
        if f"agent-{cluster}" not in names:
            fed.start_agent(cluster)


def pending(fed: LocalFederation, cluster: str) -> int:
    """Reports the cluster's agent holds unacknowledged (0 when it does not answer)."""
    url = f"http://{fed.agent_host(cluster)}:{constants.AGENT_LOCAL_PORT}/healthz"
    try:
        return int(httpx.get(url, timeout=2).json().get("pending") or 0)
    except httpx.HTTPError:
        return 0


def drained(fed: LocalFederation, cluster: str) -> bool:
    """The cluster's agent holds no unacknowledged report."""
    return pending(fed, cluster) == 0


def hub_metrics(fed: LocalFederation) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The hub's Prometheus samples: (name, sorted labels) -> value ({} when it does not
    answer)."""
    try:
        text = httpx.get(fed.metrics_url, headers=fed.metrics_headers(), timeout=2).text
    except httpx.HTTPError:
        return {}
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def apiserver_pid(state_dir: str, name: str = "hub") -> int:
    """The process id of that apiserver of the plane."""
    state = State.load(Path(state_dir))
    assert state is not None, state_dir
    return next(p.pid for p in state.procs if p.name == f"kube-apiserver-{name}")


def _netns(pid: int | str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/proc/{pid}/ns/net")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def kill_pod_processes(pod_ip: str, sig: int = signal.SIGKILL) -> list[int]:
    """Signal every process of the local-node pod with this IP (as a kubelet killing the pod's
    cgroup would): those with POD_IP=<ip> and whatever else runs in their network namespace
    (never the caller's own). Returns the pids signalled."""
    marker = f"POD_IP={pod_ip}".encode()
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    seeds: set[tuple[int, int] | None] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                seeds.add(_netns(pid))
    seeds.discard(None)
    seeds.discard(_netns("self"))
    hit = [int(p) for p in pids if _netns(p) in seeds]
    for target in hit:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, sig)
    return hit


def flower_pids(fed: LocalFederation, cluster: str, uid: str, program: str) -> list[int]:
    """Pids of `program` (e.g. `flower-supernode`, `flwr-clientapp`) processes of the client
    pod that `cluster` runs for the resource with this uid (read from each process's
    environment: its cluster, its agent and the resource's uid; other resources' and earlier
    drills' client pods run the same programs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            # argv[:3]: a script run through its shebang is `python -IS <script> ...` (the
            # ClientApp worker's flwr-clientapp shim, workloads.sdk.worker).
            if not any(a.endswith(program.encode()) for a in argv[:3]):
                continue
            env = dict(
                kv.split("=", 1)
                for kv in (entry / "environ").read_bytes().decode(errors="replace").split("\0")
                if "=" in kv
            )
        except OSError:
            continue
        if env.get(constants.ENV_CLUSTER_NAME) == cluster and env.get(constants.ENV_FL_UID) == uid:
            found.append(int(entry.name))
    return found


def rounds_missing(
    status: dict[str, Any], clusters: list[str], rounds: int
) -> list[tuple[int, str]]:
    """The (round, cluster) pairs of rounds 1..`rounds` that have no loss in the status's
    history: a report lost somewhere on the way (empty when none was)."""
    have = {(h["round"], h["cluster"]) for h in status.get("history") or []
            if h.get("loss") is not None}  # fmt: skip
    return sorted({(r, c) for r in range(1, rounds + 1) for c in clusters} - have)


def replies_without_report(
    status: dict[str, Any], manifest: dict[str, Any]
) -> list[tuple[int, str]]:
    """The (round, cluster) pairs the server got a result of (the model store's checkpoint
    metrics) that have no loss in the status's history: a report lost between that client
    and the status (empty when none was). A round a cluster missed (its client failed, or
    it was not sent the round) is not a lost report: the checkpoint's "failed" names it."""
    have = {(h["round"], h["cluster"]) for h in status.get("history") or []
            if h.get("loss") is not None}  # fmt: skip
    replied = {
        (int(entry["round"]), cluster)
        for entry in manifest.get("checkpoints") or []
        for phase in ("train", "evaluate")
        for cluster in (entry.get("metrics") or {}).get(phase) or {}
    }
    return sorted(replied - have)


def rounds_missed(manifest: dict[str, Any], cluster: str) -> dict[int, str]:
    """Round -> why, for each checkpointed round without a train result of `cluster`."""
    missed: dict[int, str] = {}
    for entry in manifest.get("checkpoints") or []:
        metrics = entry.get("metrics") or {}
        if cluster not in (metrics.get("train") or {}):
            why = ((metrics.get("failed") or {}).get("train") or {}).get(cluster)
            missed[int(entry["round"])] = why or "not sent the round's message"
    return missed
