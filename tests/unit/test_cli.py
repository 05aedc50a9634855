"""`ocm-fl` CLI against FederatedLearning resources given as dicts (no cluster)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from hub_controller import cli
from ocmfl import constants

runner = CliRunner()


def resource(phase: str = "Running", model: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase,
        "round": 2,
        "totalRounds": 3,
        "clients": "2/2",
        "accuracy": 0.91,
        "message": "training",
        "conditions": [
            {
                "type": "PlacementSatisfied",
                "status": "True",
                "reason": "AllDecisionsScheduled",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "clusters": [
            {
                "name": "cluster2",
                "phase": "Running",
                "round": 2,
                "samples": 719,
                "loss": 0.31,
                "accuracy": 0.9,
                "dataPath": "/data/c2",
            },
            {"name": "cluster1", "phase": "Running", "round": 2, "loss": 0.25, "accuracy": 0.92},
            {"name": "cluster3", "phase": "NoData", "reason": "no ClusterClaim"},
        ],
    }
    if model:
        status["model"] = {
            "path": "/var/lib/ocm-fl/models/fl/digits/final.pt",
            "round": 3,
            "sha256": "ab" * 32,
            "metrics": {"accuracy": 0.93, "loss": 0.2},
        }
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "digits", "namespace": "fl"},
        "spec": {"server": {"rounds": 3}, "client": {"dataClaim": "x"}},
        "status": status,
    }


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Make the CLI read these resources: `get` returns the last, `watch` yields them all."""
    items: list[dict[str, Any]] = []
    calls: list[tuple[Any, ...]] = []

    def load(name: str, ns: str, kubeconfig: str | None, context: str | None) -> dict[str, Any]:
        calls.append((name, ns, kubeconfig, context))
        return items[-1]

    def watch(
        name: str, ns: str, kubeconfig: str | None, context: str | None
    ) -> Iterator[dict[str, Any]]:
        calls.append((name, ns, kubeconfig, context))
        yield from items

    monkeypatch.setattr(cli, "loader", load)
    monkeypatch.setattr(cli, "watcher", watch)
    monkeypatch.setattr(cli, "console", Console(width=160))
    yield items


def test_summary_shows_round_of_total_clients_and_accuracy() -> None:
    s = cli.summary(resource())
    assert s == {
        "name": "fl/digits",
        "phase": "Running",
        "round": "2/3",
        "clients": "2/2",
        "accuracy": "0.9100",
        "message": "training",
    }


def test_summary_of_a_fresh_resource_is_pending_with_spec_rounds() -> None:
    fl = resource()
    del fl["status"]
    s = cli.summary(fl)
    assert s["phase"] == "Pending" and s["round"] == "0/3" and s["accuracy"] == "-"


def test_cluster_rows_are_sorted_and_missing_values_are_dashes() -> None:
    rows = cli.cluster_rows(resource())
    assert [r["cluster"] for r in rows] == ["cluster1", "cluster2", "cluster3"]
    assert rows[1]["samples"] == "719" and rows[1]["loss"] == "0.3100"
    assert rows[2]["phase"] == "NoData" and rows[2]["loss"] == "-"
    assert rows[2]["reason"] == "no ClusterClaim"


def test_plot_series_has_only_clusters_that_reported() -> None:
    series = cli.plot_series(resource())
    assert series == {
        "loss": {"cluster2": 0.31, "cluster1": 0.25},
        "accuracy": {"cluster2": 0.9, "cluster1": 0.92},
    }


def test_status_command_prints_clusters_and_conditions(serve: list[dict[str, Any]]) -> None:
    serve.append(resource())
    res = runner.invoke(cli.app, ["status", "digits", "-n", "fl", "--context", "kind-hub"])
    assert res.exit_code == 0, res.output
    for text in ("fl/digits", "Running", "2/3", "cluster1", "cluster3", "PlacementSatisfied"):
        assert text in res.output


def test_status_json_is_machine_readable(serve: list[dict[str, Any]]) -> None:
    serve.append(resource())
    res = runner.invoke(cli.app, ["status", "digits", "-n", "fl", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["phase"] == "Running" and len(data["clusters"]) == 3


def test_watch_stops_at_completed_with_exit_zero(serve: list[dict[str, Any]]) -> None:
    serve += [resource("Running"), resource("Completed", model=True), resource("Running")]
    res = runner.invoke(cli.app, ["watch", "digits", "-n", "fl"])
    assert res.exit_code == 0, res.output
    assert "Completed" in res.output


def test_watch_exits_one_when_training_failed(serve: list[dict[str, Any]]) -> None:
    serve += [resource("Running"), resource("Failed")]
    res = runner.invoke(cli.app, ["watch", "digits", "-n", "fl"])
    assert res.exit_code == 1


def test_model_command_prints_the_artifact(serve: list[dict[str, Any]]) -> None:
    serve.append(resource("Completed", model=True))
    res = runner.invoke(cli.app, ["model", "digits", "-n", "fl", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["round"] == 3 and info["metrics"]["accuracy"] == 0.93
    res = runner.invoke(cli.app, ["model", "digits", "-n", "fl"])
    assert res.exit_code == 0 and "final.pt" in res.output


def test_model_command_exits_one_before_there_is_a_model(serve: list[dict[str, Any]]) -> None:
    serve.append(resource("Running"))
    res = runner.invoke(cli.app, ["model", "digits", "-n", "fl"])
    assert res.exit_code == 1
    assert "no model yet" in res.output


def test_plot_command_writes_a_png(serve: list[dict[str, Any]], tmp_path: Path) -> None:
    serve.append(resource("Completed", model=True))
    out = tmp_path / "metrics.png"
    res = runner.invoke(cli.app, ["plot", "digits", "-n", "fl", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_reports_still_writes_a_chart(tmp_path: Path) -> None:
    fl = resource()
    fl["status"]["clusters"] = []
    out = cli.plot(fl, tmp_path / "empty.svg")
    assert out.read_text().lstrip().startswith("<?xml")


def test_missing_resource_exits_two(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client.exceptions import ApiException

    def load(*_: Any) -> dict[str, Any]:
        raise ApiException(status=404, reason="Not Found")

    monkeypatch.setattr(cli, "loader", load)
    res = runner.invoke(cli.app, ["status", "nope", "-n", "fl"])
    assert res.exit_code == 2
    assert "not found" in res.output
