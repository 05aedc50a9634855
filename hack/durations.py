"""Where a test run's time went: per test file, from the JUnit XML hack/run-tests.sh writes.

    .venv/bin/python -m hack.durations out/test-reports/planes.xml [--top 30]

Prints each file's total seconds (set-up and tear-down of its tests included, as pytest's
JUnit report counts them), its number of tests, and the share of the phase, slowest first.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def per_file(report: Path) -> dict[str, tuple[float, int]]:
    """File -> (seconds, tests) over every testcase in the report."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for case in ET.parse(report).getroot().iter("testcase"):
        # classname is the dotted module path (plus a class, if any): the file is its module.
        parts = case.get("classname", "").split(".")
        while parts and not parts[-1].startswith("test_"):
            parts.pop()
        name = "/".join(parts) + ".py" if parts else case.get("classname", "?")
        totals[name][0] += float(case.get("time", "0"))
        totals[name][1] += 1
    return {k: (v[0], int(v[1])) for k, v in totals.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    files = per_file(args.report)
    total = sum(s for s, _ in files.values()) or 1.0
    print(f"{'seconds':>8} {'tests':>5} {'share':>6}  file")
    for name, (secs, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{secs:8.1f} {n:5d} {secs / total:6.1%}  {name}")
    print(f"{total:8.1f} {sum(n for _, n in files.values()):5d} {1:6.0%}  all")


if __name__ == "__main__":
    main()
