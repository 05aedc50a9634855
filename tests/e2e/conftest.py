"""Fixtures shared by the e2e modules: one private plane and one local federation per session.

The plane (hub + 3 managed clusters) lives in ``$OCMFL_CP_DIR-e2e`` (default
/dev/shm/ocm-fl-cp-e2e), apart from the shared test plane; the hub controller, aggregator, CSR
signer and agents (hack/localfed.py) run once for every e2e module. Each module uses its own
hub namespaces and ClusterClaims and removes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hack import controlplane as cp
from hack.controlplane import processes
from hack.localfed import LocalFederation
from ocmfl.kube import Kube

STATE_DIR = Path(f"{processes.state_dir()}-e2e")


@pytest.fixture(scope="session")
def plane() -> Iterator[cp.ControlPlane]:
    with cp.session(clusters=3, state_dir=STATE_DIR) as state:
        yield cp.ControlPlane.from_state(state)


@pytest.fixture(scope="session")
def fed(
    plane: cp.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalFederation]:
    workdir = tmp_path_factory.mktemp("e2e")
    f = LocalFederation(plane, workdir / "federation")
    f.start()
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture(scope="session")
def hub(plane: cp.ControlPlane) -> Iterator[Kube]:
    k = Kube(plane.hub_kubeconfig)
    yield k
    k.close()
