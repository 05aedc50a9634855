"""One local plane and one local federation for all drills (starting them costs minutes).

The plane lives in ``$OCMFL_CP_DIR-drills`` (default /dev/shm/ocm-fl-cp-drills): two
clusters. Each drill uses its own hub namespaces and ClusterClaims and removes its resources.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack import controlplane as cp
from hack.localfed import LocalFederation
from hack.testing import wait_for
from ocmfl.kube import Kube

STATE_DIR = Path((os.environ.get("OCMFL_CP_DIR") or "/dev/shm/ocm-fl-cp") + "-drills")


@pytest.fixture(scope="package")
def plane() -> Iterator[cp.ControlPlane]:
    """The drills' plane (hub + 2 clusters)."""
    with cp.session(clusters=2, state_dir=STATE_DIR) as state:
        yield cp.ControlPlane.from_state(state)


@pytest.fixture(scope="package")
def fed(
    plane: cp.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalFederation]:
    """Hub controller, aggregator, CSR signer and one agent per cluster, as processes."""
    with LocalFederation(plane, tmp_path_factory.mktemp("drills") / "federation") as f:
        # Read the hub's /metrics token now: drills scrape while the apiserver is stopped.
        wait_for(f.metrics_headers, 60, "the hub's /metrics token")
        yield f


@pytest.fixture(scope="package")
def hub(plane: cp.ControlPlane) -> Iterator[Kube]:
    """A client of the hub apiserver."""
    k = Kube(plane.hub_kubeconfig)
    yield k
    k.close()
