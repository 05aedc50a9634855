"""`ocm-fl` CLI and its pure rendering (ocmfl_cli.dashboard), on resources given as dicts.

The Kubernetes API is replaced by a fake `cli.connect`; only the unreachable-API and
bad-kubeconfig tests use the real client (against a closed 127.0.0.1 port / missing file).
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console, Group
from typer.testing import CliRunner

from ocmfl import constants
from ocmfl_cli import commands as cli
from ocmfl_cli import dashboard

runner = CliRunner()
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def resource(phase: str = "Running", model: bool = False, history: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase,
        "round": 2,
        "totalRounds": 3,
        "clients": "2/3",
        "accuracy": 0.91,
        "message": "training",
        "conditions": [
            {
                "type": "PlacementSatisfied",
                "status": "True",
                "reason": "AllDecisionsScheduled",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
            {
                "type": "ClientsReady",
                "status": "False",
                "reason": "ClusterNoData",
                "message": "cluster3 has no ClusterClaim fl-data",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
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
                "lastReportTime": "2026-01-01T11:59:48Z",
            },
            {
                "name": "cluster1",
                "phase": "Running",
                "round": 2,
                "samples": 1078,
                "loss": 0.25,
                "accuracy": 0.92,
                "dataPath": "/data/c1",
                "lastReportTime": "2026-01-01T11:55:00+00:00",
            },
            {"name": "cluster3", "phase": "NoData", "reason": "no ClusterClaim fl-data"},
        ],
    }
    if history:
        status["history"] = [
            {"round": r, "cluster": c, "loss": loss, "accuracy": acc, "samples": n}
            for r, c, loss, acc, n in [
                (1, "cluster1", 0.6, 0.80, 1078),
                (1, "cluster2", 0.7, 0.78, 719),
                (1, "global", 0.64, 0.79, None),
                (2, "cluster1", 0.25, 0.92, 1078),
                (2, "cluster2", 0.31, None, 719),
                (2, "global", 0.27, 0.91, None),
            ]
        ]
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
        "metadata": {"name": "digits", "namespace": "fl", "resourceVersion": "7"},
        "spec": {"server": {"rounds": 3}, "client": {"dataClaim": "fl-data"}},
        "status": status,
    }


@dataclass
class FakeSource:
    """Stands in for the API server: `get` returns the last item, `watch` yields them all."""

    items: list[dict[str, Any]] = field(default_factory=list)
    namespace: str = "fl"
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    then_raise: Exception | None = None

    def get(self, name: str, namespace: str) -> dict[str, Any]:
        self.calls.append(("get", name, namespace))
        if not self.items:
            raise cli.NotFoundError(name, namespace)
        return self.items[-1]

    def watch(self, name: str, namespace: str, timeout: float | None) -> Iterator[dict[str, Any]]:
        self.calls.append(("watch", name, namespace, timeout))
        yield from self.items
        if self.then_raise is not None:
            raise self.then_raise


@pytest.fixture
def source(monkeypatch: pytest.MonkeyPatch) -> FakeSource:
    """Make every command read from a FakeSource; remembers connect()'s arguments too."""
    fake = FakeSource()

    def connect(kubeconfig: str | None, context: str | None) -> cli.Source:
        fake.calls.append(("connect", kubeconfig, context))
        return fake

    monkeypatch.setattr(cli, "connect", connect)
    return fake


# --- pure rendering --------------------------------------------------------------------------


def test_summary_shows_round_of_total_clients_and_accuracy() -> None:
    assert dashboard.summary(resource()) == {
        "name": "fl/digits",
        "phase": "Running",
        "round": "2/3",
        "clients": "2/3",
        "accuracy": "0.9100",
        "message": "training",
    }


def test_summary_and_header_show_the_privacy_spent_of_a_dp_run() -> None:
    fl = resource()
    fl["status"]["privacy"] = {"mode": "central", "epsilon": 2.3456, "delta": 1e-05, "rounds": 3}
    shown = "epsilon 2.346 at delta 1e-05 after 3 rounds (central DP)"
    assert dashboard.summary(fl)["privacy"] == shown
    header = dashboard.render_header(fl)
    assert isinstance(header, Group)
    assert f"privacy spent: {shown}" in [str(part) for part in header.renderables]


