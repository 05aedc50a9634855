"""ClientApp: trains and evaluates the global model on this cluster's partition only.

The SuperNode's node config (set by ``ocm-fl-client``) says which cluster this is, the data
directory (the one the cluster's ClusterClaim points to) and the local agent endpoint.
"""

from __future__ import annotations

import os
import time
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ocmfl.constants import ENV_AGENT_ENDPOINT, ENV_CLUSTER_NAME, ENV_DATA_DIR
from workloads.data import Partition, load_partition
from workloads.fedapp.arrays import from_array_record, to_array_record
from workloads.fedapp.settings import (
    NODE_AGENT_ENDPOINT,
    NODE_CLUSTER,
    NODE_DATA_DIR,
    RunSettings,
    client_settings,
)
from workloads.metrics_hook import LocalMetrics, post_metrics
from workloads.tasks import Task, get_task
from workloads.tasks.common import evaluate, set_weights, train

app = ClientApp()

CLIENT_RECORD = "client"  # ConfigRecord in every reply: {"cluster": name}


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
    if not data_dir:
        raise RuntimeError(f"cluster {cluster}: no data directory configured ({NODE_DATA_DIR})")
    task = get_task(settings.task)
    partition = load_partition(data_dir)
    if partition.manifest.get("task") != task.name:
        raise RuntimeError(
            f"{data_dir} holds task {partition.manifest.get('task')!r}, run wants {task.name!r}"
        )
    return cluster, task, partition


def _reply(
    msg: Message, cluster: str, metrics: dict[str, Any], arrays: ArrayRecord | None
) -> Message:
    content = RecordDict(
        {"metrics": MetricRecord(metrics), CLIENT_RECORD: ConfigRecord({"cluster": cluster})}
    )
    if arrays is not None:
        content["arrays"] = arrays
    return Message(content=content, reply_to=msg)


@app.train()
def train_handler(msg: Message, context: Context) -> Message:
    """Train the received global model on the local partition."""
    started = time.monotonic()
    settings = client_settings(context.run_config, context.node_config)
    cluster, task, part = _load(context, settings)
    config = msg.content.config_records["config"]
    server_round = int(_number(config.get("server-round", 0)))
    mu = _number(config.get("proximal-mu", 0.0)) if settings.strategy == "fedprox" else 0.0
    model = task.build_model()
    set_weights(model, list(from_array_record(msg.content.array_records["arrays"]).values()))
    result = train(
        model,
        part.x,
        part.y,
        epochs=settings.local_epochs,
        lr=settings.lr,
        batch_size=settings.batch_size,
        proximal_mu=mu,
        seed=settings.seed + server_round,
    )
    duration = time.monotonic() - started
    post_metrics(
        _node_value(context, NODE_AGENT_ENDPOINT, ENV_AGENT_ENDPOINT),
        LocalMetrics(
            cluster, server_round, "fit", result.loss, result.accuracy, result.samples, duration
        ),
    )
    metrics = {
        "train-loss": result.loss,
        "train-accuracy": result.accuracy,
        "num-examples": result.samples,
        "duration-s": duration,
    }
    return _reply(msg, cluster, metrics, to_array_record(model))


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Evaluate the received global model on the local partition."""
    started = time.monotonic()
    settings = client_settings(context.run_config, context.node_config)
    cluster, task, part = _load(context, settings)
    server_round = int(_number(msg.content.config_records["config"].get("server-round", 0)))
    model = task.build_model()
    set_weights(model, list(from_array_record(msg.content.array_records["arrays"]).values()))
    result = evaluate(model, part.x, part.y)
    duration = time.monotonic() - started
    post_metrics(
        _node_value(context, NODE_AGENT_ENDPOINT, ENV_AGENT_ENDPOINT),
        LocalMetrics(
            cluster,
            server_round,
            "evaluate",
            result.loss,
            result.accuracy,
            result.samples,
            duration,
        ),
    )
    metrics = {
        "eval-loss": result.loss,
        "eval-accuracy": result.accuracy,
        "num-examples": result.samples,
    }
    return _reply(msg, cluster, metrics, None)
