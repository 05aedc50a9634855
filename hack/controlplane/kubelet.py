"""Real kubelet nodes for the local control plane: kubelet + containerd + kube-proxy.

`up(kubelet=True)` gives the hub and every cluster one real node instead of the process-based
local node: kubelet and kube-proxy v1.35.4 built from the same Kubernetes wrapper module as the
apiservers, Debian's containerd 1.6 with runc, the CNI bridge plugin, and a kube-scheduler per
apiserver. Pods run as real containers from images in the node's own containerd (imported from
podman's store: `hack.images`, `imagePullPolicy: Never/IfNotPresent`, no registry).

Each node lives in namespaces of its own, so nothing it does reaches the machine or the other
planes (and engineers) on it:
- a network namespace with one veth on a bridge of this plane (podnet.node_net): kube-proxy's
  and the bridge plugin's iptables rules, its sysctls and its pod networks stay inside;
- a mount namespace with private /run, /var/lib/cni and /var/lib/kubelet tmpfs, so containerd's
  and runc's state, pod network namespaces and every volume mount vanish with the node;
- the kernel tunables kubelet insists on setting (vm.overcommit_memory, kernel.panic, ...) are
  files bound over /proc/sys in that mount namespace: kubelet sets them there, the machine keeps
  its values;
- a cgroup root of its own (`/ocmfl-<slot>-<node>`), removed on teardown.

Addresses come from the plane's one address plan (podnet): node i at podnet.node_ip, on one host
bridge per plane; its pods in podnet.pod_cidr and its apiserver's Services in
podnet.service_cidr, the ranges the process-based nodes use too (a loopback range cannot work:
inside a pod 127.x is the pod's own). Every node routes the other
nodes' Service ranges to them, so a cluster's pod reaches the hub's LoadBalancer address; a
host-side forwarder gives the pods and node agents the apiserver (which listens on 127.0.0.1).
Cluster DNS: CoreDNS (built from the Go module registry) in every node's network namespace,
on the node address, answering only for cluster.local from that node's apiserver.

This module starts, checks and tears down nodes: kubelet_spec says what a node is and renders
its files, kubelet_images makes the images it runs, kubelet_host is the host side.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import grpc
import yaml

from hack.controlplane import build, certs, podnet, processes
from hack.controlplane.kubelet_host import bridge_name, delete_bridge, ip, veth_name
from hack.controlplane.kubelet_images import (
    copy_store,
    ensure_pause_image,
    image_store,
    node_images,
)
from hack.controlplane.kubelet_spec import (
    CNI_BIN,
    NODE_LABEL,
    PAUSE_IMAGE,
    NodeError,
    NodeSpec,
    cgroup_root,
    cni_config,
    containerd_config,
    corefile,
    holder_script,
    kube_proxy_config,
    kubelet_config,
    node_kubeconfig,
    nodes_dir,
    specs,
)
from hack.controlplane.processes import Proc, State
from ocmfl.kube import Kube

COMPONENT = build.Component(
    "kubernetes-node",
    build.KUBERNETES_VERSION,
    "kubernetes",
    (
        "k8s.io/kubernetes/cmd/kubelet",
        "k8s.io/kubernetes/cmd/kube-proxy",
        "k8s.io/kubernetes/cmd/kube-scheduler",
        "k8s.io/kubernetes/cmd/kubectl",
    ),
    build._k8s_ldflags(build.KUBERNETES_VERSION),
)
COREDNS_VERSION = "v1.15.0"
DNS_COMPONENT = build.Component(
    "coredns", COREDNS_VERSION, "coredns", ("github.com/coredns/coredns",), "-s -w"
)

CGROUP_FS = Path("/sys/fs/cgroup")


# --- prerequisites -------------------------------------------------------------------------------


def missing_tools() -> list[str]:
    tools = ("containerd", "ctr", "runc", "iptables", "ip", "nsenter", "unshare", "podman", "gcc")
    missing = [t for t in tools if shutil.which(t) is None]
    missing += [f"{CNI_BIN}/{p}" for p in ("bridge", "host-local", "loopback")]
    return [m for m in missing if not (m.startswith("/") and Path(m).exists())]


def build_binaries() -> float:
    """kubelet, kube-proxy, kube-scheduler, kubectl and CoreDNS (cached like the rest)."""
    return build.build_component(COMPONENT) + build.build_component(DNS_COMPONENT)


def _nsenter(holder: int, argv: list[str]) -> list[str]:
    return ["nsenter", "-t", str(holder), "-m", "-n", "--", *argv]


def _wait(what: str, check: object, timeout: float, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not processes.alive(proc.pid):
            raise processes.ComponentFailed(proc.name, Path(proc.log), "exited during startup")
        with contextlib.suppress(Exception):
            if check():  # type: ignore[operator]
                return
        time.sleep(0.2)
    if proc is not None:
        raise processes.ComponentFailed(proc.name, Path(proc.log), f"{what}: timed out")
    raise NodeError(f"{what}: timed out after {timeout:.0f}s")


def cri_ready(socket: Path) -> bool:
    """Whether the CRI runtime service on `socket` answers a Version call (raises if not)."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        version = channel.unary_unary(
            "/runtime.v1.RuntimeService/Version",
            request_serializer=bytes,
            response_deserializer=bytes,
        )
        version(b"", timeout=2)  # an empty VersionRequest
    return True


