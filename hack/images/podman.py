"""The few podman calls the image builder needs (local image store, no registry)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CACHE_LABEL = "io.ocm-fl.cache-key"


class ImageError(RuntimeError):
    """A build step failed; the message names the step and its log."""


def podman() -> str:
    path = shutil.which("podman")
    if path is None:
        raise ImageError(
            "podman not found: run `bash hack/install-system-deps.sh` (Debian's podman, buildah, "
            "runc, debootstrap)"
        )
    return path


def run(args: Sequence[str], log: Path | None = None, *, input_bytes: bytes | None = None) -> str:
    """Run `podman ARGS`; output goes to `log` (appended) when given, else is returned."""
    cmd = [podman(), *args]
    if log is None:
        proc = subprocess.run(cmd, capture_output=True, input=input_bytes, check=False)
        if proc.returncode != 0:
            raise ImageError(
                f"`podman {' '.join(args[:3])} ...` failed (rc={proc.returncode}): "
                f"{proc.stderr.decode(errors='replace').strip()[-2000:]}"
            )
        return proc.stdout.decode()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        fh.write(("$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise ImageError(f"`podman {' '.join(args[:2])} ...` failed (rc={rc}); log {log}:\n{tail}")
    return ""


def inspect(image: str) -> dict[str, Any] | None:
    """`podman image inspect` of one image, or None when the store has no such image."""
    proc = subprocess.run(
        [podman(), "image", "inspect", image], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        return None
    got: list[dict[str, Any]] = json.loads(proc.stdout)
    return got[0] if got else None


def cache_key(image: str) -> str | None:
    """The cache key label the builder put on `image` (None if absent or unlabelled)."""
    info = inspect(image)
    if info is None:
        return None
    labels = (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}
    value = labels.get(CACHE_LABEL)
    return str(value) if value else None


def image_id(image: str) -> str:
    info = inspect(image)
    if info is None:
        raise ImageError(f"image {image} is not in the local store")
    return str(info["Id"])


def size_bytes(image: str) -> int:
    """Uncompressed size of the image (all layers), as `podman images` reports it."""
    info = inspect(image)
    if info is None:
        raise ImageError(f"image {image} is not in the local store")
    return int(info["Size"])
