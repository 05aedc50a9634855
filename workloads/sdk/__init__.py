"""The ocm-fl app SDK: everything a Flower app needs from the platform, and nothing else.

An ordinary Flower 1.42 app (``pyproject.toml`` with ``[tool.flwr.app]``, a ServerApp and a
ClientApp) trains on the platform as it is. These functions give it the platform's features:

ClientApp side
- ``data_dir(context)``: this cluster's data directory (from its ClusterClaim), with an error
  naming the path when it is missing or empty.
- ``cluster_name(context)``: the managed cluster's name.
- ``PlatformClientApp``: Flower's ClientApp that, when the server asks
  (``run_strategy(..., evaluate_in_train=True)``), runs the app's evaluate function inside the
  train call and returns its metrics with the train reply: one phase per round, not two; and
  takes a model the server narrowed for the wire in the app's own dtypes.
- ``wire_format``: that widening as a mod, for a plain ``ClientApp``.
- ``forwarding_client_app("pkg.client_app:app")``: a thin ClientApp (no torch import) that
  runs the real one in the cluster's long-lived worker (``ocm-fl-client`` starts it, with the
  model stack imported once), else in its own process.
- ``agent_metrics``: a ClientApp mod (``ClientApp(mods=[agent_metrics])``) that reports each
  reply's loss/accuracy/samples to the cluster's addon agent (shown in the resource's status);
  never blocks, never fails training.

ServerApp side
- ``run_strategy(strategy, grid, initial_arrays=..., num_rounds=...)``: Flower's strategy loop
  with the starting model (``initModel``: .npz, Flower ArrayRecord, torch .pt/.pth,
  safetensors), a checkpoint and manifest every round, the final model, resume from this
  resource's newest checkpoint, the minimum-results rule, replies pulled every 0.2 s (Flower:
  3 s), with ``evaluate_in_train=True`` client evaluation folded into the train phase, and
  with ``wire_dtype="float16"`` the model sent both ways in half the bytes
  (``workloads.sdk.wire``).
- ``FedAvg``, ``FedProx``: Flower's strategies with the weighted average computed at memory
  speed (same arguments, same results; ``workloads.sdk.aggregate``); with ``run_strategy``
  each train reply is folded into a running sum as it arrives, so the ServerApp does not hold
  every client's model at once.
- ``ModelStore``, ``load_model``: the store itself (directory/PVC or S3-compatible) and model
  files, for apps that write their own loop or evaluate a stored model.
"""

from workloads.sdk.aggregate import FedAvg, FedProx
from workloads.sdk.client import EVALUATE_IN_TRAIN, FOLDED_RECORD, PlatformClientApp
from workloads.sdk.formats import ModelFormatError, read_model, to_numpy, to_record
from workloads.sdk.loop import (
    PlatformGrid,
    StartModelError,
    TooFewResultsError,
    run_strategy,
)
from workloads.sdk.metrics import agent_metrics
from workloads.sdk.node import DataDirError, agent_endpoint, cluster_name, data_dir
from workloads.sdk.platform import ServerPlatform
from workloads.sdk.store import Checkpoint, ModelStore, ModelStoreError, load_model
from workloads.sdk.wire import WireFormatError, wire_format
from workloads.sdk.worker import forwarding_client_app

__all__ = [
    "EVALUATE_IN_TRAIN",
    "FOLDED_RECORD",
    "Checkpoint",
    "DataDirError",
    "FedAvg",
    "FedProx",
    "ModelFormatError",
    "ModelStore",
    "ModelStoreError",
    "PlatformClientApp",
    "PlatformGrid",
    "ServerPlatform",
    "StartModelError",
    "TooFewResultsError",
    "WireFormatError",
    "agent_endpoint",
    "agent_metrics",
    "cluster_name",
    "data_dir",
    "forwarding_client_app",
    "load_model",
    "read_model",
    "run_strategy",
    "to_numpy",
    "to_record",
    "wire_format",
]
