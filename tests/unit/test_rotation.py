"""The rotation of slow plane tests (hack/rotation.py): which turn a run is, and that every
rotating test names tests that run on every commit and cover it, as docs/testing.md says."""

from __future__ import annotations

import ast
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from hack import rotation

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Rotating:
    test: str  # path::name
    turn: int
    covered_by: tuple[str, ...]


def _tests(path: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text())
    return {
        n.name: n
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")
    }


def _rotation_marker(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.Call | None:
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and ast.unparse(d.func) == "pytest.mark.rotation":
            return d
    return None


def _rotating() -> list[Rotating]:
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for name, fn in _tests(path).items():
            marker = _rotation_marker(fn)
            if marker is None:
                continue
            kw = {k.arg: ast.literal_eval(k.value) for k in marker.keywords}
            found.append(
                Rotating(f"{path.relative_to(ROOT)}::{name}", kw["turn"], tuple(kw["covered_by"]))
            )
    return found


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_a_run_of_chosen_tests_runs_them_all_and_a_bad_setting_names_the_variable(
    tmp_path: Path,
) -> None:
    for setting in (None, "", "all"):
        assert rotation.this_turn(setting, tmp_path).turn is None
    assert rotation.this_turn("2", tmp_path).turn == 2
    for bad in ("3", "sometimes", "-1"):
        with pytest.raises(ValueError, match=r"OCMFL_ROTATION=.*use commit, all, or a turn"):
            rotation.this_turn(bad, tmp_path)


def test_the_commit_count_picks_the_turn_and_a_shallow_clone_runs_everything(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    for i in range(4):
        (repo / "f").write_text(str(i))
        _git(repo, "add", "f")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", str(i))
    turn = rotation.this_turn("commit", repo)
    assert (turn.turn, turn.why) == (4 % rotation.TURNS, "commit 4 of HEAD's history")
    assert rotation.runs(turn, 4 % rotation.TURNS)
    assert not rotation.runs(turn, (4 + 1) % rotation.TURNS)
    shallow = tmp_path / "shallow"
    _git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    assert rotation.this_turn("commit", shallow).turn is None
    assert rotation.this_turn("commit", tmp_path / "no-git").turn is None


def test_every_rotating_test_is_covered_by_tests_that_run_on_every_commit() -> None:
    rotating = _rotating()
    assert rotating, "no test carries the rotation marker: drop hack/rotation.py or this test"
    names = {r.test for r in rotating}
    for r in rotating:
        assert 0 <= r.turn < rotation.TURNS, r
        assert r.covered_by, r
        for cover in r.covered_by:
            path, _, name = cover.partition("::")
            assert name in _tests(ROOT / path), f"{r.test}: {cover} does not exist"
            assert cover not in names, f"{r.test}: {cover} rotates too"


def test_docs_name_each_rotating_test_its_turn_and_the_tests_that_cover_it() -> None:
    docs = (ROOT / "docs" / "testing.md").read_text()
    section = docs.split("## Rotation", 1)[1].split("\n## ", 1)[0]
    for r in _rotating():
        row = next((ln for ln in section.splitlines() if r.test in ln), None)
        assert row is not None, f"docs/testing.md's Rotation table lacks {r.test}"
        assert f"| {r.turn} |" in row, (r, row)
        for cover in r.covered_by:
            assert cover.rpartition("::")[2] in row, (cover, row)
