"""Real kubelet nodes for the local control plane: kubelet + containerd + kube-proxy.

`up(kubelet=True)` gives the hub and every cluster one real node instead of the process-based
local node: kubelet and kube-proxy v1.35.4 built from the same Kubernetes wrapper module as the
apiservers, Debian's containerd 1.6 with runc, the CNI bridge plugin, and a kube-scheduler per
apiserver. Pods run as real containers from images in the node's own containerd (imported from
podman's store: `hack.images`, `imagePullPolicy: Never/IfNotPresent`, no registry).

Each node lives in namespaces of its own, so nothing it does reaches the machine or the other
planes (and engineers) on it:
- a network namespace with one veth on a bridge of this plane (10.215.<slot>.0/24): kube-proxy's
  and the bridge plugin's iptables rules, its sysctls and its pod networks stay inside;
- a mount namespace with private /run, /var/lib/cni and /var/lib/kubelet tmpfs, so containerd's
  and runc's state, pod network namespaces and every volume mount vanish with the node;
- the kernel tunables kubelet insists on setting (vm.overcommit_memory, kernel.panic, ...) are
  files bound over /proc/sys in that mount namespace: kubelet sets them there, the machine keeps
  its values;
- a cgroup root of its own (`/ocmfl-<slot>-<node>`), removed on teardown.

Addresses (index = node_index(slot, i)): node IP 10.215.<slot>.<10+i>, pods
10.216.<index>.0/24, Services 10.217.<index>.0/24 (the apiserver's --service-cluster-ip-range; a
loopback range cannot work, inside a pod 127.x is the pod's own). Every node routes the other
nodes' Service ranges to them, so a cluster's pod reaches the hub's LoadBalancer address; a
host-side forwarder gives the pods and node agents the apiserver (which listens on 127.0.0.1).
Cluster DNS: CoreDNS (built from the Go module registry) in every node's network namespace,
on the node address, answering only for cluster.local from that node's apiserver.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import grpc
import yaml

from hack.controlplane import build, certs, podnet, processes
from hack.controlplane.processes import Proc, State
from ocmfl.kube import Informer, Kube, KubeError, Obj

log = logging.getLogger(__name__)

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
CGROUP_FS = Path("/sys/fs/cgroup")


class NodeError(RuntimeError):
    """A kubelet node could not be started; the message names the part and its log."""


# --- addresses ---------------------------------------------------------------------------------


def node_index(slot: int, i: int) -> int:
    """Address index of apiserver `i` (hub 0) of the plane in address slot `slot`."""
    return slot * podnet.NODES + i


def bridge_name(slot: int) -> str:
    return f"ocmflkb{slot}"


def bridge_ip(slot: int) -> str:
    return f"10.215.{slot}.1"


def node_ip(slot: int, i: int) -> str:
    return f"10.215.{slot}.{10 + i}"


def pod_cidr(slot: int, i: int) -> str:
    return f"10.216.{node_index(slot, i)}.0/24"


def service_cidr(slot: int, i: int) -> str:
    return f"10.217.{node_index(slot, i)}.0/24"


def kubernetes_service_ip(slot: int, i: int) -> str:
    """The first address of the Service range: the `kubernetes` Service's ClusterIP."""
    return f"10.217.{node_index(slot, i)}.1"


def apiserver_ips(slot: int, n_apiservers: int) -> list[str]:
    """Addresses pods and node agents reach the apiservers at: they go in its certificate."""
    return [bridge_ip(slot), *(kubernetes_service_ip(slot, i) for i in range(n_apiservers))]


def node_name(cluster: str) -> str:
    return f"ocmfl-kubelet-{cluster}"


def cgroup_root(slot: int, cluster: str) -> str:
    return f"/ocmfl-{slot}-{cluster}"


def nodes_dir(slot: int) -> Path:
    return NODES_ROOT / f"slot{slot}"


# --- prerequisites -------------------------------------------------------------------------------


