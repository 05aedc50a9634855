"""What the platform tells an app, and where: node config on clusters, env on the hub.

Client side (``ocm-fl-client`` writes them into the SuperNode's node config, so a ClientApp
reads them from ``context.node_config``): the cluster's name, its data directory (the path
its ClusterClaim names, mounted into the pod) and the local agent's endpoint, plus the
resource's per-cluster values (``spec.client.runConfig`` and matching overrides).

Server side (``ocm-fl-server`` puts them in the environment of the SuperLink, whose ServerApp
processes inherit it): the model store, the starting model, the resource uid, the rounds, the
results a round needs, the round timeout and the resource's differential privacy. Flower's run
config cannot carry them: it only takes keys the app itself declares.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ocmfl import constants

# Node config keys (ClientApp side).
NODE_CLUSTER = "cluster-name"
NODE_DATA_DIR = "data-dir"
NODE_AGENT_ENDPOINT = "agent-endpoint"
RESERVED_NODE_KEYS = (NODE_CLUSTER, NODE_DATA_DIR, NODE_AGENT_ENDPOINT)


class PlatformConfigError(ValueError):
    """A platform setting is malformed; the message names it."""


_Number = TypeVar("_Number", int, float)
_Settings = TypeVar("_Settings")


def exported(
    text: str, env: str, parse: Callable[[Mapping[str, Any]], _Settings]
) -> _Settings | None:
    """Settings the launcher exported as JSON in ``$env`` (`text`; None when empty), read by
    `parse`; bad JSON or settings raise PlatformConfigError naming the variable."""
    if not text:
        return None
    try:
        return parse(json.loads(text))
    except ValueError as exc:
        raise PlatformConfigError(f"${env}: {exc}") from None


def env_number(
    env: Mapping[str, str], name: str, kind: type[_Number], minimum: _Number
) -> _Number | None:
    """``$name`` as an int or float (None when unset or blank); a malformed value or one
    below `minimum` raises PlatformConfigError naming the variable."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise PlatformConfigError(f"${name} must be {what}, got {raw!r}") from None
    if value < minimum:
        raise PlatformConfigError(f"${name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class ServerPlatform:
    """The platform's settings for a ServerApp (all empty when run outside the platform)."""

    storage: str = ""
    init_model: str = ""
    resource_uid: str = ""
    rounds: int | None = None
    min_results: int = 1
    round_timeout: float | None = None
    node_names_file: str = ""
    privacy: str = ""  # JSON of spec.privacy.differentialPrivacy (workloads.sdk.privacy)
    secure_aggregation: str = ""  # JSON of spec.privacy.secureAggregation (workloads.sdk.secagg)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServerPlatform:
        """Read the settings ``ocm-fl-server`` exported (``os.environ`` by default)."""
        env = os.environ if env is None else env
        return cls(
            storage=env.get(constants.ENV_STORAGE, "").strip(),
            init_model=env.get(constants.ENV_INIT_MODEL, "").strip(),
            resource_uid=env.get(constants.ENV_FL_UID, "").strip(),
            rounds=env_number(env, constants.ENV_ROUNDS, int, 1),
            min_results=env_number(env, constants.ENV_MIN_CLIENTS, int, 1) or 1,
            round_timeout=env_number(env, constants.ENV_ROUND_TIMEOUT, float, 0.0),
            node_names_file=env.get(constants.ENV_NODE_NAMES, "").strip(),
            privacy=env.get(constants.ENV_PRIVACY, "").strip(),
            secure_aggregation=env.get(constants.ENV_SECURE_AGGREGATION, "").strip(),
        )

    def to_env(self) -> dict[str, str]:
        """The settings as the environment ``from_env`` reads (empty values left out)."""
        pairs = {
            constants.ENV_STORAGE: self.storage,
            constants.ENV_INIT_MODEL: self.init_model,
            constants.ENV_FL_UID: self.resource_uid,
            constants.ENV_ROUNDS: str(self.rounds) if self.rounds else "",
            constants.ENV_MIN_CLIENTS: str(self.min_results),
            constants.ENV_ROUND_TIMEOUT: str(self.round_timeout) if self.round_timeout else "",
            constants.ENV_NODE_NAMES: self.node_names_file,
            constants.ENV_PRIVACY: self.privacy,
            constants.ENV_SECURE_AGGREGATION: self.secure_aggregation,
        }
        return {k: v for k, v in pairs.items() if v}

    def node_names(self) -> dict[int, str]:
        """Flower node id -> cluster name, from the launcher's registration file (may be empty
        before registration or outside the platform)."""
        if not self.node_names_file:
            return {}
        try:
            data = json.loads(Path(self.node_names_file).read_text())
        except (OSError, ValueError):
            return {}
        out: dict[int, str] = {}
        for cluster, node_id in data.items() if isinstance(data, dict) else []:
            try:
                out[int(node_id)] = str(cluster)
            except (TypeError, ValueError):
                continue
        return out
