"""What one real kubelet node is (test infrastructure; hack/controlplane/kubelet.py runs it):
its names, directories and addresses (from the plane's one address plan, podnet), and the
configuration files its containerd, CNI plugin, kubelet, kube-proxy and CoreDNS get.

Pure: nothing here starts a process or touches the host.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from hack.controlplane import certs, podnet
from hack.controlplane.processes import State

NODES_ROOT = Path(os.environ.get("OCMFL_KUBELET_DIR", "/var/lib/ocm-fl-kubelet"))
PAUSE_IMAGE = "localhost/ocm-fl/pause:3.10.1"
CNI_BIN = Path("/usr/lib/cni")
NODE_LABEL = "ocmfl.local/kubelet"


# What kubelet's setupKernelTunables writes (KernelTunableModify): bound over /proc/sys files.
KERNEL_TUNABLES = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


class NodeError(RuntimeError):
    """A kubelet node could not be started; the message names the part and its log."""


def node_name(cluster: str) -> str:
    return f"ocmfl-kubelet-{cluster}"


def cgroup_root(slot: int, cluster: str) -> str:
    return f"/ocmfl-{slot}-{cluster}"


def nodes_dir(slot: int) -> Path:
    return NODES_ROOT / f"slot{slot}"


def apiserver_ips(slot: int, n_apiservers: int) -> list[str]:
    """Addresses pods and node agents reach the apiservers at: they go in its certificate."""
    return [
        podnet.node_bridge_ip(slot),
        *(podnet.kubernetes_service_ip(slot, i) for i in range(n_apiservers)),
    ]


@dataclass(frozen=True)
class NodeSpec:
    """One kubelet node: which apiserver, where it lives, its addresses."""

    cluster: str  # "hub" or clusterN
    i: int  # 0 for the hub
    slot: int
    apiserver_port: int
    n_nodes: int

    @property
    def name(self) -> str:
        return node_name(self.cluster)

    @property
    def dir(self) -> Path:
        return nodes_dir(self.slot) / self.cluster

    @property
    def ip(self) -> str:
        return podnet.node_ip(self.slot, self.i)

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def server(self) -> str:
        return f"https://{podnet.node_bridge_ip(self.slot)}:{self.apiserver_port}"


def specs(state: State) -> list[NodeSpec]:
    names = ["hub", *state.clusters]
    return [
        NodeSpec(n, i, state.slot, int(state.apiservers[n].rsplit(":", 1)[1]), len(names))
        for i, n in enumerate(names)
    ]


def containerd_config(spec: NodeSpec) -> str:
    d = spec.dir
    return f"""version = 2
root = "{d}/containerd/root"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{spec.socket}"
[ttrpc]
  address = "/run/containerd/ttrpc.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which these machines lack.
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "/run/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{d}/cni"
"""


def cni_config(spec: NodeSpec) -> str:
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "ocmfl",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(podnet.pod_cidr(spec.slot, spec.i))}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        },
        indent=2,
    )


def kubelet_config(spec: NodeSpec) -> str:
    cfg = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{spec.socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root(spec.slot, spec.cluster),
        "failCgroupV1": False,
        "failSwapOn": False,
        "protectKernelDefaults": False,
        "maxOpenFiles": 10000,
        "address": spec.ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        # The kubelet API listens only on this plane's private bridge: the apiserver reads
        # logs and execs without a client certificate (anonymous, allowed).
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "clusterDomain": "cluster.local",
        "resolvConf": str(spec.dir / "resolv.conf"),
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "tlsCertFile": str(spec.dir / "pki" / "kubelet.crt"),
        "tlsPrivateKeyFile": str(spec.dir / "pki" / "kubelet.key"),
        "fileCheckFrequency": "20s",
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
        "containerLogMaxSize": "5Mi",
        "podLogsDirectory": str(spec.dir / "pod-logs"),
        "shutdownGracePeriod": "0s",
        "localStorageCapacityIsolation": False,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
    }
    cfg["clusterDNS"] = [spec.ip]  # CoreDNS on the node address
    return yaml.safe_dump(cfg)


def kube_proxy_config(spec: NodeSpec) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(spec.dir / "kube-proxy.kubeconfig")},
            "hostnameOverride": spec.name,
            "bindAddress": "0.0.0.0",
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            "mode": "iptables",
            "clusterCIDR": str(podnet.pod_cidr(spec.slot, spec.i)),
            "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
            # nf_conntrack_max is read-only outside the initial network namespace.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
    )


def node_kubeconfig(
    spec: NodeSpec, ca_pem: bytes, kp: certs.KeyPair, user: str, path: Path
) -> None:
    # The apiserver certificate names "kubernetes", not the bridge address the node dials.
    certs.write_kubeconfig(path, spec.server, ca_pem, kp, user, tls_server_name="kubernetes")


def corefile(spec: NodeSpec) -> str:
    # No `forward`: names outside cluster.local get no answer, and nothing leaves the machine.
    return f"""cluster.local:53 in-addr.arpa:53 {{
    bind {spec.ip}
    errors
    kubernetes cluster.local in-addr.arpa {{
        kubeconfig {spec.dir / "coredns.kubeconfig"} coredns
        pods insecure
        ttl 5
    }}
    cache 5
}}
"""


def holder_script(spec: NodeSpec) -> str:
    """Runs in the node's fresh mount + network namespaces, then holds them open."""
    binds = "\n".join(
        f"printf %s {v} > {spec.dir}/sysctl/{k.replace('/', '.')}; "
        f"mount --bind {spec.dir}/sysctl/{k.replace('/', '.')} /proc/sys/{k}"
        for k, v in KERNEL_TUNABLES.items()
    )
    return f"""set -e
mount --make-rprivate /
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/netns /run/containerd /run/xtables
mount -t tmpfs -o mode=755 tmpfs /var/lib/cni 2>/dev/null || {{ mkdir -p /var/lib/cni; \
mount -t tmpfs -o mode=755 tmpfs /var/lib/cni; }}
mkdir -p {spec.dir}/sysctl
{binds}
ip link set lo up
readlink /proc/self/ns/mnt > {spec.dir}/mnt-ns
touch {spec.dir}/holder.ready
exec sleep infinity
"""
