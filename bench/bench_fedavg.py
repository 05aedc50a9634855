"""FedAvg aggregation speed against this machine's memory read bandwidth, in the same run.

    .venv/bin/python bench/bench_fedavg.py [--params 10000000] [--clients 10] [--repeats 5]

Builds `--clients` train replies (ArrayRecord of `--params` float32 values in a few tensors,
plus the `num-examples` MetricRecord, as Flower receives them), then times, best of
`--repeats` taken in turns (so each sees the same spells of load): the memory read bandwidth
(numpy summing a float32 buffer as large as all the client arrays together, on one core and
on all cores, the faster counts), Flower's `aggregate_arrayrecords` and the SDK's. Speed of
an aggregation = the bytes of client arrays it must read / its time; printed as a fraction of
the bandwidth, with the largest difference
between the two results and the engine of ours (torch's fused multiply-add when torch is
installed, else numpy with Flower's very operations). Not a test: numbers depend on the
machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords as flower_aggregate

from workloads.sdk import aggregate
from workloads.sdk.aggregate import aggregate_arrayrecords as our_aggregate


def replies(params: int, clients: int, seed: int = 0) -> list[RecordDict]:
    """Client replies: a model of `params` float32 values split over four tensors."""
    rng = np.random.default_rng(seed)
    sizes = [params // 2, params // 4, params // 8]
    sizes.append(params - sum(sizes))
    out = []
    for c in range(clients):
        arrays = {
            f"layer{i}": rng.standard_normal(n, dtype=np.float32) for i, n in enumerate(sizes)
        }
        metrics = MetricRecord({"num-examples": 100 + 37 * c})
        out.append(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                    "metrics": metrics,
                }
            )
        )
    return out


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, tuple[float, Any]]:
    """Best time and last result of each function, the functions taking turns each repeat:
    on a shared machine every one of them then sees the same spells of load."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    results: dict[str, Any] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            started = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - started)
    return {name: (min(times[name]), results[name]) for name in fns}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=10_000_000)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    records = replies(args.params, args.clients)
    read_bytes = args.params * args.clients * 4
    buffer = np.ones(args.params * args.clients, dtype=np.float32)
    # Our average uses every core: so does one of the reads (numpy's sum releases the GIL).
    cores = len(os.sched_getaffinity(0))
    parts = np.array_split(buffer, cores)
    with ThreadPoolExecutor(cores) as pool:
        timed = interleaved(
            {
                "read_one_core": lambda: float(buffer.sum()),
                "read_all_cores": lambda: sum(pool.map(lambda a: float(a.sum()), parts)),
                "flower": lambda: flower_aggregate(records, "num-examples"),
                "ours": lambda: our_aggregate(records, "num-examples"),
            },
            args.repeats,
        )
    bandwidth = read_bytes / min(timed["read_one_core"][0], timed["read_all_cores"][0])
    flower_s, flower = timed["flower"]
    ours_s, ours = timed["ours"]
    diff = max(float(np.max(np.abs(flower[k].numpy() - ours[k].numpy()))) for k in flower)
    report = {
        "params": args.params,
        "clients": args.clients,
        "load_avg": os.getloadavg()[0],
        "engine": "torch" if aggregate._torch() is not None else "numpy",
        "read_bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "flower_s": round(flower_s, 4),
        "ours_s": round(ours_s, 4),
        "flower_fraction_of_bandwidth": round(read_bytes / flower_s / bandwidth, 3),
        "ours_fraction_of_bandwidth": round(read_bytes / ours_s / bandwidth, 3),
        "speedup": round(flower_s / ours_s, 2),
        "max_abs_difference": diff,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
