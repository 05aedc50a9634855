"""Unit tests of the local node's pod network plan (hack/controlplane/podnet.py, pure parts)."""

from __future__ import annotations

import ipaddress
import itertools

import pytest

from hack.controlplane import podnet, podplan


def _ranges(slot: int) -> list[ipaddress.IPv4Network]:
    nodes = range(podnet.NODES)
    return (
        [podnet.pod_cidr(slot, i) for i in nodes]
        + [ipaddress.IPv4Network(podnet.service_cidr(slot, i)) for i in nodes]
        + [ipaddress.IPv4Network(f"{podnet.host_address(slot, 0)}/20", strict=False)]
    )


def test_no_two_ranges_overlap_within_or_across_planes() -> None:
    everything = [r for s in range(podnet.SLOTS) for r in _ranges(s)]
    for a, b in itertools.combinations(everything, 2):
        assert not a.overlaps(b), (a, b)
    for s in range(podnet.SLOTS):
        for r in _ranges(s):
            assert r.subnet_of(podnet.plane_net(s))
            assert not r.is_loopback  # inside a pod 127/8 is the pod's own loopback


def test_services_and_host_addresses_are_host_terminated_and_pods_are_not() -> None:
    for s in range(podnet.SLOTS):
        local = podnet.host_terminated(s)
        for i in range(podnet.NODES):
            assert ipaddress.IPv4Network(podnet.service_cidr(s, i)).subnet_of(local)
            assert not podnet.pod_cidr(s, i).overlaps(local)
            kip = ipaddress.IPv4Address(podnet.kubernetes_service_ip(s, i))
            assert kip in ipaddress.IPv4Network(podnet.service_cidr(s, i))
            assert ipaddress.IPv4Address(podnet.gateway(s, i)) in podnet.pod_cidr(s, i)
        assert ipaddress.IPv4Address(podnet.host_address(s, 4063)) in local
    with pytest.raises(ValueError, match="host address index"):
        podnet.host_address(0, 16 * 254)
    with pytest.raises(ValueError, match="address slot"):
        podnet.pod_cidr(podnet.SLOTS, 0)
    with pytest.raises(ValueError, match=r"node \d+ outside"):
        podnet.pod_cidr(0, podnet.NODES)


def test_names_fit_linux_interface_names_and_identify_their_plane() -> None:
    names = [podnet.bridge_name(s, i) for s in range(podnet.SLOTS) for i in range(podnet.NODES)]
    for s in range(podnet.SLOTS):
        net = podnet.pod_cidr(s, podnet.NODES - 1)
        names.append(podnet.pod_link_name(s, str(net.broadcast_address - 1)))
    assert all(len(n) <= 15 for n in names)  # IFNAMSIZ - 1
    assert len(set(names)) == len(names)
    mine = podnet.owned(3, [*names, "eth0", "ofl3x", "ofl31-2-3", "cni0", "ofl3-8-2"])
    assert mine == sorted(
        [podnet.bridge_name(3, i) for i in range(podnet.NODES)]
        + [podnet.pod_link_name(3, str(podnet.pod_cidr(3, 9).broadcast_address - 1)), "ofl3-8-2"]
    )
    with pytest.raises(ValueError, match="is not in plane slot 3"):
        podnet.pod_link_name(3, "10.204.8.2")  # another plane's address


def test_pod_addresses_come_round_robin_from_the_node_range_and_run_out_cleanly() -> None:
    ipam = podnet.PodAddresses(2, 1)
    net, gw = podnet.pod_cidr(2, 1), podnet.gateway(2, 1)
    first = [ipam.allocate() for _ in range(3)]
    assert first == [str(net.network_address + n) for n in (2, 3, 4)]
    ipam.release(first[0])
    assert ipam.allocate() == str(net.network_address + 5)  # freed ones are reused last
    rest = [ipam.allocate() for _ in range(net.num_addresses - 6)]
    every = set(first[1:] + rest) | {str(net.network_address + 5)}
    assert first[0] in every and gw not in every
    assert str(net.broadcast_address) not in every
    assert len(every) == net.num_addresses - 3  # network, gateway and broadcast excluded
    with pytest.raises(podnet.NetError, match="exhausted"):
        ipam.allocate()
    ipam.release(rest[10])
    assert ipam.allocate() == rest[10]


def test_containers_join_the_pod_network_namespace_and_drop_inherited_handles() -> None:
    plan = podplan.ContainerPlan("c", "busybox", ["sh", "-c", "true"], {})
    argv = podplan.launcher_argv(plan, "/pods/x/hosts", "/run/netns/ofl0-8-2")
    shell = argv.index("/bin/sh")
    assert argv[:shell] == [
        "setpriv", "--pdeathsig", "KILL", "--",
        "nsenter", "--net=/run/netns/ofl0-8-2", "--",
        "unshare", "--mount", "--propagation", "private", "--",
    ]  # fmt: skip
    script = argv[shell + 2].splitlines()
    assert script[1] == "umount -l /run/netns 2>/dev/null || true"
    assert argv[-3:] == ["sh", "-c", "true"]
    plain = podplan.launcher_argv(plan)
    assert "nsenter" not in plain and "umount" not in plain[plain.index("/bin/sh") + 2]


def test_a_pod_namespace_name_gives_back_its_address() -> None:
    ip = str(podnet.pod_cidr(5, 3).network_address + 300)
    assert podnet.pod_address(5, podnet.pod_link_name(5, ip)) == ip
    assert podnet.pod_address(5, podnet.bridge_name(5, 3)) is None
    assert podnet.pod_address(5, podnet.pod_link_name(4, "10.204.8.2")) is None


def test_every_node_bridge_has_its_own_fixed_locally_administered_mac() -> None:
    # Fixed, so deleting a pod's veth cannot change the gateway MAC under the node's other
    # pods (a bridge without its own address takes its lowest port's).
    macs = {podnet.bridge_mac(s, n) for s in range(podnet.SLOTS) for n in range(podnet.NODES)}
    assert len(macs) == podnet.SLOTS * podnet.NODES
    for mac in macs:
        first = int(mac.split(":")[0], 16)
        assert first & 0b10 and not first & 0b01  # locally administered, unicast
    with pytest.raises(ValueError, match="address slot"):
        podnet.bridge_mac(podnet.SLOTS, 0)
