"""Pod networking of the local node (TEST INFRASTRUCTURE): a network namespace per pod.

Like a CNI bridge plugin: every pod gets its own network namespace (its own loopback, so a
SuperLink binds the pod's 127.0.0.1:9092 as in a real pod), joined to its node's bridge by a
veth pair, with an address from the node's pod range. Processes on the host are reached the
way a real cluster reaches its Services: through host-terminated addresses.

Address plan of the plane in address slot ``s`` (several planes run on one machine; the slot
table in plane.py keeps them apart), all inside ``10.P.0.0/16`` with ``P = 200 + s``:

==========================  =================================  ===================================
what                        addresses                          notes
==========================  =================================  ===================================
pods of node i (hub 0,      ``10.P.(8i+8).0/21``               bridge ``ofl<s>b<i>`` holds the
clusters 1..9)                                                 gateway ``.1``: the node's address
Service ClusterIPs of       ``10.P.(128+8i).0/21``             ``--service-cluster-ip-range``;
apiserver i                                                    ``.1`` is ``kubernetes.default``
host addresses              ``10.P.240.0/20``                  for host processes pods must reach
                                                               (localfed's agents and hub)
real kubelet nodes          ``10.P.0.0/24``                    ``up(kubelet=True)`` only: one host
(kubelet.py)                                                   bridge holds ``.1``, node i is
                                                               ``.(10+i)``; its pods and Services
                                                               use the two ranges above
==========================  =================================  ===================================

This is the plane's one address plan: the process-based nodes and the real kubelet nodes take
every address from the functions below.

With local nodes, ``10.P.128.0/17`` is one ``local`` route on the host: any address in it is the
host's own, so the forwarder (kube-proxy stand-in) listens on ClusterIPs and host processes bind
host addresses. A pod has two routes: its node's pod range (on the bridge) and ``10.P.128.0/17``
through its gateway; nothing else, so pods of different clusters never reach each other's pod
addresses, only Services, LoadBalancer addresses and host addresses, as across real clusters,
whether or not the host forwards packets. No iptables rule and no sysctl is changed.

Every name starts with ``ofl<s>``: network namespaces and host-side veths are
``ofl<s>-<x>-<y>`` for pod address ``10.P.x.y``, bridges ``ofl<s>b<i>``. `sweep` removes all of
a slot's objects (and kills whatever still runs in its namespaces), even after a crash.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

SLOTS = 8  # address slots (planes at once on one machine)
NODES = 10  # apiservers per plane: hub + 9 clusters
NETNS_DIR = Path("/run/netns")  # where `ip netns` keeps its namespace handles


class NetError(RuntimeError):
    """A pod network could not be set up (names the `ip` command and its error)."""


# --- the address plan (pure) --------------------------------------------------------------
def _check(slot: int, node: int | None = None) -> None:
    if not 0 <= slot < SLOTS:
        raise ValueError(f"address slot {slot} outside 0..{SLOTS - 1}")
    if node is not None and not 0 <= node < NODES:
        raise ValueError(f"node {node} outside 0..{NODES - 1}")


def plane_net(slot: int) -> ipaddress.IPv4Network:
    """Everything the plane in `slot` uses."""
    _check(slot)
    return ipaddress.IPv4Network(f"10.{200 + slot}.0.0/16")


def pod_cidr(slot: int, node: int) -> ipaddress.IPv4Network:
    """Pod range of node `node` (0 = hub)."""
    _check(slot, node)
    return ipaddress.IPv4Network(f"10.{200 + slot}.{8 * node + 8}.0/21")


def gateway(slot: int, node: int) -> str:
    """The node's own address on its bridge: pods' default route, `status.hostIP`."""
    return str(pod_cidr(slot, node).network_address + 1)


def service_cidr(slot: int, node: int) -> str:
    """ClusterIP range of apiserver `node` (non-loopback: inside a pod 127/8 is its own)."""
    _check(slot, node)
    return f"10.{200 + slot}.{128 + 8 * node}.0/21"


def kubernetes_service_ip(slot: int, node: int) -> str:
    """ClusterIP the apiserver gives `default/kubernetes` (the first of its range)."""
    return str(ipaddress.IPv4Network(service_cidr(slot, node)).network_address + 1)


def node_net(slot: int) -> ipaddress.IPv4Network:
    """The real kubelet nodes' own network (kubelet.py): one bridge on the host."""
    _check(slot)
    return ipaddress.IPv4Network(f"10.{200 + slot}.0.0/24")


