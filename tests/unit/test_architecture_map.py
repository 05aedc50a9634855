"""docs/architecture.md's module map ("Where the code lives") lists every module, and no other.

The rule, as the doc states it: every `*.py` file under the five shipped packages has one list
item that starts with its path in backticks, except generated protobuf stubs (`*_pb2*.py`)
and an `__init__.py` that defines no function or class (docstrings and re-exports only).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
SECTION = "Where the code lives"
PACKAGES = ("hub_controller", "agent_addon", "workloads", "ocmfl", "ocmfl_cli")
ENTRY = re.compile(r"^- `([^`]+\.py)`", re.M)
FIX = f"add a line for it in docs/architecture.md, section {SECTION}"


def section_text() -> str:
    """The text of the doc's "Where the code lives" section (up to the next `## ` heading)."""
    text = DOC.read_text()
    start = re.search(rf"^## {re.escape(SECTION)}\n", text, re.M)
    assert start is not None, f"docs/architecture.md has no section '## {SECTION}'"
    end = re.search(r"^## ", text[start.end() :], re.M)
    return text[start.end() : start.end() + end.start()] if end else text[start.end() :]


def map_entries() -> list[str]:
    """The module paths the map lists, in order, duplicates kept."""
    return ENTRY.findall(section_text())


def defines_code(path: Path) -> bool:
    """Whether a module defines a function or class at its top level."""
    tree = ast.parse(path.read_text(), filename=str(path))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return any(isinstance(node, kinds) for node in tree.body)


def tree_modules() -> set[str]:
    """Every module the map must list, as a path relative to the repository root."""
    out: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "_pb2" in path.name:
                continue  # generated from proto/ by hack/gen-proto.sh
            if path.name == "__init__.py" and not defines_code(path):
                continue
            out.add(path.relative_to(ROOT).as_posix())
    return out


def test_the_module_map_lists_every_module_and_only_those() -> None:
    listed = set(map_entries())
    modules = tree_modules()
    missing = sorted(modules - listed)
    stale = sorted(listed - modules)
    problems = []
    if missing:
        problems.append(f"modules missing from the map ({FIX}): " + ", ".join(missing))
    if stale:
        problems.append(
            "map entries whose file no longer exists (remove or rename them in "
            f"docs/architecture.md, section {SECTION}): " + ", ".join(stale)
        )
    assert not problems, "\n".join(problems)


def test_the_module_map_lists_each_module_once() -> None:
    twice = sorted(path for path, n in Counter(map_entries()).items() if n > 1)
    assert not twice, f"listed more than once in docs/architecture.md, {SECTION}: {twice}"


def test_the_module_map_is_not_empty() -> None:
    # Guards the parser: a changed list format must not turn the check into 0 == 0.
    assert len(map_entries()) > 50
