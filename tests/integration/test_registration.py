"""Registration gone wrong, on the plane's real OCM registration (issue 28, bad input).

A cluster whose bootstrap kubeconfig is wrong never reaches the hub: `clusteradm accept` (the
plane's helper) fails naming the registration agent's own error. A ManagedClusterAddOn whose
cluster is missing or not accepted says so in the hub's condition on it, with the fix; a
cluster that registers and is accepted moves on to an agent identity.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.controlplane import clusteradm, plane
from hack.controlplane.processes import State
from hack.localfed import MCA_PATH, LocalFederation
from hack.testing import wait_for
from hub_controller.signer.addon_status import CONDITION
from ocmfl import constants
from ocmfl.kube import Kube

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

MCS = f"/apis/{constants.CLUSTER_GROUP}/v1/managedclusters"


@pytest.fixture(scope="module")
def fed(
    control_plane: plane.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalFederation]:
    with LocalFederation(control_plane, tmp_path_factory.mktemp("registration") / "fed") as f:
        yield f


@pytest.fixture(scope="module")
def hub(control_plane: plane.ControlPlane) -> Iterator[Kube]:
    k = Kube(control_plane.hub_kubeconfig)
    yield k
    k.close()


@pytest.fixture
def state(control_plane: plane.ControlPlane) -> State:
    loaded = State.load(Path(control_plane.state_dir))
    assert loaded is not None
    return loaded


def agent_condition(hub: Kube, cluster: str) -> dict[str, Any] | None:
    mca = hub.get(f"{MCA_PATH.format(ns=cluster)}/{constants.ADDON_NAME}") or {}
    return next(
        (c for c in (mca.get("status") or {}).get("conditions") or [] if c["type"] == CONDITION),
        None,
    )


def enable_by_hand(hub: Kube, cluster: str) -> None:
    """What an admin does for a cluster the hub has no namespace for yet (clusteradm addon
    enable refuses it): the namespace and the ManagedClusterAddOn."""
    hub.create("/api/v1/namespaces", {"metadata": {"name": cluster}})
    clusteradm.addon_enable(hub, constants.ADDON_NAME, cluster, constants.AGENT_NAMESPACE)


def test_joined_clusters_report_how_long_registration_took(
    control_plane: plane.ControlPlane, fed: LocalFederation, hub: Kube, state: State
) -> None:
    # Every cluster of the plane registered for real (its agent's start -> Joined), and the
    # hub's condition on its addon says the agent holds its identity.
    assert set(state.joined_seconds) == set(control_plane.clusters)
    for c in fed.clusters:

        def issued(c: str = c) -> dict[str, Any] | None:
            got = agent_condition(hub, c)
            return got if got and got["status"] == "True" else None

        cond = wait_for(issued, 60, f"{c}'s addon condition True")
        assert cond["reason"] == "AgentIdentityIssued", cond
    print(f"\nregistration agent start -> Joined: {state.joined_seconds}")


def test_a_wrong_bootstrap_kubeconfig_fails_accept_naming_the_agents_error(
    control_plane: plane.ControlPlane, hub: Kube, state: State
) -> None:
    good = yaml.safe_load(plane.bootstrap_kubeconfig(state))
    good["users"][0]["user"]["token"] = "not-the-bootstrap-token"
    agent = plane.start_registration_agent(
        state,
        "badboot",
        bootstrap=yaml.safe_dump(good),
        spoke=control_plane.clusters[1],
        hub_kubeconfig_secret="hub-kubeconfig-badboot",
    )
    try:
        with pytest.raises(clusteradm.AcceptError) as err:
            clusteradm.accept(hub, "badboot", 15, why_not=lambda: plane.log_errors(agent.log))
        message = str(err.value)
        assert "no registration CSR and no ManagedCluster" in message
        assert "bootstrap kubeconfig" in message and "Unauthorized" in message, message
        assert hub.get(f"{MCS}/badboot") is None
    finally:
        plane.stop_component(state, agent.name)


def test_an_addon_on_a_cluster_never_accepted_or_missing_says_why(
    control_plane: plane.ControlPlane, fed: LocalFederation, hub: Kube, state: State
) -> None:
    agent = plane.start_registration_agent(
        state,
        "notaccepted",
        bootstrap=plane.bootstrap_kubeconfig(state),
        spoke=control_plane.clusters[1],
        hub_kubeconfig_secret="hub-kubeconfig-notaccepted",
    )
    try:
        wait_for(lambda: hub.get(f"{MCS}/notaccepted"), 60, "the ManagedCluster registered")
        for name in ("notaccepted", "ghost"):  # ghost: no such cluster at all
            enable_by_hand(hub, name)
        got = wait_for(
            lambda: agent_condition(hub, "notaccepted"), 60, "the condition on notaccepted"
        )
        assert (got["status"], got["reason"]) == ("False", "ClusterNotAccepted"), got
        assert "clusteradm accept --clusters notaccepted" in got["message"]
        ghost = wait_for(lambda: agent_condition(hub, "ghost"), 60, "the condition on ghost")
        assert (ghost["status"], ghost["reason"]) == ("False", "ClusterNotFound"), ghost
        assert "bootstrap kubeconfig" in ghost["message"]
    finally:
        plane.stop_component(state, agent.name)
        for name in ("notaccepted", "ghost"):
            hub.delete(f"{MCA_PATH.format(ns=name)}/{constants.ADDON_NAME}")
            hub.delete(f"/api/v1/namespaces/{name}")
        hub.delete(f"{MCS}/notaccepted")
