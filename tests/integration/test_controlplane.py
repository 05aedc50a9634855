"""The local control plane behaves like a real OCM hub with managed clusters.

Real: kube-apiservers, controller managers, OCM placement controller and work agents.
Test infrastructure: local nodes (kubelet stand-in) and the ClusterClaim mirror.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hack import testing
from hack.controlplane import podnet
from hack.controlplane.plane import ControlPlane
from ocmfl.constants import CLUSTER_GROUP, WORK_GROUP, WORKLOAD_IMAGE
from ocmfl.kube import Kube, KubeError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

T = TypeVar("T")
BUSYBOX = "registry.k8s.io/e2e-test-images/busybox:1.29-4"


def wait_for(fn: Callable[[], T | None], timeout: float = 60.0, what: str = "condition") -> T:
    """hack.testing.wait_for, riding out the 404/409 of objects not there yet or in flux."""

    def tolerant() -> T | None:
        try:
            return fn()
        except KubeError as e:
            if e.status not in (404, 409):
                raise
            return None

    return testing.wait_for(tolerant, timeout, what)


@pytest.fixture
def hub(control_plane: ControlPlane) -> Iterator[Kube]:
    k = Kube(control_plane.hub_kubeconfig)
    yield k
    k.close()


@pytest.fixture
def spokes(control_plane: ControlPlane, namespace: str) -> Iterator[dict[str, Kube]]:
    """Admin clients of every managed cluster, with the test namespace created there too."""
    ks = {c: Kube(p) for c, p in control_plane.cluster_kubeconfigs.items()}
    for k in ks.values():
        k.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    yield ks
    for k in ks.values():
        k.delete(f"/api/v1/namespaces/{namespace}")
        k.close()


def test_placement_claim_selector_picks_exactly_the_matching_clusters(
    hub: Kube, spokes: dict[str, Kube], namespace: str
) -> None:
    claim = f"{namespace}.test.ocmfl.io"
    claims_path = f"/apis/{CLUSTER_GROUP}/v1alpha1/clusterclaims"
    first, *others = sorted(spokes)
    values = {first: "yes", **{c: "no" for c in others}}
    for c, v in values.items():
        spokes[c].create(
            claims_path,
            {
                "apiVersion": f"{CLUSTER_GROUP}/v1alpha1",
                "kind": "ClusterClaim",
                "metadata": {"name": claim},
                "spec": {"value": v},
            },
        )
    try:
        hub.create(
            f"/apis/{CLUSTER_GROUP}/v1beta2/namespaces/{namespace}/managedclustersetbindings",
            {
                "apiVersion": f"{CLUSTER_GROUP}/v1beta2",
                "kind": "ManagedClusterSetBinding",
                "metadata": {"name": "global", "namespace": namespace},
                "spec": {"clusterSet": "global"},
            },
        )
        hub.create(
            f"/apis/{CLUSTER_GROUP}/v1beta1/namespaces/{namespace}/placements",
            {
                "apiVersion": f"{CLUSTER_GROUP}/v1beta1",
                "kind": "Placement",
                "metadata": {"name": "p", "namespace": namespace},
                "spec": {
                    "clusterSets": ["global"],
                    "predicates": [
                        {
                            "requiredClusterSelector": {
                                "claimSelector": {
                                    "matchExpressions": [
                                        {"key": claim, "operator": "In", "values": ["yes"]}
                                    ]
                                }
                            }
                        }
                    ],
                },
            },
        )

        def decided() -> list[str] | None:
            got = hub.request(
                "GET",
                f"/apis/{CLUSTER_GROUP}/v1beta1/namespaces/{namespace}/placementdecisions",
                query={"labelSelector": f"{CLUSTER_GROUP}/placement=p"},
            )
            names = sorted(
                d["clusterName"]
                for pd in got["items"]
                for d in pd.get("status", {}).get("decisions") or []
            )
            return names if names == [first] else None

        assert wait_for(decided, 60, "placement decision") == [first]
    finally:
        for k in spokes.values():
            k.delete(f"{claims_path}/{claim}")


def _job(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "hello", "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": BUSYBOX, "command": ["sh", "-c", "echo hi; exit 0"]}
                    ],
                }
            },
        },
    }


def test_manifestwork_job_runs_on_its_cluster_and_feedback_reaches_the_hub(
    hub: Kube, spokes: dict[str, Kube], namespace: str, control_plane: ControlPlane
) -> None:
    cluster, other = sorted(spokes)[:2] if len(spokes) > 1 else (sorted(spokes)[0], None)
    works = f"/apis/{WORK_GROUP}/v1/namespaces/{cluster}/manifestworks"
    name = f"{namespace}-job"
    hub.create(
        works,
        {
            "apiVersion": f"{WORK_GROUP}/v1",
            "kind": "ManifestWork",
            "metadata": {"name": name, "namespace": cluster},
            "spec": {
                "workload": {"manifests": [_job(namespace)]},
                "manifestConfigs": [
                    {
                        "resourceIdentifier": {
                            "group": "batch",
                            "resource": "jobs",
                            "namespace": namespace,
                            "name": "hello",
                        },
                        "feedbackRules": [
                            {
                                "type": "JSONPaths",
                                "jsonPaths": [{"name": "succeeded", "path": ".status.succeeded"}],
                            }
                        ],
                    }
                ],
            },
        },
    )

    def feedback() -> int | None:
        work = hub.get(f"{works}/{name}") or {}
        for m in work.get("status", {}).get("resourceStatus", {}).get("manifests") or []:
            for v in m.get("statusFeedback", {}).get("values") or []:
                if v["name"] == "succeeded" and v["fieldValue"].get("integer"):
                    return int(v["fieldValue"]["integer"])
        return None

    assert wait_for(feedback, 90, "succeeded feedback on the hub") == 1
    job = spokes[cluster].get(f"/apis/batch/v1/namespaces/{namespace}/jobs/hello")
    assert job is not None and job["status"]["succeeded"] == 1
    if other:
        assert spokes[other].get(f"/apis/batch/v1/namespaces/{namespace}/jobs/hello") is None
    pod_dirs = Path(control_plane.state_dir, "pods", cluster)
    logs = list(pod_dirs.glob(f"{namespace}_hello-*/logs/c.log"))
    assert logs and logs[0].read_text() == "hi\n"

    hub.delete(f"{works}/{name}")
    wait_for(
        lambda: spokes[cluster].get(f"/apis/batch/v1/namespaces/{namespace}/jobs/hello") is None,
        60,
        "job removal",
    )
    wait_for(lambda: hub.get(f"{works}/{name}") is None, 60, "manifestwork removal")


def test_apiserver_refuses_an_invalid_crd_object(hub: Kube, namespace: str) -> None:
    with pytest.raises(KubeError) as e:
        hub.create(
            f"/apis/{CLUSTER_GROUP}/v1beta1/namespaces/{namespace}/placements",
            {
                "apiVersion": f"{CLUSTER_GROUP}/v1beta1",
                "kind": "Placement",
                "metadata": {"name": "bad", "namespace": namespace},
                "spec": {"numberOfClusters": "three"},
            },
        )
    assert e.value.status == 422
    assert "numberOfClusters" in e.value.body


def _pod(name: str, image: str, command: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": image, "command": command}],
        },
    }


def test_pod_with_an_unknown_image_ends_in_a_clear_error_state(
    spokes: dict[str, Kube], namespace: str
) -> None:
    """Like kubelet: ErrImagePull first, then ImagePullBackOff, the pod Pending."""
    k = spokes[sorted(spokes)[-1]]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    k.create(pods, _pod("redis", "docker.io/library/redis:7", ["redis-server"]))
    seen: set[str] = set()

    def waiting(reason: str) -> dict[str, Any] | None:
        pod = k.get(f"{pods}/redis") or {}
        for cs in pod.get("status", {}).get("containerStatuses") or []:
            w = cs.get("state", {}).get("waiting") or {}
            seen.add(str(w.get("reason")))
            if w.get("reason") == reason:
                return pod
        return None

    wait_for(lambda: waiting("ErrImagePull") or waiting("ImagePullBackOff"), 30, "ErrImagePull")
    pod = wait_for(lambda: waiting("ImagePullBackOff"), 30, "ImagePullBackOff")
    assert pod["status"]["phase"] == "Pending"
    assert "redis" in pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"]


def test_pod_whose_node_selector_matches_no_node_is_unschedulable(
    spokes: dict[str, Kube], namespace: str
) -> None:
    """Like kube-scheduler: PodScheduled=False, reason Unschedulable; never bound."""
    k = spokes[sorted(spokes)[-1]]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    body = _pod("picky", "busybox", ["sh", "-c", "true"])
    body["spec"]["nodeSelector"] = {"gpu": "h100"}
    k.create(pods, body)

    def unschedulable() -> dict[str, Any] | None:
        pod = k.get(f"{pods}/picky") or {}
        for c in pod.get("status", {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
                return pod
        return None

    pod = wait_for(unschedulable, 30, "Unschedulable")
    assert not pod["spec"].get("nodeName")
    assert pod["status"]["phase"] == "Pending"


SERVER = (
    "import os, socket\n"
    "s = socket.socket(); s.bind((os.environ['POD_IP'], 18080)); s.listen()\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(os.environ['HOSTNAME'].encode()); c.close()\n"
)


def test_pods_on_different_clusters_listen_on_the_same_port_without_collision(
    spokes: dict[str, Kube], namespace: str
) -> None:
    if len(spokes) < 2:
        pytest.skip("needs two managed clusters")
    pods = f"/api/v1/namespaces/{namespace}/pods"
    chosen = sorted(spokes)[:2]
    for c in chosen:
        spokes[c].create(pods, _pod(f"srv-{c}", WORKLOAD_IMAGE, ["python", "-c", SERVER]))

    def ip_of(c: str) -> str | None:
        pod = spokes[c].get(f"{pods}/srv-{c}") or {}
        st = pod.get("status", {})
        ready = any(
            x["type"] == "Ready" and x["status"] == "True" for x in st.get("conditions") or []
        )
        return st.get("podIP") if ready else None

    ips = {c: wait_for(functools.partial(ip_of, c), 30, f"pod on {c} running") for c in chosen}
    assert len(set(ips.values())) == 2

    def answer(ip: str) -> str | None:
        try:
            with socket.create_connection((ip, 18080), timeout=2) as s:
                return s.recv(100).decode() or None
        except OSError:
            return None

    for c, ip in ips.items():
        assert wait_for(functools.partial(answer, ip), 20, f"answer from {c}") == f"srv-{c}"


LOOPBACK_SERVER = (
    "import os, socket\n"
    "lo = socket.socket(); lo.bind(('127.0.0.1', 9092)); lo.listen()\n"  # as a SuperLink does
    "s = socket.socket(); s.bind(('0.0.0.0', 18080)); s.listen()\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(os.environ['HOSTNAME'].encode()); c.close()\n"
)


def _ready_ip(k: Kube, pods: str, name: str) -> str | None:
    st = (k.get(f"{pods}/{name}") or {}).get("status", {})
    ready = any(x["type"] == "Ready" and x["status"] == "True" for x in st.get("conditions") or [])
    return st.get("podIP") if ready else None


def _answer(ip: str, port: int = 18080) -> str | None:
    try:
        with socket.create_connection((ip, port), timeout=2) as s:
            return s.recv(100).decode() or None
    except OSError:
        return None


def test_pods_on_one_cluster_each_have_their_own_loopback_and_ports(
    spokes: dict[str, Kube], namespace: str
) -> None:
    """Two pods bind the same 127.0.0.1 port and the same wildcard port, as in real pods."""
    k = spokes[sorted(spokes)[0]]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for name in ("lo-a", "lo-b"):
        k.create(pods, _pod(name, WORKLOAD_IMAGE, ["python", "-c", LOOPBACK_SERVER]))
    ips = {n: wait_for(functools.partial(_ready_ip, k, pods, n), 30, n) for n in ("lo-a", "lo-b")}
    assert len(set(ips.values())) == 2
    for name, ip in ips.items():
        assert not ipaddress.ip_address(ip).is_loopback
        assert wait_for(functools.partial(_answer, ip), 20, f"answer from {name}") == name
        pod = k.get(f"{pods}/{name}") or {}
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0  # no bind failure


PROBE = """
import socket, sys
out = []
for addr in sys.argv[1:]:
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=3) as s:
            out.append(s.recv(100).decode() or "empty")
    except OSError as e:
        out.append(f"unreachable:{type(e).__name__}")
