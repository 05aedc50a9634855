"""Which slow plane tests a full run leaves to other commits (docs/testing.md, "Rotation").

A test marked `@pytest.mark.rotation(turn=K, covered_by=...)` repeats what the tests named in
`covered_by` already check on every run (docs/testing.md names them). With OCMFL_ROTATION=commit
(`hack/run-tests.sh` sets it for the full suite) it runs only when the number of commits in
HEAD's history, modulo TURNS, is K: each such test runs at least every TURNS commits.
OCMFL_ROTATION=all (or unset: a run of chosen tests) runs every test; OCMFL_ROTATION=<K>
runs turn K.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

TURNS = 3
ENV = "OCMFL_ROTATION"


@dataclass(frozen=True)
class Turn:
    """The turn of this run: `None` runs every test."""

    turn: int | None
    why: str


def commit_count(root: Path) -> int | None:
    """Commits in HEAD's history, or None where git cannot say (no git, a shallow clone)."""
    try:
        shallow = subprocess.run(
            ["git", "rev-parse", "--is-shallow-repository"],
            cwd=root, capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        if shallow.stdout.strip() == "true":
            return None
        out = subprocess.run(
            ["git", "rev-list", "--count", "HEAD"],
            cwd=root, capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return int(out.stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def this_turn(setting: str | None, root: Path) -> Turn:
    """The turn OCMFL_ROTATION=`setting` gives; a value that is not a known one is an error
    naming the variable and its values."""
    if setting in (None, "", "all"):
        return Turn(None, "every test runs")
    if setting == "commit":
        count = commit_count(root)
        if count is None:
            return Turn(None, "git cannot count this checkout's commits: every test runs")
        return Turn(count % TURNS, f"commit {count} of HEAD's history")
    if setting.isdigit() and int(setting) < TURNS:
        return Turn(int(setting), f"{ENV}={setting}")
    raise ValueError(f"{ENV}={setting!r}: use commit, all, or a turn from 0 to {TURNS - 1}")


def runs(turn: Turn, test_turn: int) -> bool:
    """Whether a rotating test of `test_turn` runs on `turn`."""
    return turn.turn is None or turn.turn == test_turn
