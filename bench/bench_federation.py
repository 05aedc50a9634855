"""Time per round, its phases, CPU and memory per process: ours vs stock Flower, same app.

    .venv/bin/python bench/bench_federation.py [--rounds 3] [--repeats 2] [--mode ours|bare|both]

"ours": ocm-fl-server + 2 x ocm-fl-client (TLS, SuperNode auth, the mTLS Fleet gateway and
cluster-side tunnels as deployed, checkpoints, server-side and client-side evaluation) with the
platform's speed settings. "bare": flower-superlink
--insecure + 2 flower-supernode --insecure + flwr run of the same app and data, as stock Flower
runs it (separate evaluation phase, Flower's own 3 s reply polling, one ClientApp process per
message importing the model stack). Runs alternate ours/bare, `--repeats` times each.

Round timing comes from the ServerApp's log lines, time-stamped as they stream in (Flower's log
stream lags 0.2-0.7 s, the same for both): a round runs from "[ROUND r/N]" to the next one (the
last to "Strategy execution finished"); "train" is configure_train -> aggregate_train,
"evaluate" configure_evaluate -> aggregate_evaluate, "server" the rest (aggregation, server
evaluation, checkpoint). CPU seconds and peak RSS per process kind are sampled from /proc every
0.2 s, for this bench's descendants only (CPU of a process is its last sample: a short-lived
one may lose up to 0.2 s). Prints one
JSON object: "ours" and "bare" each with "per_round_s" (median over every round of every
repeat), phases, CPU and RSS; "ratio" = ours / bare per_round_s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # hack/ is not installed

from hack.testing import free_port
from ocmfl import pki
from ocmfl.nodekeys import write_keypair
from workloads.data import partition
from workloads.flower_app import inspect_app
from workloads.flower_env import flower_env, write_connection

BIN = Path(sys.executable).parent
APP = Path(__file__).resolve().parents[1] / "examples" / "apps" / "digits"
CLUSTERS = ("cluster1", "cluster2")
KINDS = ("ocm-fl-server", "ocm-fl-client", "ocm-fl-worker", "flower-superlink",
         "flower-supernode", "flower-superexec", "flwr-serverapp", "flwr-clientapp",
         "flwr", "nginx")  # fmt: skip
TICK = os.sysconf("SC_CLK_TCK")
# Stock Flower as an app author gets it: separate evaluation and Flower's own reply polling.
BARE_RUN_CONFIG = {"evaluate-in-train": False}
BARE_ENV = {"OCMFL_GRID_POLL_INTERVAL": "0"}
# Ablations of "ours" (--ours-env/--ours-client-arg/--ours-run-config), to see what each change
# saves: e.g. OCMFL_GRID_POLL_INTERVAL=0, --no-worker, {"evaluate-in-train": false}.
OURS: dict[str, Any] = {"env": {}, "client_args": [], "run_config": {}, "server_args": []}


class ProcSampler(threading.Thread):
    """Per process kind: peak RSS of one process (MB), CPU seconds summed over processes,
    and how many processes of the kind ran."""

    def __init__(self, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak: dict[str, float] = defaultdict(float)
        self.cpu: dict[int, tuple[str, float]] = {}
        self.stop = threading.Event()

    @staticmethod
    def kind_of(cmd: str) -> str | None:
        parts = cmd.split(" ")
        for i, part in enumerate(parts[:3]):
            name = part.rsplit("/", 1)[-1].rstrip(":")  # nginx renames itself "nginx: ..."
            if name in KINDS:
                return name
            if name.startswith("python") and i + 2 < len(parts) and parts[i + 1] == "-m":
                module = parts[i + 2]
                if module in ("workloads.clientapp_worker", "workloads.sdk.worker"):
                    return "ocm-fl-worker"
        return None

    def descendants(self) -> set[str]:
        """This bench's descendant processes (other work on the machine is not counted)."""
        children: dict[str, list[str]] = defaultdict(list)
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                children[stat[1]].append(pid)
        out, todo = set(), [str(os.getpid())]
        while todo:
            for child in children.get(todo.pop(), []):
                out.add(child)
                todo.append(child)
        return out

    def sample(self) -> None:
        for pid in self.descendants():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                kind = self.kind_of(cmd.strip())
                if kind is None:
                    continue
                status = Path(f"/proc/{pid}/status").read_text()
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            rss = next((ln for ln in status.splitlines() if ln.startswith("VmRSS:")), "")
            self.peak[kind] = max(self.peak[kind], int(rss.split()[1]) / 1024 if rss else 0.0)
            self.cpu[int(pid)] = (kind, (int(stat[11]) + int(stat[12])) / TICK)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            time.sleep(self.interval)

    def report(self) -> dict[str, Any]:
        cpu: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        for kind, seconds in self.cpu.values():
            cpu[kind] += seconds
            count[kind] += 1
        return {
            "peak_rss_mb": {k: round(v) for k, v in sorted(self.peak.items())},
            "cpu_s": {k: round(v, 1) for k, v in sorted(cpu.items())},
            "processes": dict(sorted(count.items())),
        }


