"""One local plane and one local federation for all e2e modules (starting them costs minutes).

The plane lives in ``$OCMFL_CP_DIR-e2e`` (default /dev/shm/ocm-fl-cp-e2e), so parallel
worktrees with their own OCMFL_CP_DIR do not share it. Three clusters; each module gives data to
some of them with its own ClusterClaims and hub namespaces, and removes them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hack import controlplane as cp
from hack.localfed import LocalFederation
from ocmfl.kube import Kube

STATE_DIR = Path((os.environ.get("OCMFL_CP_DIR") or "/dev/shm/ocm-fl-cp") + "-e2e")


@pytest.fixture(scope="package")
def plane() -> Iterator[cp.ControlPlane]:
    """The e2e plane (hub + 3 clusters)."""
    with cp.session(clusters=3, state_dir=STATE_DIR) as state:
        yield cp.ControlPlane.from_state(state)


@pytest.fixture(scope="package")
def fed(plane: cp.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Hub controller, aggregator, CSR signer and one agent per cluster, as processes."""
    with LocalFederation(plane, tmp_path_factory.mktemp("e2e") / "federation") as f:
        yield f


@pytest.fixture(scope="package")
def hub(plane: cp.ControlPlane) -> Iterator[Kube]:
    """A client of the hub apiserver."""
    k = Kube(plane.hub_kubeconfig)
    yield k
    k.close()
