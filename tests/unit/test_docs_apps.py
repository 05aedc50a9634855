"""docs/apps.md shows the app the byo_app e2e test trains (tests/apps/byo), file for file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "apps.md"
APP = ROOT / "tests" / "apps" / "byo"
BLOCK = re.compile(r"\*\*`([^`]+)`\*\*\n\n```\w*\n(.*?)```\n", re.S)


def test_the_documented_app_is_the_tested_app_file_for_file() -> None:
    shown = dict(BLOCK.findall(DOC.read_text()))
    files = {
        str(p.relative_to(APP)): p.read_text()
        for p in sorted(APP.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert shown == files


def test_the_documented_app_uses_nothing_of_the_project_but_the_sdk() -> None:
    for path in APP.rglob("*.py"):
        imports = re.findall(r"^(?:from|import) (\S+)", path.read_text(), re.M)
        ours = [m for m in imports if m.split(".")[0] in {"workloads", "hub_controller", "ocmfl"}]
        assert all(m == "workloads.sdk" for m in ours), (path, ours)
