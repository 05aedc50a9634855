"""ClientApp: trains and evaluates the global model on this cluster's partition only.

The SuperNode's node config (set by ``ocm-fl-client``) says which cluster this is, the data
directory (the one the cluster's ClusterClaim points to) and the local agent endpoint.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ocmfl.constants import ENV_AGENT_ENDPOINT, ENV_CLUSTER_NAME, ENV_DATA_DIR
from workloads.data import Partition, load_partition
from workloads.fedapp.arrays import from_array_record, named_to_array_record
from workloads.fedapp.settings import (
    NODE_AGENT_ENDPOINT,
    NODE_CLUSTER,
    NODE_DATA_DIR,
    RunSettings,
    client_settings,
)
from workloads.fedapp.strategies import CLIENT_RECORD  # every reply: {"cluster": name}
from workloads.metrics_hook import LocalMetrics, post_metrics
from workloads.tasks import Task, get_task
from workloads.tasks.common import evaluate, get_weights, set_weights, train

app = ClientApp()


def _node_value(context: Context, key: str, env: str) -> str:
    value = context.node_config.get(key) or os.environ.get(env, "")
    return str(value)


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number in the message config, got {value!r}")
    return float(value)


def _load(context: Context, settings: RunSettings) -> tuple[str, Task, Partition]:
    cluster = _node_value(context, NODE_CLUSTER, ENV_CLUSTER_NAME) or "unknown"
    data_dir = _node_value(context, NODE_DATA_DIR, ENV_DATA_DIR)
    task, part = load_local(cluster, data_dir, settings)
    return cluster, task, part


def load_local(cluster: str, data_dir: str, settings: RunSettings) -> tuple[Task, Partition]:
    """This cluster's task and partition; only ``data_dir`` is read."""
    if not data_dir:
        raise RuntimeError(f"cluster {cluster}: no data directory configured ({NODE_DATA_DIR})")
    task = get_task(settings.task)
    partition = load_partition(data_dir)
    if partition.manifest.get("task") != task.name:
        raise RuntimeError(
            f"{data_dir} holds task {partition.manifest.get('task')!r}, run wants {task.name!r}"
        )
    return task, partition


def _reply(
    msg: Message, cluster: str, metrics: dict[str, Any], arrays: ArrayRecord | None
) -> Message:
    content = RecordDict(
        {"metrics": MetricRecord(metrics), CLIENT_RECORD: ConfigRecord({"cluster": cluster})}
    )
    if arrays is not None:
        content["arrays"] = arrays
    return Message(content=content, reply_to=msg)


@dataclass(frozen=True)
class LocalResult:
    """What one local fit/evaluate produced, before it becomes a reply."""

    weights: dict[str, npt.NDArray[Any]] | None
    loss: float
    accuracy: float
    samples: int
    duration_s: float


def local_fit(
    task: Task,
    part: Partition,
    weights: Mapping[str, npt.NDArray[Any]],
    settings: RunSettings,
    server_round: int,
    proximal_mu: float,
) -> LocalResult:
    """Train the global weights on this partition (FedProx term when mu > 0)."""
    started = time.monotonic()
    model = task.build_model()
    set_weights(model, list(weights.values()))
    result = train(
        model,
        part.x,
        part.y,
        epochs=settings.local_epochs,
        lr=settings.lr,
        batch_size=settings.batch_size,
        proximal_mu=proximal_mu,
        seed=settings.seed + server_round,
    )
    names = list(model.state_dict().keys())
    new = dict(zip(names, get_weights(model), strict=True))
    return LocalResult(
        new, result.loss, result.accuracy, result.samples, time.monotonic() - started
    )


def local_evaluate(
    task: Task, part: Partition, weights: Mapping[str, npt.NDArray[Any]]
) -> LocalResult:
    """Evaluate the global weights on this partition."""
    started = time.monotonic()
    model = task.build_model()
    set_weights(model, list(weights.values()))
    result = evaluate(model, part.x, part.y)
    return LocalResult(
        None, result.loss, result.accuracy, result.samples, time.monotonic() - started
    )


def _config_number(msg: Message, key: str, default: float) -> float:
    return _number(msg.content.config_records["config"].get(key, default))


@app.train()
def train_handler(msg: Message, context: Context) -> Message:
    """Train the received global model on the local partition."""
    settings = client_settings(context.run_config, context.node_config)
    cluster, task, part = _load(context, settings)
    server_round = int(_config_number(msg, "server-round", 0))
    mu = _config_number(msg, "proximal-mu", 0.0) if settings.strategy == "fedprox" else 0.0
    weights = from_array_record(msg.content.array_records["arrays"])
    res = local_fit(task, part, weights, settings, server_round, mu)
    _post(context, cluster, server_round, "fit", res)
    metrics = {
        "train-loss": res.loss,
        "train-accuracy": res.accuracy,
        "num-examples": res.samples,
        "duration-s": res.duration_s,
    }
    assert res.weights is not None
    return _reply(msg, cluster, metrics, named_to_array_record(res.weights))


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Evaluate the received global model on the local partition."""
    settings = client_settings(context.run_config, context.node_config)
    cluster, task, part = _load(context, settings)
    server_round = int(_config_number(msg, "server-round", 0))
    weights = from_array_record(msg.content.array_records["arrays"])
    res = local_evaluate(task, part, weights)
    _post(context, cluster, server_round, "evaluate", res)
    metrics = {"eval-loss": res.loss, "eval-accuracy": res.accuracy, "num-examples": res.samples}
    return _reply(msg, cluster, metrics, None)


def _post(context: Context, cluster: str, server_round: int, phase: str, res: LocalResult) -> None:
    post_metrics(
        _node_value(context, NODE_AGENT_ENDPOINT, ENV_AGENT_ENDPOINT),
        LocalMetrics(
            cluster, server_round, phase, res.loss, res.accuracy, res.samples, res.duration_s
        ),
    )