def test_summary_of_a_fresh_resource_is_pending_with_spec_rounds() -> None:
    fl = resource()
    del fl["status"]
    s = dashboard.summary(fl)
    assert s["phase"] == "Pending" and s["round"] == "0/3" and s["accuracy"] == "-"


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0, "0s ago"), (12, "12s ago"), (125, "2m ago"), (7300, "2h ago")]
)
def test_ago_is_the_largest_whole_unit(seconds: int, shown: str) -> None:
    ts = datetime.fromtimestamp(NOW.timestamp() - seconds, UTC).isoformat()
    assert dashboard.ago(ts, NOW) == shown


def test_ago_of_a_missing_or_future_time() -> None:
    assert dashboard.ago(None, NOW) == "-"
    assert dashboard.ago("2026-01-01T12:00:05Z", NOW) == "0s ago"  # clock skew
    assert dashboard.ago("not a time", NOW) == "not a time"


def test_cluster_rows_are_sorted_with_every_column_and_dashes_for_missing_values() -> None:
    rows = dashboard.cluster_rows(resource(), NOW)
    assert [r["cluster"] for r in rows] == ["cluster1", "cluster2", "cluster3"]
    assert list(rows[0]) == list(dashboard.CLUSTER_COLUMNS)
    assert rows[1] == {
        "cluster": "cluster2",
        "phase": "Running",
        "data path": "/data/c2",
        "samples": "719",
        "round": "2",
        "loss": "0.3100",
        "accuracy": "0.9000",
        "last report": "12s ago",
        "reason": "",
    }
    assert rows[0]["last report"] == "5m ago"
    assert rows[2]["phase"] == "NoData" and rows[2]["loss"] == "-"
    assert rows[2]["reason"] == "no ClusterClaim fl-data"


def test_only_conditions_that_are_not_true_are_problems() -> None:
    assert dashboard.problem_conditions(resource()) == [
        {
            "type": "ClientsReady",
            "status": "False",
            "reason": "ClusterNoData",
            "message": "cluster3 has no ClusterClaim fl-data",
        }
    ]


def test_history_series_per_metric_per_cluster_sorted_by_round() -> None:
    fl = resource()
    fl["status"]["history"].insert(0, {"round": 2, "cluster": "cluster1", "loss": 9.0})
    series = dashboard.history_series(fl)
    assert series["loss"]["cluster1"] == [(1, 0.6), (2, 0.25)]  # later entry wins
    assert series["accuracy"]["cluster2"] == [(1, 0.78)]  # null accuracy left out
    assert set(series["loss"]) == {"cluster1", "cluster2", "global"}


def test_history_figure_has_loss_and_accuracy_axes_with_a_line_per_cluster() -> None:
    fig = dashboard.history_figure(resource())
    assert len(fig.axes) == 2
    loss, acc = fig.axes
    assert loss.get_title() == "loss per round" and acc.get_title() == "accuracy per round"
    assert sorted(str(line.get_label()) for line in loss.get_lines()) == [
        "cluster1",
        "cluster2",
        "global",
    ]


def test_history_figure_without_history_says_so() -> None:
    with pytest.raises(dashboard.NoHistoryError, match="no per-round metrics yet"):
        dashboard.history_figure(resource(history=False))


def test_render_dashboard_is_usable_without_the_cli() -> None:
    con = Console(width=200, record=True)
    con.print(dashboard.render_dashboard(resource(), NOW))
    text = con.export_text()
    assert "fl/digits" in text and "12s ago" in text and "/data/c1" in text


# --- commands --------------------------------------------------------------------------------


