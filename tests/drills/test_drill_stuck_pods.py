"""Drill 11: a pod that cannot run, for the server or on one cluster (docs/reliability.md).

Faults injected into the real plane: a server image that does not exist (the hub's local node
reports ErrImagePull, then ImagePullBackOff, as kubelet does), and a client nodeSelector that
only one cluster's node matches (the other cluster's local node leaves the pod Unschedulable,
as kube-scheduler does). Both resources run at once to keep the drill short.

What must hold: within seconds the status shows the kubelet's (scheduler's) reason on the
ServerReady condition or on that cluster's row, and the run fails at
timeouts.clientsReadySeconds with a message naming the reason.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from examples.demo import demo_resource
from hack import controlplane as cp
from hack.localfed import FL_PATH, LocalFederation, create_fl, get_fl, prepare_data
from hack.testing import wait_for
from hub_controller.api import CONDITION_SERVER_READY
from ocmfl.kube import Kube

pytestmark = [pytest.mark.drill, pytest.mark.timeout(600)]

TIMEOUT_S = 20  # timeouts.clientsReadySeconds of both resources
PULL_REASONS = ("ErrImagePull", "ImagePullBackOff")


def _status(hub: Kube, ns: str, name: str) -> dict[str, Any]:
    return dict(((get_fl(hub, ns, name) or {}).get("status")) or {})


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def _gone(hub: Kube, ns: str, name: str) -> bool:
    return get_fl(hub, ns, name) is None


def _when(hub: Kube, ns: str, name: str, test: Callable[[dict[str, Any]], bool], what: str,
          timeout: float = 240) -> tuple[dict[str, Any], float]:  # fmt: skip
    """Wait until the status passes `test`; (that status, monotonic time seen)."""

    def passed() -> dict[str, Any] | None:
        status = _status(hub, ns, name)
        return status if status and test(status) else None

    return wait_for(passed, timeout, what, interval=0.5), time.monotonic()


def test_drill_pods_that_cannot_run_show_the_kubelets_reason_and_fail_at_the_timeout(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    c1, c2 = plane.clusters[:2]
    # (a) the server's image does not exist; one cluster with data, its client fine.
    bad_server = demo_resource(rounds=1, min_clients=1)
    bad_server["metadata"]["name"] = "bad-server"
    bad_server["spec"]["server"]["image"] = "quay.io/ocm-fl/no-such-server:0.0.0"
    bad_server["spec"]["server"]["timeouts"]["clientsReadySeconds"] = TIMEOUT_S
    # (b) a client nodeSelector only cluster 1's node matches: cluster 2's pod is Unschedulable.
    picky = demo_resource(rounds=1, min_clients=2)
    picky["metadata"]["name"] = "picky"
    picky["spec"]["server"]["timeouts"]["clientsReadySeconds"] = TIMEOUT_S
    picky["spec"]["client"]["pod"] = {
        "nodeSelector": {"kubernetes.io/hostname": f"ocmfl-local-{c1}"}
    }
    claim = picky["spec"]["client"]["dataClaim"]
    prepare_data(plane, tmp_path / "data", [c1, c2], claim, sizes="1,1")
    ns_a, ns_b = "drill-image", "drill-sched"
    t0 = time.monotonic()
    create_fl(hub, ns_a, bad_server)
    create_fl(hub, ns_b, picky)
    try:
        # The server condition names the kubelet's reason within seconds of the Job.
        status_a, seen_a = _when(
            hub, ns_a, "bad-server",
            lambda s: _condition(s, CONDITION_SERVER_READY).get("reason") in PULL_REASONS,
            "ServerReady naming ErrImagePull/ImagePullBackOff",
        )  # fmt: skip
        server = _condition(status_a, CONDITION_SERVER_READY)
        assert server["status"] == "False"
        assert "no-such-server" in server["message"], server
        assert status_a["phase"] in ("Waiting", "Running"), status_a

        # Cluster 2's row names Unschedulable; cluster 1's row does not.
        status_b, seen_b = _when(
            hub, ns_b, "picky",
            lambda s: any(
                r["name"] == c2 and "Unschedulable" in (r.get("reason") or "")
                for r in s.get("clusters") or []
            ),
            f"{c2}'s row naming Unschedulable",
        )  # fmt: skip
        rows = {r["name"]: r for r in status_b["clusters"]}
        assert "Unschedulable" not in (rows[c1].get("reason") or ""), rows[c1]
        assert "didn't match Pod's node affinity/selector" in rows[c2]["reason"]

        # Both runs fail at the configured timeout, naming the reason.
        failed_a, end_a = _when(
            hub, ns_a, "bad-server", lambda s: s.get("phase") == "Failed", "bad-server Failed"
        )
        assert any(r in failed_a["message"] for r in PULL_REASONS), failed_a["message"]
        assert f"{TIMEOUT_S}s" in failed_a["message"], failed_a["message"]
        failed_b, end_b = _when(
            hub, ns_b, "picky", lambda s: s.get("phase") == "Failed", "picky Failed"
        )
        assert f"{c2}: Unschedulable" in failed_b["message"], failed_b["message"]
        print(
            f"\nDRILL 11: server ErrImagePull shown {seen_a - t0:.1f}s after create, run Failed "
            f"{end_a - seen_a:.1f}s later; {c2} Unschedulable shown {seen_b - t0:.1f}s after "
            f"create, run Failed {end_b - seen_b:.1f}s later (timeout {TIMEOUT_S}s)"
        )
    finally:
        for ns, name in ((ns_a, "bad-server"), (ns_b, "picky")):
            hub.delete(f"{FL_PATH.format(ns=ns)}/{name}")
        for ns, name in ((ns_a, "bad-server"), (ns_b, "picky")):
            wait_for(functools.partial(_gone, hub, ns, name), 180, f"{name} deleted")
