"""The model store: the starting model, a checkpoint every round, the final model, a manifest.

Layout under the store's root (a directory or ``s3://bucket/prefix``)::

    manifest.json                          {"format", "uid", "checkpoints": [entry...],
                                            "final": entry | null, "info": {...}}
    checkpoints/<uid>/round-0003.npz       named arrays (state_dict names and order)
    final/model.npz

An entry is ``{"round", "path" (relative), "sha256", "metrics", "created", "uid"}``; ``uid``
is the FederatedLearning resource's uid. A store belongs to the uid in its manifest: a store
that another resource's manifest already claims is refused (StoreOwnedError), never resumed,
overwritten or set aside, so nobody trains on another resource's (or a planted) checkpoint.
Files are written before the manifest that
points to them, each atomically, so a crash never leaves the manifest pointing at half a file.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy.typing as npt
from flwr.app import ArrayRecord

from workloads.sdk.formats import ModelFormatError, read_model, read_npz, write_npz
from workloads.sdk.platform import ServerPlatform
from workloads.sdk.storage import (
    Backend,
    DirectoryBackend,
    NotFoundError,
    S3Backend,
    StorageError,
    open_backend,
    parse_s3,
)

STORE_FORMAT = "ocmfl-model-store/v2"
MANIFEST = "manifest.json"
FINAL_PATH = "final/model.npz"
Arrays = ArrayRecord | Mapping[str, npt.NDArray[Any]]


class ModelStoreError(Exception):
    """The store or a model in it is unreadable or fails its digest check."""


class StoreOwnedError(ModelStoreError):
    """The store's manifest belongs to another resource (uid)."""