def test_status_on_a_terminal_prints_header_problem_conditions_and_a_cluster_table(
    source: FakeSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=200, color_system=None)
    monkeypatch.setattr(cli, "console", terminal)
    source.items.append(resource())
    res = runner.invoke(cli.app, ["status", "digits", "-n", "fl", "--context", "kind-hub"])
    assert res.exit_code == 0, res.output
    out = screen.getvalue()
    for text in ("fl/digits", "Running", "round 2/3", "clients 2/3", "0.9100", "training"):
        assert text in out
    assert "ClientsReady=False ClusterNoData: cluster3 has no ClusterClaim fl-data" in out
    assert "PlacementSatisfied" not in out  # True conditions are not shown
    rows = [line for line in out.splitlines() if "cluster" in line and "/data/" in line]
    assert len(rows) == 2 and "1078" in rows[0] and "0.2500" in rows[0] and "ago" in rows[0]
    assert any("cluster3" in line and "NoData" in line for line in out.splitlines())
    assert source.calls == [("connect", None, "kind-hub"), ("get", "digits", "fl")]


def test_status_off_a_terminal_prints_one_key_value_line_per_fact(source: FakeSource) -> None:
    source.items.append(resource())
    res = runner.invoke(cli.app, ["status", "digits", "-n", "fl"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("fl/digits phase=Running round=2/3 clients=2/3 accuracy=0.9100")
    assert lines[1] == (
        'condition=ClientsReady status=False reason=ClusterNoData message="cluster3 has no '
        'ClusterClaim fl-data"'
    )
    rows = [line for line in lines if line.startswith("cluster=")]
    assert [r.split()[0] for r in rows] == [
        "cluster=cluster1",
        "cluster=cluster2",
        "cluster=cluster3",
    ]
    assert "samples=1078" in rows[0] and "loss=0.2500" in rows[0] and "last-report=" in rows[0]
    assert "reason=" not in rows[0] and 'reason="no ClusterClaim' in rows[2]
    assert "phase=NoData" in rows[2]


def test_namespace_defaults_to_the_contexts(source: FakeSource) -> None:
    source.items.append(resource())
    source.namespace = "team-a"
    res = runner.invoke(cli.app, ["status", "digits", "--kubeconfig", "/k.yaml"])
    assert res.exit_code == 0, res.output
    assert source.calls == [("connect", "/k.yaml", None), ("get", "digits", "team-a")]


def test_piped_output_is_wide_enough_that_rows_do_not_fold(source: FakeSource) -> None:
    fl = resource()
    fl["status"]["clusters"][0]["reason"] = "a reason long enough to matter " * 2
    source.items.append(fl)
    res = runner.invoke(cli.app, ["status", "digits"])
    assert res.exit_code == 0, res.output
    assert len([line for line in res.output.splitlines() if "cluster2" in line]) == 1
    assert "a reason long enough to matter a reason long enough to matter" in res.output


def test_status_json_is_machine_readable(source: FakeSource) -> None:
    source.items.append(resource())
    res = runner.invoke(cli.app, ["status", "digits", "-o", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["phase"] == "Running" and len(data["clusters"]) == 3
    assert [c["type"] for c in data["conditions"]] == ["ClientsReady"]


def test_missing_resource_exits_two_naming_it(source: FakeSource) -> None:
    res = runner.invoke(cli.app, ["status", "nope", "-n", "fl"])
    assert res.exit_code == 2
    assert "federatedlearning nope not found in namespace fl" in res.stderr


def test_watch_stops_at_completed_with_exit_zero(source: FakeSource) -> None:
    source.items += [resource("Running"), resource("Completed", model=True), resource("Failed")]
    res = runner.invoke(cli.app, ["watch", "digits", "--timeout", "30"])
    assert res.exit_code == 0, res.output
    assert "Completed" in res.output and "cluster1" in res.output
    assert "2/3" in res.output  # the round progress bar
    assert source.calls[-1] == ("watch", "digits", "fl", 30.0)


def test_watch_off_a_terminal_logs_one_line_per_change(source: FakeSource) -> None:
    source.items += [resource("Running"), resource("Running"), resource("Completed")]
    res = runner.invoke(cli.app, ["watch", "digits"])
    assert res.exit_code == 0, res.output
    summaries = [line for line in res.output.splitlines() if line.startswith("fl/digits ")]
    assert [line.split()[1] for line in summaries] == ["phase=Running", "phase=Completed"]
    assert any(line.startswith("cluster=cluster1 ") for line in res.output.splitlines())


def test_watch_json_is_one_object_per_change(source: FakeSource) -> None:
    source.items += [resource("Running"), resource("Completed", model=True)]
    res = runner.invoke(cli.app, ["watch", "digits", "-o", "json"])
    assert res.exit_code == 0, res.output
    objects = [json.loads(line) for line in res.stdout.splitlines()]
    assert [o["phase"] for o in objects] == ["Running", "Completed"]
    assert len(objects[-1]["clusters"]) == 3


def test_watch_on_a_terminal_draws_live(
    source: FakeSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=screen, force_terminal=True, width=200))
    source.items += [resource("Running"), resource("Completed")]
    res = runner.invoke(cli.app, ["watch", "digits"])
    assert res.exit_code == 0, res.output
    assert "Completed" in screen.getvalue() and "cluster2" in screen.getvalue()


def test_watch_exits_one_when_training_failed(source: FakeSource) -> None:
    failed = resource("Failed")
    failed["status"]["message"] = "round 2 timed out"
    source.items += [resource("Running"), failed]
    res = runner.invoke(cli.app, ["watch", "digits"])
    assert res.exit_code == 1
    assert "fl/digits failed: round 2 timed out" in res.stderr


def test_watch_exits_one_on_timeout(source: FakeSource) -> None:
    source.items += [resource("Running")]  # the watch ends (timeout) before a final phase
    res = runner.invoke(cli.app, ["watch", "digits", "--timeout", "5"])
    assert res.exit_code == 1
    assert "timed out after 5s: fl/digits is Running, round 2/3" in res.stderr


def test_watch_exits_two_when_the_resource_is_deleted(source: FakeSource) -> None:
    source.items += [resource("Running")]
    source.then_raise = cli.NotFoundError("digits", "fl")
    res = runner.invoke(cli.app, ["watch", "digits"])
    assert res.exit_code == 2
    assert "not found in namespace fl" in res.stderr


def test_model_prints_the_artifact(source: FakeSource) -> None:
    source.items.append(resource("Completed", model=True))
    res = runner.invoke(cli.app, ["model", "digits", "-o", "json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["round"] == 3 and info["metrics"]["accuracy"] == 0.93
    res = runner.invoke(cli.app, ["model", "digits"])
    assert res.exit_code == 0, res.output
    assert "final.pt" in res.output and "ab" * 32 in res.output and "0.9300" in res.output


def test_logs_prints_each_failed_clients_log_tail(source: FakeSource) -> None:
    fl = resource("Running")
    fl["status"]["clusters"][0]["clientLog"] = "Traceback (most recent call last):\nValueError: x"
    source.items.append(fl)
    res = runner.invoke(cli.app, ["logs", "digits"])
    assert res.exit_code == 0, res.output
    assert res.stdout == "==> cluster2 <==\nTraceback (most recent call last):\nValueError: x\n"
    res = runner.invoke(cli.app, ["logs", "digits", "--cluster", "cluster2", "-o", "json"])
    assert json.loads(res.stdout) == {"cluster2": fl["status"]["clusters"][0]["clientLog"]}
    res = runner.invoke(cli.app, ["logs", "digits", "--cluster", "cluster1"])
    assert res.exit_code == 1
    assert "no client log from cluster cluster1" in res.stderr and "CLIENT_LOGS=off" in res.stderr
    res = runner.invoke(cli.app, ["logs", "digits", "--cluster", "cluster9"])
    assert res.exit_code == 2 and "cluster 'cluster9' is not in digits" in res.stderr


def test_model_exits_one_before_there_is_a_model(source: FakeSource) -> None:
    source.items.append(resource("Running"))
    res = runner.invoke(cli.app, ["model", "digits"])
    assert res.exit_code == 1
    assert "no model yet" in res.stderr and "phase Running" in res.stderr


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_plot_writes_a_png_of_the_history(source: FakeSource, tmp_path: Path) -> None:
    source.items.append(resource("Completed", model=True))
    out = tmp_path / "metrics.png"
    res = runner.invoke(cli.app, ["plot", "digits", "-f", str(out)])
    assert res.exit_code == 0, res.output
    width, height = _png_size(out.read_bytes())
    assert width > height > 100  # two subplots side by side
    assert len(dashboard.history_figure(source.items[-1]).axes) == 2


def test_plot_history_writes_svg_for_the_demo(tmp_path: Path) -> None:
    out = dashboard.plot_history(resource(), tmp_path / "m.svg")
    assert "<svg" in out.read_text()


def test_plot_json_gives_the_series_and_needs_no_file(source: FakeSource) -> None:
    source.items.append(resource())
    res = runner.invoke(cli.app, ["plot", "digits", "-o", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["file"] is None and "global" in data["series"]["accuracy"]


def test_plot_needs_a_file_or_json(source: FakeSource) -> None:
    source.items.append(resource())
    res = runner.invoke(cli.app, ["plot", "digits"])
    assert res.exit_code == 2 and "--file" in res.stderr


def test_plot_without_history_exits_one(source: FakeSource, tmp_path: Path) -> None:
    source.items.append(resource(history=False))
    out = tmp_path / "metrics.png"
    res = runner.invoke(cli.app, ["plot", "digits", "-f", str(out)])
    assert res.exit_code == 1
    assert "no per-round metrics yet" in res.stderr and not out.exists()


def test_plot_without_matplotlib_says_which_extra_to_install(
    source: FakeSource, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An install without matplotlib (e.g. `pip install ocm-federated-learning` alone)."""
    import sys

    source.items.append(resource("Completed", model=True))
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    out = tmp_path / "metrics.png"
    res = runner.invoke(cli.app, ["plot", "digits", "-f", str(out)])
    assert res.exit_code == cli.EXIT_UNREACHABLE
    assert "pip install 'ocm-federated-learning[cli]'" in res.stderr and not out.exists()


# --- the real client, without a cluster ------------------------------------------------------


def _kubeconfig(path: Path, server: str, namespace: str | None = None) -> Path:
    ctx: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace:
        ctx["namespace"] = namespace
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "main", "context": ctx},
                    {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "o"}},
                ],
                "current-context": "main",
            }
        )
    )
    return path


def test_context_namespace_from_the_kubeconfig(tmp_path: Path) -> None:
    kc = str(_kubeconfig(tmp_path / "kc", "https://127.0.0.1:1", namespace="team-a"))
    assert cli._context_namespace(kc, None) == "team-a"
    assert cli._context_namespace(kc, "other") == "o"
    bare = str(_kubeconfig(tmp_path / "bare", "https://127.0.0.1:1"))
    assert cli._context_namespace(bare, None) == "default"


def test_unreachable_api_exits_two_with_the_address(tmp_path: Path) -> None:
    kc = _kubeconfig(tmp_path / "kc", "http://127.0.0.1:1")
    res = runner.invoke(cli.app, ["status", "digits", "--kubeconfig", str(kc)])
    assert res.exit_code == 2
    assert "cannot reach the Kubernetes API at http://127.0.0.1:1" in res.stderr


def test_unknown_context_or_missing_kubeconfig_exits_two(tmp_path: Path) -> None:
    kc = _kubeconfig(tmp_path / "kc", "http://127.0.0.1:1")
    res = runner.invoke(cli.app, ["status", "d", "--kubeconfig", str(kc), "--context", "nope"])
    assert res.exit_code == 2 and "cannot load" in res.stderr
    res = runner.invoke(cli.app, ["model", "d", "--kubeconfig", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "cannot load" in res.stderr
