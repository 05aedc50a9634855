"""The example apps (examples/apps) train through their own ServerApp and ClientApp objects,
in process: two clusters' partitions, the platform's settings in the environment as
ocm-fl-server gives them, Flower's FedAvg, the SDK's store. (The launchers and transport are
covered by the federation tests, which run the digits app.)"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Context, Message, RecordDict, UserConfig

from tests.unit.flower_local import LocalGrid, stamp_task_identity
from workloads.data import partition
from workloads.flower_app import inspect_app
from workloads.sdk import ModelStore, ServerPlatform

pytestmark = [pytest.mark.federation, pytest.mark.byo_app, pytest.mark.timeout(900)]

APPS = Path(__file__).resolve().parents[2] / "examples" / "apps"
CLUSTERS = ("cluster1", "cluster2")


@pytest.fixture(autouse=True)
def _task(monkeypatch: pytest.MonkeyPatch) -> None:
    stamp_task_identity(monkeypatch)


@pytest.fixture
def app_path() -> Iterator[None]:
    """Each app's directory on sys.path, as Flower puts an installed app there."""
    added = [str(APPS / name) for name in ("digits", "digits-cnn", "tabular")]
    sys.path[:0] = added
    try:
        yield
    finally:
        for entry in added:
            sys.path.remove(entry)


def _federate(
    name: str, data: Path, storage: Path, monkeypatch: pytest.MonkeyPatch, **platform: Any
) -> dict[str, Any]:
    """Run app `name` for its rounds over two in-process clusters; return the manifest."""
    app = inspect_app(APPS / name)
    server_mod, server_attr = app.serverapp.split(":")
    client_mod, client_attr = app.clientapp.split(":")
    server_app = getattr(importlib.import_module(server_mod), server_attr)
    client_app = getattr(importlib.import_module(client_mod), client_attr)
    run_config = {**app.config, **platform.pop("run_config", {})}
    settings = ServerPlatform(storage=str(storage), resource_uid="u", min_results=2, **platform)
    for key, value in settings.to_env().items():
        monkeypatch.setenv(key, value)

    def node(cluster: str, node_id: int) -> Any:
        node_config: UserConfig = {"cluster-name": cluster, "data-dir": str(data / cluster)}
        context = Context(node_id, node_id, node_config, RecordDict(), run_config)

        def handle(msg: Message) -> Message:
            reply: Message = client_app(message=msg, context=context)
            return reply

        return handle

    grid = LocalGrid({11: node("cluster1", 11), 12: node("cluster2", 12)})
    server_app(grid=grid, context=Context(1, 0, {}, RecordDict(), run_config))
    return ModelStore(storage, "u").manifest()


def test_digits_mlp_learns(app_path: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    partition(tmp_path / "data", list(CLUSTERS), split="iid", sizes="1,1", seed=0)
    manifest = _federate(
        "digits", tmp_path / "data", tmp_path / "store", monkeypatch,
        rounds=2, run_config={"test-dir": str(tmp_path / "data" / "test")},
    )  # fmt: skip
    start = manifest["info"]["starts"][0]["server"]["test-accuracy"]
    final = manifest["final"]["metrics"]["server"]["test-accuracy"]
    assert final > start + 0.3, (start, final)
    assert set(manifest["final"]["metrics"]["train"]) == set(CLUSTERS)


def test_the_cnn_has_a_million_parameters_and_starts_from_the_pth_it_makes(
    app_path: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    subprocess.run(
        [sys.executable, "-m", "cnn_app.pretrain", "--out", str(store / "base.pth")],
        cwd=APPS / "digits-cnn", check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    from cnn_app.task import DigitsCNN, evaluate, load_data

    assert sum(p.numel() for p in DigitsCNN().parameters()) >= 1_000_000
    partition(tmp_path / "data", list(CLUSTERS), split="iid", sizes="1,1", seed=0)
    pretrained = DigitsCNN()
    pretrained.load_state_dict(torch.load(store / "base.pth", weights_only=True))
    _, pretrained_accuracy = evaluate(pretrained, *load_data(tmp_path / "data" / "test"))
    manifest = _federate(
        "digits-cnn", tmp_path / "data", store, monkeypatch, rounds=1, init_model="base.pth",
        run_config={"test-dir": str(tmp_path / "data" / "test")},
    )  # fmt: skip
    [start] = manifest["info"]["starts"]
    assert start["from"] == "initModel base.pth"
    assert start["server"]["test-accuracy"] == pytest.approx(pretrained_accuracy, abs=1e-6)
    assert manifest["final"]["round"] == 1


def test_tabular_logistic_regression_learns(
    app_path: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition(tmp_path / "data", list(CLUSTERS), task_name="breast-cancer", split="iid",
              sizes="1,1", seed=0)  # fmt: skip
    manifest = _federate("tabular", tmp_path / "data", tmp_path / "store", monkeypatch, rounds=2)
    evaluate = manifest["final"]["metrics"]["evaluate"]
    assert set(evaluate) == set(CLUSTERS)
    assert all(m["eval-accuracy"] > 0.85 for m in evaluate.values()), evaluate
