"""The model on the wire as float16 against float32 (``run_strategy(..., wire_dtype=...)``),
both through the platform path in the same run.

    .venv/bin/python bench/bench_wire_format.py [--rounds 5] [--params 1e7] [--repeat 2]

Two apps, each run once per wire format (``--repeat`` times, alternating), through
ocm-fl-server + 2 x ocm-fl-client (mTLS gateway and tunnels, SuperLink, SuperNodes, worker,
model store), as bench_federation and bench_large_model run them:
- ``examples/apps/digits`` (the digits MLP, label-skewed partitions, ``--rounds`` rounds): the
  accuracy effect, as the held-out test accuracy of the final model;
- ``tests/apps/large`` at ``--params`` float32 numbers (2 rounds): the bytes and the time;
  its ServerApp checks every number of the final model (to float16's rounding with float16).

Bytes are what crossed the loopback interface during the run (``/proc/net/dev``, lo's
received bytes): every hop of the platform path (client -> tunnel -> gateway -> SuperLink and
back) and the processes' other traffic, so the float16/float32 ratio is the saving the whole
path sees, not just the model's. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # hack/ is not installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_federation import APP, OURS, run_ours, setup
from bench_large_model import LARGE_APP

WIRES = ("float32", "float16")


def loopback_bytes() -> int:
    """Bytes received on the loopback interface since boot."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[0])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def one_run(
    root: Path, p: dict[str, Path], app: Path, config: dict[str, Any], rounds: int, tag: str
) -> dict[str, Any]:
    OURS["run_config"] = config
    before = loopback_bytes()
    run = run_ours(root, p, rounds, tag, app=app)
    moved = loopback_bytes() - before
    per_round = [r["total"] for r in run.pop("rounds")]
    return {
        "ok": run["ok"],
        "wire_mb": round(moved / 2**20, 1),
        "per_round_s": round(statistics.median(per_round), 2) if per_round else None,
        "test_accuracy": run.get("test_accuracy"),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats, and every run."""

    def med(key: str) -> float | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return round(statistics.median(values), 4) if values else None

    return {"ok": all(r["ok"] for r in runs), "wire_mb": med("wire_mb"),
            "per_round_s": med("per_round_s"), "test_accuracy": med("test_accuracy"),
            "runs": runs}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the digits app")
    parser.add_argument("--params", default="1e7", help="numbers of the large app's model")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ocmfl-wire-"))
    p = setup(root)
    apps = {
        "digits": (APP, {}, args.rounds),
        "large": (LARGE_APP, {"params": int(float(args.params)), "layers": 8}, 2),
    }
    out: dict[str, Any] = {}
    for name, (app, config, rounds) in apps.items():
        runs: dict[str, list[dict[str, Any]]] = {w: [] for w in WIRES}
        for i in range(args.repeat):
            for wire in WIRES:
                tag = f"{name}-{wire}-{i}"
                got = one_run(root, p, app, {**config, "wire-dtype": wire}, rounds, tag)
                print(json.dumps({tag: got}), file=sys.stderr, flush=True)
                runs[wire].append(got)
        result = {w: summary(r) for w, r in runs.items()}
        full, half = result["float32"], result["float16"]
        if full["wire_mb"] and half["wire_mb"]:
            result["wire_ratio"] = round(half["wire_mb"] / full["wire_mb"], 3)
        if full["per_round_s"] and half["per_round_s"]:
            result["time_ratio"] = round(half["per_round_s"] / full["per_round_s"], 3)
        out[name] = result
    print(json.dumps({"rounds": args.rounds, "params": args.params, "apps": out}, indent=2))


if __name__ == "__main__":
    main()
