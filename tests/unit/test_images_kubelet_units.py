"""Pure parts of the image builder (hack/images) and of the kubelet nodes (hack/controlplane)."""

from __future__ import annotations

import concurrent.futures
import ipaddress
from pathlib import Path

import pytest
import yaml

from hack.controlplane import kubelet, kubelet_images, kubelet_spec, podnet
from hack.images import deploy, podman
from ocmfl import constants


def test_copy_sources_are_what_the_dockerfiles_copy_from_the_context() -> None:
    srcs = deploy.copy_sources(deploy.by_name("addon").dockerfile)
    assert {"pyproject.toml", "deploy/images/pyproject_deps.py", "ocmfl", "hub_controller"} <= set(
        srcs
    )
    assert "/src/requirements.txt" not in srcs  # COPY --from=<stage> reads no context file
    # A README edit must not rebuild the images (the build writes a stand-in readme).
    assert "README.md" not in srcs


def test_context_files_skip_what_dockerignore_excludes() -> None:
    files = deploy.context_files(deploy.by_name("workload").dockerfile)
    rels = [str(f.relative_to(deploy.ROOT)) for f in files]
    assert any(r.startswith("workloads/") for r in rels)
    assert not [r for r in rels if "__pycache__" in r or r.endswith(".pyc")]


def test_content_key_follows_the_files_the_build_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "deploy" / "images").mkdir(parents=True)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "a.py").write_text("x = 1\n")
    (tmp_path / "other.py").write_text("y = 1\n")
    (tmp_path / "deploy" / "images" / "t.Dockerfile").write_text(
        "ARG PYTHON_IMAGE=python:3.11-slim\nFROM ${PYTHON_IMAGE}\nCOPY app app\n"
    )
    monkeypatch.setattr(deploy, "ROOT", tmp_path)
    monkeypatch.setattr(deploy, "DOCKERFILES", tmp_path / "deploy" / "images")
    monkeypatch.setattr(podman, "image_id", lambda image: "sha256:base")
    img = deploy.DeployImage("t", "example/t:1", {"PYTHON_IMAGE": "base"})
    first = deploy.content_key(img)
    (tmp_path / "other.py").write_text("y = 2\n")  # not copied: same key
    assert deploy.content_key(img) == first
    (tmp_path / "app" / "a.py").write_text("x = 2\n")
    assert deploy.content_key(img) != first
    monkeypatch.setattr(podman, "image_id", lambda image: "sha256:other-base")
    assert deploy.content_key(img) != first


def test_every_built_image_is_one_the_chart_and_controller_use() -> None:
    assert {i.tag for i in deploy.IMAGES} == {constants.ADDON_IMAGE, constants.WORKLOAD_IMAGE}
    assert all(p.is_file() for p in (i.dockerfile for i in deploy.IMAGES))


@pytest.mark.parametrize("slot", [0, 7])
def test_kubelet_addresses_are_private_distinct_and_never_loopback(slot: int) -> None:
    n = 10
    nodes = [ipaddress.ip_address(podnet.node_ip(slot, i)) for i in range(n)]
    services = [ipaddress.ip_network(podnet.service_cidr(slot, i)) for i in range(n)]
    pods = [podnet.pod_cidr(slot, i) for i in range(n)]
    assert len(set(nodes)) == n and len(set(services)) == n and len(set(pods)) == n
    node_net = podnet.node_net(slot)
    for net in [*services, *pods, node_net]:
        assert net.is_private and not net.is_loopback
        assert not any(net.overlaps(o) for o in [*services, *pods, node_net] if o != net)
    # The node addresses are off the host-terminated range local nodes route to the host.
    assert not node_net.overlaps(podnet.host_terminated(slot))
    assert all(ip in node_net for ip in nodes)
    assert ipaddress.ip_address(podnet.node_bridge_ip(slot)) in node_net
    assert ipaddress.ip_address(podnet.node_bridge_ip(slot)) not in nodes
    ips = kubelet_spec.apiserver_ips(slot, 3)
    assert podnet.kubernetes_service_ip(slot, 2) in ips and podnet.node_bridge_ip(slot) in ips


def _spec(cluster: str = "cluster1", i: int = 1) -> kubelet_spec.NodeSpec:
    return kubelet_spec.NodeSpec(cluster, i, 3, 41234, 3)


def test_kubelet_config_keeps_the_node_to_itself() -> None:
    spec = _spec()
    cfg = yaml.safe_load(kubelet_spec.kubelet_config(spec))
    assert cfg["cgroupRoot"] == "/ocmfl-3-cluster1" and cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["failCgroupV1"] is False and cfg["maxOpenFiles"] < 20000
    assert cfg["address"] == spec.ip and cfg["clusterDNS"] == [spec.ip]
    assert cfg["containerRuntimeEndpoint"] == f"unix://{spec.socket}"
    assert cfg["podLogsDirectory"].startswith(str(spec.dir))


