"""OCM's real addon manager renders the chart's AddOnTemplate and signs agent CSRs with our CA.

With the chart's addon objects on the hub and a ManagedClusterAddOn for cluster1 (what
`clusteradm addon enable` creates), OCM's addon manager (v1.2.0, built from the module
registry) must write a ManifestWork whose agent manifests have every {{VARIABLE}} filled from
the AddOnDeploymentConfig, the CA bundle joined back together and the CustomSigner client
certificate mounted at constants.AGENT_CERT_DIR. A CSR made the way OCM's registration agent
makes it is then approved and signed with the CA Secret that `hub_controller.bootstrap.ca_init`
created, and the certificate names cluster1 (ocmfl.pki).

Uses the plane's addon manager when it runs one (OCMFL_CP_ADDON_MANAGER=1), else starts one
for this module and stops it afterwards.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from hack.controlplane import addon_registration
from hack.controlplane.plane import ControlPlane
from hack.helm import helm_binary
from hack.testing import wait_for
from ocmfl import constants, pki
from ocmfl.kube import Kube

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "ocm-federated-learning"
ADDON_API = f"/apis/{constants.ADDON_GROUP}/v1alpha1"
T = TypeVar("T")


@pytest.fixture(scope="module")
def addon_manager(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    from hack.controlplane import build, processes

    state = processes.State.load()
    if state is not None and state.addon_manager:
        yield
        return
    log = tmp_path_factory.mktemp("addon-manager") / "addon-manager.log"
    port = processes.free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(build.binary("addon")),
                "manager",
                f"--kubeconfig={control_plane.hub_kubeconfig}",
                f"--listen=127.0.0.1:{port}",
                "--disable-leader-election",
                f"--namespace={constants.HUB_NAMESPACE}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        time.sleep(2)
        assert proc.poll() is None, log.read_text()[-3000:]
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def hub(control_plane: ControlPlane) -> Iterator[Kube]:
    kube = Kube(control_plane.hub_kubeconfig)
    yield kube
    kube.close()


def _path(obj: dict[str, Any]) -> str:
    kind, meta = obj["kind"], obj["metadata"]
    plural = {
        "ClusterManagementAddOn": "clustermanagementaddons",
        "AddOnTemplate": "addontemplates",
        "AddOnDeploymentConfig": "addondeploymentconfigs",
    }[kind]
    ns = f"/namespaces/{meta['namespace']}" if "namespace" in meta else ""
    return f"{ADDON_API}{ns}/{plural}"


def test_addon_manager_renders_agent_and_signs_its_csr_with_our_ca(
    control_plane: ControlPlane,
    addon_manager: None,
    hub: Kube,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm binary absent: build it with `bash hack/tools/build-helm.sh`")
    cluster = sorted(control_plane.cluster_kubeconfigs)[0]
    addon = f"fl-test-{uuid.uuid4().hex[:6]}"
    out = subprocess.run(
        [
            helm,
            "template",
            "t",
            str(CHART),
            "--namespace",
            namespace,
            "--set",
            f"addon.name={addon}",
            "--set",
            "aggregator.externalAddress=hub.example:30443",
            "--set",
            "addon.agentLogLevel=DEBUG",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d and d["kind"] in _ADDON_KINDS]
    created: list[str] = []
    try:
        for d in docs:
            hub.create(_path(d), d, exist_ok=False)
            if "namespace" not in d["metadata"]:
                created.append(f"{_path(d)}/{d['metadata']['name']}")
        env = {**os.environ, "KUBECONFIG": control_plane.hub_kubeconfig}
        for args in (
            ["ensure-secret", "--secret", "ocm-fl-ca"],
            ["publish", "--secret", "ocm-fl-ca", "--adc", addon],
        ):
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "hub_controller.bootstrap.ca_init",
                    *args,
                    "--namespace",
                    namespace,
                ],
                env=env,
                check=True,
                capture_output=True,
                timeout=120,
            )
        ca_secret = hub.get(f"/api/v1/namespaces/{namespace}/secrets/ocm-fl-ca")
        assert ca_secret is not None
        ca_pem = base64.b64decode(ca_secret["data"]["tls.crt"])

        # What `clusteradm addon enable --names <addon> --clusters <cluster>` creates.
        mca = {
            "apiVersion": f"{constants.ADDON_GROUP}/v1alpha1",
            "kind": "ManagedClusterAddOn",
            "metadata": {"name": addon, "namespace": cluster},
            "spec": {"installNamespace": constants.AGENT_NAMESPACE},
        }
        hub.create(f"{ADDON_API}/namespaces/{cluster}/managedclusteraddons", mca, exist_ok=False)
        created.append(f"{ADDON_API}/namespaces/{cluster}/managedclusteraddons/{addon}")

        work = wait_for(
            lambda: _addon_work(hub, cluster, addon), 120, f"the addon ManifestWork for {addon}"
        )
        manifests = work["spec"]["workload"]["manifests"]
        dep = next(m for m in manifests if m["kind"] == "Deployment")
        pod = dep["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["image"] == constants.ADDON_IMAGE
        env_vars = {e["name"]: e.get("value") for e in container["env"]}
        assert env_vars[constants.ENV_HUB_AGGREGATOR_ADDRESS] == "hub.example:30443"
        assert env_vars[constants.ENV_CLUSTER_NAME] == cluster
        assert env_vars[constants.ENV_LOG_LEVEL] == "DEBUG"
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert constants.AGENT_CERT_DIR in mounts  # injected by OCM for the CustomSigner
        secret = next(m for m in manifests if m["kind"] == "Secret")
        assert base64.b64decode(secret["data"]["ca.crt"]) == ca_pem
        assert "{{" not in json.dumps(manifests)

        # The registration config OCM hands to the cluster's registration agent ...
        mca_live = wait_for(
            lambda: _registrations(hub, cluster, addon), 60, "ManagedClusterAddOn registrations"
        )
        (reg,) = [r for r in mca_live if r["signerName"] == constants.SIGNER_NAME]
        subject = reg["subject"]
        # ... and the CSR that agent would create from it.
        csr_pem, _ = addon_registration.make_csr(subject["user"], subject.get("groups", []))
        csr = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {
                "generateName": f"addon-{cluster}-{addon}-",
                "labels": {
                    "open-cluster-management.io/cluster-name": cluster,
                    "open-cluster-management.io/addon-name": addon,
                },
            },
            "spec": {
                "request": base64.b64encode(csr_pem).decode(),
                "signerName": constants.SIGNER_NAME,
                "usages": ["digital signature", "key encipherment", "client auth"],
            },
        }
        made = hub.request("POST", "/apis/certificates.k8s.io/v1/certificatesigningrequests", csr)
        csr_path = (
            f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{made['metadata']['name']}"
        )
        created.append(csr_path)
        signed = wait_for(
            lambda: (hub.get(csr_path) or {}).get("status", {}).get("certificate"),
            90,
            "OCM to approve and sign the agent CSR",
        )
        cert = pki.load_cert_pem(base64.b64decode(signed))
        assert pki.verify_issued_by(cert, pki.load_cert_pem(ca_pem))
        # Bound to this addon: a certificate of another addon names no cluster for us.
        with pytest.raises(pki.IdentityError, match="belongs to addon"):
            pki.cluster_from_certificate(cert)
        monkeypatch.setattr(constants, "ADDON_NAME", addon)
        assert pki.cluster_from_certificate(cert) == cluster
    finally:
        for path in reversed(created):
            hub.delete(path)


_ADDON_KINDS = {"ClusterManagementAddOn", "AddOnTemplate", "AddOnDeploymentConfig"}


def _addon_work(hub: Kube, cluster: str, addon: str) -> dict[str, Any] | None:
    works = hub.get(
        f"/apis/{constants.WORK_GROUP}/v1/namespaces/{cluster}/manifestworks",
        query={"labelSelector": f"open-cluster-management.io/addon-name={addon}"},
    )
    items = (works or {}).get("items") or []
    return items[0] if items else None


def _registrations(hub: Kube, cluster: str, addon: str) -> list[dict[str, Any]] | None:
    mca = hub.get(f"{ADDON_API}/namespaces/{cluster}/managedclusteraddons/{addon}")
    regs: list[dict[str, Any]] = ((mca or {}).get("status") or {}).get("registrations") or []
    return regs or None