def _start(track: object, logs: Path, name: str, argv: list[str]) -> Proc:
    """Start process `name` (its output in `logs/<name>.log`), handed to `track` to stop."""
    proc: Proc = track(processes.spawn(name, argv, logs / f"{name}.log"))  # type: ignore[operator]
    return proc


def start_node(
    spec: NodeSpec,
    state: State,
    track: object,
    store: Path,
    ca: certs.KeyPair,
) -> None:
    """Namespaces, veth, containerd (images: a copy of `store`), kubelet and kube-proxy."""
    logs = Path(state.dir) / "logs"
    shutil.rmtree(spec.dir, ignore_errors=True)
    (spec.dir / "cni").mkdir(parents=True)
    (spec.dir / "pki").mkdir()
    (spec.dir / "resolv.conf").write_text("nameserver 127.0.0.1\noptions ndots:5\n")
    for sub in _cgroup_controllers():
        (CGROUP_FS / sub / cgroup_root(spec.slot, spec.cluster).lstrip("/")).mkdir(
            parents=True, exist_ok=True
        )

    holder = _start(
        track,
        logs,
        f"node-ns-{spec.cluster}",
        [
            "unshare",
            "--mount",
            "--net",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            holder_script(spec),
        ],
    )
    _wait("node namespaces", lambda: (spec.dir / "holder.ready").exists(), 20, holder)

    def in_node(name: str, argv: list[str]) -> Proc:
        """Start `argv` in the node's namespaces as process `<name>-<cluster>`."""
        return _start(track, logs, f"{name}-{spec.cluster}", _nsenter(holder.pid, argv))

    # veth: the host end on this plane's bridge, eth0 inside with the node address.
    host_end = veth_name(spec.slot, spec.i)
    ip("link", "del", host_end, check=False)
    ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", str(holder.pid))
    ip("link", "set", host_end, "master", bridge_name(spec.slot), "up")
    inside = [
        ["addr", "add", f"{spec.ip}/24", "dev", "eth0"],
        ["link", "set", "eth0", "up"],
        ["route", "add", "default", "via", podnet.node_bridge_ip(spec.slot)],
    ]
    inside += [
        ["route", "add", podnet.service_cidr(spec.slot, j), "via", podnet.node_ip(spec.slot, j)]
        for j in range(spec.n_nodes)
        if j != spec.i
    ]
    for args in inside:
        subprocess.run(_nsenter(holder.pid, ["ip", *args]), check=True, capture_output=True)

    # PKI: the node's client identity (system:nodes), kube-proxy's, the kubelet serving cert.
    node_kp = certs.issue(ca, f"system:node:{spec.name}", orgs=("system:nodes",), client=True)
    proxy_kp = certs.issue(ca, "system:kube-proxy", client=True)
    serving = certs.issue(
        ca, spec.name, server=True, ip_addresses=(spec.ip,), dns_names=(spec.name,)
    )
    certs.write(serving, spec.dir / "pki", "kubelet")
    node_kubeconfig(spec, ca.cert_pem, node_kp, "kubelet", spec.dir / "kubelet.kubeconfig")
    node_kubeconfig(spec, ca.cert_pem, proxy_kp, "kube-proxy", spec.dir / "kube-proxy.kubeconfig")
    dns_kp = certs.issue(ca, "system:ocmfl:coredns", client=True)
    node_kubeconfig(spec, ca.cert_pem, dns_kp, "coredns", spec.dir / "coredns.kubeconfig")

    copy_store(store, spec.dir / "containerd" / "root")
    (spec.dir / "containerd.toml").write_text(containerd_config(spec))
    (spec.dir / "cni" / "10-ocmfl.conflist").write_text(cni_config(spec))
    ctrd = in_node("containerd", ["containerd", "--config", str(spec.dir / "containerd.toml")])
    _wait("containerd socket", spec.socket.exists, 30, ctrd)
    # The socket comes before the CRI: while containerd recovers its state (its images: about
    # a second here) the CRI answers "server is not initialized yet", and a kubelet that
    # checks it then exits for good (seen in CI).
    _wait("containerd CRI", lambda: cri_ready(spec.socket), 60, ctrd)
    (spec.dir / "kubelet.yaml").write_text(kubelet_config(spec))
    in_node(
        "kubelet",
        [
            str(COMPONENT.binaries["kubelet"]),
            f"--config={spec.dir / 'kubelet.yaml'}",
            f"--kubeconfig={spec.dir / 'kubelet.kubeconfig'}",
            f"--root-dir={spec.dir / 'kubelet'}",
            f"--hostname-override={spec.name}",
            f"--node-ip={spec.ip}",
            f"--node-labels={NODE_LABEL}=true",
            "--v=1",
        ],
    )
    (spec.dir / "Corefile").write_text(corefile(spec))
    in_node(
        "coredns",
        [str(DNS_COMPONENT.binaries["coredns"]), "-conf", str(spec.dir / "Corefile")],
    )
    (spec.dir / "kube-proxy.yaml").write_text(kube_proxy_config(spec))
    in_node(
        "kube-proxy",
        [str(COMPONENT.binaries["kube-proxy"]), f"--config={spec.dir / 'kube-proxy.yaml'}"],
    )


