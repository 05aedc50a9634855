"""The committed status stubs are exactly what hack/gen-proto.sh generates (Flower's check)."""

from __future__ import annotations

import filecmp
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "ocmfl" / "status" / "v1"


def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [str(ROOT / "hack" / "gen-proto.sh"), str(tmp_path)], check=True, capture_output=True
    )
    fresh = tmp_path / "ocmfl" / "status" / "v1"
    names = sorted(p.name for p in fresh.iterdir())
    assert names == ["report_pb2.py", "report_pb2.pyi", "report_pb2_grpc.py", "report_pb2_grpc.pyi"]
    stale = [n for n in names if not filecmp.cmp(fresh / n, GENERATED / n, shallow=False)]
    assert not stale, f"regenerate with hack/gen-proto.sh: {stale} differ from the proto"