print("|".join(out))
"""


def test_cluster_ips_and_host_addresses_reach_across_clusters_but_pod_ips_do_not(
    control_plane: ControlPlane, spokes: dict[str, Kube], namespace: str
) -> None:
    """From a pod on one cluster: another cluster's Service (its ClusterIP, forwarded on the
    host) and a host process answer; the other cluster's pod address does not (separate
    networks, as real clusters)."""
    if len(spokes) < 2:
        pytest.skip("needs two managed clusters")
    here, there = sorted(spokes)[:2]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    web = _pod("web", WORKLOAD_IMAGE, ["python", "-c", LOOPBACK_SERVER])
    web["metadata"]["labels"] = {"app": "web"}
    spokes[there].create(pods, web)
    spokes[there].create(
        f"/api/v1/namespaces/{namespace}/services",
        {"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [
            {"port": 80, "targetPort": 18080}]}},
    )  # fmt: skip
    web_ip = wait_for(functools.partial(_ready_ip, spokes[there], pods, "web"), 30, "web")
    svc = spokes[there].get(f"/api/v1/namespaces/{namespace}/services/web") or {}
    cluster_ip = svc["spec"]["clusterIP"]
    assert wait_for(lambda: _answer(cluster_ip, 80), 20, "ClusterIP from the host") == "web"

    host_ip = control_plane.host_address(4000)  # far from what localfed uses
    listener = socket.create_server((host_ip, 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.5)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                c, _ = listener.accept()
                c.sendall(b"host")
                c.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        targets = [f"{cluster_ip}:80", f"{host_ip}:{listener.getsockname()[1]}", f"{web_ip}:18080"]
        spokes[here].create(pods, _pod("probe", WORKLOAD_IMAGE, ["python", "-c", PROBE, *targets]))

        def done() -> str | None:
            phase = (spokes[here].get(f"{pods}/probe") or {}).get("status", {}).get("phase")
            return phase if phase in ("Succeeded", "Failed") else None

        assert wait_for(done, 60, "probe finished") == "Succeeded"
        log = next(
            Path(control_plane.state_dir, "pods", here).glob(f"{namespace}_probe_*/logs/c.log")
        )
        answers = log.read_text().strip().split("|")
        assert answers[:2] == ["web", "host"], answers
        assert answers[2].startswith("unreachable"), answers
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_on_failure_pods_restart_until_they_succeed(
    spokes: dict[str, Kube], namespace: str
) -> None:
    k = spokes[sorted(spokes)[0]]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    pod = _pod(
        "flaky",
        BUSYBOX,
        ["sh", "-c", "test -f /scratch/once && exit 0; touch /scratch/once; exit 7"],
    )
    pod["spec"]["restartPolicy"] = "OnFailure"
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "s", "mountPath": "/scratch"}]
    pod["spec"]["volumes"] = [{"name": "s", "emptyDir": {}}]
    k.create(pods, pod)

    def succeeded() -> dict[str, Any] | None:
        got = k.get(f"{pods}/flaky") or {}
        return got if got.get("status", {}).get("phase") == "Succeeded" else None

    cs = wait_for(succeeded, 30, "Succeeded")["status"]["containerStatuses"][0]
    assert cs["restartCount"] == 1
    assert cs["lastState"]["terminated"]["exitCode"] == 7
    assert not Path("/scratch/once").exists()  # the mount was private to the pod


def test_deleting_a_pod_stops_its_processes(spokes: dict[str, Kube], namespace: str) -> None:
    k = spokes[sorted(spokes)[0]]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    k.create(pods, _pod("sleeper", BUSYBOX, ["sh", "-c", "sleep 300 & sleep 300"]))

    def pid() -> int | None:
        got = k.get(f"{pods}/sleeper") or {}
        for cs in got.get("status", {}).get("containerStatuses") or []:
            if "running" in cs.get("state", {}):
                return int(cs["containerID"].removeprefix("local://"))
        return None

    leader = wait_for(pid, 30, "running")

    def group_of_two() -> list[Path] | None:
        # "running" can be reported before sh has forked its background sleep (busy machine).
        got = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(p) == leader]
        return got if len(got) >= 2 else None  # sh and its background sleep

    group = wait_for(group_of_two, 10, "sh and its background sleep")
    k.delete(f"{pods}/sleeper")
    wait_for(lambda: k.get(f"{pods}/sleeper") is None, 30, "pod gone")
    wait_for(lambda: all(not _alive(p) for p in group), 10, "process group gone")


def test_deleting_a_pod_kills_processes_that_left_its_group_and_removes_its_network(
    control_plane: ControlPlane, spokes: dict[str, Kube], namespace: str
) -> None:
    k = spokes[sorted(spokes)[0]]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    marker = str(7000 + os.getpid() % 1000)  # a sleep only this test starts
    k.create(
        pods, _pod("escaper", BUSYBOX, ["sh", "-c", f"setsid sleep {marker} & exec sleep 600"])
    )
    ip = wait_for(functools.partial(_ready_ip, k, pods, "escaper"), 30, "running")
    link = podnet.pod_link_name(control_plane.slot, ip)

    def escaped() -> list[Path]:
        out = []
        for p in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if (
                    p.name.isdigit()
                    and (p / "cmdline").read_bytes() == f"sleep\0{marker}\0".encode()
                ):
                    out.append(p)
        return out

    [child] = wait_for(escaped, 10, "the escaped sleep")
    assert (podnet.NETNS_DIR / link).exists() and Path(f"/sys/class/net/{link}").exists()
    k.delete(f"{pods}/escaper")
    wait_for(lambda: k.get(f"{pods}/escaper") is None, 40, "pod gone")
    wait_for(lambda: not _alive(child), 10, "the process outside the pod's group gone")
    assert not (podnet.NETNS_DIR / link).exists()
    assert not Path(f"/sys/class/net/{link}").exists()


def _pgid(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return -1


def _alive(proc: Path) -> bool:
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_hub_load_balancer_is_reachable_from_a_cluster_pod(
    hub: Kube, spokes: dict[str, Kube], namespace: str
) -> None:
    web = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": WORKLOAD_IMAGE,
                    "command": ["python", "-c", SERVER],
                    "ports": [{"name": "tcp", "containerPort": 18080}],
                }
            ]
        },
    }
    hub.create(f"/api/v1/namespaces/{namespace}/pods", web)
    hub.create(
        f"/api/v1/namespaces/{namespace}/services",
        {
            "metadata": {"name": "web"},
            "spec": {
                "type": "LoadBalancer",
                "selector": {"app": "web"},
                "ports": [{"port": 443, "targetPort": "tcp"}],
            },
        },
    )

    def ingress() -> str | None:
        svc = hub.get(f"/api/v1/namespaces/{namespace}/services/web") or {}
        ing = svc.get("status", {}).get("loadBalancer", {}).get("ingress") or []
        return ing[0]["ip"] if ing else None

    ip = wait_for(ingress, 30, "LoadBalancer ingress")
    k = spokes[sorted(spokes)[0]]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    # The address exists before a backend is ready (as with a real load balancer): retry.
    client = (
        "import socket,sys,time\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        s=socket.create_connection((sys.argv[1], 443), timeout=5); break\n"
        "    except OSError: time.sleep(0.3)\n"
        "print(s.recv(100).decode())"
    )
    k.create(pods, _pod("client", WORKLOAD_IMAGE, ["python", "-c", client, ip]))

    def done() -> str | None:
        got = k.get(f"{pods}/client") or {}
        return (
            got.get("status", {}).get("phase")
            if got.get("status", {}).get("phase") in ("Succeeded", "Failed")
            else None
        )

    assert wait_for(done, 30, "client finished") == "Succeeded"


def test_manifestwork_deployment_becomes_ready_and_reports_replicas(
    hub: Kube, spokes: dict[str, Kube], namespace: str
) -> None:
    cluster = sorted(spokes)[-1]
    works = f"/apis/{WORK_GROUP}/v1/namespaces/{cluster}/manifestworks"
    name = f"{namespace}-deploy"
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "sleepy", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "sleepy"}},
            "template": {
                "metadata": {"labels": {"app": "sleepy"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "c", "image": BUSYBOX, "command": ["sleep", "3600"]}],
                },
            },
        },
    }
    hub.create(
        works,
        {
            "apiVersion": f"{WORK_GROUP}/v1",
            "kind": "ManifestWork",
            "metadata": {"name": name, "namespace": cluster},
            "spec": {
                "workload": {"manifests": [deploy]},
                "manifestConfigs": [
                    {
                        "resourceIdentifier": {
                            "group": "apps",
                            "resource": "deployments",
                            "namespace": namespace,
                            "name": "sleepy",
                        },
                        "feedbackRules": [{"type": "WellKnownStatus"}],
                    }
                ],
            },
        },
    )

    def ready_replicas() -> int | None:
        work = hub.get(f"{works}/{name}") or {}
        for m in work.get("status", {}).get("resourceStatus", {}).get("manifests") or []:
            for v in m.get("statusFeedback", {}).get("values") or []:
                if v["name"] == "ReadyReplicas" and v["fieldValue"].get("integer") == 2:
                    return 2
        return None

    assert wait_for(ready_replicas, 60, "ReadyReplicas=2 on the hub") == 2
    hub.delete(f"{works}/{name}")

    def no_pods() -> bool:
        got = spokes[cluster].request(
            "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": "app=sleepy"}
        )
        return not got["items"]

    wait_for(no_pods, 60, "deployment pods removed")


def test_addon_template_agent_runs_on_the_cluster_and_becomes_available(
    hub: Kube, spokes: dict[str, Kube], namespace: str, control_plane: ControlPlane
) -> None:
    group = "addon.open-cluster-management.io"
    addon, cluster = f"demo-{namespace}", sorted(spokes)[0]
    agent = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "agent", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {"name": "c", "image": BUSYBOX, "command": ["sh", "-c", "sleep 3600"]}
                    ],
                },
            },
        },
    }
    hub.create(
        f"/apis/{group}/v1alpha1/addontemplates",
        {
            "apiVersion": f"{group}/v1alpha1",
            "kind": "AddOnTemplate",
            "metadata": {"name": addon},
            "spec": {"addonName": addon, "agentSpec": {"workload": {"manifests": [agent]}}},
        },
    )
    hub.create(
        f"/apis/{group}/v1alpha1/clustermanagementaddons",
        {
            "apiVersion": f"{group}/v1alpha1",
            "kind": "ClusterManagementAddOn",
            "metadata": {"name": addon},
            "spec": {
                "supportedConfigs": [
                    {"group": group, "resource": "addontemplates", "defaultConfig": {"name": addon}}
                ],
                "installStrategy": {"type": "Manual"},
            },
        },
    )
    mca = f"/apis/{group}/v1alpha1/namespaces/{cluster}/managedclusteraddons"
    hub.create(
        mca,
        {
            "apiVersion": f"{group}/v1alpha1",
            "kind": "ManagedClusterAddOn",
            "metadata": {"name": addon, "namespace": cluster},
            "spec": {},
        },
    )
    try:

        def available() -> bool:
            got = hub.get(f"{mca}/{addon}") or {}
            return any(
                c["type"] == "Available" and c["status"] == "True"
                for c in got.get("status", {}).get("conditions") or []
            )

        wait_for(available, 90, "ManagedClusterAddOn Available")
        dep = spokes[cluster].get(f"/apis/apps/v1/namespaces/{namespace}/deployments/agent")
        assert dep is not None and dep["status"].get("readyReplicas") == 1
    finally:
        hub.delete(f"{mca}/{addon}")
        hub.delete(f"/apis/{group}/v1alpha1/clustermanagementaddons/{addon}")
        hub.delete(f"/apis/{group}/v1alpha1/addontemplates/{addon}")


WHOAMI = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host = os.environ["KUBERNETES_SERVICE_HOST"] + ":" + os.environ["KUBERNETES_SERVICE_PORT"]
req = urllib.request.Request(
    f"https://{host}/apis/authentication.k8s.io/v1/selfsubjectreviews", method="POST",
    data=json.dumps({"apiVersion": "authentication.k8s.io/v1",
                     "kind": "SelfSubjectReview"}).encode(),
    headers={"Authorization": "Bearer " + open(sa + "/token").read(),
             "Content-Type": "application/json"})
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
print(json.load(urllib.request.urlopen(req, context=ctx))["status"]["userInfo"]["username"])
print(open(sa + "/namespace").read())
"""


def test_pods_get_in_cluster_credentials_of_their_service_account(
    spokes: dict[str, Kube], namespace: str, control_plane: ControlPlane
) -> None:
    cluster = sorted(spokes)[0]
    k = spokes[cluster]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    k.create(pods, _pod("whoami", WORKLOAD_IMAGE, ["python", "-c", WHOAMI]))

    def finished() -> str | None:
        phase = (k.get(f"{pods}/whoami") or {}).get("status", {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    assert wait_for(finished, 30, "whoami finished") == "Succeeded"
    log = (
        next(
            Path(control_plane.state_dir, "pods", cluster).glob(f"{namespace}_whoami_*/logs/c.log")
        )
        .read_text()
        .split()
    )
    assert log == [f"system:serviceaccount:{namespace}:default", namespace]
