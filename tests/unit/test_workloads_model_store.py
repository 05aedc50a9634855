"""Model store: checkpoints, final model, manifest, digests and resume point."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from workloads.model_store import ModelStore, ModelStoreError, load_arrays


def _arrays(v: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), v, dtype=np.float32), "b": np.arange(3, dtype=np.float32)}


def test_checkpoints_are_indexed_with_round_metrics_digest_and_time(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.save_checkpoint(1, _arrays(1.0), {"server": {"test-accuracy": 0.5}})
    entry = store.save_checkpoint(2, _arrays(2.0), {"server": {"test-accuracy": 0.7}})
    manifest = store.manifest()
    assert [c["round"] for c in manifest["checkpoints"]] == [1, 2]
    data = (tmp_path / entry["path"]).read_bytes()
    assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert entry["created"].endswith("Z")
    assert entry["metrics"]["server"]["test-accuracy"] == 0.7


def test_latest_returns_newest_intact_checkpoint(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.save_checkpoint(1, _arrays(1.0), {})
    entry = store.save_checkpoint(2, _arrays(2.0), {})
    latest = store.latest()
    assert latest is not None and latest.round == 2
    assert list(latest.arrays) == ["w", "b"]  # state_dict order kept
    (tmp_path / entry["path"]).write_bytes(b"corrupt")
    latest = store.latest()
    assert latest is not None and latest.round == 1
    np.testing.assert_array_equal(latest.arrays["w"], _arrays(1.0)["w"])


def test_empty_store_has_no_resume_point_and_no_final(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "new")
    assert store.latest() is None and store.final() is None


def test_final_model_is_recorded(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.save_final(3, _arrays(3.0), {"server": {"test-accuracy": 0.9}})
    final = store.final()
    assert final is not None and final.round == 3
    assert store.manifest()["final"]["path"] == "final/model.npz"


def test_digest_mismatch_and_garbage_files_raise(tmp_path: Path) -> None:
    path = tmp_path / "m.npz"
    path.write_bytes(b"not an npz")
    with pytest.raises(ModelStoreError, match="sha256"):
        load_arrays(path, "0" * 64)
    with pytest.raises(ModelStoreError, match=str(path)):
        load_arrays(path)


def test_set_info_keeps_the_first_value(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.set_info("start", {"round": 0})
    store.set_info("start", {"round": 5})
    assert store.manifest()["info"]["start"] == {"round": 0}


def test_append_info_keeps_every_value(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.append_info("starts", {"round": 0})
    store.append_info("starts", {"round": 2})
    assert store.manifest()["info"]["starts"] == [{"round": 0}, {"round": 2}]