def missing_tools() -> list[str]:
    tools = ("containerd", "ctr", "runc", "iptables", "ip", "nsenter", "unshare", "podman", "gcc")
    missing = [t for t in tools if shutil.which(t) is None]
    missing += [f"{CNI_BIN}/{p}" for p in ("bridge", "host-local", "loopback")]
    return [m for m in missing if not (m.startswith("/") and Path(m).exists())]


def build_binaries() -> float:
    """kubelet, kube-proxy, kube-scheduler, kubectl and CoreDNS (cached like the rest)."""
    return build.build_component(COMPONENT) + build.build_component(DNS_COMPONENT)


def ensure_pause_image(log_file: Path) -> None:
    """The sandbox ("pause") image: Kubernetes' own pause.c, static, in an image FROM scratch."""
    from hack.images import podman

    if podman.inspect(PAUSE_IMAGE) is not None:
        return
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{build.KUBERNETES_VERSION}"],
        cwd=build.GOMOD_DIR / "kubernetes",
        env=build._go_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    src = Path(json.loads(proc.stdout or "{}").get("Dir", "/nonexistent")) / "build/pause/linux"
    if not (src / "pause.c").is_file():
        raise NodeError(f"pause.c not found in the Kubernetes module ({src}): {proc.stderr}")
    work = log_file.parent / "pause-build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run(
        [
            "gcc",
            "-Os",
            "-static",
            "-Wall",
            '-DVERSION="v3.10.1"',
            "-o",
            str(work / "pause"),
            str(src / "pause.c"),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(["strip", str(work / "pause")], check=False, capture_output=True)
    (work / "Containerfile").write_text(
        'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n'
    )
    podman.run(["build", "-t", PAUSE_IMAGE, str(work)], log_file)
    shutil.rmtree(work, ignore_errors=True)


STORE_ROOT = NODES_ROOT / "image-store"
SEED_REF = "seed.ocm-fl.local/keep"  # the previous store's images while the new ones import
# Bumped when the store's layout or recipe changes, so an old store is not reused.
STORE_FORMAT = "1"
# The bolt databases containerd writes in place: every node gets its own copy of these, and
# hard links to everything else (content blobs and unpacked layers are never written again).
STORE_DATABASES = (
    "io.containerd.metadata.v1.bolt/meta.db",
    "io.containerd.snapshotter.v1.overlayfs/metadata.db",
)


def store_key(images: dict[str, str]) -> str:
    """Key of the image store for these images (name -> image id)."""
    h = hashlib.sha256(STORE_FORMAT.encode() + b"\0")
    for name, image_id in sorted(images.items()):
        h.update(f"{name}={image_id}\0".encode())
    return h.hexdigest()[:16]


def _store_containerd_config(d: Path) -> str:
    return f"""version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/ttrpc.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"""


def _build_store(images: list[str], out: Path, log_file: Path, seed: Path | None) -> None:
    """Import and unpack `images` (from podman's store) once into a containerd root at out/root.

    A containerd of its own, in a private mount namespace (the unpack mounts stay there), with
    only what an import needs (no CRI); stopped afterwards. `seed`, the previous store's root,
    is hard-linked in first: layers it already holds (the torch base, the dependencies) are
    not unpacked again, only the changed ones; containerd drops what the old images alone used.
    """
    from hack.images import podman

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if seed is not None:
        copy_store(seed, tmp / "root")
    (tmp / "containerd.toml").write_text(_store_containerd_config(tmp))
    with log_file.open("ab") as fh:
        ctrd = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "containerd",
                "--config",
                str(tmp / "containerd.toml"),
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while not (tmp / "containerd.sock").exists():
            if ctrd.poll() is not None or time.monotonic() > deadline:
                raise NodeError(f"containerd for the image store did not start; log {log_file}")
            time.sleep(0.1)

        def ctr(*args: str, stdin: IO[bytes] | None = None) -> subprocess.CompletedProcess[str]:
            cmd = ["ctr", "--address", str(tmp / "containerd.sock"), "-n", "k8s.io", *args]
            return subprocess.run(cmd, stdin=stdin, capture_output=True, text=True, check=False)

        # An import replaces the old image of the same name at once, and containerd's garbage
        # collector can then drop the old image's layers before the new one's unpack claims the
        # ones they share ("parent snapshot ... does not exist"): keep the seed's images
        # referenced under names of their own until every import is done.
        kept = []
        for i, old in enumerate(ctr("images", "ls", "-q").stdout.split()):
            kept.append(f"{SEED_REF}/{i}:seed")
            ctr("images", "tag", old, kept[-1])
        for image in images:
            start = time.monotonic()
            save = subprocess.Popen(
                [podman.podman(), "save", "--format", "docker-archive", image],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            res = ctr("images", "import", "-", stdin=save.stdout)
            assert save.stdout is not None
            save.stdout.close()
            save_err = save.communicate()[1].decode(errors="replace")
            if save.returncode != 0 or res.returncode != 0:
                raise NodeError(
                    f"podman save {image} | ctr import: {save_err.strip()} {res.stderr.strip()}"
                )
            with log_file.open("a") as log:
                log.write(f"imported {image} in {time.monotonic() - start:.1f}s\n")
        if kept:
            ctr("images", "rm", *kept)  # now containerd drops what only the old images used
    finally:
        os.killpg(ctrd.pid, signal.SIGTERM)
        try:
            ctrd.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(ctrd.pid, signal.SIGKILL)
            ctrd.wait()
    for name in ("state", "opt", "containerd.sock", "ttrpc.sock", "containerd.toml"):
        path = tmp / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    (tmp / "images.json").write_text(json.dumps(images))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


@contextlib.contextmanager
def image_store(images: list[str], log_file: Path) -> Iterator[Path]:
    """A containerd root holding `images`, imported and unpacked once per set of image ids.

    Importing the 1.5 GB workload image into one containerd takes minutes here; every node
    instead gets a hard-linked copy of this root (`copy_store`), which takes about a second.
    The store stays under NODES_ROOT for the next plane until an image changes; then the new
    one replaces it. While the yielded path is in use a shared lock keeps it in place.
    """
    from hack.images import podman

    STORE_ROOT.mkdir(parents=True, exist_ok=True)
    key = store_key({i: podman.image_id(i) for i in images})
    store = STORE_ROOT / key
    with (STORE_ROOT / "store.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (store / "images.json").is_file():
            seeds = [d for d in STORE_ROOT.iterdir() if (d / "images.json").is_file()]
            seed = max(seeds, key=lambda d: d.stat().st_mtime, default=None)
            try:
                _build_store(images, store, log_file, None if seed is None else seed / "root")
            except NodeError as err:
                if seed is None:
                    raise
                # Seen once: containerd refused a seeded import ("parent snapshot ... does not
                # exist"); the seed only saves time, so build the store from nothing instead.
                with log_file.open("a") as fh:
                    fh.write(f"seeded import failed ({err}); importing without a seed\n")
                _build_store(images, store, log_file, None)
            for old in STORE_ROOT.iterdir():
                if old.is_dir() and old != store:
                    shutil.rmtree(old, ignore_errors=True)
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield store / "root"


def copy_store(store_root: Path, dest: Path) -> None:
    """A node's containerd root: hard links to the store, own copies of its databases."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(store_root), str(dest)], check=True, capture_output=True)
    for rel in STORE_DATABASES:
        db = dest / rel
        if db.is_file():
            tmp = db.with_name(db.name + ".copy")
            shutil.copy2(db, tmp)
            os.replace(tmp, db)


# --- host side: bridge, per-apiserver forwarders, LoadBalancer addresses ---------------------


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def create_bridge(slot: int) -> None:
    br = bridge_name(slot)
    _ip("link", "del", br, check=False)
    _ip("link", "add", br, "type", "bridge")
    _ip("addr", "add", f"{bridge_ip(slot)}/24", "dev", br)
    _ip("link", "set", br, "up")


def delete_bridge(slot: int) -> None:
    _ip("link", "del", bridge_name(slot), check=False)


def veth_name(slot: int, i: int) -> str:
    """Host end of node `i`'s veth (its other end is eth0 in the node's network namespace)."""
    return f"ocmflk{slot}n{i}"


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
        return node_ip(self.slot, self.i)

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def server(self) -> str:
        return f"https://{bridge_ip(self.slot)}:{self.apiserver_port}"


def specs(state: State) -> list[NodeSpec]:
    names = ["hub", *state.clusters]
    return [
        NodeSpec(n, i, state.slot, int(state.apiservers[n].rsplit(":", 1)[1]), len(names))
        for i, n in enumerate(names)
    ]


class HostSide:
    """In the supervisor, per apiserver: the apiserver on the bridge, LoadBalancer addresses.

    The forwarder makes the apiserver (127.0.0.1 only) reachable at <bridge ip>:<its port> for
    kubelet, kube-proxy and pods (the `kubernetes` Service's endpoint). A LoadBalancer Service
    gets its ClusterIP as ingress address, as MetalLB gives one up front; kube-proxy routes it.
    """

    def __init__(self, spec: NodeSpec, kube: Kube, stop: threading.Event) -> None:
        from hack.controlplane.forwarder import Forwarder

        self.spec = spec
        self.kube = kube
        self.stop = stop
        self.wake = threading.Event()
        self.ready = threading.Event()
        self.forwarder = Forwarder(f"api-{spec.cluster}")
        self.services = Informer(kube, "/api/v1/services", self.wake, stop, f"lb-{spec.cluster}")
        self.thread = threading.Thread(target=self._loop, name=f"host-{spec.cluster}", daemon=True)

    def start(self) -> None:
        addr = (bridge_ip(self.spec.slot), self.spec.apiserver_port)
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


# --- node side -------------------------------------------------------------------------------


def _containerd_config(spec: NodeSpec) -> str:
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


def _cni_config(spec: NodeSpec) -> str:
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
                        "ranges": [[{"subnet": pod_cidr(spec.slot, spec.i)}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        },
        indent=2,
    )


def _kubelet_config(spec: NodeSpec) -> str:
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


def _kube_proxy_config(spec: NodeSpec) -> str:
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
            "clusterCIDR": pod_cidr(spec.slot, spec.i),
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


def _kubeconfig(spec: NodeSpec, ca_pem: bytes, kp: certs.KeyPair, user: str, path: Path) -> None:
    from hack.controlplane.plane import write_kubeconfig

    write_kubeconfig(path, spec.server, ca_pem, kp, user)
    cfg = yaml.safe_load(path.read_text())
    # The apiserver certificate names "kubernetes", not the bridge address the node dials.
    cfg["clusters"][0]["cluster"]["tls-server-name"] = "kubernetes"
    path.write_text(yaml.safe_dump(cfg))


def _corefile(spec: NodeSpec) -> str:
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


def _holder_script(spec: NodeSpec) -> str:
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

    holder = track(  # type: ignore[operator]
        processes.spawn(
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
                _holder_script(spec),
            ],
            logs / f"node-ns-{spec.cluster}.log",
        )
    )
    _wait("node namespaces", lambda: (spec.dir / "holder.ready").exists(), 20, holder)

    # veth: the host end on this plane's bridge, eth0 inside with the node address.
    host_end = veth_name(spec.slot, spec.i)
    _ip("link", "del", host_end, check=False)
    _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", str(holder.pid))
    _ip("link", "set", host_end, "master", bridge_name(spec.slot), "up")
    inside = [
        ["addr", "add", f"{spec.ip}/24", "dev", "eth0"],
        ["link", "set", "eth0", "up"],
        ["route", "add", "default", "via", bridge_ip(spec.slot)],
    ]
    inside += [
        ["route", "add", service_cidr(spec.slot, j), "via", node_ip(spec.slot, j)]
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
    _kubeconfig(spec, ca.cert_pem, node_kp, "kubelet", spec.dir / "kubelet.kubeconfig")
    _kubeconfig(spec, ca.cert_pem, proxy_kp, "kube-proxy", spec.dir / "kube-proxy.kubeconfig")
    dns_kp = certs.issue(ca, "system:ocmfl:coredns", client=True)
    _kubeconfig(spec, ca.cert_pem, dns_kp, "coredns", spec.dir / "coredns.kubeconfig")

    copy_store(store, spec.dir / "containerd" / "root")
    (spec.dir / "containerd.toml").write_text(_containerd_config(spec))
    (spec.dir / "cni" / "10-ocmfl.conflist").write_text(_cni_config(spec))
    ctrd = track(  # type: ignore[operator]
        processes.spawn(
            f"containerd-{spec.cluster}",
            _nsenter(holder.pid, ["containerd", "--config", str(spec.dir / "containerd.toml")]),
            logs / f"containerd-{spec.cluster}.log",
        )
    )
    _wait("containerd socket", spec.socket.exists, 30, ctrd)
    # The socket comes before the CRI: while containerd recovers its state (its images: about
    # a second here) the CRI answers "server is not initialized yet", and a kubelet that
    # checks it then exits for good (seen in CI).
    _wait("containerd CRI", lambda: cri_ready(spec.socket), 60, ctrd)
    (spec.dir / "kubelet.yaml").write_text(_kubelet_config(spec))
    track(  # type: ignore[operator]
        processes.spawn(
            f"kubelet-{spec.cluster}",
            _nsenter(
                holder.pid,
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
            ),
            logs / f"kubelet-{spec.cluster}.log",
        )
    )
    (spec.dir / "Corefile").write_text(_corefile(spec))
    track(  # type: ignore[operator]
        processes.spawn(
            f"coredns-{spec.cluster}",
            _nsenter(
                holder.pid,
                [str(DNS_COMPONENT.binaries["coredns"]), "-conf", str(spec.dir / "Corefile")],
            ),
            logs / f"coredns-{spec.cluster}.log",
        )
    )
    (spec.dir / "kube-proxy.yaml").write_text(_kube_proxy_config(spec))
    track(  # type: ignore[operator]
        processes.spawn(
            f"kube-proxy-{spec.cluster}",
            _nsenter(
                holder.pid,
                [str(COMPONENT.binaries["kube-proxy"]), f"--config={spec.dir / 'kube-proxy.yaml'}"],
            ),
            logs / f"kube-proxy-{spec.cluster}.log",
        )
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
            "endpoints": [{"addresses": [bridge_ip(spec.slot)], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": spec.apiserver_port, "protocol": "TCP"}],
        },
    )


def start_scheduler(state: State, cluster: str, track: object) -> Proc:
    port = processes.free_port()
    kc = state.kubeconfigs[cluster]
    p: Proc = track(  # type: ignore[operator]
        processes.spawn(
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
            Path(state.dir) / "logs" / f"kube-scheduler-{cluster}.log",
        )
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
        _ip("link", "del", veth_name(slot, i), check=False)
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


def node_images() -> list[str]:
    """Images every node gets: those hack.images built (OCMFL_KUBELET_IMAGES: a comma list)."""
    from hack.images import deploy, podman

    env = os.environ.get("OCMFL_KUBELET_IMAGES")
    names = [n for n in env.split(",") if n] if env is not None else [i.tag for i in deploy.IMAGES]
    return [n for n in names if podman.inspect(n) is not None]


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
        "HUB_NODE_ADDRESS": node_ip(state.slot, 0),
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
