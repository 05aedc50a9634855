"""Unit tests of the local control plane's pure parts (no binaries, no apiserver)."""

from __future__ import annotations

import base64
import datetime as dt
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from hack.controlplane import certs, podplan
from ocmfl.constants import ADDON_IMAGE, APPS_DIR, WORKLOAD_IMAGE


def test_certificates_chain_to_the_ca_and_carry_subject_and_sans() -> None:
    ca = certs.make_ca()
    leaf = certs.issue(
        ca,
        "admin",
        orgs=("system:masters",),
        client=True,
        server=True,
        ip_addresses=("127.0.0.1",),
        dns_names=("localhost",),
    )
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    cert = x509.load_pem_x509_certificate(leaf.cert_pem)
    cert.verify_directly_issued_by(ca_cert)
    assert "O=system:masters" in cert.subject.rfc4514_string()
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_project_images_run_from_the_venv_and_unknown_images_are_refused() -> None:
    assert podplan.resolve_image(WORKLOAD_IMAGE).path.startswith(str(podplan.VENV_BIN))
    assert podplan.resolve_image(ADDON_IMAGE.replace("0.1.0", "9.9")).path.startswith(
        str(podplan.VENV_BIN)
    )
    assert podplan.resolve_image(
        "registry.k8s.io/e2e-test-images/busybox:1.29-4"
    ).default_command == ("sh",)
    with pytest.raises(podplan.NotRunnable) as e:
        podplan.resolve_image("docker.io/library/redis:7")
    assert e.value.reason == "ErrImagePull"  # kubelet's reason for an image it cannot get


def test_project_images_carry_the_example_apps_and_test_images_their_own(tmp_path: Path) -> None:
    [apps] = podplan.resolve_image(WORKLOAD_IMAGE).mounts
    assert apps == podplan.Mount(str(podplan.PROJECT_APPS), APPS_DIR, read_only=True)
    assert (podplan.PROJECT_APPS / "digits" / "pyproject.toml").is_file()
    image = "localhost/my-app:test"
    with pytest.raises(podplan.NotRunnable):
        podplan.resolve_image(image, podplan.read_local_images(tmp_path))
    podplan.register_local_image(tmp_path, image, tmp_path / "mine")
    runtime = podplan.resolve_image(image, podplan.read_local_images(tmp_path))
    assert runtime.path.startswith(str(podplan.VENV_BIN))
    assert runtime.mounts == (podplan.Mount(str(tmp_path / "mine"), APPS_DIR, read_only=True),)


def _pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p1", "namespace": "ns1", "uid": "u1", "labels": {"a": "b"}},
        "spec": {"containers": [], **spec},
    }


def test_env_resolves_values_field_refs_config_maps_secrets_and_expansion() -> None:
    data = {("configmap", "cm"): {"K": "from-cm", "X": "x"}, ("secret", "s"): {"pw": "hunter2"}}

    def lookup(kind: str, ns: str, name: str) -> dict[str, str] | None:
        return data.get((kind, name))

    ctr = {
        "name": "c",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "P_"}],
        "env": [
            {"name": "A", "value": "1"},
            {"name": "B", "value": "$(A)-$(POD_IP)-$$(A)"},
            {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "H", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']"}}},
            {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "K"}}},
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
        ],
    }
    env = podplan.container_env(
        _pod(), ctr, {"POD_IP": "10.200.16.2"}, lookup, "10.200.16.2", "10.200.16.1"
    )
    assert env["B"] == "1-10.200.16.2-$(A)"
    assert (env["N"], env["IP"], env["H"], env["L"], env["C"], env["S"]) == (
        "p1",
        "10.200.16.2",
        "10.200.16.1",
        "b",
        "from-cm",
        "hunter2",
    )
    assert env["P_X"] == "x"
    missing = {
        "name": "c",
        "env": [{"name": "Z", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}],
    }
    with pytest.raises(podplan.NotYet):
        podplan.container_env(_pod(), missing, {}, lookup, "10.200.16.2", "10.200.16.1")


def test_service_env_points_at_the_ready_pod_and_its_target_port() -> None:
    svc = {
        "metadata": {"name": "fl-server", "namespace": "ns1"},
        "spec": {
            "selector": {"app": "s"},
            "ports": [{"name": "grpc", "port": 80, "targetPort": "grpc"}],
        },
    }
    pod = {"spec": {"containers": [{"ports": [{"name": "grpc", "containerPort": 9092}]}]}}
    env = podplan.service_env([svc], lambda s: ("127.20.0.5", podplan.target_ports(s, pod)))
    assert env["FL_SERVER_SERVICE_HOST"] == "127.20.0.5"
    assert env["FL_SERVER_SERVICE_PORT"] == "9092"
    assert env["FL_SERVER_SERVICE_PORT_GRPC"] == "9092"
    assert podplan.service_env([svc], lambda s: None) == {}


