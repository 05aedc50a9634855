"""Process plumbing shared by the launchers: Flower's environment, child processes, flwr CLI."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

CONNECTION = "ocmfl"  # name of the SuperLink connection in $FLWR_HOME/config.toml

# Speed knob Flower reads: how often a SuperExec asks for a task to start (default 1 s; each
# ask is one local HTTP call, so 0.1 s costs little). The SuperNode's idle 3 s is fixed in
# Flower 1.42; the ServerApp grid's 3 s is replaced by workloads.sdk's 0.2 s reply polling.
DEFAULT_ENV: Mapping[str, str] = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",
}


def flower_env(flwr_home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for Flower processes: telemetry off, absolute FLWR_HOME, our poll knob.

    Values already set in the caller's environment win over our defaults.
    """
    env = dict(os.environ)
    for key, value in DEFAULT_ENV.items():
        env.setdefault(key, value)
    env["FLWR_HOME"] = str(flwr_home.resolve())
    # Flower starts flower-superexec / flwr-* by name: put this Python's scripts first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if extra:
        env.update(extra)
    return env


def executable(name: str) -> str:
    """Path of a console script: next to this Python first (the venv), then PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} or on PATH")
    return found


def write_connection(flwr_home: Path, address: str, root_certificates: Path) -> Path:
    """Write $FLWR_HOME/config.toml with one TLS connection named CONNECTION as default.

    The CA is named by its mounted path, not resolved: the kubelet replaces a Secret's files
    by switching `..data` to a new directory and deleting the old one, and every `flwr`
    command of the run reads this file again."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    path.write_text(
        "[superlink]\n"
        f'default = "{CONNECTION}"\n\n'
        f"[superlink.{CONNECTION}]\n"
        f'address = "{address}"\n'
        f'root-certificates = "{root_certificates.absolute()}"\n'
    )
    return path


def start(
    cmd: Sequence[str], env: Mapping[str, str], log: IO[bytes] | None
) -> subprocess.Popen[bytes]:
    """Start a Flower child process (its own helpers watch its pid and exit with it)."""
    return subprocess.Popen(
        list(cmd),
        env=dict(env),
        stdout=log if log is not None else None,
        stderr=subprocess.STDOUT if log is not None else None,
    )


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM a child (Flower stops its own helpers), SIGKILL when it does not go in time."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)


class FlwrCliError(RuntimeError):
    """A `flwr` CLI call failed."""


# Each call is a fresh Python process that imports Flower: about 2.5 s idle, over a minute
# seen on a 2-core hub running several servers at once. A hang is still bounded.
FLWR_CLI_TIMEOUT = 300.0


def flwr_json(
    args: Sequence[str], env: Mapping[str, str], timeout: float = FLWR_CLI_TIMEOUT
) -> Any:
    """Run ``flwr <args> --format json`` and return its parsed JSON output."""
    cmd = [executable("flwr"), *args, "--format", "json"]
    try:
        done = subprocess.run(
            cmd, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise FlwrCliError(f"flwr {' '.join(args[:2])}: no answer within {timeout:.0f}s") from None
    try:
        data = json.loads(done.stdout)
    except ValueError:
        raise FlwrCliError(
            f"flwr {' '.join(args[:2])}: exit {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-500:]}"
        ) from None
    if isinstance(data, dict) and data.get("success") is False:
        raise FlwrCliError(f"flwr {' '.join(args[:2])}: {data.get('error-message', data)}")
    return data
