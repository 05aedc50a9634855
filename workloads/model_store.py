"""Checkpoints and the final model on the storage path, with a manifest.json index.

Layout under the storage root::

    manifest.json                  {"format", "checkpoints": [entry...], "final": entry|null}
    checkpoints/round-0003.npz     named arrays (state_dict names, state_dict order)
    final/model.npz

An entry is ``{"round", "path" (relative), "sha256", "metrics", "created"}``. Files and the
manifest are written to a temporary name and renamed, so a crash never leaves a half-written
file behind that the manifest points to.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

STORE_FORMAT = "ocmfl-model-store/v1"
MANIFEST = "manifest.json"
Arrays = dict[str, npt.NDArray[Any]]


class ModelStoreError(Exception):
    """The store or a model file is unreadable or fails its digest check."""


@dataclass(frozen=True)
class Checkpoint:
    """A stored model: its round, arrays and manifest entry."""

    round: int
    arrays: Arrays
    entry: dict[str, Any]


def serialize_arrays(arrays: Mapping[str, npt.NDArray[Any]]) -> bytes:
    """Named arrays as .npz bytes (order preserved)."""
    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items()})  # type: ignore[arg-type]
    return buffer.getvalue()


def load_arrays(path: Path, sha256: str | None = None) -> Arrays:
    """Read named arrays from an .npz model file, checking its digest when given."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelStoreError(f"cannot read model file {path}: {exc}") from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ModelStoreError(f"model file {path} does not match its sha256")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {name: np.asarray(npz[name]) for name in npz.files}
    except (OSError, ValueError) as exc:
        raise ModelStoreError(f"model file {path} is not an .npz of arrays: {exc}") from None


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ModelStore:
    """Round checkpoints and the final model under one storage directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def manifest(self) -> dict[str, Any]:
        """The manifest (an empty one when nothing has been stored yet)."""
        path = self.root / MANIFEST
        if not path.exists():
            return {"format": STORE_FORMAT, "checkpoints": [], "final": None}
        try:
            manifest: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ModelStoreError(f"cannot read {path}: {exc}") from None
        return manifest

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        _atomic_write(self.root / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())

    def _store(
        self, rel: str, rnd: int, arrays: Mapping[str, npt.NDArray[Any]], metrics: Mapping[str, Any]
    ) -> dict[str, Any]:
        data = serialize_arrays(arrays)
        _atomic_write(self.root / rel, data)
        return {
            "round": rnd,
            "path": rel,
            "sha256": hashlib.sha256(data).hexdigest(),
            "metrics": dict(metrics),
            "created": _now(),
        }

    def save_checkpoint(
        self, rnd: int, arrays: Mapping[str, npt.NDArray[Any]], metrics: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Store the model after round ``rnd`` and record it in the manifest."""
        entry = self._store(f"checkpoints/round-{rnd:04d}.npz", rnd, arrays, metrics)
        manifest = self.manifest()
        kept = [c for c in manifest["checkpoints"] if c["round"] != rnd]
        manifest["checkpoints"] = sorted([*kept, entry], key=lambda c: int(c["round"]))
        self._write_manifest(manifest)
        return entry

    def save_final(
        self, rnd: int, arrays: Mapping[str, npt.NDArray[Any]], metrics: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Store the final model (after ``rnd`` rounds) and record it in the manifest."""
        entry = self._store("final/model.npz", rnd, arrays, metrics)
        manifest = self.manifest()
        manifest["final"] = entry
        self._write_manifest(manifest)
        return entry

    def set_info(self, key: str, value: Any) -> None:
        """Record extra facts in the manifest (e.g. where training started); first write wins."""
        manifest = self.manifest()
        info = manifest.setdefault("info", {})
        if key not in info:
            info[key] = value
            self._write_manifest(manifest)

    def append_info(self, key: str, value: Any) -> None:
        """Append to a list of facts in the manifest (e.g. every (re)start of training)."""
        manifest = self.manifest()
        manifest.setdefault("info", {}).setdefault(key, []).append(value)
        self._write_manifest(manifest)

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint whose file is intact, or None."""
        for entry in reversed(self.manifest()["checkpoints"]):
            try:
                arrays = load_arrays(self.root / entry["path"], entry["sha256"])
            except ModelStoreError:
                continue
            return Checkpoint(round=int(entry["round"]), arrays=arrays, entry=entry)
        return None

    def final(self) -> Checkpoint | None:
        """The final model, or None when training has not finished."""
        entry = self.manifest().get("final")
        if not entry:
            return None
        arrays = load_arrays(self.root / entry["path"], entry["sha256"])
        return Checkpoint(round=int(entry["round"]), arrays=arrays, entry=entry)
