"""Data partitions: splits, on-disk format, and the errors a client sees for bad paths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from workloads import data
from workloads.data import PartitionError, load_partition, partition, split_indices


def test_iid_split_covers_every_sample_once_with_requested_sizes() -> None:
    y = np.repeat(np.arange(10), 30).astype(np.int64)
    parts = split_indices(y, data.parse_sizes("3,1", 2), split="iid", seed=1)
    joined = np.concatenate(parts)
    assert sorted(joined.tolist()) == list(range(len(y)))
    assert [len(p) for p in parts] == [225, 75]


def test_label_skew_split_gives_clusters_different_label_mixes() -> None:
    y = np.repeat(np.arange(10), 50).astype(np.int64)
    parts = split_indices(y, [0.5, 0.5], split="label-skew", seed=3, alpha=0.1)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(y)))
    hist = [np.bincount(y[p], minlength=10) / len(p) for p in parts]
    assert np.abs(hist[0] - hist[1]).sum() > 0.5  # far from identical label distributions


def test_label_skew_keeps_requested_sizes() -> None:
    y = np.repeat(np.arange(4), 5).astype(np.int64)
    parts = split_indices(y, [0.5, 0.25, 0.25], split="label-skew", seed=0, alpha=0.01)
    assert [len(p) for p in parts] == [10, 5, 5]
    assert sorted(np.concatenate(parts).tolist()) == list(range(20))


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="2 clusters"):
        data.parse_sizes("1,2,3", 2)
    with pytest.raises(ValueError, match="> 0"):
        data.parse_sizes("1,0", 2)


def test_partition_cli_writes_partitions_manifests_and_test_set(tmp_path: Path) -> None:
    code = data.main(
        ["partition", "--out", str(tmp_path), "--clusters", "c1,c2",
         "--split", "label-skew", "--sizes", "2,1", "--seed", "7"]
    )  # fmt: skip
    assert code == 0
    summary = json.loads((tmp_path / "manifest.json").read_text())
    c1, c2, test = (load_partition(tmp_path / n) for n in ("c1", "c2", "test"))
    assert summary["clusters"] == {"c1": c1.samples, "c2": c2.samples}
    assert c1.samples + c2.samples + test.samples == 1797  # all of sklearn's digits
    assert c1.samples > c2.samples
    hist = c1.manifest["label_histogram"]
    assert sum(hist.values()) == c1.samples
    assert c1.x.shape[1] == 64 and c1.x.dtype == np.float32 and c1.x.max() <= 1.0


def test_breast_cancer_task_partitions_too(tmp_path: Path) -> None:
    summary = partition(tmp_path, ["a", "b"], task_name="breast-cancer", seed=1)
    assert summary["task"] == "breast-cancer"
    assert load_partition(tmp_path / "a").x.shape[1] == 30


def test_missing_data_directory_error_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(PartitionError, match=str(missing)):
        load_partition(missing)


def test_malformed_manifest_error_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(PartitionError, match=str(tmp_path / "manifest.json")):
        load_partition(tmp_path)


def test_sample_count_mismatch_is_detected(tmp_path: Path) -> None:
    partition(tmp_path, ["a"], seed=0, test_fraction=0.0)
    manifest_path = tmp_path / "a" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["samples"] += 1
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(PartitionError, match="samples"):
        load_partition(tmp_path / "a")
