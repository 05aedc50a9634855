"""Per-cluster data partitions on disk, and the CLI that writes them.

On-disk format (one directory per cluster, plus ``test/`` for the held-out set)::

    OUT/manifest.json            {"format": "ocmfl-partitions/v1", "task", "split", "seed",
                                  "clusters": {name: samples}, "test": samples}
    OUT/<cluster>/data.npz       x: float32 [n, features], y: int64 [n]
    OUT/<cluster>/manifest.json  {"format": "ocmfl-partition/v1", "task", "name", "samples",
                                  "num_features", "num_classes", "label_histogram",
                                  "split", "seed", "sha256"}

A client is given exactly one ``<cluster>`` directory (the path its ClusterClaim names) and
reads nothing else. Usage::

    python -m workloads.data partition --out DIR --clusters c1,c2 --split label-skew \
        --sizes 3,1 --task digits
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

PARTITION_FORMAT = "ocmfl-partition/v1"
PARTITIONS_FORMAT = "ocmfl-partitions/v1"
DATA_FILE = "data.npz"
MANIFEST_FILE = "manifest.json"
TEST_DIR = "test"

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


class PartitionError(Exception):
    """A partition directory is missing or malformed; the message names the path."""


@dataclass(frozen=True)
class Partition:
    """One loaded partition: features, labels and its manifest."""

    path: Path
    x: FloatArray
    y: IntArray
    manifest: dict[str, Any]

    @property
    def samples(self) -> int:
        """Number of samples."""
        return len(self.y)


# --- pure splitting ------------------------------------------------------------------------


def parse_sizes(text: str | None, n: int) -> list[float]:
    """Relative partition sizes from "3,1" style text (equal when empty), normalised to 1."""
    if not text:
        return [1.0 / n] * n
    values = [float(v) for v in text.split(",") if v.strip()]
    if len(values) != n:
        raise ValueError(f"--sizes has {len(values)} values for {n} clusters")
    if any(v <= 0 for v in values):
        raise ValueError("--sizes values must be > 0")
    total = sum(values)
    return [v / total for v in values]


def _cuts(n: int, weights: Sequence[float]) -> list[int]:
    """Integer counts that sum to n, proportional to weights (largest remainder)."""
    raw = [w * n for w in weights]
    counts = [int(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def split_indices(
    y: IntArray,
    sizes: Sequence[float],
    *,
    split: str,
    seed: int,
    alpha: float = 0.5,
) -> list[IntArray]:
    """Assign every index of ``y`` to one of ``len(sizes)`` partitions.

    ``iid``: shuffled, cut by ``sizes``. ``label-skew``: partition sizes follow ``sizes``
    exactly, and each partition draws its labels from its own Dirichlet(``alpha``) preference
    over the classes (smaller alpha, more skew) as far as the classes have samples left.
    """
    rng = np.random.default_rng(seed)
    k = len(sizes)
    if split == "iid":
        order = rng.permutation(len(y))
        counts = _cuts(len(y), sizes)
        bounds = np.cumsum([0, *counts])
        return [np.sort(order[bounds[i] : bounds[i + 1]]).astype(np.int64) for i in range(k)]
    if split != "label-skew":
        raise ValueError(f"unknown split {split!r}: expected 'iid' or 'label-skew'")
    labels = np.unique(y)
    pools = {int(c): list(rng.permutation(np.flatnonzero(y == c))) for c in labels}
    targets = _cuts(len(y), sizes)
    parts: list[IntArray] = []
    for i, target in enumerate(targets):
        if i == k - 1:  # the last partition takes what is left (exactly its target)
            rest = [j for pool in pools.values() for j in pool]
            parts.append(np.sort(np.asarray(rest, dtype=np.int64)))
            break
        prefs = rng.dirichlet([alpha] * len(labels))
        want = dict(zip((int(c) for c in labels), _cuts(target, list(prefs)), strict=True))
        take = {c: min(n, len(pools[c])) for c, n in want.items()}
        short = target - sum(take.values())
        # Fill any shortfall from the classes this partition prefers most, then the fullest.
        by_pref = sorted(take, key=lambda c: (-want[c], -len(pools[c])))
        while short > 0:
            for c in by_pref:
                if short > 0 and take[c] < len(pools[c]):
                    take[c] += 1
                    short -= 1
        chosen: list[int] = []
        for c, n in take.items():
            chosen.extend(int(j) for j in pools[c][:n])
            pools[c] = pools[c][n:]
        parts.append(np.sort(np.asarray(chosen, dtype=np.int64)))
    return parts


def label_histogram(y: IntArray) -> dict[str, int]:
    """Label -> count, labels as strings (JSON keys)."""
    labels, counts = np.unique(y, return_counts=True)
    return {str(int(k)): int(c) for k, c in zip(labels, counts, strict=True)}


# --- I/O -----------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_partition(
    directory: Path,
    x: FloatArray,
    y: IntArray,
    *,
    name: str,
    task: str,
    num_classes: int,
    split: str,
    seed: int,
) -> dict[str, Any]:
    """Write one partition (data.npz + manifest.json) and return its manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    data_path = directory / DATA_FILE
    with data_path.open("wb") as fh:
        np.savez(fh, x=x.astype(np.float32), y=y.astype(np.int64))
    manifest: dict[str, Any] = {
        "format": PARTITION_FORMAT,
        "task": task,
        "name": name,
        "samples": len(y),
        "num_features": int(x.shape[1]),
        "num_classes": num_classes,
        "label_histogram": label_histogram(y),
        "split": split,
        "seed": seed,
        "sha256": _sha256(data_path),
    }
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def load_partition(directory: str | Path) -> Partition:
    """Load and validate a partition directory; raise PartitionError naming the path."""
    path = Path(directory)
    if not path.is_dir():
        raise PartitionError(f"data directory {path} does not exist or is not a directory")
    manifest_path = path / MANIFEST_FILE
    data_path = path / DATA_FILE
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise PartitionError(f"data directory {path} has no {MANIFEST_FILE}") from None
    except (OSError, ValueError) as exc:
        raise PartitionError(f"cannot read {manifest_path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != PARTITION_FORMAT:
        raise PartitionError(f"{manifest_path} is not an {PARTITION_FORMAT} manifest")
    try:
        with np.load(data_path, allow_pickle=False) as npz:
            x = np.asarray(npz["x"], dtype=np.float32)
            y = np.asarray(npz["y"], dtype=np.int64)
    except FileNotFoundError:
        raise PartitionError(f"data directory {path} has no {DATA_FILE}") from None
    except (OSError, ValueError, KeyError) as exc:
        raise PartitionError(f"cannot read {data_path}: {exc}") from None
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
        raise PartitionError(f"{data_path}: x must be [n, f] and y [n], got {x.shape}, {y.shape}")
    if len(y) == 0 or len(y) != manifest.get("samples"):
        raise PartitionError(
            f"{data_path}: {len(y)} samples, manifest says {manifest.get('samples')}"
        )
    if x.shape[1] != manifest.get("num_features"):
        raise PartitionError(f"{data_path}: {x.shape[1]} features, manifest disagrees")
    return Partition(path=path, x=x, y=y, manifest=manifest)


def partition(
    out: Path,
    clusters: Sequence[str],
    *,
    task_name: str = "digits",
    split: str = "iid",
    sizes: str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    alpha: float = 0.5,
) -> dict[str, Any]:
    """Split a task's data set into per-cluster partitions plus a held-out test set."""
    from workloads.tasks import get_task

    if not clusters or len(set(clusters)) != len(clusters):
        raise ValueError("--clusters needs distinct, non-empty names")
    if TEST_DIR in clusters:
        raise ValueError(f"{TEST_DIR!r} is reserved for the held-out test set")
    task = get_task(task_name)
    x, y = task.load_dataset()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    n_test = round(len(y) * test_fraction)
    test_idx, pool_idx = np.sort(order[:n_test]), np.sort(order[n_test:])
    weights = parse_sizes(sizes, len(clusters))
    parts = split_indices(y[pool_idx], weights, split=split, seed=seed + 1, alpha=alpha)
    common = {"task": task.name, "num_classes": task.num_classes, "split": split, "seed": seed}
    summary: dict[str, Any] = {
        "format": PARTITIONS_FORMAT,
        **common,
        "clusters": {},
        "test": 0,
    }
    for name, idx in zip(clusters, parts, strict=True):
        sel = pool_idx[idx]
        m = write_partition(out / name, x[sel], y[sel], name=name, **common)  # type: ignore[arg-type]
        summary["clusters"][name] = m["samples"]
    if n_test:
        m = write_partition(out / TEST_DIR, x[test_idx], y[test_idx], name=TEST_DIR, **common)  # type: ignore[arg-type]
        summary["test"] = m["samples"]
    (out / MANIFEST_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: ``python -m workloads.data partition ...``."""
    parser = argparse.ArgumentParser(prog="python -m workloads.data")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("partition", help="write per-cluster partitions and a held-out test set")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--clusters", required=True, help="comma-separated cluster names")
    p.add_argument("--task", default="digits", help="digits | breast-cancer")
    p.add_argument("--split", default="iid", choices=["iid", "label-skew"])
    p.add_argument("--sizes", default=None, help="relative sizes, e.g. 3,1 (default equal)")
    p.add_argument("--alpha", type=float, default=0.5, help="label-skew Dirichlet alpha")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    clusters = [c.strip() for c in args.clusters.split(",") if c.strip()]
    try:
        summary = partition(
            args.out,
            clusters,
            task_name=args.task,
            split=args.split,
            sizes=args.sizes,
            test_fraction=args.test_fraction,
            seed=args.seed,
            alpha=args.alpha,
        )
    except ValueError as exc:
        print(f"partition: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
