"""Evaluate a stored model (or the seeded starting model) on a held-out partition.

The local demo and the e2e test use it to show accuracy before and after training on data no
cluster trained on: `python -m workloads.evaluate --task digits --test-dir DIR [--model FILE]`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workloads.data import load_partition
from workloads.fedapp.settings import RunSettings
from workloads.model_store import load_arrays
from workloads.tasks import get_task
from workloads.tasks.common import EvalResult, build_model, evaluate, set_weights


def held_out(
    task: str, test_dir: Path, model_file: Path | None = None, seed: int | None = None
) -> EvalResult:
    """Loss/accuracy on `test_dir` of `model_file`, or of the seeded initial model if None."""
    model = build_model(get_task(task), RunSettings().seed if seed is None else seed)
    if model_file is not None:
        set_weights(model, list(load_arrays(model_file).values()))
    test = load_partition(test_dir)
    return evaluate(model, test.x, test.y)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m workloads.evaluate", description=__doc__)
    p.add_argument("--task", default="digits")
    p.add_argument("--test-dir", type=Path, required=True)
    p.add_argument("--model", type=Path, default=None, help=".npz; default: initial model")
    a = p.parse_args(argv)
    r = held_out(a.task, a.test_dir, a.model)
    print(json.dumps({"loss": r.loss, "accuracy": r.accuracy, "samples": r.samples}))


if __name__ == "__main__":
    main()
