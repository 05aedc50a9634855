"""The ManagedClusterAddOn condition that says why a cluster's agent has no identity."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from hub_controller.signer.addon_status import CONDITION, AddonStatus, Outcome, condition_for

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)


def cluster(
    *, accepted: bool = True, joined: bool = True, available: str = "True", deleting: bool = False
) -> dict[str, Any]:
    conds = [{"type": "ManagedClusterJoined", "status": "True" if joined else "False"}]
    conds.append(
        {
            "type": "ManagedClusterConditionAvailable",
            "status": available,
            "reason": "ManagedClusterLeaseUpdateStopped",
            "message": "Registration agent stopped updating its lease.",
        }
    )
    meta: dict[str, Any] = {"name": "c1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T11:00:00Z"
    return {
        "metadata": meta,
        "spec": {"hubAcceptsClient": accepted},
        "status": {"conditions": conds},
    }


ISSUED = Outcome("AgentIdentityIssued", "agent identity issued, valid until X", ok=True)
DENIED_AGENT = Outcome("AgentIdentityUnverifiedRequester", "CSR x: UnverifiedRequester: ...")
DENIED_CREDENTIAL = Outcome("HubCredentialDenied", "OCM's KubeClient CSR addon-c1-x was denied")


@pytest.mark.parametrize(
    ("mc", "credential_ok", "credential", "agent", "reason", "says"),
    [
        (None, False, None, None, "ClusterNotFound", "bootstrap kubeconfig"),
        (cluster(deleting=True), True, None, ISSUED, "ClusterDeleting", "being deleted"),
        (cluster(accepted=False), True, None, ISSUED, "ClusterNotAccepted", "clusteradm accept"),
        (cluster(joined=False), False, None, None, "ClusterNotJoined", "has not joined"),
        (cluster(available="Unknown"), True, None, ISSUED, "ClusterUnavailable", "lease"),
        (cluster(), False, DENIED_CREDENTIAL, None, "HubCredentialDenied", "delete Secret"),
        (cluster(), False, None, None, "WaitingForHubCredential", "registration agent"),
        (cluster(), True, None, None, "WaitingForAgent", "pod running"),
        (cluster(), True, None, DENIED_AGENT, DENIED_AGENT.reason, "UnverifiedRequester"),
        (cluster(), True, None, ISSUED, "AgentIdentityIssued", "valid until"),
    ],
)
def test_the_condition_names_the_first_missing_step_and_its_fix(
    mc: dict[str, Any] | None,
    credential_ok: bool,
    credential: Outcome | None,
    agent: Outcome | None,
    reason: str,
    says: str,
) -> None:
    status, got_reason, message = condition_for("c1", mc, credential_ok, credential, agent)
    assert got_reason == reason
    assert says in message
    assert status == ("True" if reason == "AgentIdentityIssued" else "False")


def test_a_denied_credential_counts_only_until_a_new_one_is_issued() -> None:
    status, reason, _ = condition_for("c1", cluster(), True, DENIED_CREDENTIAL, ISSUED)
    assert (status, reason) == ("True", "AgentIdentityIssued")


class RecordingKube:
    """The two GETs and the apply AddonStatus makes, in memory."""

    def __init__(self, addon: dict[str, Any] | None, mc: dict[str, Any] | None) -> None:
        self.addon, self.mc = addon, mc
        self.applied: list[tuple[str, dict[str, Any]]] = []

    def get(self, path: str) -> dict[str, Any] | None:
        return self.mc if "/managedclusters/" in path else self.addon

    def apply(self, obj: dict[str, Any], path: str) -> dict[str, Any]:
        self.applied.append((path, obj))
        assert self.addon is not None
        self.addon.setdefault("status", {})["conditions"] = obj["status"]["conditions"]
        return obj


def test_the_condition_is_applied_to_the_addons_status_once_per_change() -> None:
    addon: dict[str, Any] = {"metadata": {"name": "federated-learning", "namespace": "c1"}}
    kube = RecordingKube(addon, cluster(accepted=False))
    status = AddonStatus(kube, clock=lambda: NOW)  # type: ignore[arg-type]
    status.refresh("c1")
    status.refresh("c1")  # nothing changed: nothing written
    assert len(kube.applied) == 1
    path, body = kube.applied[0]
    assert path.endswith("/managedclusteraddons/federated-learning/status")
    (cond,) = body["status"]["conditions"]
    assert cond["type"] == CONDITION and cond["reason"] == "ClusterNotAccepted"
    assert cond["lastTransitionTime"] == "2026-12-03T12:00:00Z"
    kube.mc = cluster()
    status.agent("c1", ISSUED)  # no recorded hub credential yet: still waiting for it
    assert kube.applied[-1][1]["status"]["conditions"][0]["reason"] == "WaitingForHubCredential"


def test_an_addon_being_deleted_or_gone_is_left_alone() -> None:
    kube = RecordingKube(None, cluster())
    AddonStatus(kube, clock=lambda: NOW).refresh("c1")  # type: ignore[arg-type]
    kube.addon = {"metadata": {"name": "x", "deletionTimestamp": "2026-12-03T11:00:00Z"}}
    AddonStatus(kube, clock=lambda: NOW).refresh("c1")  # type: ignore[arg-type]
    assert kube.applied == []
