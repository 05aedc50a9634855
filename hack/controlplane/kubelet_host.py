"""The host side of the plane's real kubelet nodes (test infrastructure): the bridge their
veths hang on, and, in the supervisor, per apiserver a forwarder onto the bridge and the
LoadBalancer addresses (hack/controlplane/kubelet.py starts the nodes themselves).
"""

from __future__ import annotations

import contextlib
import subprocess
import threading

from hack.controlplane import podnet
from hack.controlplane.forwarder import Forwarder
from hack.controlplane.kubelet_spec import NodeSpec
from ocmfl.kube import Informer, Kube, KubeError, Obj


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def bridge_name(slot: int) -> str:
    return f"ocmflkb{slot}"


def create_bridge(slot: int) -> None:
    br = bridge_name(slot)
    ip("link", "del", br, check=False)
    ip("link", "add", br, "type", "bridge")
    ip("addr", "add", f"{podnet.node_bridge_ip(slot)}/24", "dev", br)
    ip("link", "set", br, "up")


def delete_bridge(slot: int) -> None:
    ip("link", "del", bridge_name(slot), check=False)


def veth_name(slot: int, i: int) -> str:
    """Host end of node `i`'s veth (its other end is eth0 in the node's network namespace)."""
    return f"ocmflk{slot}n{i}"


class HostSide:
    """In the supervisor, per apiserver: the apiserver on the bridge, LoadBalancer addresses.

    The forwarder makes the apiserver (127.0.0.1 only) reachable at <bridge ip>:<its port> for
    kubelet, kube-proxy and pods (the `kubernetes` Service's endpoint). A LoadBalancer Service
    gets its ClusterIP as ingress address, as MetalLB gives one up front; kube-proxy routes it.
    """

    def __init__(self, spec: NodeSpec, kube: Kube, stop: threading.Event) -> None:
        self.spec = spec
        self.kube = kube
        self.stop = stop
        self.wake = threading.Event()
        self.ready = threading.Event()
        self.forwarder = Forwarder(f"api-{spec.cluster}")
        self.services = Informer(kube, "/api/v1/services", self.wake, stop, f"lb-{spec.cluster}")
        self.thread = threading.Thread(target=self._loop, name=f"host-{spec.cluster}", daemon=True)

    def start(self) -> None:
        addr = (podnet.node_bridge_ip(self.spec.slot), self.spec.apiserver_port)
        self.forwarder.sync({addr: ("127.0.0.1", self.spec.apiserver_port)})
        self.services.start()
        self.thread.start()

    def _loop(self) -> None:
        self.services.synced.wait()
        self.ready.set()
        while not self.stop.is_set():
            self.wake.wait(1.0)
            self.wake.clear()
            for svc in self.services.snapshot():
                with contextlib.suppress(KubeError):
                    self._set_lb(svc)
        self.forwarder.close()

    def _set_lb(self, svc: Obj) -> None:
        spec = svc.get("spec", {})
        if spec.get("type") != "LoadBalancer" or not spec.get("clusterIP"):
            return
        want = {"ingress": [{"ip": spec["clusterIP"], "ipMode": "VIP"}]}
        if (svc.get("status") or {}).get("loadBalancer") == want:
            return
        meta = svc["metadata"]
        self.kube.patch(
            f"/api/v1/namespaces/{meta['namespace']}/services/{meta['name']}/status",
            {"status": {"loadBalancer": want}},
        )
