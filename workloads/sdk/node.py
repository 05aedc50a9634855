"""ClientApp side: this cluster's name, data directory and per-cluster values."""

from __future__ import annotations

import os
from pathlib import Path

from flwr.app import Context

from ocmfl.constants import ENV_AGENT_ENDPOINT, ENV_CLUSTER_NAME, ENV_DATA_DIR
from workloads.sdk.platform import NODE_AGENT_ENDPOINT, NODE_CLUSTER, NODE_DATA_DIR


class DataDirError(RuntimeError):
    """This cluster's data directory is not configured, missing or empty; the message names
    the path (and the node config key it came from)."""


def _node_value(context: Context | None, key: str, env: str) -> str:
    value = context.node_config.get(key) if context is not None else None
    return str(value) if value not in (None, "") else os.environ.get(env, "")


def cluster_name(context: Context | None = None) -> str:
    """The managed cluster this ClientApp runs on ("" outside the platform)."""
    return _node_value(context, NODE_CLUSTER, ENV_CLUSTER_NAME)


def agent_endpoint(context: Context | None = None) -> str:
    """The local addon agent's URL ("" when there is none)."""
    return _node_value(context, NODE_AGENT_ENDPOINT, ENV_AGENT_ENDPOINT)


def data_dir(context: Context | None = None) -> Path:
    """This cluster's data directory: the path its ClusterClaim names, mounted into the pod.

    Read from node config ``data-dir`` (``$OCMFL_DATA_DIR`` as a fallback). Raises
    DataDirError naming the path when it is not set, does not exist, is not a directory or
    is empty, so the run fails with a message that says which cluster and which path.
    """
    raw = _node_value(context, NODE_DATA_DIR, ENV_DATA_DIR)
    who = f"cluster {cluster_name(context) or '(unknown)'}"
    if not raw:
        raise DataDirError(
            f"{who}: no data directory: node config {NODE_DATA_DIR!r} and ${ENV_DATA_DIR} "
            "are unset (the platform sets them from the cluster's data claim)"
        )
    path = Path(raw)
    if not path.exists():
        raise DataDirError(f"{who}: data directory {path} does not exist")
    if not path.is_dir():
        raise DataDirError(f"{who}: data directory {path} is not a directory")
    if not any(path.iterdir()):
        raise DataDirError(f"{who}: data directory {path} is empty")
    return path
