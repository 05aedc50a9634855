"""A ManagedCluster the hub admin deletes loses its addon identity, and can join again.

On the e2e plane (OCM's real registration, the agents OCM deployed): the third cluster's agent
reports with its own certificate; the admin deletes its ManagedCluster; the aggregator refuses
that certificate from the next report on (measured), and the cluster's credentials get no new
identity. Then the cluster's admin resets its registration agent (deletes its hub kubeconfig
Secret and restarts it from the bootstrap kubeconfig), the hub admin accepts it again and
enables the addon: its agent gets a new identity and reports again.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

import pytest

from agent_addon.csr import csr_object
from hack import controlplane as cp
from hack.controlplane import clusteradm
from hack.controlplane import plane as planes
from hack.controlplane.processes import State
from hack.localfed import MCA_PATH, LocalFederation, addon_hub_kubeconfig
from hack.testing import ReportProbe, wait_for
from ocmfl import constants, pki
from ocmfl.kube import Kube, KubeError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
MCS = f"/apis/{constants.CLUSTER_GROUP}/v1/managedclusters"


def test_a_deleted_cluster_loses_its_addon_identity_and_can_join_again(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    victim = plane.clusters[-1]
    # The cluster's root keeps a copy of its agent's key and certificate (OCM removes the agent
    # pod, and its memory volume, with the cluster).
    cert_dir = tmp_path / "agent-tls"
    shutil.copytree(fed.agent_cert_dir(victim), cert_dir, symlinks=False)
    ca = (fed.ca_dir / pki.CERT_FILE).read_bytes()
    creds = Kube(addon_hub_kubeconfig(plane, victim, tmp_path / "addon"))
    probe = ReportProbe(fed.aggregator_address, cert_dir, ca, victim)
    assert probe.ask() == "accepted"
    hub.delete(f"{MCS}/{victim}")  # the hub admin removes the cluster
    try:
        refusal, took = probe.until_refused(60)
        assert refusal.startswith("PERMISSION_DENIED"), refusal
        made = creds.create(CSRS, csr_object(victim, pki.generate_key()), exist_ok=False)
        assert made is not None

        def denied() -> str | None:
            status = (hub.get(f"{CSRS}/{made['metadata']['name']}") or {}).get("status") or {}
            assert not status.get("certificate"), status
            return next(
                (c["reason"] for c in status.get("conditions") or [] if c["type"] == "Denied"),
                None,
            )

        # The cluster is gone, or it has lost its RBAC and its addon (OCM's cleanup): either
        # way its agent gets nothing.
        assert wait_for(denied, 30, "the CSR denied") in {"UnknownCluster", "UnverifiedRequester"}
        print(f"\nDELETED: {victim}'s agent reports refused {took:.2f}s after its deletion")
    except BaseException:
        # The tests after this one need all three clusters: bring it back before failing.
        with contextlib.suppress(Exception):
            _rejoin(plane, fed, hub, victim)
        raise
    rejoined = _rejoin(plane, fed, hub, victim)
    again = ReportProbe(fed.aggregator_address, fed.agent_cert_dir(victim), ca, victim)
    wait_for(lambda: again.ask() == "accepted", 60, f"{victim} reporting again")
    mca = hub.get(f"{MCA_PATH.format(ns=victim)}/{constants.ADDON_NAME}")
    assert mca is not None
    print(f"REJOINED: {victim} Joined {rejoined:.1f}s after its registration agent restarted")


def _rejoin(plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, victim: str) -> float:
    """Once the deleted cluster is gone from the hub, its admin resets its registration agent,
    the hub admin accepts it again and enables the addon, until its agent holds a new
    identity; the seconds from the agent's restart to Joined."""
    wait_for(lambda: hub.get(f"{MCS}/{victim}") is None, 180, f"{victim}'s ManagedCluster gone")
    state = State.load(Path(plane.state_dir))
    assert state is not None
    planes.stop_component(state, f"registration-agent-{victim}")
    spoke = Kube(plane.cluster_kubeconfigs[victim])
    with contextlib.suppress(KubeError):
        spoke.delete(
            "/api/v1/namespaces/open-cluster-management-agent/secrets/hub-kubeconfig-secret"
        )
    spoke.close()
    shutil.rmtree(planes.klusterlet_dir(Path(plane.state_dir), victim) / "hub-kubeconfig")
    rejoined_from = time.monotonic()
    agent = planes.start_registration_agent(
        state, victim, bootstrap=planes.bootstrap_kubeconfig(state)
    )
    clusteradm.accept(hub, victim, 120, why_not=lambda: planes.log_errors(agent.log))
    planes.wait_joined(hub, state, victim, 120)
    rejoined = time.monotonic() - rejoined_from
    clusteradm.addon_enable(hub, constants.ADDON_NAME, victim, constants.AGENT_NAMESPACE)

    def identity() -> bool:
        health = fed.agent_health(victim) or {}
        return bool(health.get("certificateNotAfter"))

    wait_for(identity, 180, f"{victim}'s new agent with its identity")
    return rejoined
