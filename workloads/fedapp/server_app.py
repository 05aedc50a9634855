"""ServerApp: runs the rounds, checkpoints every round, resumes, saves the final model.

Start model, in order: the newest intact checkpoint in the storage directory (a restarted
server trains only the remaining rounds), else ``init-model`` (an .npz of named arrays), else
a fresh model seeded with ``seed``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, MetricRecordValues
from flwr.serverapp import Grid, ServerApp

from workloads.data import Partition, load_partition
from workloads.fedapp.arrays import from_array_record, named_to_array_record
from workloads.fedapp.settings import RunSettings
from workloads.fedapp.strategies import make_strategy
from workloads.model_store import ModelStore, load_arrays
from workloads.tasks import get_task
from workloads.tasks.common import build_model, evaluate, get_weights, set_weights

log = logging.getLogger(__name__)

app = ServerApp()


def _plain(metrics: Any) -> Any:
    """MetricRecord values (and nested dicts of them) as JSON-able Python values."""
    if isinstance(metrics, dict | MetricRecord):
        return {str(k): _plain(v) for k, v in metrics.items()}
    if isinstance(metrics, list):
        return [_plain(v) for v in metrics]
    return metrics


def run_training(grid: Grid, settings: RunSettings) -> dict[str, Any]:
    """Train for the remaining rounds; return a summary of the final model."""
    if not settings.storage_dir:
        raise ValueError("storage-dir is required (checkpoints and the final model go there)")
    task = get_task(settings.task)
    store = ModelStore(Path(settings.storage_dir))
    model = build_model(task, settings.seed)
    names = list(model.state_dict().keys())

    done = 0
    checkpoint = store.latest()
    if checkpoint is not None:
        done = checkpoint.round
        start = checkpoint.arrays
        print(f"resuming from checkpoint of round {done}", flush=True)
    elif settings.init_model:
        start = load_arrays(Path(settings.init_model))
    else:
        start = dict(zip(names, get_weights(model), strict=True))
    set_weights(model, list(start.values()))  # also checks the shapes fit the task's model

    test: Partition | None = load_partition(settings.test_dir) if settings.test_dir else None
    remaining = settings.num_server_rounds - done
    if remaining <= 0:
        final = store.final()
        if final is None:
            store.save_final(done, start, checkpoint.entry["metrics"] if checkpoint else {})
        return {"round": done, "resumed_from": done, "rounds_run": 0}

    strategy = make_strategy(settings)

    def server_eval(arrays: ArrayRecord) -> dict[str, MetricRecordValues]:
        if test is None:
            return {}
        set_weights(model, list(from_array_record(arrays).values()))
        result = evaluate(model, test.x, test.y)
        return {"test-loss": result.loss, "test-accuracy": result.accuracy}

    def on_round(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        metrics = server_eval(arrays)
        if server_round == 0:
            store.append_info(
                "starts", {"round": done, "rounds_to_run": remaining, "server": metrics}
            )
            return MetricRecord(metrics) if metrics else None
        global_round = done + server_round
        store.save_checkpoint(
            global_round,
            from_array_record(arrays),
            {
                "server": metrics,
                "train": _plain(strategy.train_by_round.get(server_round, {})),
                "evaluate": _plain(strategy.evaluate_by_round.get(server_round, {})),
            },
        )
        print(
            f"round {global_round}/{settings.num_server_rounds} checkpointed {metrics}", flush=True
        )
        return MetricRecord(metrics) if metrics else None

    result = strategy.start(
        grid=grid,
        initial_arrays=named_to_array_record(start),
        num_rounds=remaining,
        timeout=settings.round_timeout,
        train_config=ConfigRecord({"lr": settings.lr}),
        evaluate_fn=on_round,
    )
    final_arrays = from_array_record(result.arrays) if result.arrays is not None else start
    last = store.latest()
    entry = store.save_final(
        settings.num_server_rounds, final_arrays, last.entry["metrics"] if last else {}
    )
    return {
        "round": settings.num_server_rounds,
        "resumed_from": done,
        "rounds_run": remaining,
        "sha256": entry["sha256"],
    }


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower entry point: parse the run config and train."""
    settings = RunSettings.from_run_config(context.run_config)
    summary = run_training(grid, settings)
    print(f"training finished: {summary}", flush=True)
