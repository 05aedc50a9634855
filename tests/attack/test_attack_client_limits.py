"""The caps hold on the managed cluster too (issue 29 item 3): the client namespace a work makes
carries a LimitRange and a ResourceQuota built from the namespace policy's maxPodResources
(hub_controller.operator.desired.limits). On the plane, through the real OCM work agent and the
cluster's own admission and quota controller: the client pod that asked for nothing runs under
the caps, and pods in that namespace over a cap, over the GPU total or past the pod count are
refused by the cluster itself, whatever the hub let through.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hub_controller.api import FLRef, parse_spec
from hub_controller.membership import ClusterResolution
from hub_controller.operator.desired import limits, security, works
from ocmfl import constants

if TYPE_CHECKING:
    from ocmfl.kube import Kube

pytestmark = pytest.mark.attack

CAPS = {"cpu": "500m", "memory": "256Mi", "nvidia.com/gpu": "1"}


def _pod(namespace: str, name: str, resources: dict[str, Any]) -> dict[str, Any]:
    """A pod that meets `restricted` and is never scheduled (no node has its label): it only
    has to pass admission, and then counts against the quota while it stays Pending (and,
    never bound to a node, goes at once when its namespace does)."""
    spec = security.harden(
        {
            "nodeSelector": {"kubernetes.io/hostname": "no-such-node"},
            "containers": [
                {"name": "c", "image": constants.WORKLOAD_IMAGE, "resources": resources}
            ],
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_on_the_plane_the_client_namespace_holds_every_pod_to_the_caps(
    hub_and_spoke: tuple[Kube, Kube, str], tmp_path: Path
) -> None:
    from hack.testing import wait_for
    from ocmfl.kube import KubeError

    hub, spoke, cluster = hub_and_spoke
    ref = FLRef("attack", f"caps-{uuid.uuid4().hex[:6]}", str(uuid.uuid4()))
    data = tmp_path / "data"
    data.mkdir()
    raw = {
        "server": {"app": {"path": f"{constants.APPS_DIR}/digits"}},
        "client": {"dataClaim": "fl.data-path", "placement": {"clusterSets": ["global"]}},
    }
    resolution = ClusterResolution(cluster, str(data), "claim", {})
    work = works.desired_work(
        ref,
        parse_spec(raw, ref.name),
        resolution,
        "127.0.0.1:1",
        server_name="fl.example",
        caps=CAPS,
    )
    works_path = f"/apis/{constants.WORK_GROUP}/v1/namespaces/{cluster}/manifestworks"
    namespace = works.client_namespace(ref)
    pods_path = f"/api/v1/namespaces/{namespace}/pods"
    quota_path = f"/api/v1/namespaces/{namespace}/resourcequotas/{limits.QUOTA_NAME}"
    hub.create(works_path, work)
    try:
        # The spec states no resources: the client pod got the caps as limits and a small
        # request, from the cluster's LimitRange (the hub sent none).
        pods = wait_for(
            lambda: (spoke.get(pods_path) or {}).get("items"), 120, "client pod created"
        )
        [client] = pods[0]["spec"]["containers"]
        assert client["resources"] == {
            "limits": {"cpu": "500m", "memory": "256Mi"},
            "requests": {"cpu": "100m", "memory": "256Mi"},
        }

        def counted() -> dict[str, Any] | None:
            status = (spoke.get(quota_path) or {}).get("status") or {}
            return status if (status.get("used") or {}).get("pods") == "1" else None

        status = wait_for(counted, 60, "the cluster's quota controller counting the client pod")
        assert status["hard"]["pods"] == str(limits.CLIENT_PODS)
        assert status["hard"]["requests.nvidia.com/gpu"] == "2"

        def refusal(pod: dict[str, Any]) -> str:
            with pytest.raises(KubeError) as exc:
                spoke.create(pods_path, pod)
            assert exc.value.status == 403, exc.value
            return exc.value.message

        # Over a cap: the LimitRange refuses it.
        over = refusal(_pod(namespace, "over-cpu", {"limits": {"cpu": "2"}}))
        assert "maximum cpu usage per Container is 500m" in over
        # More GPUs than the namespace's total: the quota refuses it.
        gpus = {"nvidia.com/gpu": "3"}
        greedy = refusal(_pod(namespace, "gpus", {"requests": gpus, "limits": gpus}))
        assert f"exceeded quota: {limits.QUOTA_NAME}" in greedy
        assert "requests.nvidia.com/gpu=3" in greedy
        # One more pod fits (the Job's replacement); the next is past the count.
        spoke.create(pods_path, _pod(namespace, "second", {}))
        third = refusal(_pod(namespace, "third", {}))
        assert f"exceeded quota: {limits.QUOTA_NAME}" in third
        assert "pods=1" in third
    finally:
        hub.delete(f"{works_path}/{works.work_name(ref)}")
    wait_for(lambda: spoke.get(f"/api/v1/namespaces/{namespace}") is None, 180, "ns gone")