def bootstrap_apiserver(kube: Kube, spec: NodeSpec) -> None:
    """RBAC for the node agents and the `kubernetes` Service's endpoint (the forwarder)."""
    kube.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "ocmfl:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["services", "endpoints", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
    )
    bindings = {
        "ocmfl:coredns": ("ocmfl:coredns", {"kind": "User", "name": "system:ocmfl:coredns"}),
        "ocmfl:nodes": ("system:node", {"kind": "Group", "name": "system:nodes"}),
        "ocmfl:kube-proxy": ("system:node-proxier", {"kind": "User", "name": "system:kube-proxy"}),
    }
    for name, (role, subject) in bindings.items():
        kube.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", **subject}],
            },
        )
    kube.create(
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kubernetes",
                "namespace": "default",
                "labels": {
                    "kubernetes.io/service-name": "kubernetes",
                    "endpointslice.kubernetes.io/managed-by": "ocm-fl-controlplane",
                },
            },
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": [podnet.node_bridge_ip(spec.slot)], "conditions": {"ready": True}}
            ],
            "ports": [{"name": "https", "port": spec.apiserver_port, "protocol": "TCP"}],
        },
    )


def start_scheduler(state: State, cluster: str, track: object) -> Proc:
    port = processes.free_port()
    kc = state.kubeconfigs[cluster]
    p = _start(
        track,
        Path(state.dir) / "logs",
        f"kube-scheduler-{cluster}",
        [
            str(COMPONENT.binaries["kube-scheduler"]),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--profiling=false",
        ],
    )
    p.port = port
    return p


