"""Flower app pieces without Flower processes: settings, client work, failure rule."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from workloads.data import PartitionError, partition
from workloads.fedapp.client_app import load_local, local_evaluate, local_fit
from workloads.fedapp.settings import RunSettings, client_settings
from workloads.fedapp.strategies import (
    TooFewResultsError,
    TrackingFedAvg,
    TrackingFedProx,
    make_strategy,
    split_replies,
)
from workloads.tasks import get_task
from workloads.tasks.common import build_model, get_weights

APP_TOML = Path(__file__).resolve().parents[2] / "workloads" / "fedapp" / "pyproject.toml"


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("parts")
    partition(out, ["a", "b"], split="label-skew", sizes="2,1", seed=0)
    return out


def _initial() -> dict[str, Any]:
    model = build_model(get_task("digits"), 0)
    return dict(zip(model.state_dict().keys(), get_weights(model), strict=True))


def test_app_config_defaults_match_run_settings() -> None:
    app = tomllib.loads(APP_TOML.read_text())["tool"]["flwr"]["app"]
    assert app["components"]["serverapp"] == "workloads.fedapp.server_app:app"
    assert app["components"]["clientapp"] == "workloads.fedapp.client_app:app"
    assert RunSettings.from_run_config(app["config"]) == RunSettings()
    assert set(app["config"]) == set(RunSettings().to_run_config())


def test_invalid_settings_are_rejected_with_all_reasons() -> None:
    with pytest.raises(ValueError, match=r"num-server-rounds.*strategy"):
        RunSettings(num_server_rounds=0, strategy="sgd")


def test_cluster_overrides_win_for_client_side_keys_only() -> None:
    s = client_settings(
        {"lr": 0.1, "num-server-rounds": 3}, {"lr": 0.05, "num-server-rounds": 9, "x": 1}
    )
    assert s.lr == 0.05 and s.num_server_rounds == 3


def test_client_reads_only_its_partition_and_reports_its_sample_count(parts: Path) -> None:
    task, part = load_local("a", str(parts / "a"), RunSettings())
    res = local_fit(task, part, _initial(), RunSettings(local_epochs=2), 1, 0.0)
    assert res.samples == part.samples == part.manifest["samples"]
    assert res.weights is not None and list(res.weights) == list(_initial())


def test_local_training_improves_accuracy_on_the_partition(parts: Path) -> None:
    task, part = load_local("a", str(parts / "a"), RunSettings())
    before = local_evaluate(task, part, _initial())
    trained = local_fit(task, part, _initial(), RunSettings(local_epochs=3), 1, 0.0)
    assert trained.weights is not None
    after = local_evaluate(task, part, trained.weights)
    assert after.accuracy > before.accuracy + 0.3 and after.loss < before.loss


def test_fedprox_term_keeps_local_weights_closer_to_global(parts: Path) -> None:
    task, part = load_local("b", str(parts / "b"), RunSettings())
    start = _initial()
    settings = RunSettings(local_epochs=3)

    def drift(mu: float) -> float:
        res = local_fit(task, part, start, settings, 1, mu)
        assert res.weights is not None
        return sum(float(np.sum((res.weights[k] - start[k]) ** 2)) for k in start)

    assert drift(5.0) < drift(0.0)


def test_missing_data_dir_fails_the_client_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(PartitionError, match=str(tmp_path / "gone")):
        load_local("a", str(tmp_path / "gone"), RunSettings())


def test_partition_of_another_task_is_refused(parts: Path) -> None:
    with pytest.raises(RuntimeError, match="breast-cancer"):
        load_local("a", str(parts / "a"), RunSettings(task="breast-cancer"))


def _reply(node: int, cluster: str | None, samples: int = 10, error: str = "") -> Any:
    content = RecordDict({"metrics": MetricRecord({"train-loss": 1.0, "num-examples": samples})})
    if cluster is not None:
        content["client"] = ConfigRecord({"cluster": cluster})
    return SimpleNamespace(
        content=content,
        metadata=SimpleNamespace(src_node_id=node),
        error=SimpleNamespace(reason=error),
        has_error=lambda: bool(error),
    )


def test_replies_are_kept_per_cluster() -> None:
    valid, per = split_replies([_reply(1, "c1", 7), _reply(2, None, 3)], 2, "train", 1)
    assert len(valid) == 2
    assert per == {"c1": {"train-loss": 1.0, "num-examples": 7},
                   "node-2": {"train-loss": 1.0, "num-examples": 3}}  # fmt: skip


def test_too_few_successful_results_fail_the_round_with_the_reason() -> None:
    replies = [_reply(1, "c1"), _reply(2, "c2", error="ValueError: boom")]
    with pytest.raises(TooFewResultsError, match=r"round 2 train: 1 .* minimum is 2 .*boom"):
        split_replies(replies, 2, "train", 2)
    with pytest.raises(TooFewResultsError, match="timeout"):
        split_replies([], 1, "evaluate", 1)


def test_strategy_choice_follows_settings() -> None:
    prox = make_strategy(RunSettings(strategy="fedprox", proximal_mu=0.3, min_clients=3))
    assert isinstance(prox, TrackingFedProx) and prox.proximal_mu == 0.3
    assert prox.min_available_nodes == 3 and prox.min_train_nodes == 3
    assert isinstance(make_strategy(RunSettings()), TrackingFedAvg)
