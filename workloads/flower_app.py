"""A Flower app directory as the server launcher sees it: checked before anything starts.

An app is a directory with a ``pyproject.toml`` holding ``[project] name, version``,
``[tool.flwr.app] publisher``, ``[tool.flwr.app.components] serverapp, clientapp`` and
optionally ``[tool.flwr.app.config]`` (run config defaults). ``inspect_app`` refuses anything
else with a message naming the path; ``run_config`` checks the resource's run config against
the keys the app declares (Flower's SuperLink would refuse unknown keys less clearly).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROUNDS_KEY = "num-server-rounds"  # the run config key Flower's templates use for rounds
RunConfigValue = int | float | bool | str


class AppError(ValueError):
    """The directory is not a usable Flower app; the message names the path and the fix."""


@dataclass(frozen=True)
class FlowerApp:
    """What the launcher needs to know about an app."""

    path: Path
    name: str
    version: str
    serverapp: str
    clientapp: str
    config: Mapping[str, RunConfigValue]


def _flatten(raw: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def inspect_app(path: Path | str) -> FlowerApp:
    """Read and check an app directory; AppError names the path and what is missing."""
    root = Path(path)
    if not root.exists():
        raise AppError(f"app directory {root} does not exist in the server image")
    if not root.is_dir():
        raise AppError(f"app path {root} is not a directory")
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        raise AppError(f"app directory {root} has no pyproject.toml: not a Flower app")
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AppError(f"{pyproject}: {exc}") from None
    project = data.get("project") or {}
    app = (data.get("tool") or {}).get("flwr", {}).get("app")
    if not isinstance(app, Mapping):
        raise AppError(f"{pyproject} has no [tool.flwr.app] table: not a Flower app")
    components = app.get("components") or {}
    missing = [
        key
        for key, value in (
            ("[project] name", project.get("name")),
            ("[project] version", project.get("version")),
            ("[tool.flwr.app] publisher", app.get("publisher")),
            ("[tool.flwr.app.components] serverapp", components.get("serverapp")),
            ("[tool.flwr.app.components] clientapp", components.get("clientapp")),
        )
        if not value
    ]
    if missing:
        raise AppError(f"{pyproject} lacks {', '.join(missing)}")
    config = _flatten(app.get("config") or {})
    return FlowerApp(
        path=root.resolve(),
        name=str(project["name"]),
        version=str(project["version"]),
        serverapp=str(components["serverapp"]),
        clientapp=str(components["clientapp"]),
        config=config,
    )


def run_config(
    app: FlowerApp, overrides: Mapping[str, RunConfigValue], rounds: int | None
) -> dict[str, RunConfigValue]:
    """The run config to submit: the resource's values (keys the app declares only) and,
    when the app declares ``num-server-rounds``, the resource's rounds."""
    unknown = sorted(set(overrides) - set(app.config))
    if unknown:
        declared = ", ".join(sorted(app.config)) or "none"
        raise AppError(
            f"run config keys {unknown} are not declared in [tool.flwr.app.config] of "
            f"{app.path / 'pyproject.toml'} (declared: {declared})"
        )
    for key, value in overrides.items():
        if not isinstance(value, int | float | str):
            raise AppError(f"run config {key}: {value!r} is not a number, boolean or string")
    config = dict(overrides)
    if rounds is not None and ROUNDS_KEY in app.config:
        config[ROUNDS_KEY] = rounds
    return config
