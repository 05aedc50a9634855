"""Run config of the Flower app: one typed view shared by the launcher and the ServerApp.

Keys are the ``[tool.flwr.app.config]`` keys in ``fedapp/pyproject.toml``; the launcher
renders flags into a ``--run-config`` string, the ServerApp parses ``context.run_config``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

STRATEGIES = ("fedavg", "fedprox")

# Node config keys the client launcher passes to its SuperNode (--node-config).
NODE_CLUSTER = "cluster-name"
NODE_DATA_DIR = "data-dir"
NODE_AGENT_ENDPOINT = "agent-endpoint"
# Run-config keys a cluster may override for itself (node config wins in the ClientApp).
CLIENT_OVERRIDABLE: dict[str, type[int] | type[float]] = {
    "lr": float,
    "local-epochs": int,
    "batch-size": int,
}


@dataclass(frozen=True)
class RunSettings:
    """Everything one federated training run needs to know."""

    task: str = "digits"
    num_server_rounds: int = 3
    strategy: str = "fedavg"
    proximal_mu: float = 0.1
    lr: float = 0.1
    local_epochs: int = 1
    batch_size: int = 32
    min_clients: int = 2
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    round_timeout: float = 600.0
    seed: int = 0
    storage_dir: str = ""
    init_model: str = ""
    test_dir: str = ""

    def __post_init__(self) -> None:
        problems = []
        if self.num_server_rounds < 1:
            problems.append("num-server-rounds must be >= 1")
        if self.strategy not in STRATEGIES:
            problems.append(f"strategy must be one of {', '.join(STRATEGIES)}")
        if self.min_clients < 1:
            problems.append("min-clients must be >= 1")
        if not (0.0 < self.fraction_train <= 1.0):
            problems.append("fraction-train must be in (0, 1]")
        if not (0.0 <= self.fraction_evaluate <= 1.0):
            problems.append("fraction-evaluate must be in [0, 1]")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            problems.append("lr must be > 0")
        if self.local_epochs < 1 or self.batch_size < 1:
            problems.append("local-epochs and batch-size must be >= 1")
        if self.proximal_mu < 0:
            problems.append("proximal-mu must be >= 0")
        if self.round_timeout <= 0:
            problems.append("round-timeout must be > 0")
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> RunSettings:
        """Parse a Flower run config (kebab-case keys); unknown keys are ignored."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = f.name.replace("_", "-")
            if key not in config:
                continue
            raw = config[key]
            kind = type(getattr(cls(), f.name))
            values[f.name] = kind(raw) if kind is not bool else bool(raw)
        return cls(**values)

    def to_run_config(self) -> dict[str, str | int | float]:
        """The settings as Flower run config (kebab-case keys)."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)}


def client_settings(run_config: Mapping[str, Any], node_config: Mapping[str, Any]) -> RunSettings:
    """The run settings as this client sees them: node-config overrides win."""
    merged = dict(run_config)
    merged.update({k: v for k, v in node_config.items() if k in CLIENT_OVERRIDABLE})
    return RunSettings.from_run_config(merged)
