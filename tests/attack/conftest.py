"""Fixtures the attack modules share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hack.controlplane.plane import ControlPlane
    from ocmfl.kube import Kube


@pytest.fixture
def hub(control_plane: ControlPlane) -> Iterator[Kube]:
    """A client of the session plane's hub, with the project's CRDs and the chart's admission
    policy installed."""
    from hack.localfed import install_crd
    from ocmfl.kube import Kube

    k = Kube(control_plane.hub_kubeconfig)
    install_crd(k)
    yield k
    k.close()


@pytest.fixture
def hub_and_spoke(control_plane: ControlPlane) -> Iterator[tuple[Kube, Kube, str]]:
    """Clients of the plane's hub and of its first managed cluster's apiserver (as its admin),
    and that cluster's name."""
    from ocmfl.kube import Kube

    cluster = control_plane.clusters[0]
    hub, spoke = (
        Kube(control_plane.hub_kubeconfig),
        Kube(control_plane.cluster_kubeconfigs[cluster]),
    )
    yield hub, spoke, cluster
    hub.close()
    spoke.close()
