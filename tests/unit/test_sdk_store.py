"""SDK model store and model files: formats, checkpoints, manifest, resume by resource uid."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from workloads.sdk import ModelStore, ModelStoreError, load_model, to_numpy, to_record
from workloads.sdk.formats import (
    ModelFormatError,
    read_model,
    write_arrayrecord,
    write_npz,
    write_safetensors,
)
from workloads.sdk.storage import DirectoryBackend, StorageError, open_backend
from workloads.sdk.store import StoreOwnedError


def _arrays(v: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), v, dtype=np.float32), "b": np.arange(3, dtype=np.float32)}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def test_every_format_reads_into_the_same_named_arrays(tmp_path: Path) -> None:
    model = _model()
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    torch.save(model.state_dict(), tmp_path / "m.pth")
    torch.save({"epoch": 3, "model_state_dict": model.state_dict()}, tmp_path / "ckpt.pt")
    (tmp_path / "m.npz").write_bytes(write_npz(state))
    (tmp_path / "m.arrayrecord").write_bytes(write_arrayrecord(state))
    (tmp_path / "m.safetensors").write_bytes(write_safetensors(state))
    for name in ("m.pth", "ckpt.pt", "m.npz", "m.arrayrecord", "m.safetensors"):
        record = load_model(tmp_path / name)
        if name.endswith(".safetensors"):  # safetensors sorts names; run_strategy reorders
            assert sorted(record) == sorted(state)
        else:
            assert list(record) == list(state), name  # state_dict order kept
        for key, value in to_numpy(record).items():
            np.testing.assert_array_equal(value, state[key])
        # ... and it loads straight back into the torch model
        fresh = _model()
        fresh.load_state_dict(record.to_torch_state_dict())


def test_bad_model_files_name_the_file_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / "whole.pth").write_bytes(b"")
    torch.save(_model(), tmp_path / "module.pth")  # a pickled module, not a state_dict
    with pytest.raises(ModelFormatError, match=r"module\.pth cannot be loaded as weights"):
        read_model((tmp_path / "module.pth").read_bytes(), "module.pth")
    torch.save({"lr": 0.1}, tmp_path / "notweights.pt")
    with pytest.raises(ModelFormatError, match=r"notweights\.pt holds a dict.*state_dict"):
        read_model((tmp_path / "notweights.pt").read_bytes(), "notweights.pt")
    with pytest.raises(ModelFormatError, match=r"x\.onnx: unknown model format \.onnx"):
        read_model(b"", "x.onnx")
    with pytest.raises(ModelFormatError, match=r"bad\.npz is not an \.npz"):
        read_model(b"garbage", "bad.npz")
    with pytest.raises(ModelStoreError, match=r"missing\.pth does not exist"):
        load_model(tmp_path / "missing.pth")


def test_checkpoints_are_indexed_with_round_metrics_digest_time_and_uid(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "uid-1")
    store.save_checkpoint(1, _arrays(1.0), {"server": {"test-accuracy": 0.5}})
    entry = store.save_checkpoint(2, _arrays(2.0), {"server": {"test-accuracy": 0.7}})
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["uid"] == "uid-1"
    assert [c["round"] for c in manifest["checkpoints"]] == [1, 2]
    data = (tmp_path / entry["path"]).read_bytes()
    assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert entry["created"].endswith("Z") and entry["uid"] == "uid-1"
    assert entry["metrics"]["server"]["test-accuracy"] == 0.7
    assert store.url(entry) == str(tmp_path / "checkpoints" / "uid-1" / "round-0002.npz")


def test_latest_returns_the_newest_intact_checkpoint_of_the_same_resource(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "uid-1")
    store.save_checkpoint(1, _arrays(1.0), {})
    entry = store.save_checkpoint(2, to_record(_arrays(2.0)), {})
    latest = store.latest()
    assert latest is not None and latest.round == 2
    assert list(latest.arrays) == ["w", "b"]
    (tmp_path / entry["path"]).write_bytes(b"corrupt")
    latest = store.latest()
    assert latest is not None and latest.round == 1
    np.testing.assert_array_equal(to_numpy(latest.arrays)["w"], _arrays(1.0)["w"])
    # Another resource (a new uid) is refused: it neither resumes from nor overwrites it.
    other = ModelStore(tmp_path, "uid-2")
    with pytest.raises(StoreOwnedError, match="belongs to resource uid 'uid-1'"):
        other.latest()
    with pytest.raises(StoreOwnedError):
        other.save_checkpoint(1, _arrays(5.0), {})
    assert other.final() is None
    latest = ModelStore(tmp_path, "uid-1").latest()
    assert latest is not None and latest.round == 1


def test_final_model_and_info(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "u")
    assert store.final() is None
    store.append_info("starts", {"round": 0})
    store.append_info("starts", {"round": 2})
    entry = store.save_final(3, _arrays(3.0), {"server": {"test-accuracy": 0.9}})
    final = store.final()
    assert final is not None and final.round == 3 and entry["path"] == "final/model.npz"
    assert [s["round"] for s in store.manifest()["info"]["starts"]] == [0, 2]
    (tmp_path / "final" / "model.npz").write_bytes(b"tampered")
    with pytest.raises(ModelStoreError, match="does not match its sha256"):
        store.final()


def test_initial_model_paths_inside_the_store_or_absolute(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", "u")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "base.npz").write_bytes(write_npz(_arrays(7.0)))
    (tmp_path / "elsewhere.npz").write_bytes(write_npz(_arrays(8.0)))
    assert to_numpy(store.read_model("base.npz"))["w"][0, 0] == 7.0
    assert to_numpy(store.read_model(str(tmp_path / "elsewhere.npz")))["w"][0, 0] == 8.0
    with pytest.raises(ModelStoreError, match=r"initial model: .*store/nope\.pth does not exist"):
        store.read_model("nope.pth")


def test_directory_backend_refuses_paths_outside_its_root(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    with pytest.raises(StorageError, match="not a relative path"):
        backend.write("../escape", b"x")
    with pytest.raises(StorageError, match="absolute directory or s3://"):
        open_backend("relative/dir")
    with pytest.raises(StorageError, match="names no bucket"):
        open_backend("s3:///prefix")
