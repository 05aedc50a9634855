"""The server launcher's outcome for any app, and its checks of the app directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.flower_app import AppError, inspect_app, run_config
from workloads.outcome import RunLog, decide, final_metrics, readable_error

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "apps"
FINAL = {
    "round": 3,
    "path": "final/model.npz",
    "sha256": "ab" * 32,
    "uid": "u",
    "metrics": {"server": {"test-accuracy": 0.9}, "evaluate": {}},
}
DONE = {"run-id": 7, "status": "finished:completed", "status-details": ""}


def _log(*lines: str, min_results: int = 2) -> RunLog:
    log = RunLog(min_results=min_results)
    for line in lines:
        log.feed(line)
    return log


def test_completed_with_a_final_model_reports_rounds_path_sha_and_metrics() -> None:
    out = decide(DONE, {"final": FINAL}, _log(), rounds=3, uid="u", model_url="/m/final/model.npz")
    assert out.ok and out.rounds == 3 and out.model_path == "/m/final/model.npz"
    assert out.metrics == {"test-accuracy": 0.9}
    assert "completed 3 rounds" in out.reason and "sha256 abababababab" in out.reason
    assert out.termination_message()["sha256"] == "ab" * 32


def test_a_final_model_of_another_resource_or_too_few_rounds_is_not_success() -> None:
    other = decide(DONE, {"final": {**FINAL, "uid": "old"}}, _log(), rounds=3, uid="u",
                   model_url="/m")  # fmt: skip
    assert other.ok and other.model_path is None  # not ours: not reported as our model
    short = decide(DONE, {"final": {**FINAL, "round": 2}}, _log(), rounds=3, uid="u",
                   model_url="/m")  # fmt: skip
    assert not short.ok and "round 2 of 3" in short.reason


def test_a_failed_serverapp_fails_with_its_own_message() -> None:
    status = {
        "run-id": 9,
        "status": "finished:failed",
        "status-details": "<class 'RuntimeError'>:<'tokenizer not found at /x'>",
    }
    out = decide(status, None, _log("[ROUND 1/3]"), rounds=3, uid="u", model_url=None)
    assert not out.ok
    assert out.reason == "run 9 finished:failed: RuntimeError: tokenizer not found at /x"
    assert out.termination_message() == {"ok": False, "reason": out.reason, "round": 1}


def test_a_raising_clientapp_fails_even_an_app_without_the_sdk() -> None:
    log = _log(
        "[ROUND 1/3]",
        "INFO :      aggregate_train: Received 0 results and 2 failures",
        "INFO :      \t> Received error in reply from node 12: "
        "<class 'ValueError'>:<'column price missing in /data/c1'>",
    )
    out = decide(DONE, None, log, rounds=3, uid="u", model_url=None)
    assert not out.ok
    assert "fewer than 2 successful client results" in out.reason
    assert "ValueError: column price missing in /data/c1" in out.reason


def test_an_app_without_the_store_completes_with_the_rounds_its_log_shows() -> None:
    out = decide(DONE, None, _log("[ROUND 1/2]", "[ROUND 2/2]"), rounds=2, uid="u", model_url=None)
    assert out.ok and out.rounds == 2 and out.model_path is None
    assert "stored no final model" in out.reason


def test_long_errors_are_trimmed_to_one_line() -> None:
    status = {**DONE, "status": "finished:failed", "status-details": "boom\n" * 500}
    out = decide(status, None, _log(), rounds=1, uid="u", model_url=None)
    assert len(out.reason) <= 400 and "\n" not in out.reason


def test_final_metrics_fall_back_to_the_clients_weighted_mean() -> None:
    per = {"c1": {"eval-accuracy": 1.0, "num-examples": 3}, "c2": {"eval-accuracy": 0.0,
           "num-examples": 1}}  # fmt: skip
    assert final_metrics({"server": {}, "evaluate": per}) == {"eval-accuracy": 0.75}
    assert readable_error("<class 'a.b.KeyError'>:<'x'>") == "KeyError: x"


def test_app_directories_are_checked_before_anything_starts(tmp_path: Path) -> None:
    app = inspect_app(EXAMPLES / "digits")
    assert (app.name, app.serverapp) == ("digits", "digits_app.server_app:app")
    assert app.config["num-server-rounds"] == 3
    with pytest.raises(AppError, match=f"app directory {tmp_path / 'nope'} does not exist"):
        inspect_app(tmp_path / "nope")
    with pytest.raises(AppError, match=r"has no pyproject\.toml"):
        inspect_app(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(AppError, match=r"has no \[tool.flwr.app\] table"):
        inspect_app(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\nversion = "1"\n[tool.flwr.app]\npublisher = "p"\n'
        '[tool.flwr.app.components]\nserverapp = "a:app"\n'
    )
    with pytest.raises(AppError, match=r"lacks \[tool.flwr.app.components\] clientapp"):
        inspect_app(tmp_path)


def test_run_config_takes_only_declared_keys_and_the_resource_rounds() -> None:
    app = inspect_app(EXAMPLES / "digits")
    assert run_config(app, {"lr": 0.05}, 5) == {"lr": 0.05, "num-server-rounds": 5}
    with pytest.raises(AppError, match=r"run config keys \['learning-rate'\] are not declared"):
        run_config(app, {"learning-rate": 0.05}, None)
    tabular = inspect_app(EXAMPLES / "tabular")
    assert run_config(tabular, {}, None) == {}


# Flower 1.42's strategy log for one round (flwr.serverapp.strategy), as `flwr log` streams it.
def _round_log(rnd: int, train_loss: float, eval_loss: float, eval_acc: float) -> list[str]:
    return [
        "INFO :      ",
        f"INFO :      [ROUND {rnd}/3]",
        "INFO :      configure_train: Sampled 2 nodes (out of 2)",
        "INFO :      aggregate_train: Received 2 results and 0 failures",
        f"INFO :      \t└──> Aggregated MetricRecord: {{'train_loss': {train_loss}}}",
        "INFO :      configure_evaluate: Sampled 2 nodes (out of 2)",
        "INFO :      aggregate_evaluate: Received 2 results and 0 failures",
        f"INFO :      \t└──> Aggregated MetricRecord: {{'eval_loss': {eval_loss}, "
        f"'eval_acc': {eval_acc}}}",
    ]


def test_an_app_without_the_sdk_gets_its_rounds_and_history_from_flowers_log() -> None:
    lines = [line for r in (1, 2, 3) for line in _round_log(r, 1.0 / r, 0.9 / r, 0.3 * r)]
    out = decide(DONE, None, _log(*lines), rounds=3, uid="u", model_url=None)
    assert out.ok and out.rounds == 3
    message = out.termination_message()
    assert message["round"] == 3
    # Evaluate values over train values; the metric names are the app's own.
    assert message["history"] == [
        {"round": 1, "loss": 0.9, "accuracy": 0.3},
        {"round": 2, "loss": 0.45, "accuracy": 0.6},
        {"round": 3, "loss": 0.3, "accuracy": 0.9},
    ]


def test_serverapp_side_evaluation_wins_and_train_values_stand_in_for_missing_ones() -> None:
    lines = [
        "INFO :      [ROUND 1/1]",
        "INFO :      aggregate_train: Received 2 results and 0 failures",
        "INFO :      \t└──> Aggregated MetricRecord: {'loss': 0.7, 'num-examples': 40}",
        "INFO :      Global evaluation",
        "INFO :      \t└──> MetricRecord: {'test-accuracy': 0.81}",
    ]
    assert _log(*lines).history() == [{"round": 1, "loss": 0.7, "accuracy": 0.81}]


def test_a_metric_record_that_is_not_a_plain_dict_or_is_huge_is_left_out() -> None:
    lines = [
        "INFO :      [ROUND 1/2]",
        "INFO :      aggregate_train: Received 2 results and 0 failures",
        "INFO :      \t└──> Aggregated MetricRecord: {'loss': __import__('os').getpid()}",
        "INFO :      [ROUND 2/2]",
        "INFO :      aggregate_train: Received 2 results and 0 failures",
        "INFO :      \t└──> Aggregated MetricRecord: {'loss': [" + "1.0, " * 2000 + "]}",
    ]
    assert _log(*lines).history() == []


def test_the_history_in_the_termination_message_keeps_the_latest_rounds_that_fit() -> None:
    lines = [line for r in range(1, 401) for line in _round_log(r, 0.5, 0.25, 0.75)]
    message = decide(DONE, None, _log(*lines), rounds=400, uid="u", model_url=None)
    text = json.dumps(message.termination_message())
    assert len(text.encode()) < 4096  # the kubelet keeps at most 4096 bytes
    rounds = [row["round"] for row in message.termination_message()["history"]]
    assert rounds == list(range(rounds[0], 401)) and len(rounds) > 20