def node_bridge_ip(slot: int) -> str:
    """The host's address on the kubelet nodes' bridge: their default route, and where the
    supervisor forwards each apiserver (kubelet_host.HostSide)."""
    return str(node_net(slot).network_address + 1)


def node_ip(slot: int, node: int) -> str:
    """Real kubelet node `node`'s address (0 = hub)."""
    _check(slot, node)
    return str(node_net(slot).network_address + 10 + node)


def host_terminated(slot: int) -> ipaddress.IPv4Network:
    """The range routed `local` on the host: ClusterIPs and host addresses."""
    _check(slot)
    return ipaddress.IPv4Network(f"10.{200 + slot}.128.0/17")


def host_address(slot: int, n: int) -> str:
    """The n-th host address (n >= 0): bind a host process there so pods can reach it."""
    _check(slot)
    if not 0 <= n < 16 * 254:
        raise ValueError(f"host address index {n} outside 0..{16 * 254 - 1}")
    hi, lo = divmod(n, 254)
    return f"10.{200 + slot}.{240 + hi}.{lo + 1}"


def prefix(slot: int) -> str:
    """Every interface and namespace name of the slot starts with this."""
    _check(slot)
    return f"ofl{slot}"


def bridge_name(slot: int, node: int) -> str:
    _check(slot, node)
    return f"{prefix(slot)}b{node}"


def pod_link_name(slot: int, ip: str) -> str:
    """Name of a pod's network namespace and of its veth's host end (<= 15 characters)."""
    a = ipaddress.IPv4Address(ip)
    if a not in plane_net(slot):
        raise ValueError(f"{ip} is not in plane slot {slot} ({plane_net(slot)})")
    _, _, x, y = str(a).split(".")
    return f"{prefix(slot)}-{x}-{y}"


def pod_address(slot: int, name: str) -> str | None:
    """The pod address a `pod_link_name` stands for (None for other names)."""
    m = re.fullmatch(rf"{prefix(slot)}-(\d+)-(\d+)", name)
    return f"10.{200 + slot}.{m.group(1)}.{m.group(2)}" if m else None


def owned(slot: int, names: Iterable[str]) -> list[str]:
    """The names (links, namespaces) that belong to the plane in `slot`."""
    pattern = re.compile(rf"^{prefix(slot)}(b\d+|-\d+-\d+)$")
    return sorted(n for n in names if pattern.match(n))


@dataclass
class PodAddresses:
    """IPAM of one node: hands out its pod range round robin (a freed address is reused last,
    so a stale neighbour entry for it has long expired)."""

    slot: int
    node: int
    used: set[str] = field(default_factory=set)
    _next: int = 2  # .1 is the gateway

    def allocate(self) -> str:
        net = pod_cidr(self.slot, self.node)
        size = net.num_addresses - 1  # the last one is broadcast
        for _ in range(size):
            n = self._next
            self._next = self._next + 1 if self._next + 1 < size else 2
            ip = str(net.network_address + n)
            if ip not in self.used:
                self.used.add(ip)
                return ip
        raise NetError(f"pod range {net} of node {self.node} is exhausted")

    def release(self, ip: str) -> None:
        self.used.discard(ip)


# --- the host side (runs `ip`; root with CAP_NET_ADMIN) -----------------------------------
def _ip(*args: str, stdin: str | None = None, check: bool = True) -> str:
    cmd = ["ip", *args]
    try:
        out = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as e:
        raise NetError(f"{' '.join(cmd)}: {e}") from e
    if check and out.returncode != 0:
        raise NetError(f"{' '.join(cmd)}: {out.stderr.strip() or out.returncode}")
    return out.stdout


def ensure_plane(slot: int) -> None:
    """The `local` route that makes ClusterIPs and host addresses the host's own."""
    net = str(host_terminated(slot))
    _ip("route", "replace", "local", net, "dev", "lo", "table", "local")


def bridge_mac(slot: int, node: int) -> str:
    """The node bridge's own MAC address (locally administered, one per slot and node)."""
    _check(slot, node)
    return f"02:6f:66:00:{slot:02x}:{node:02x}"


