"""Piped and narrow-terminal output of `ocm-fl` and of the demo's result (examples/demo.py).

Off a terminal (a pipe, a log) a table is one record per line and nothing wraps; on a terminal
too narrow for a table, records again; on any terminal, paths and words are never cut.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from test_cli import FakeSource, resource
from typer.testing import CliRunner

from examples import demo
from ocmfl_cli import commands as cli
from ocmfl_cli import dashboard
from workloads.sdk.store import MANIFEST

runner = CliRunner()
BORDERS = set("│┃┏┓┗┛┡┩┠┨┣┫╇╋━─┌┐└┘├┤┬┴┼╭╮╰╯═║")
MODEL_PATH = "/var/lib/ocm-fl/models/team-a/" + "digits-federation-" * 5 + "final/model.npz"
DATA_PATH = "/mnt/ocm-fl/partitions/" + "cluster2-partition-" * 3 + "digits.npz"
REASON = "no ClusterClaim fl-data on this cluster (looked at /etc/ocm/claims/fl-data.yaml)"
SHA = "ab" * 32


def piped(monkeypatch: pytest.MonkeyPatch) -> tuple[Console, io.StringIO]:
    """stdout is a pipe and nobody said how wide (COLUMNS unset)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    return Console(file=out, force_terminal=False), out


def narrow_terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=40, color_system=None), out


def long_resource() -> dict[str, Any]:
    fl: dict[str, Any] = resource("Completed", model=True)
    fl["metadata"]["uid"] = "0000-uid"
    fl["status"]["model"]["path"] = MODEL_PATH
    clusters = fl["status"]["clusters"]
    clusters[0]["dataPath"] = DATA_PATH
    clusters[2]["reason"] = REASON
    return fl


def line_with(out: str, text: str) -> str:
    """The one line of `out` that holds `text` whole (fails when it is split or missing)."""
    lines = [line for line in out.splitlines() if text in line]
    assert len(lines) == 1, f"{text!r} not whole on one line of:\n{out}"
    return lines[0]


def assert_words_whole(out: str, texts: list[str]) -> None:
    """Every word of `texts` appears unbroken on a line of `out`."""
    lines = out.splitlines()
    for word in {w for t in texts for w in t.split()}:
        assert any(word in line for line in lines), f"{word!r} split in:\n{out}"


def assert_no_borders(out: str) -> None:
    bordered = [line for line in out.splitlines() if BORDERS & set(line)]
    assert not bordered, out


@pytest.fixture
def source(monkeypatch: pytest.MonkeyPatch) -> FakeSource:
    fake = FakeSource()
    monkeypatch.setattr(cli, "connect", lambda kubeconfig, context: fake)
    return fake


# --- ocm-fl ----------------------------------------------------------------------------------