def node_ready(kube: Kube, spec: NodeSpec) -> bool:
    node = kube.get(f"/api/v1/nodes/{spec.name}")
    conds = ((node or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


# --- teardown --------------------------------------------------------------------------------


def _cgroup_controllers() -> list[str]:
    if (CGROUP_FS / "cgroup.controllers").exists():  # cgroup v2: one hierarchy
        return [""]
    return [
        p.name
        for p in CGROUP_FS.iterdir()
        if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists()
    ]


def _kill_cgroup_tree(root: Path) -> None:
    """SIGKILL every process under `root`, then remove the tree bottom-up."""
    if not root.is_dir():
        return
    dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    for _ in range(20):
        pids = set()
        for d in [*dirs, root]:
            with contextlib.suppress(OSError):
                pids |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for d in [*dirs, root]:
        with contextlib.suppress(OSError):
            d.rmdir()


def _pids_in_mount_ns(ns: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/mnt") == ns:
                    out.append(int(entry))
    return out


def teardown(slot: int, clusters: list[str]) -> None:
    """Leave nothing behind: pods, shims, cgroups, the bridge, the node directories.

    Network and mount namespaces (iptables rules, pod networks, volume mounts, containerd's
    state) go away with their last process.
    """
    for cluster in ["hub", *clusters]:
        d = nodes_dir(slot) / cluster
        with contextlib.suppress(OSError):
            # The node's daemons and the containerd shims (which outlive their parent).
            ns = (d / "mnt-ns").read_text().strip()
            deadline = time.monotonic() + 10
            while (pids := _pids_in_mount_ns(ns)) and time.monotonic() < deadline:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)
                time.sleep(0.1)
        for sub in _cgroup_controllers():
            _kill_cgroup_tree(CGROUP_FS / sub / cgroup_root(slot, cluster).lstrip("/"))
    # The node's network namespace can outlive its processes for minutes (closed TCP
    # connections still retransmitting their FIN hold it); deleting the host end of the veth
    # removes both ends at once.
    for i in range(len(clusters) + 1):
        ip("link", "del", veth_name(slot, i), check=False)
    delete_bridge(slot)
    shutil.rmtree(nodes_dir(slot), ignore_errors=True)


def start_all(
    state: State, track: object, ca: certs.KeyPair, *, echo: bool = False, timeout: float = 120.0
) -> None:
    """After the apiservers and the supervisor: schedulers, then one node per apiserver."""
    t0 = time.monotonic()
    missing = missing_tools()
    if missing:
        raise NodeError(f"kubelet nodes need {missing}: run `bash hack/install-system-deps.sh`")
    build_binaries()
    logs = Path(state.dir) / "logs"
    ensure_pause_image(logs / "pause-image.log")
    node_specs = specs(state)
    for spec in node_specs:
        kube = Kube(state.kubeconfigs[spec.cluster])
        try:
            bootstrap_apiserver(kube, spec)
        finally:
            kube.close()
        start_scheduler(state, spec.cluster, track)
    with image_store([PAUSE_IMAGE, *node_images()], logs / "image-store.log") as store:
        if echo:
            print(f"image store ready ({time.monotonic() - t0:.1f}s)", flush=True)
        for spec in node_specs:
            start_node(spec, state, track, store, ca)
            if echo:
                print(f"node {spec.name}: started ({time.monotonic() - t0:.1f}s)", flush=True)
    for spec in node_specs:
        kube = Kube(state.kubeconfigs[spec.cluster])
        try:
            _wait(f"node {spec.name} Ready", lambda k=kube, s=spec: node_ready(k, s), timeout)
        finally:
            kube.close()
    if echo:
        print(f"{len(node_specs)} kubelet nodes Ready ({time.monotonic() - t0:.1f}s)", flush=True)


def demo_env(state: State) -> dict[str, str]:
    """What hack/demo-local.sh needs to run examples/kind/demo.sh's later steps here."""
    from hack.helm import helm_binary

    merged: dict[str, object] = {"apiVersion": "v1", "kind": "Config", "clusters": []}
    users: list[object] = []
    contexts: list[object] = []
    for name in ["hub", *state.clusters]:
        cfg = yaml.safe_load(Path(state.kubeconfigs[name]).read_text())
        merged["clusters"].append({"name": name, "cluster": cfg["clusters"][0]["cluster"]})  # type: ignore[attr-defined]
        users.append({"name": name, "user": cfg["users"][0]["user"]})
        contexts.append({"name": name, "context": {"cluster": name, "user": name}})
    merged.update({"users": users, "contexts": contexts, "current-context": "hub"})
    path = Path(state.dir) / "kubeconfig" / "all.kubeconfig"
    path.write_text(yaml.safe_dump(merged))
    path.chmod(0o600)
    return {
        "KUBECONFIG": str(path),
        "HUB_CONTEXT": "hub",
        "CLUSTERS": ",".join(state.clusters),
        "HUB_NODE_ADDRESS": podnet.node_ip(state.slot, 0),
        "NODES_DIR": str(nodes_dir(state.slot)),
        "MODELS_DIR": str(nodes_dir(state.slot) / "hub" / "models"),
        "HELM": helm_binary() or "helm",
        "PATH": f"{COMPONENT.out_dir}:{os.environ.get('PATH', '')}",
    }


if __name__ == "__main__":
    import shlex
    import sys

    if sys.argv[1:] != ["demo-env"]:
        sys.exit("usage: python -m hack.controlplane.kubelet demo-env")
    loaded = State.load()
    if loaded is None or not loaded.kubelet:
        sys.exit(f"no plane with kubelet nodes in {processes.state_dir()} (up --kubelet)")
    for key, value in demo_env(loaded).items():
        print(f"{key}={shlex.quote(value)}")