def test_containerd_config_has_its_own_state_and_restricts_oom_score_adj() -> None:
    spec = _spec()
    text = kubelet_spec.containerd_config(spec)
    assert f'root = "{spec.dir}/containerd/root"' in text
    assert f'address = "{spec.socket}"' in text
    assert "restrict_oom_score_adj = true" in text and "SystemdCgroup = false" in text
    assert f'sandbox_image = "{kubelet_spec.PAUSE_IMAGE}"' in text


def test_node_namespace_binds_every_kernel_tunable_kubelet_writes() -> None:
    script = kubelet_spec.holder_script(_spec())
    for key in kubelet_spec.KERNEL_TUNABLES:
        assert f"/proc/sys/{key}" in script
    assert "mount --make-rprivate /" in script and "tmpfs /run" in script


def test_cni_config_gives_pods_the_nodes_range() -> None:
    spec = _spec()
    conf = yaml.safe_load(kubelet_spec.cni_config(spec))
    ipam = conf["plugins"][0]["ipam"]
    assert ipam["ranges"][0][0]["subnet"] == str(podnet.pod_cidr(spec.slot, spec.i))


def test_image_store_key_follows_the_image_ids() -> None:
    key = kubelet_images.store_key({"a": "sha256:1", "b": "sha256:2"})
    assert key == kubelet_images.store_key({"b": "sha256:2", "a": "sha256:1"})
    assert key != kubelet_images.store_key({"a": "sha256:1", "b": "sha256:3"})
    assert key != kubelet_images.store_key({"a": "sha256:1"})


def test_a_node_shares_the_stores_layers_but_writes_its_own_databases(tmp_path: Path) -> None:
    store = tmp_path / "store" / "root"
    blob = store / "io.containerd.content.v1.content" / "blobs" / "sha256" / "ab"
    layer = store / "io.containerd.snapshotter.v1.overlayfs" / "snapshots" / "1" / "fs" / "f"
    for f in (blob, layer, *(store / rel for rel in kubelet_images.STORE_DATABASES)):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f.name)
    node = tmp_path / "node" / "containerd" / "root"
    kubelet_images.copy_store(store, node)
    for f in (blob, layer):
        assert (node / f.relative_to(store)).stat().st_ino == f.stat().st_ino
    for rel in kubelet_images.STORE_DATABASES:
        assert (node / rel).stat().st_ino != (store / rel).stat().st_ino
        (node / rel).write_text("changed by the node")
        assert (store / rel).read_text() == Path(rel).name


def test_a_store_whose_seeded_import_fails_is_built_from_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen in CI: containerd refused the import into a copy of the previous store ("parent
    # snapshot ... does not exist"); the seed only saves time, the plane must still come up.
    monkeypatch.setattr(kubelet_images, "STORE_ROOT", tmp_path / "stores")
    monkeypatch.setattr(podman, "image_id", lambda image: f"sha256:{image}-new")
    old = tmp_path / "stores" / "old"
    (old / "root").mkdir(parents=True)
    (old / "images.json").write_text("[]")
    seeds: list[Path | None] = []

    def build(images: list[str], out: Path, log_file: Path, seed: Path | None) -> None:
        seeds.append(seed)
        if seed is not None:
            raise kubelet_spec.NodeError("ctr: parent snapshot sha256:c7ab does not exist")
        (out / "root").mkdir(parents=True)
        (out / "images.json").write_text('["workload"]')

    monkeypatch.setattr(kubelet_images, "_build_store", build)
    log = tmp_path / "store.log"
    with kubelet_images.image_store(["workload"], log) as root:
        assert root.is_dir() and root.parent.name == kubelet_images.store_key(
            {"workload": "sha256:workload-new"}
        )
    assert seeds == [old / "root", None]
    assert "importing without a seed" in log.read_text()
    assert not old.exists()  # the old store goes once the new one stands


def test_the_kubelet_waits_for_containerds_cri_not_only_its_socket(tmp_path: Path) -> None:
    # Seen in CI: the socket was there, the CRI still answered "server is not initialized
    # yet" (containerd recovering its images), and the kubelet started then exited for good.
    import grpc

    answers = iter([grpc.StatusCode.UNKNOWN, None])

    def version(request: bytes, context: grpc.ServicerContext) -> bytes:
        code = next(answers)
        if code is not None:
            context.abort(code, "server is not initialized yet")
        return b""

    handler = grpc.method_handlers_generic_handler(
        "runtime.v1.RuntimeService",
        {"Version": grpc.unary_unary_rpc_method_handler(version)},
    )
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(1), handlers=[handler])
    socket = tmp_path / "containerd.sock"
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        with pytest.raises(grpc.RpcError, match="not initialized"):
            kubelet.cri_ready(socket)
        assert kubelet.cri_ready(socket)
    finally:
        server.stop(None)