@dataclass(frozen=True)
class Checkpoint:
    """A stored model: its round, arrays and manifest entry."""

    round: int
    arrays: ArrayRecord
    entry: dict[str, Any]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _uid_dir(uid: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", uid) or "no-uid"


class ModelStore:
    """Checkpoints and the final model of one resource (``resource_uid``) in one store."""

    def __init__(self, backend: Backend | Path | str, resource_uid: str = "") -> None:
        if isinstance(backend, Path):
            backend = DirectoryBackend(backend)
        elif isinstance(backend, str):
            backend = open_backend(backend)
        self.backend: Backend = backend
        self.uid = resource_uid

    @classmethod
    def from_platform(cls, platform: ServerPlatform | None = None) -> ModelStore | None:
        """The store the platform configured (None outside the platform)."""
        platform = platform or ServerPlatform.from_env()
        if not platform.storage:
            return None
        try:
            return cls(platform.storage, platform.resource_uid)
        except StorageError as exc:
            raise ModelStoreError(str(exc)) from None

    @property
    def location(self) -> str:
        """The store's root (a directory or s3://bucket/prefix)."""
        return self.backend.location

    def url(self, entry: Mapping[str, Any]) -> str:
        """Where an entry's file lives (a path or an s3:// URL)."""
        return self.backend.url(str(entry["path"]))

    # --- manifest ------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        """The manifest (an empty one when nothing has been stored yet)."""
        try:
            raw = self.backend.read(MANIFEST)
        except NotFoundError:
            return {"format": STORE_FORMAT, "uid": self.uid, "checkpoints": [], "final": None}
        except StorageError as exc:
            raise ModelStoreError(str(exc)) from None
        try:
            manifest: dict[str, Any] = json.loads(raw)
        except ValueError as exc:
            raise ModelStoreError(f"{self.backend.url(MANIFEST)}: {exc}") from None
        manifest.setdefault("checkpoints", [])
        manifest.setdefault("final", None)
        return manifest

    def check_owner(self) -> dict[str, Any]:
        """The manifest, when this store is empty or ours; StoreOwnedError when another
        resource's manifest claims it."""
        manifest = self.manifest()
        owner = str(manifest.get("uid", ""))
        if owner != self.uid:
            raise StoreOwnedError(
                f"model store {self.backend.url(MANIFEST)} belongs to resource uid {owner!r}, "
                f"not to this one ({self.uid!r}): refusing to resume, overwrite or set aside "
                "another resource's checkpoints; give this resource its own storage (another "
                "prefix or claim) or have the store's owner remove it"
            )
        return manifest

    def _own_manifest(self) -> dict[str, Any]:
        """The manifest to update (ours; StoreOwnedError for another resource's store)."""
        return self.check_owner()

    def _write(self, rel: str, data: bytes) -> None:
        try:
            self.backend.write(rel, data)
        except StorageError as exc:
            raise ModelStoreError(str(exc)) from None

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        manifest["format"] = STORE_FORMAT
        self._write(MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())

    def _store(
        self, rel: str, rnd: int, arrays: Arrays, metrics: Mapping[str, Any]
    ) -> dict[str, Any]:
        data = write_npz(arrays)
        self._write(rel, data)
        return {
            "round": rnd,
            "path": rel,
            "sha256": hashlib.sha256(data).hexdigest(),
            "metrics": dict(metrics),
            "created": _now(),
            "uid": self.uid,
        }

    # --- writing -------------------------------------------------------------------------
    def save_checkpoint(
        self, rnd: int, arrays: Arrays, metrics: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Store the model after round ``rnd`` and record it in the manifest."""
        rel = f"checkpoints/{_uid_dir(self.uid)}/round-{rnd:04d}.npz"
        entry = self._store(rel, rnd, arrays, metrics)
        manifest = self._own_manifest()
        kept = [c for c in manifest["checkpoints"] if c["round"] != rnd]
        manifest["checkpoints"] = sorted([*kept, entry], key=lambda c: int(c["round"]))
        self._write_manifest(manifest)
        return entry

    def save_final(self, rnd: int, arrays: Arrays, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Store the final model (after ``rnd`` rounds) and record it in the manifest."""
        entry = self._store(FINAL_PATH, rnd, arrays, metrics)
        manifest = self._own_manifest()
        manifest["final"] = entry
        self._write_manifest(manifest)
        return entry

    def append_info(self, key: str, value: Any) -> None:
        """Append to a list of facts in the manifest (e.g. every (re)start of training)."""
        manifest = self._own_manifest()
        manifest.setdefault("info", {}).setdefault(key, []).append(value)
        self._write_manifest(manifest)

    # --- reading -------------------------------------------------------------------------
    def _load(self, entry: Mapping[str, Any]) -> ArrayRecord:
        try:
            data = self.backend.read(str(entry["path"]))
        except StorageError as exc:
            raise ModelStoreError(str(exc)) from None
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise ModelStoreError(f"{self.url(entry)} does not match its sha256")
        try:
            return read_npz(data, self.url(entry))
        except ModelFormatError as exc:
            raise ModelStoreError(str(exc)) from None

    def latest(self) -> Checkpoint | None:
        """The newest intact checkpoint of this resource, or None (StoreOwnedError for
        another resource's store)."""
        manifest = self.check_owner()
        for entry in reversed(manifest["checkpoints"]):
            if entry.get("uid", "") != self.uid:
                continue
            try:
                arrays = self._load(entry)
            except ModelStoreError:
                continue
            return Checkpoint(round=int(entry["round"]), arrays=arrays, entry=entry)
        return None

    def final(self) -> Checkpoint | None:
        """This resource's final model, or None when training has not finished."""
        manifest = self.manifest()
        entry = manifest.get("final")
        if not entry or entry.get("uid", "") != self.uid:
            return None
        return Checkpoint(round=int(entry["round"]), arrays=self._load(entry), entry=entry)

    def read_model(self, ref: str) -> ArrayRecord:
        """A starting model: a path inside this store (``initModel: base.pth``), an absolute
        path in the server's filesystem, or ``s3://bucket/key``. Any format of
        workloads.sdk.formats."""
        try:
            if ref.startswith("s3://"):
                bucket, key = parse_s3(ref)
                data, name = S3Backend(bucket).read(key), ref
            elif Path(ref).is_absolute():
                data, name = DirectoryBackend(Path(ref).parent).read(Path(ref).name), ref
            else:
                data, name = self.backend.read(ref), self.backend.url(ref)
        except StorageError as exc:
            raise ModelStoreError(f"initial model: {exc}") from None
        try:
            return read_model(data, name)
        except ModelFormatError as exc:
            raise ModelStoreError(f"initial model: {exc}") from None


def load_model(ref: str | Path) -> ArrayRecord:
    """Read a model file (any supported format) from a path or an ``s3://`` URL."""
    text = str(ref)
    resolved = text if text.startswith("s3://") else str(Path(text).resolve())
    return ModelStore(DirectoryBackend(Path("/"))).read_model(resolved)