def test_volumes_are_materialised_per_pod(tmp_path: Path) -> None:
    secret = {"tls.crt": "CERT"}
    pod = _pod(
        volumes=[
            {
                "name": "cfg",
                "configMap": {"name": "cm", "items": [{"key": "a", "path": "x/a.txt"}]},
            },
            {"name": "sec", "secret": {"secretName": "s"}},
            {"name": "scratch", "emptyDir": {}},
            {
                "name": "proj",
                "projected": {
                    "sources": [
                        {"configMap": {"name": "cm"}},
                        {
                            "downwardAPI": {
                                "items": [
                                    {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}
                                ]
                            }
                        },
                    ]
                },
            },
        ]
    )

    def lookup(kind: str, ns: str, name: str) -> dict[str, str] | None:
        return {"a": "A", "b": "B"} if kind == "configmap" else secret

    vols = podplan.materialise_volumes(pod, tmp_path, lookup, "10.200.8.9", "10.200.8.1")
    assert (vols["cfg"] / "x/a.txt").read_text() == "A"
    assert (vols["sec"] / "tls.crt").read_text() == "CERT"
    assert vols["scratch"].is_dir()
    assert (vols["proj"] / "b").read_text() == "B"
    assert (vols["proj"] / "ns").read_text() == "ns1"
    assert podplan.decode_secret({"k": base64.b64encode(b"v").decode()}) == {"k": "v"}


def test_a_claim_mounts_the_hostpath_of_its_bound_volume(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pod = {
        "metadata": {"namespace": "ns1"},
        "spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]},
    }
    pv = {"spec": {"hostPath": {"path": str(data), "type": "Directory"}}}
    pending = {"spec": {"volumeName": "pv1"}, "status": {"phase": "Pending"}}
    bound = {"spec": {"volumeName": "pv1"}, "status": {"phase": "Bound"}}
    claims: dict[str, tuple[Any, Any]] = {"d": (pending, pv)}

    def claim(ns: str, name: str) -> tuple[Any, Any]:
        return claims.get(name, (None, None))

    def lookup(kind: str, ns: str, name: str) -> dict[str, str] | None:
        return None

    # Like kubelet: the pod waits until the PV controller has bound the claim.
    with pytest.raises(podplan.NotYet, match="ns1/d is Pending, not Bound"):
        podplan.materialise_volumes(pod, tmp_path, lookup, "ip", "host", claims=claim)
    claims["d"] = (bound, pv)
    vols = podplan.materialise_volumes(pod, tmp_path, lookup, "ip", "host", claims=claim)
    assert vols["data"] == data
    claims["d"] = (bound, {"spec": {"csi": {"driver": "x"}}})
    with pytest.raises(podplan.NotRunnable, match="mounts only hostPath"):
        podplan.materialise_volumes(pod, tmp_path, lookup, "ip", "host", claims=claim)


def test_two_pods_see_their_own_files_at_the_same_mount_path(tmp_path: Path) -> None:
    target = tmp_path / "mnt"
    target.mkdir()
    procs = []
    for who in ("one", "two"):
        src = tmp_path / who
        src.mkdir()
        (src / "f").write_text(who)
        plan = podplan.ContainerPlan(
            "c",
            "busybox",
            ["sh", "-c", f"sleep 0.3; cat {target}/f"],
            {"PATH": podplan.SYSTEM_PATH},
            [podplan.Mount(str(src), str(target), read_only=True)],
        )
        procs.append(
            subprocess.Popen(
                podplan.launcher_argv(plan),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=plan.env,
            )
        )
    outs = [p.communicate(timeout=10)[0].decode() for p in procs]
    if any("Operation not permitted" in o for o in outs):
        pytest.skip("mount namespaces not permitted here")
    assert outs == ["one", "two"]
    assert list(target.iterdir()) == []  # nothing leaked into the host mount table


def test_a_volume_over_a_parent_of_the_repo_does_not_hide_the_project_venv(
    tmp_path: Path,
) -> None:
    """An emptyDir mounted at a parent of the checkout (the agent's /tmp, CI cloning into
    /tmp/...) must not hide the venv the project's images map to."""
    empty = tmp_path / "empty"
    empty.mkdir()
    parent = podplan.REPO_ROOT.parent
    plan = podplan.ContainerPlan(
        "c",
        "busybox",
        ["sh", "-c", f"test -x {podplan.VENV_BIN / 'python'} && ls {parent}"],
        {"PATH": podplan.SYSTEM_PATH},
        [podplan.Mount(str(empty), str(parent))],
    )
    out = subprocess.run(
        podplan.launcher_argv(plan), capture_output=True, text=True, env=plan.env, timeout=10
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # Only the repository is back in the emptied parent; nothing leaked into the host.
    assert out.stdout.split() == [podplan.REPO_ROOT.name]
    assert [p.name for p in empty.iterdir()] == [podplan.REPO_ROOT.name]


def test_csrcleaner_deletes_only_decided_requests_past_their_age() -> None:
    from hack.controlplane.csrcleaner import expired

    now = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
    old, fresh = "2026-12-03T11:58:00Z", "2026-12-03T11:59:30Z"

    def csr(conditions: list[tuple[str, str]], certificate: bool) -> dict[str, Any]:
        status: dict[str, Any] = {
            "conditions": [
                {"type": t, "status": "True", "lastUpdateTime": at} for t, at in conditions
            ]
        }
        if certificate:
            status["certificate"] = "Y2VydA=="
        return {"metadata": {"creationTimestamp": old}, "status": status}

    assert expired(csr([("Approved", old)], certificate=True), now)  # issued a while ago
    assert expired(csr([("Denied", old)], certificate=False), now)
    assert not expired(csr([("Approved", fresh)], certificate=True), now)  # just issued
    assert not expired(csr([("Approved", old)], certificate=False), now)  # not signed yet
    assert not expired(csr([], certificate=False), now)  # pending: OCM's or an admin's to decide