def test_status_piped_prints_one_whole_record_per_cluster(
    source: FakeSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    console, out = piped(monkeypatch)
    monkeypatch.setattr(cli, "console", console)
    source.items.append(long_resource())
    res = runner.invoke(cli.app, ["status", "digits"])
    assert res.exit_code == 0, res.output
    text = out.getvalue()
    assert_no_borders(text)
    assert line_with(text, "fl/digits ").startswith("fl/digits phase=Completed round=2/3")
    for name in ("cluster1", "cluster2", "cluster3"):
        assert line_with(text, f"cluster={name} ").startswith(f"cluster={name} phase=")
    assert f"data-path={DATA_PATH} " in line_with(text, "cluster=cluster2 ")
    assert f"reason={json.dumps(REASON)}" in line_with(text, "cluster=cluster3 ")


def test_status_on_a_narrow_terminal_falls_back_to_records_with_every_word_whole(
    source: FakeSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    console, out = narrow_terminal()
    monkeypatch.setattr(cli, "console", console)
    source.items.append(long_resource())
    res = runner.invoke(cli.app, ["status", "digits"])
    assert res.exit_code == 0, res.output
    text = out.getvalue()
    line_with(text, DATA_PATH)
    rows = dashboard.cluster_rows(long_resource())
    assert_words_whole(text, [v for row in rows for v in row.values()])
    assert_no_borders(text)  # the table (95+ columns) cannot fit in 40


def test_status_on_a_wide_terminal_is_still_a_table(
    source: FakeSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=250, color_system=None)
    monkeypatch.setattr(cli, "console", console)
    source.items.append(long_resource())
    res = runner.invoke(cli.app, ["status", "digits"])
    assert res.exit_code == 0, res.output
    assert "┃ cluster " in out.getvalue() and "│" in line_with(out.getvalue(), DATA_PATH)


@pytest.mark.parametrize("width", range(40, 220, 15))
def test_a_table_is_drawn_only_where_no_cell_is_cut(width: int) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=width, color_system=None)
    fl = long_resource()
    dashboard.print_dashboard(console, fl)
    rows = dashboard.cluster_rows(fl)
    assert_words_whole(out.getvalue(), [v for row in rows for v in row.values()])
    assert "…" not in out.getvalue()


def test_watch_on_a_narrow_terminal_ends_with_whole_records(
    source: FakeSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    console, out = narrow_terminal()
    monkeypatch.setattr(cli, "console", console)
    source.items += [resource("Running"), long_resource()]
    res = runner.invoke(cli.app, ["watch", "digits"])
    assert res.exit_code == 0, res.output
    # the live frames cut records at the edge ('…'); after them, the records whole
    records = [line for line in out.getvalue().splitlines() if "cluster=cluster2 " in line]
    assert any(r.endswith("…") for r in records) and DATA_PATH in records[-1]
    line_with(out.getvalue(), DATA_PATH)


@pytest.mark.parametrize("where", ["piped", "narrow terminal"])
def test_model_path_and_digest_stay_whole(
    where: str, source: FakeSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    console, out = piped(monkeypatch) if where == "piped" else narrow_terminal()
    monkeypatch.setattr(cli, "console", console)
    source.items.append(long_resource())
    res = runner.invoke(cli.app, ["model", "digits"])
    assert res.exit_code == 0, res.output
    line_with(out.getvalue(), MODEL_PATH)
    line_with(out.getvalue(), SHA)


# --- the demo's result -----------------------------------------------------------------------


def demo_report(console: Console, tmp_path: Path) -> tuple[str, Path]:
    """demo.report on a completed run, with a model store holding held-out scores."""
    store = tmp_path / "store"
    store.mkdir()
    manifest = {
        "info": {"starts": [{"server": {"test-accuracy": 0.1123, "test-loss": 2.3011}}]},
        "final": {"metrics": {"server": {"test-accuracy": 0.9512, "test-loss": 0.1734}}},
    }
    (store / MANIFEST).write_text(json.dumps(manifest))
    workdir = tmp_path / ("demo-workdir-" * 6)
    workdir.mkdir()
    demo.report(console, long_resource(), workdir, True, store)
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue(), workdir / "metrics.png"


def test_demo_report_piped_is_records_and_whole_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    console, _ = piped(monkeypatch)
    text, png = demo_report(console, tmp_path)
    assert_no_borders(text)
    assert line_with(text, "held-out=initial ") == "held-out=initial accuracy=0.112 loss=2.301"
    assert line_with(text, "accuracy=0.951") == (
        'held-out="final (round 3)" accuracy=0.951 loss=0.173'
    )
    assert line_with(text, MODEL_PATH) == f"model: {MODEL_PATH} sha256 {SHA}"
    assert png.exists() and line_with(text, str(png)).endswith(str(png))


def test_demo_report_on_a_narrow_terminal_cuts_no_path_or_word(tmp_path: Path) -> None:
    console, _ = narrow_terminal()
    text, png = demo_report(console, tmp_path)
    assert line_with(text, MODEL_PATH) == f"model: {MODEL_PATH} sha256 {SHA}"
    line_with(text, str(png))
    assert_words_whole(
        text,
        [
            "global model on held-out data (never seen by any cluster)",
            "initial 0.112 2.301 final (round 3) 0.951 0.173",
        ],
    )
