"""Shared pytest fixtures.

Local control plane (hack/controlplane, test infrastructure):
- `control_plane` (session): brings the plane up once per test session with 2 managed clusters
  (env OCMFL_CP_CLUSTERS overrides) or reuses a healthy running one. A plane started by a test
  session is torn down when the last session using it ends; one started with
  `python -m hack.controlplane up` is left running. Only tests marked `integration` or `e2e`
  may use it; nothing starts unless a test asks for it.
- `namespace` (function): a fresh hub namespace, deleted after the test.
- `helm` (session): the helm binary setup builds, for tests that render the chart.

With OCMFL_NO_SKIPS=1 (hack/run-tests.sh sets it, so `make test` and CI do) a skipped test is
reported as failed: `make test` runs the set-up first, which installs every tool a test could
skip for (helm, shellcheck, util-linux, the OCM binaries), so a skip there means a broken set-up
or a test that no longer checks what its name says.
Add further fixtures below; keep each one small and documented.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hack.controlplane.plane import ControlPlane


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """The running local control plane (see module docstring)."""
    from hack.controlplane import plane

    n = int(os.environ.get("OCMFL_CP_CLUSTERS", "2"))
    with plane.session(n) as state:
        yield plane.ControlPlane.from_state(state)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Refuse `control_plane` in tests not marked integration/e2e (keeps unit runs cheap)."""
    if "control_plane" in getattr(item, "fixturenames", ()) and not (
        item.get_closest_marker("integration") or item.get_closest_marker("e2e")
    ):
        pytest.fail("tests using control_plane must be marked integration or e2e")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under OCMFL_NO_SKIPS=1, a skip (in set-up or in the test) becomes a failure that keeps
    the skip's reason (see module docstring)."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("OCMFL_NO_SKIPS") != "1" or not report.skipped:
        return
    if hasattr(report, "wasxfail"):  # an expected failure is not a skip
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped where the set-up guarantees every tool (OCMFL_NO_SKIPS=1): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """The same for a whole module skipped at import (pytest.importorskip, module-level skip)."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("OCMFL_NO_SKIPS") == "1" and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"module skipped where the set-up guarantees every tool: {reason}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under OCMFL_ROTATION, deselect the rotating tests that are not this run's turn
    (hack/rotation.py); the run's header line names the turn and the tests left for others."""
    from hack import rotation

    turn = rotation.this_turn(os.environ.get(rotation.ENV), config.rootpath)
    kept, left = [], []
    for item in items:
        marker = item.get_closest_marker("rotation")
        if marker is None or rotation.runs(turn, int(marker.kwargs["turn"])):
            kept.append(item)
        else:
            left.append(item)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if turn.turn is not None and reporter is not None:
        names = ", ".join(i.nodeid for i in left) or "none collected"
        reporter.write_line(
            f"rotation: turn {turn.turn} of {rotation.TURNS} ({turn.why}); "
            f"left to other commits: {names}"
        )
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm binary setup builds (hack/helm.py); skipped (so failed in make test) without."""
    from hack.helm import helm_binary

    path = helm_binary()
    if path is None:
        pytest.skip("helm binary absent: build it with `bash hack/tools/build-helm.sh`")
    return path


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace on the hub, deleted (without waiting) after the test."""
    from ocmfl.kube import Kube

    hub = Kube(control_plane.hub_kubeconfig)
    name = f"t-{uuid.uuid4().hex[:8]}"
    hub.create("/api/v1/namespaces", {"metadata": {"name": name}}, exist_ok=False)
    try:
        yield name
    finally:
        hub.delete(f"/api/v1/namespaces/{name}")
        hub.close()
