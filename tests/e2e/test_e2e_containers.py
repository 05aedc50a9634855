"""The federation in real containers: real kubelets, the Helm chart, the images hack/images built.

A private local control plane whose hub and clusters each have a real kubelet + containerd node
(`up(kubelet=True)`, hack/controlplane/kubelet.py), with OCM's registration, addon manager and
work agents: every cluster joined from a bootstrap kubeconfig and was accepted. Then
examples/kind/demo.sh's own steps after the clusters exist, through hack/demo-local.sh: helm
installs the chart (the hub Deployment and the CA hook Jobs run from the addon image), the
addon is enabled and OCM deploys the agent from the chart's AddOnTemplate, its registration
agent gives the agent its hub kubeconfig (KubeClient), the agent gets its identity from the
hub's signer, each cluster gets a data partition and its ClusterClaim,
examples/federatedlearning.yaml is applied and the server and client Jobs run from the workload
image until the resource is Completed, with the clusters' reports in its status.

The images go into one containerd image store, once per set of image ids, and every node gets
a hard-linked copy of it (kubelet_images.image_store): no import per node.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack import controlplane as cp
from hack.controlplane import kubelet_spec
from hack.images import deploy, podman
from hub_controller.signer.addon_status import CONDITION
from ocmfl import constants
from ocmfl.kube import Kube

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.images,
    pytest.mark.timeout(2400),
]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plane() -> Iterator[cp.State]:
    for img in deploy.IMAGES:
        assert podman.cache_key(img.tag) == deploy.content_key(img), (
            f"{img.tag} is missing or stale: run `make images`"
        )
    base = os.environ.get("OCMFL_CP_DIR") or "/dev/shm/ocm-fl-cp"
    d = Path(f"{base}-kubelet")
    start = time.monotonic()
    state = cp.up(2, state_dir=d, kubelet=True, timeout=300.0)
    print(f"kubelet plane up in {time.monotonic() - start:.0f}s")
    try:
        yield state
    finally:
        cp.down(d)
        assert not kubelet_spec.nodes_dir(state.slot).exists()


def test_demo_steps_run_the_federation_in_containers_to_completed(plane: cp.State) -> None:
    env = {**os.environ, "OCMFL_CP_DIR": plane.dir, "TIMEOUT_SECONDS": "1500"}
    start = time.monotonic()
    res = subprocess.run(
        ["bash", str(ROOT / "hack" / "demo-local.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=2100,
        check=False,
    )
    print(f"demo steps took {time.monotonic() - start:.0f}s")
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-6000:]
    assert "phase: Completed" in res.stdout

    # Everything ran as containers under the real kubelets, from the images built here.
    hub = Kube(plane.kubeconfigs["hub"])
    pods = hub.get("/api/v1/pods")
    assert pods is not None
    images = {
        c["image"]: c.get("containerID", "")
        for p in pods["items"]
        for c in (p.get("status") or {}).get("containerStatuses") or []
    }
    hub.close()
    assert images.get(constants.ADDON_IMAGE, "").startswith("containerd://"), images
    assert images.get(constants.WORKLOAD_IMAGE, "").startswith("containerd://"), images
    for cluster in plane.clusters:
        kube = Kube(plane.kubeconfigs[cluster])
        got = kube.get(f"/api/v1/namespaces/{constants.AGENT_NAMESPACE}/pods")
        kube.close()
        assert got is not None
        statuses = [
            c for p in got["items"] for c in (p.get("status") or {}).get("containerStatuses") or []
        ]
        assert any(c["image"] == constants.ADDON_IMAGE and c.get("ready") for c in statuses), (
            statuses
        )
        # The agent's hub kubeconfig is what OCM's registration agent wrote (no stand-in), and
        # the hub says the agent holds its identity.
        kube = Kube(plane.kubeconfigs[cluster])
        secret = kube.get(
            f"/api/v1/namespaces/{constants.AGENT_NAMESPACE}/secrets/{constants.HUB_KUBECONFIG_SECRET}"
        )
        kube.close()
        assert secret is not None and {"kubeconfig", "tls.crt", "tls.key"} <= set(secret["data"])
        hub = Kube(plane.kubeconfigs["hub"])
        mca = hub.get(
            f"/apis/{constants.ADDON_GROUP}/v1alpha1/namespaces/{cluster}/managedclusteraddons/"
            f"{constants.ADDON_NAME}"
        )
        hub.close()
        assert mca is not None
        conds = {c["type"]: c for c in (mca.get("status") or {}).get("conditions") or []}
        assert conds["Available"]["status"] == "True", conds
        assert conds[CONDITION]["reason"] == "AgentIdentityIssued", conds
    # Reports reached the aggregator: every cluster's row carries its metrics.
    hub = Kube(plane.kubeconfigs["hub"])
    fls = hub.get(f"/apis/{constants.API_VERSION}/{constants.PLURAL}") or {}
    hub.close()
    (fl,) = fls.get("items") or []
    rows = {r["name"]: r for r in fl["status"].get("clusters") or []}
    assert set(rows) == set(plane.clusters), rows
    assert all(r.get("accuracy") is not None and r.get("lastReportTime") for r in rows.values())
