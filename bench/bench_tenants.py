"""K federations at once on one hub: what the hub processes and the rounds pay for K.

    OCMFL_CP_DIR=... .venv/bin/python bench/bench_tenants.py --ks 1,5,10 --rounds 3

On a private local control plane (``$OCMFL_CP_DIR-bench``, hub + 2 managed clusters) with the
hub controller (+ aggregator + CSR signer, one process) and one agent per cluster as processes
(hack/localfed.py), each phase applies K identical FederatedLearning resources (K tenant
namespaces, the same app and data, 2 clients each) at once, waits until all are Completed and
deletes them. Per phase it reports:

* CPU seconds and peak RSS of the hub process (kopf controller and aggregator share it), of the
  agents and of the local nodes' supervisor (the kube-proxy stand-in forwards every
  connection); CPU seconds and peak PSS of all FL server pods and all FL client pods
  (processes found by their pod network namespace); sampled every second;
* wall time from apply to all Completed;
* per-round time: the median gap between consecutive round checkpoints in each resource's
  model store (``created`` in manifest.json), averaged over the K resources, and its ratio to
  the K = 1 phase of the same run.

Not a test: numbers depend on the machine and its load. The first K should be 1 (baseline).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.demo import demo_resource
from hack import controlplane as cp
from hack.controlplane import podnet, processes
from hack.localfed import (
    FL_PATH,
    LocalFederation,
    create_fl,
    get_fl,
    prepare_data,
    set_cluster_claim,
)
from hack.testing import wait_for
from ocmfl.kube import Kube

PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(start time in ticks, CPU seconds, RSS bytes) of `pid`, or None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19]), (int(fields[11]) + int(fields[12])) / TICKS, int(fields[21]) * PAGE


def _pss(pid: int) -> int:
    """Proportional set size of `pid` in bytes (shared pages split among their users)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


