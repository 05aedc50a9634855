"""`clusteradm accept` on the local plane: which registration CSRs it approves.

OCM's registration agent creates its CSR and its ManagedCluster at the same time, so on a busy
machine the CSR can be older than the ManagedCluster; such a cluster must still be accepted
(CI once waited 300 s for a CSR that was there all along)."""

from __future__ import annotations

from typing import Any

import pytest

from hack.controlplane import clusteradm


def csr(name: str, created: str, state: str = "", user: str = clusteradm.BOOTSTRAP_USER) -> Any:
    conditions = [{"type": state, "status": "True"}] if state else []
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"username": user},
        "status": {"conditions": conditions},
    }


class CSRKube:
    """The CSR list and approval calls approve_csr makes."""

    def __init__(self, *items: Any) -> None:
        self.items = list(items)
        self.approved: list[str] = []

    def get(self, path: str, query: dict[str, str] | None = None) -> dict[str, Any]:
        assert path == clusteradm.CSRS
        return {"items": self.items}

    def request(self, method: str, path: str, body: Any) -> None:
        assert method == "PUT" and path.endswith("/approval")
        assert any(c["type"] == "Approved" for c in body["status"]["conditions"])
        self.approved.append(body["metadata"]["name"])


MC_CREATED = "2026-12-04T10:00:05Z"


def test_a_pending_csr_older_than_its_managed_cluster_is_approved() -> None:
    kube = CSRKube(csr("c1-abc", "2026-12-04T10:00:02Z"))
    assert clusteradm.approve_csr(kube, "c1", MC_CREATED) == "c1-abc"  # type: ignore[arg-type]
    assert kube.approved == ["c1-abc"]


def test_every_pending_csr_is_approved_and_the_newest_named() -> None:
    kube = CSRKube(csr("c1-new", "2026-12-04T10:00:07Z"), csr("c1-old", "2026-12-04T10:00:01Z"))
    assert clusteradm.approve_csr(kube, "c1", MC_CREATED) == "c1-new"  # type: ignore[arg-type]
    assert sorted(kube.approved) == ["c1-new", "c1-old"]


def test_an_earlier_registrations_approved_csr_does_not_count() -> None:
    kube = CSRKube(csr("c1-last-hour", "2026-12-04T09:20:00Z", "Approved"))
    assert clusteradm.approve_csr(kube, "c1", MC_CREATED) is None  # type: ignore[arg-type]
    assert kube.approved == []


def test_this_registrations_approved_csr_is_named_without_a_second_approval() -> None:
    kube = CSRKube(csr("c1-abc", "2026-12-04T10:00:03Z", "Approved"))
    assert clusteradm.approve_csr(kube, "c1", MC_CREATED) == "c1-abc"  # type: ignore[arg-type]
    assert kube.approved == []


def test_other_users_csrs_are_left_alone_and_a_denied_one_is_an_error() -> None:
    addon = csr("addon-x", "2026-12-04T10:00:06Z", user="system:open-cluster-management:c1:x")
    assert clusteradm.approve_csr(CSRKube(addon), "c1", MC_CREATED) is None  # type: ignore[arg-type]
    denied = CSRKube(csr("c1-abc", "2026-12-04T10:00:06Z", "Denied"))
    with pytest.raises(clusteradm.AcceptError, match="c1-abc of c1 is denied"):
        clusteradm.approve_csr(denied, "c1", MC_CREATED)  # type: ignore[arg-type]