class LogClock:
    """Time-stamps the ServerApp's log lines as they arrive, and splits rounds into phases."""

    MARKS = {
        "round": re.compile(r"\[ROUND (\d+)/\d+\]"),
        "train0": re.compile(r"configure_train: Sampled"),
        "train1": re.compile(r"aggregate_train: Received"),
        "eval0": re.compile(r"configure_evaluate: Sampled"),
        "eval1": re.compile(r"aggregate_evaluate: Received"),
        "end": re.compile(r"Strategy execution finished"),
    }

    def __init__(self) -> None:
        self.events: list[tuple[float, str, int]] = []
        self.lines: list[str] = []

    def feed(self, stream: IO[str] | None) -> None:
        if stream is None:
            return
        for line in stream:
            now = time.monotonic()
            self.lines.append(line)
            for name, pattern in self.MARKS.items():
                m = pattern.search(line)
                if m:
                    self.events.append((now, name, int(m.group(1)) if name == "round" else 0))

    def rounds(self) -> list[dict[str, float]]:
        """One {"total", "train", "evaluate", "server"} per completed round, in seconds."""
        out: list[dict[str, float]] = []
        current: dict[str, float] | None = None
        # A restarted log stream replays lines: keep the first sight of each round only.
        seen: set[int] = set()
        for t, name, number in self.events:
            if name in ("round", "end") and current is not None:
                total = t - current["start"]
                train = current.get("train1", t) - current.get("train0", current["start"])
                evaluate = current.get("eval1", t) - current["eval0"] if "eval0" in current else 0
                out.append({"total": total, "train": train, "evaluate": evaluate,
                            "server": total - train - evaluate})  # fmt: skip
                current = None
            if name == "round" and number not in seen:
                seen.add(number)
                current = {"start": t}
            elif current is not None and name not in current and name not in ("round", "end"):
                current[name] = t
        return out


def _median(values: Iterable[float]) -> float | None:
    data = list(values)
    return round(statistics.median(data), 2) if data else None


