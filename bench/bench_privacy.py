"""Privacy on the digits example (docs/privacy.md): plain, SecAgg+, central DP (alone and with
SecAgg+) and local DP at two noise levels, in the same run, through the platform path.

    .venv/bin/python bench/bench_privacy.py [--rounds 10] [--repeat 1] [--clip 5]

Every setting runs examples/apps/digits (label-skewed partitions, 2 clusters) through
ocm-fl-server + 2 x ocm-fl-client (mTLS gateway and tunnels, SuperLink, SuperNodes, the
ClientApp workers that clip and noise, model store), as bench_federation runs it:
- plain: no privacy;
- secagg: `--secure-aggregation` on the server (reconstruction threshold 2): every train phase
  is a SecAgg+ round between the two clients' workers;
- central: `--privacy` on the server (clients clip to --clip, the server adds noise of
  --noise x clip / 2 to the average);
- local, two epsilons: `--privacy` on each client (clip, then noise for (epsilon, 1e-5) per
  round), the server only accounts.
Per setting: median seconds per round, the held-out test accuracy of the final model, and the
privacy spent (epsilon at delta 1e-5 after all rounds, from the launcher's result). Prints one
JSON object.
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

from bench_federation import OURS, run_ours, setup

from ocmfl.privacy import ClientPrivacy, DpSettings, SecAggSettings, client_privacy

SECAGG = SecAggSettings(threshold=2)


def settings(clip: float, noise: float, epsilons: tuple[float, float]) -> dict[str, Any]:
    """name -> (the server's DP settings or None, the clients' ClientPrivacy or None, the
    server's SecAgg+ settings or None)."""
    central = DpSettings("central", clip, noise_multiplier=noise)
    out: dict[str, Any] = {
        "plain": (None, None, None),
        "secagg": (None, None, SECAGG),
        f"central z={noise:g}": (central, None, None),
        f"central z={noise:g} + secagg": (central, None, SECAGG),
    }
    for eps in epsilons:
        local = DpSettings("local", clip, epsilon=eps)
        out[f"local epsilon={eps:g}"] = (local, client_privacy("bench", local, None), None)
    return out


def one_run(
    root: Path,
    p: dict[str, Path],
    rounds: int,
    tag: str,
    server: DpSettings | None,
    client: ClientPrivacy | None,
    secagg: SecAggSettings | None = None,
) -> dict[str, Any]:
    OURS["server_args"] = [] if server is None else ["--privacy", json.dumps(server.to_spec())]
    if secagg is not None:
        OURS["server_args"] += ["--secure-aggregation", json.dumps(secagg.to_spec())]
    OURS["client_args"] = [] if client is None else ["--privacy", client.to_json()]
    run = run_ours(root, p, rounds, tag)
    per_round = [r["total"] for r in run.pop("rounds")]
    spent = run.get("privacy") or {}
    return {
        "ok": run["ok"],
        "per_round_s": round(statistics.median(per_round), 2) if per_round else None,
        "test_accuracy": run.get("test_accuracy"),
        "epsilon": spent.get("epsilon"),
        "round_epsilon": spent.get("round-epsilon"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--clip", type=float, default=5.0, help="clipping norm")
    parser.add_argument("--noise", type=float, default=0.3, help="central noise multiplier")
    parser.add_argument("--epsilons", default="0.9,0.5", help="two local epsilons per round")
    args = parser.parse_args()
    eps = tuple(float(e) for e in args.epsilons.split(","))
    if len(eps) != 2:
        parser.error("--epsilons takes two values")
    root = Path(tempfile.mkdtemp(prefix="ocmfl-privacy-"))
    p = setup(root)
    out: dict[str, Any] = {}
    chosen = settings(args.clip, args.noise, (eps[0], eps[1]))
    for name, (server, client, secagg) in chosen.items():
        runs = []
        for i in range(args.repeat):
            got = one_run(root, p, args.rounds, f"{name.split()[0]}-{len(out)}-{i}", server,
                          client, secagg)  # fmt: skip
            print(json.dumps({name: got}), file=sys.stderr, flush=True)
            runs.append(got)
        out[name] = {
            "ok": all(r["ok"] for r in runs),
            "per_round_s": statistics.median(r["per_round_s"] or 0.0 for r in runs),
            "test_accuracy": statistics.median(r["test_accuracy"] or 0.0 for r in runs),
            "epsilon": runs[0]["epsilon"],
            "round_epsilon": runs[0]["round_epsilon"],
        }
    plain = out["plain"]["per_round_s"] or 1.0
    for row in out.values():
        row["time_ratio"] = round((row["per_round_s"] or 0.0) / plain, 3)
    print(json.dumps({"rounds": args.rounds, "clip": args.clip, "settings": out}, indent=2))


if __name__ == "__main__":
    main()
