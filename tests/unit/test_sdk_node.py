"""SDK, ClientApp side: the data directory and cluster name from node config; platform env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict, UserConfigValue

from ocmfl import constants
from workloads.sdk import DataDirError, ServerPlatform, cluster_name, data_dir
from workloads.sdk.platform import PlatformConfigError


def _context(**node: UserConfigValue) -> Context:
    return Context(run_id=1, node_id=1, node_config=node, state=RecordDict(), run_config={})


def test_data_dir_comes_from_node_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(constants.ENV_DATA_DIR, raising=False)
    (tmp_path / "data.npz").write_bytes(b"x")
    context = _context(**{"data-dir": str(tmp_path), "cluster-name": "cluster1"})
    assert data_dir(context) == tmp_path
    assert cluster_name(context) == "cluster1"


def test_data_dir_errors_name_the_cluster_and_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(constants.ENV_DATA_DIR, raising=False)
    with pytest.raises(DataDirError, match="cluster c1: no data directory: node config 'data-dir'"):
        data_dir(_context(**{"cluster-name": "c1"}))
    missing = tmp_path / "gone"
    with pytest.raises(DataDirError, match=f"cluster c1: data directory {missing} does not exist"):
        data_dir(_context(**{"cluster-name": "c1", "data-dir": str(missing)}))
    with pytest.raises(DataDirError, match=f"data directory {tmp_path} is empty"):
        data_dir(_context(**{"data-dir": str(tmp_path)}))
    (tmp_path / "f").write_text("x")
    with pytest.raises(DataDirError, match="is not a directory"):
        data_dir(_context(**{"data-dir": str(tmp_path / "f")}))
    monkeypatch.setenv(constants.ENV_DATA_DIR, str(tmp_path))  # the env fallback
    assert data_dir(_context()) == tmp_path


def test_server_platform_round_trips_through_the_environment(tmp_path: Path) -> None:
    names = tmp_path / "nodes.json"
    names.write_text(json.dumps({"cluster1": "123", "cluster2": "456"}))
    platform = ServerPlatform(
        storage="s3://models/fl",
        init_model="base.pth",
        resource_uid="u-1",
        rounds=5,
        min_results=2,
        round_timeout=60.0,
        node_names_file=str(names),
    )
    assert ServerPlatform.from_env(platform.to_env()) == platform
    assert platform.node_names() == {123: "cluster1", 456: "cluster2"}
    assert ServerPlatform.from_env({}) == ServerPlatform()
    with pytest.raises(PlatformConfigError, match=r"\$OCMFL_ROUNDS must be an integer"):
        ServerPlatform.from_env({constants.ENV_ROUNDS: "three"})
