"""Time per round and memory per process: our launchers vs a bare Flower run of the same app.

    .venv/bin/python bench/bench_federation.py --rounds 3 [--mode ours|bare|both]

"ours": ocm-fl-server + 2 x ocm-fl-client (TLS, SuperNode auth, checkpoints, server-side
evaluation). "bare": flower-superlink --insecure + 2 flower-supernode --insecure + flwr run,
same app and data. Round time = run elapsed (from `flwr ls`) / rounds; memory = peak RSS per
process kind, sampled every 0.5 s from /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from hack.testing import free_port
from ocmfl import pki
from ocmfl.nodekeys import write_keypair
from workloads.data import partition
from workloads.flower_env import flower_env, write_connection

BIN = Path(sys.executable).parent
APP = Path(__file__).resolve().parents[1] / "examples" / "apps" / "digits"
KINDS = ("ocm-fl-server", "ocm-fl-client", "flower-superlink", "flower-supernode",
         "flower-superexec", "flwr-serverapp", "flwr-clientapp")  # fmt: skip


class RssSampler(threading.Thread):
    """Peak RSS (MB) per process kind, summed over processes of one kind running at once."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_each: dict[str, float] = defaultdict(float)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                kind = next((k for k in KINDS if f"/{k} " in cmd or cmd.endswith(f"/{k}")), None)
                if kind is None:
                    continue
                rss = next((ln for ln in status.splitlines() if ln.startswith("VmRSS:")), "")
                mb = int(rss.split()[1]) / 1024 if rss else 0.0
                self.peak_each[kind] = max(self.peak_each[kind], mb)
            time.sleep(0.5)


def setup(root: Path) -> dict[str, Path]:
    ca = pki.create_ca(key_kind="ec")
    srv = pki.issue_server_cert(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    tls = pki.save_tls_dir(root / "tls", srv, ca.cert)
    (root / "pubs").mkdir()
    for c in ("cluster1", "cluster2"):
        pub = write_keypair(root / "keys" / c)
        (root / "pubs" / f"{c}.pub").write_bytes(pub.read_bytes())
    partition(root / "data", ["cluster1", "cluster2"], split="label-skew", sizes="2,1", seed=0)
    return {"tls": tls, "keys": root / "keys", "pubs": root / "pubs", "data": root / "data"}


def run_ours(root: Path, p: dict[str, Path], rounds: int, frac_eval: float) -> dict[str, Any]:
    port = free_port()
    clients = [
        subprocess.Popen(
            [
                str(BIN / "ocm-fl-client"),
                "--server-address",
                f"127.0.0.1:{port}",
                "--root-certificates",
                str(p["tls"] / "ca.crt"),
                "--auth-key",
                str(p["keys"] / c),
                "--cluster-name",
                c,
                "--data-dir",
                str(p["data"] / c),
                "--state-dir",
                str(root / f"ours-{c}"),
                "--port",
                str(free_port()),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for c in ("cluster1", "cluster2")
    ]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(BIN / "ocm-fl-server"), "--state-dir", str(root / "ours-server"),
             "--superlink-address", f"127.0.0.1:{port}",
             "--ssl-ca-certfile", str(p["tls"] / "ca.crt"),
             "--ssl-certfile", str(p["tls"] / "tls.crt"),
             "--ssl-keyfile", str(p["tls"] / "tls.key"),
             "--supernode-keys", str(p["pubs"]), "--rounds", str(rounds),
             "--app-dir", str(APP), "--storage", str(root / "ours-model"),
             "--run-config", json.dumps({"test-dir": str(p["data"] / "test"),
                                         "fraction-evaluate": frac_eval}),
             "--status-interval", "5",
             "--result-file", str(root / "ours.json")],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    finally:
        for c in clients:
            os.killpg(c.pid, signal.SIGTERM)
            c.wait(timeout=30)
    total = time.monotonic() - started
    result = json.loads((root / "ours.json").read_text())
    elapsed = float(result["details"]["elapsed"])
    return {"ok": done.returncode == 0, "launcher_total_s": round(total, 1),
            "run_elapsed_s": round(elapsed, 1), "per_round_s": round(elapsed / rounds, 1),
            "test_accuracy": result.get("metrics", {}).get("test-accuracy")}  # fmt: skip


def run_bare(root: Path, p: dict[str, Path], rounds: int, _frac_eval: float) -> dict[str, Any]:
    port = free_port()
    home = root / "bare-home"
    env = flower_env(home)
    write_connection(home, f"127.0.0.1:{port}", p["tls"] / "ca.crt")
    cfg = home / "config.toml"
    cfg.write_text(cfg.read_text().split("root-certificates")[0] + "insecure = true\n")
    procs = [
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
    for c in ("cluster1", "cluster2"):
        (root / f"bare-{c}.toml").write_text(
            f'cluster-name = "{c}"\ndata-dir = "{p["data"] / c}"\n'
        )
        procs.append(subprocess.Popen(
            [str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}",
             "--port", str(free_port()), "--node-config", str(root / f"bare-{c}.toml")],
            env=flower_env(root / f"bare-{c}-home"), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True))  # fmt: skip
    try:
        time.sleep(8)
        rc = root / "bare-rc.toml"
        rc.write_text(f"num-server-rounds = {rounds}\n")  # no platform env: nothing stored
        started = time.monotonic()
        out = subprocess.run(
            [
                str(BIN / "flwr"),
                "run",
                str(APP),
                "ocmfl",
                "--format",
                "json",
                "--run-config",
                str(rc),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        run_id = json.loads(out.stdout)["run-id"]
        while True:
            time.sleep(3)
            ls = subprocess.run(
                [str(BIN / "flwr"), "ls", "ocmfl", "--run-id", str(run_id), "--format", "json"],
                env=env,
                capture_output=True,
                text=True,
            )
            run = json.loads(ls.stdout)["runs"][0]
            if str(run["status"]).startswith("finished"):
                break
        total = time.monotonic() - started
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    elapsed = float(run["elapsed"])
    return {
        "ok": run["status"] == "finished:completed",
        "submit_to_finish_s": round(total, 1),
        "run_elapsed_s": round(elapsed, 1),
        "per_round_s": round(elapsed / rounds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=["ours", "bare", "both"], default="both")
    parser.add_argument(
        "--fraction-evaluate",
        type=float,
        default=1.0,
        help="ours only: 0 skips client-side evaluation (server evaluates)",
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ocmfl-bench-"))
    p = setup(root)
    report: dict[str, Any] = {"rounds": args.rounds}
    for mode, fn in (("ours", run_ours), ("bare", run_bare)):
        if args.mode not in (mode, "both"):
            continue
        sampler = RssSampler()
        sampler.start()
        report[mode] = fn(root, p, args.rounds, args.fraction_evaluate)
        sampler.stop.set()
        sampler.join()
        report[mode]["peak_rss_mb"] = {k: round(v) for k, v in sorted(sampler.peak_each.items())}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