def setup(root: Path) -> dict[str, Path]:
    ca = pki.create_ca(key_kind="ec")
    srv = pki.issue_server_cert(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    tls = pki.save_tls_dir(root / "tls", srv, ca.cert)
    (root / "pubs").mkdir()
    for c in CLUSTERS:
        pub = write_keypair(root / "keys" / c)
        (root / "pubs" / f"{c}.pub").write_bytes(pub.read_bytes())
    partition(root / "data", list(CLUSTERS), split="label-skew", sizes="2,1", seed=0)
    # the Fleet gateway's certificate and each cluster's Fleet client certificate (same CA)
    gw = pki.issue_server_cert(ca, dns_names=["localhost"])
    pki.save_tls_dir(root / "gateway-tls", gw, ca.cert)
    for c in CLUSTERS:
        pki.save_tls_dir(root / f"{c}-tls", pki.issue_fleet_client_cert(ca, "bench", c), ca.cert)
    return {"tls": tls, "keys": root / "keys", "pubs": root / "pubs", "data": root / "data",
            "gateway_tls": root / "gateway-tls"}  # fmt: skip


def _test_dir(app: Path, p: dict[str, Path]) -> dict[str, str]:
    """The run config naming the server's held-out data, for an app that declares test-dir."""
    return {"test-dir": str(p["data"] / "test")} if "test-dir" in inspect_app(app).config else {}


def _stop_all(procs: Iterable[subprocess.Popen[Any]]) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def run_ours(
    root: Path, p: dict[str, Path], rounds: int, tag: str, app: Path = APP
) -> dict[str, Any]:
    port, gateway_port = free_port(), free_port()
    clients = [
        subprocess.Popen(
            [
                str(BIN / "ocm-fl-client"),
                "--server-address",
                f"127.0.0.1:{gateway_port}",
                "--server-name",
                "localhost",
                "--root-certificates",
                str(p["tls"] / "ca.crt"),
                "--client-certfile",
                str(root / f"{c}-tls" / pki.CERT_FILE),
                "--client-keyfile",
                str(root / f"{c}-tls" / pki.KEY_FILE),
                "--auth-key",
                str(p["keys"] / c),
                "--cluster-name",
                c,
                "--data-dir",
                str(p["data"] / c),
                "--state-dir",
                str(root / f"{tag}-{c}"),
                "--port",
                str(free_port()),
                *OURS["client_args"],
            ],
            env={**os.environ, **OURS["env"]},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for c in CLUSTERS
    ]
    clock = LogClock()
    started = time.monotonic()
    server = subprocess.Popen(
        [str(BIN / "ocm-fl-server"), "--state-dir", str(root / f"{tag}-server"),
         "--superlink-address", f"127.0.0.1:{port}",
         "--ssl-ca-certfile", str(p["tls"] / "ca.crt"),
         "--ssl-certfile", str(p["tls"] / "tls.crt"),
         "--ssl-keyfile", str(p["tls"] / "tls.key"),
         "--gateway-listen", f"127.0.0.1:{gateway_port}",
         "--gateway-certfile", str(p["gateway_tls"] / pki.CERT_FILE),
         "--gateway-keyfile", str(p["gateway_tls"] / pki.KEY_FILE),
         "--supernode-keys", str(p["pubs"]), "--rounds", str(rounds), "--min-clients", "2",
         "--app-dir", str(app), "--storage", str(root / f"{tag}-model"),
         "--run-config", json.dumps({**_test_dir(app, p), **OURS["run_config"]}),
         "--result-file", str(root / f"{tag}.json"), *OURS.get("server_args", [])],
        env={**os.environ, **OURS["env"]},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    reader = threading.Thread(target=clock.feed, args=(server.stdout,), daemon=True)
    reader.start()
    try:
        code = server.wait(timeout=1800)
        reader.join(timeout=10)
    finally:
        _stop_all([server, *clients])
    total = time.monotonic() - started
    result = json.loads((root / f"{tag}.json").read_text())
    return {"ok": code == 0, "launcher_total_s": round(total, 1),
            "run_elapsed_s": round(float(result["details"].get("elapsed", 0.0)), 1),
            "test_accuracy": result.get("metrics", {}).get("test-accuracy"),
            "privacy": result.get("privacy"), "rounds": clock.rounds()}  # fmt: skip


def run_bare(
    root: Path, p: dict[str, Path], rounds: int, tag: str, app: Path = APP
) -> dict[str, Any]:
    port = free_port()
    home = root / f"{tag}-home"
    env = flower_env(home, BARE_ENV)
    write_connection(home, f"127.0.0.1:{port}", p["tls"] / "ca.crt")
    cfg = home / "config.toml"
    cfg.write_text(cfg.read_text().split("root-certificates")[0] + "insecure = true\n")
    # Stock Flower: its own default task poll, not the launchers' setting.
    env.pop("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", None)
    procs: list[subprocess.Popen[Any]] = [
        subprocess.Popen(
            [
                str(BIN / "flower-superlink"),
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--disable-runtime-dependency-installation",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    ]
    for c in CLUSTERS:
        (root / f"{tag}-{c}.toml").write_text(
            f'cluster-name = "{c}"\ndata-dir = "{p["data"] / c}"\n'
        )
        node_env = flower_env(root / f"{tag}-{c}-home")
        node_env.pop("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", None)
        procs.append(subprocess.Popen(
            [str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}",
             "--port", str(free_port()), "--node-config", str(root / f"{tag}-{c}.toml")],
            env=node_env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True))  # fmt: skip
    clock = LogClock()
    try:
        time.sleep(8)
        rc = root / f"{tag}-rc.toml"
        declared = inspect_app(app).config
        stock = {k: v for k, v in BARE_RUN_CONFIG.items() if k in declared}
        settings = {"num-server-rounds": rounds, **stock}
        rc.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
        started = time.monotonic()
        out = subprocess.run(
            [str(BIN / "flwr"), "run", str(app), "ocmfl", "--format", "json", "--run-config",
             str(rc)],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        run_id = json.loads(out.stdout)["run-id"]
        stream = subprocess.Popen(
            [str(BIN / "flwr"), "log", str(run_id), "ocmfl", "--stream"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        procs.append(stream)
        threading.Thread(target=clock.feed, args=(stream.stdout,), daemon=True).start()
        while True:
            time.sleep(3)
            ls = subprocess.run(
                [str(BIN / "flwr"), "ls", "ocmfl", "--run-id", str(run_id), "--format", "json"],
                env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            run = json.loads(ls.stdout)["runs"][0]
            if str(run["status"]).startswith("finished"):
                break
        total = time.monotonic() - started
        time.sleep(1.0)  # the last log lines
    finally:
        _stop_all(procs)
    return {"ok": run["status"] == "finished:completed", "submit_to_finish_s": round(total, 1),
            "run_elapsed_s": round(float(run["elapsed"]), 1), "rounds": clock.rounds()}  # fmt: skip


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over every round of every repeat; CPU and RSS: median/max over repeats."""
    rounds = [r for run in runs for r in run.pop("rounds")]
    summary: dict[str, Any] = {
        "ok": all(run["ok"] for run in runs),
        "per_round_s": _median(r["total"] for r in rounds),
        "phases_s": {k: _median(r[k] for r in rounds) for k in ("train", "evaluate", "server")},
        "rounds_measured": len(rounds),
        "run_elapsed_s": _median(run["run_elapsed_s"] for run in runs),
        "repeats": runs,
    }
    kinds = {k for run in runs for k in run["cpu_s"]}
    summary["cpu_s"] = {k: _median(run["cpu_s"].get(k, 0.0) for run in runs) for k in sorted(kinds)}
    summary["peak_rss_mb"] = {
        k: max(run["peak_rss_mb"].get(k, 0) for run in runs) for k in sorted(kinds)
    }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--mode", choices=["ours", "bare", "both"], default="both")
    parser.add_argument("--ours-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--ours-client-arg", action="append", default=[], metavar="ARG")
    parser.add_argument("--ours-run-config", default="{}", metavar="JSON")
    args = parser.parse_args()
    OURS["env"] = dict(kv.split("=", 1) for kv in args.ours_env)
    OURS["client_args"] = list(args.ours_client_arg)
    OURS["run_config"] = json.loads(args.ours_run_config)
    root = Path(tempfile.mkdtemp(prefix="ocmfl-bench-"))
    p = setup(root)
    modes = [(m, fn) for m, fn in (("ours", run_ours), ("bare", run_bare))
             if args.mode in (m, "both")]  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for repeat in range(args.repeats):
        for mode, fn in modes:
            sampler = ProcSampler()
            sampler.start()
            try:
                run = fn(root, p, args.rounds, f"{mode}{repeat}")
            finally:
                sampler.stop.set()
                sampler.join()
            run.update(sampler.report())
            runs[mode].append(run)
            print(f"{mode} #{repeat + 1}: {json.dumps(run)}", file=sys.stderr, flush=True)
    report: dict[str, Any] = {"rounds": args.rounds, "repeats": args.repeats,
                              "load_avg": os.getloadavg()[0], "ours_settings": OURS}  # fmt: skip
    for mode, _ in modes:
        report[mode] = summarise(runs[mode])
    if "ours" in report and "bare" in report:
        ours, bare = report["ours"]["per_round_s"], report["bare"]["per_round_s"]
        report["ratio"] = round(ours / bare, 3) if ours and bare else None
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