def ensure_bridge(slot: int, node: int) -> None:
    """The node's bridge with its gateway address and a fixed MAC (idempotent)."""
    br = bridge_name(slot, node)
    if not Path(f"/sys/class/net/{br}").exists():
        # Bridged pod traffic bypasses iptables, whatever rules others put on this machine.
        _ip(
            "link", "add", br, "type", "bridge",
            "nf_call_iptables", "0", "nf_call_ip6tables", "0", "nf_call_arptables", "0",
        )  # fmt: skip
    # A bridge without an address of its own takes the lowest MAC of its ports: deleting one
    # pod could change the gateway's MAC under every other pod of the node, whose ARP entry
    # then sent their traffic nowhere for about 30 s (seen: a tenant's last-round metrics
    # lost when another tenant's pod on the same node was deleted).
    _ip("link", "set", br, "address", bridge_mac(slot, node))
    gw = f"{gateway(slot, node)}/{pod_cidr(slot, node).prefixlen}"
    _ip("addr", "replace", gw, "dev", br)
    _ip("link", "set", br, "up")


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def create_pod_net(slot: int, node: int, ip: str) -> str:
    """A new network namespace for a pod at `ip`, wired to the node's bridge; its name."""
    name = pod_link_name(slot, ip)
    delete_pod_net(name)  # a leftover of the same name (crashed supervisor) goes first
    net = pod_cidr(slot, node)
    _ip("netns", "add", name)
    try:
        _ip("link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name)
        _ip("link", "set", name, "master", bridge_name(slot, node), "up")
        _ip(
            "-n", name, "-batch", "-",
            stdin=(
                f"addr add {ip}/{net.prefixlen} dev eth0\n"
                "link set lo up\n"
                "link set eth0 up\n"
                f"route add {host_terminated(slot)} via {gateway(slot, node)}\n"
            ),
        )  # fmt: skip
    except NetError:
        delete_pod_net(name)
        raise
    return name


def _netns_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def pids_in(name: str) -> list[int]:
    """Processes whose network namespace is the pod namespace `name`."""
    want = _netns_id(netns_path(name))
    if want is None:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _netns_id(Path(f"/proc/{entry}/ns/net")) == want:
            out.append(int(entry))
    return out


def kill_all_in(name: str, timeout: float = 5.0) -> None:
    """SIGKILL every process in namespace `name` (a pod's processes die with the pod, even
    those that left its process group); wait until none is left."""
    deadline = time.monotonic() + timeout
    while pids := pids_in(name):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            log.warning("processes %s still in netns %s", pids, name)
            return
        time.sleep(0.02)


def delete_pod_net(name: str) -> None:
    """Kill what runs in the namespace, remove the veth pair and the namespace."""
    if netns_path(name).exists():
        kill_all_in(name)
    # Deleting the host end removes the pair at once, even while a stale mount of the
    # namespace somewhere keeps the namespace itself alive.
    if Path(f"/sys/class/net/{name}").exists():
        _ip("link", "del", name, check=False)
    if netns_path(name).exists():
        _ip("netns", "del", name, check=False)


def _links() -> list[str]:
    try:
        return os.listdir("/sys/class/net")
    except OSError:
        return []


def _namespaces() -> list[str]:
    try:
        return os.listdir(NETNS_DIR)
    except OSError:
        return []


def sweep(slot: int) -> list[str]:
    """Remove every namespace, veth and bridge of `slot` and its local route; what went."""
    gone = []
    for name in owned(slot, _namespaces()):
        delete_pod_net(name)
        gone.append(f"netns {name}")
    for name in owned(slot, _links()):
        if Path(f"/sys/class/net/{name}").exists():
            _ip("link", "del", name, check=False)
            gone.append(f"link {name}")
    net = str(host_terminated(slot))
    if net in _ip("route", "show", "table", "local", "type", "local", check=False).split():
        _ip("route", "del", "local", net, "dev", "lo", "table", "local", check=False)
        gone.append(f"route local {net}")
    return gone


def leftovers(slot: int) -> list[str]:
    """What of `slot` still exists on the host (empty after `sweep`)."""
    out = [f"netns {n}" for n in owned(slot, _namespaces())]
    out += [f"link {n}" for n in owned(slot, _links())]
    net = str(host_terminated(slot))
    if net in _ip("route", "show", "table", "local", "type", "local", check=False).split():
        out.append(f"route local {net}")
    return out