@dataclass(eq=False)  # a Thread must stay hashable (threading keeps a WeakSet of them)
class Sampler(threading.Thread):
    """CPU seconds and peak memory per group of processes, every second.

    Fixed groups are process trees (root pid -> group), memory as RSS; pods are grouped by their
    network namespace (``FL servers`` on the hub node, ``FL clients`` on the cluster nodes),
    memory as PSS.
    """

    slot: int
    roots: dict[int, str]
    cpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    peak: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _last: dict[tuple[int, int], float] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)

    def _pod_groups(self) -> dict[int, str]:
        """netns inode -> group, for the plane's pod namespaces that exist now."""
        hub_pods = podnet.pod_cidr(self.slot, 0)
        out = {}
        for name in podnet.owned(self.slot, os.listdir(podnet.NETNS_DIR)):
            ip = podnet.pod_address(self.slot, name)
            if ip is None:
                continue  # a bridge
            try:
                inode = os.stat(podnet.netns_path(name)).st_ino
            except OSError:
                continue
            out[inode] = "FL servers" if ipaddress.IPv4Address(ip) in hub_pods else "FL clients"
        return out

    def sample(self) -> None:
        parents: dict[int, int] = {}
        stats: dict[int, tuple[int, float, int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            got = _stat(pid)
            if got is None:
                continue
            stats[pid] = got
            try:
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            parents[pid] = ppid
        pods = self._pod_groups()
        rss: dict[str, int] = defaultdict(int)
        for pid, (start, cpu, mem) in stats.items():
            group = None
            ino = _netns_inode(pid)
            if pid in self.roots and ino in pods:  # an agent: a pod, but its own group
                group = self.roots[pid]
            elif ino in pods:
                group = pods[ino]
                # Pods run many Python processes mapping the same libraries (torch): their
                # RSS would count those pages once per process.
                mem = _pss(pid)
            else:
                p = pid
                for _ in range(64):  # walk up to a known root
                    if p in self.roots:
                        group = self.roots[p]
                        break
                    p = parents.get(p, 0)
                    if p <= 1:
                        break
            if group is None:
                continue
            key = (pid, start)
            self.cpu[group] += cpu - self._last.get(key, 0.0)
            self._last[key] = cpu
            rss[group] += mem
        for group, total in rss.items():
            self.peak[group] = max(self.peak[group], total)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(1.0)
        self.sample()


def _round_seconds(models: Path) -> float | None:
    """Median gap between consecutive checkpoints of one run's model store."""
    manifests = list(models.rglob("manifest.json"))
    if not manifests:
        return None
    entries = json.loads(manifests[0].read_text()).get("checkpoints") or []
    times = sorted(
        (int(e["round"]), dt.datetime.fromisoformat(e["created"]).timestamp()) for e in entries
    )
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(times) if b[0] == a[0] + 1]
    return statistics.median(gaps) if gaps else None


def phase(
    k: int,
    fed: LocalFederation,
    hub: Kube,
    slot: int,
    rounds: int,
    root: Path,
    timeout: float,
) -> dict[str, Any]:
    roots = {p.popen.pid: "hub (controller + aggregator)" for p in fed.procs if p.name == "hub"}
    # The agents are pods of the local nodes (deployed by OCM): their container processes.
    roots.update({pid: "agents" for c in fed.clusters if (pid := fed.agent_pid(c)) is not None})
    state = processes.State.load(Path(fed.plane.state_dir))
    assert state is not None
    roots.update({p.pid: "supervisor (local nodes)" for p in state.procs if p.name == "supervisor"})
    sampler = Sampler(slot, roots)
    sampler.start()
    names = [(f"bench-k{k}-{i}", "digits") for i in range(k)]
    started = time.monotonic()
    for ns, name in names:
        body = demo_resource(rounds=rounds, min_clients=2)
        body["metadata"]["name"] = name
        create_fl(hub, ns, body)
    phases: dict[str, str] = {}
    messages: dict[str, str] = {}

    def all_done() -> bool:
        for ns, name in names:
            st = (get_fl(hub, ns, name) or {}).get("status") or {}
            phases[ns] = str(st.get("phase"))
            messages[ns] = str(st.get("message") or "")
        fed.check_alive()
        return all(p in ("Completed", "Failed") for p in phases.values())

    try:
        wait_for(all_done, timeout, f"{k} federations to finish")
        wall = time.monotonic() - started
    finally:
        sampler.stop.set()
        sampler.join()
    # Each resource's store is <hub's HostPath root>/<namespace>/<name>-<uid>.
    per_round = [_round_seconds(Path(str(fed.hostpath_root)) / ns) for ns, _ in names]
    for ns, name in names:
        hub.delete(f"{FL_PATH.format(ns=ns)}/{name}")
    for ns, name in names:

        def gone(ns: str = ns, name: str = name) -> bool:
            return get_fl(hub, ns, name) is None

        wait_for(gone, 300, f"{ns}/{name} deleted")
        hub.delete(f"/api/v1/namespaces/{ns}")
    known = [r for r in per_round if r is not None]
    return {
        "k": k,
        "completed": sum(p == "Completed" for p in phases.values()),
        # Why the others did not complete: a bench that only counts failures hides their cause.
        "failed": {ns: messages[ns] for ns, p in sorted(phases.items()) if p != "Completed"},
        "wall_s": round(wall, 1),
        "per_round_s": round(statistics.mean(known), 2) if known else None,
        "cpu_s": {g: round(v, 1) for g, v in sorted(sampler.cpu.items())},
        "peak_mem_mb": {g: round(v / 2**20) for g, v in sorted(sampler.peak.items())},
    }


def mem_available() -> int:
    """MemAvailable of this machine, bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def too_big(k: int, base: dict[str, Any]) -> str | None:
    """Why K federations would not fit in memory now (K times the K = 1 pods' peak), if so."""
    per_fed = sum(base["peak_mem_mb"].get(g, 0) for g in ("FL servers", "FL clients")) * 2**20
    need, have = k * per_fed, mem_available()
    if need > 0.8 * have:
        return (
            f"needs about {need / 2**30:.1f} GiB ({k} x {per_fed / 2**30:.2f} GiB measured at "
            f"K=1), {have / 2**30:.1f} GiB available"
        )
    return None


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: rounds per K, then CPU seconds and peak memory per process group and K."""
    base = results[0]["per_round_s"]
    lines = ["| K | completed | wall s | s/round | s/round vs K=1 |", "|---|---|---|---|---|"]
    for r in results:
        ratio = f"{r['per_round_s'] / base:.2f}x" if r["per_round_s"] and base else "-"
        lines.append(
            f"| {r['k']} | {r['completed']}/{r['k']} | {r['wall_s']} | {r['per_round_s']} "
            f"| {ratio} |"
        )
    groups = sorted({g for r in results for g in r["cpu_s"]})
    head = ["process group"]
    for r in results:
        head += [f"K={r['k']} CPU s", f"K={r['k']} peak MB"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in groups:
        row = [g + (" (PSS)" if g.startswith("FL") else " (RSS)")]
        for r in results:
            row += [str(r["cpu_s"].get(g, 0)), str(r["peak_mem_mb"].get(g, 0))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ks", default="1,5,10", help="comma-separated K values; start with 1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800, help="per phase, seconds")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    a = ap.parse_args()
    ks = [int(x) for x in a.ks.split(",")]
    root = Path(tempfile.mkdtemp(prefix="ocmfl-bench-tenants-"))
    state_dir = Path(f"{processes.state_dir()}-bench")
    results: list[dict[str, Any]] = []
    skipped: list[tuple[int, str]] = []
    with cp.session(clusters=2, state_dir=state_dir) as state:
        plane = cp.ControlPlane.from_state(state)
        fed = LocalFederation(plane, root / "federation")
        hub = Kube(plane.hub_kubeconfig)
        claim = demo_resource(1, 2)["spec"]["client"]["dataClaim"]
        prepare_data(plane, root / "data", plane.clusters, claim)
        fed.start()
        try:
            for k in ks:
                if results and (why := too_big(k, results[0])):
                    print(f"K={k} skipped: {why}", flush=True)
                    skipped.append((k, why))
                    continue
                r = phase(k, fed, hub, plane.slot, a.rounds, root, a.timeout)
                results.append(r)
                print(json.dumps(r), flush=True)
        finally:
            fed.stop()
            for c in plane.clusters:
                set_cluster_claim(plane, c, claim, None)
            hub.close()
    print(table(results))
    for r in results:
        for ns, why in r["failed"].items():
            print(f"K={r['k']} {ns} did not complete: {why}")
    for k, why in skipped:
        print(f"K={k} not run: {why}")
    if a.json:
        a.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
