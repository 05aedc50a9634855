"""OCM's real addon manager and registration agent run the chart's AddOnTemplate.

With the chart's addon objects on the hub and a ManagedClusterAddOn for cluster1 (what
`clusteradm addon enable` creates), OCM's addon manager (v1.2.0, built from the module
registry) must write a ManifestWork whose agent manifests have every {{VARIABLE}} filled from
the AddOnDeploymentConfig and the CA bundle that `hub_controller.bootstrap.ca_init` published.
Its only registration is KubeClient: cluster1's real registration agent makes the key on the
cluster, OCM approves and the hub's kube signer signs the CSR with OCM's default subject for
cluster1, and the result lands in the Secret the agent pod mounts. The agent then runs and the
addon turns Available by OCM's own health check.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from cryptography.x509.oid import NameOID

from hack.controlplane.plane import ControlPlane
from hack.helm import helm_binary
from hack.testing import wait_for
from hub_controller.bootstrap.addon_template import default_agent_subject
from ocmfl import constants, pki
from ocmfl.kube import Kube

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "ocm-federated-learning"
ADDON_API = f"/apis/{constants.ADDON_GROUP}/v1alpha1"
T = TypeVar("T")


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


def test_addon_manager_renders_the_agent_and_registration_gives_it_a_hub_kubeconfig(
    control_plane: ControlPlane,
    hub: Kube,
    namespace: str,
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
        enabled_at = time.monotonic()
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
        assert env_vars[constants.ENV_HUB_KUBECONFIG] == "/managed/hub-kubeconfig/kubeconfig"
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        # OCM mounts the KubeClient registration's Secret; the agent's own key and certificate
        # live in a memory emptyDir (nothing of OCM's there).
        assert {"/managed/hub-kubeconfig", constants.AGENT_CERT_DIR} <= mounts
        volumes = {v["name"]: v for v in pod["volumes"]}
        cert_mount = next(
            m for m in container["volumeMounts"] if m["mountPath"] == constants.AGENT_CERT_DIR
        )
        assert volumes[cert_mount["name"]]["emptyDir"]["medium"] == "Memory"
        secret = next(m for m in manifests if m["kind"] == "Secret")
        assert base64.b64decode(secret["data"]["ca.crt"]) == ca_pem
        assert "{{" not in json.dumps(manifests)

        # The registration OCM hands to the cluster's registration agent: KubeClient only.
        (reg,) = wait_for(
            lambda: _registrations(hub, cluster, addon), 60, "ManagedClusterAddOn registrations"
        )
        subject = default_agent_subject(cluster, addon)
        assert reg["signerName"] == constants.KUBE_APISERVER_CLIENT_SIGNER
        assert reg["subject"]["user"] == subject["user"]
        assert set(reg["subject"]["groups"]) == set(subject["groups"])
        # OCM's registration agent on the cluster makes the key there, sends the CSR, the addon
        # manager approves it and the hub's kube-controller-manager signs it; the agent stores
        # the result where the addon manager mounts it into the agent pod.
        spoke = Kube(control_plane.cluster_kubeconfigs[cluster])
        secret_path = (
            f"/api/v1/namespaces/{constants.AGENT_NAMESPACE}/secrets/{addon}-hub-kubeconfig"
        )
        try:
            stored = wait_for(
                lambda: (spoke.get(secret_path) or {}).get("data"),
                90,
                f"the registration agent to write {secret_path}",
            )
        finally:
            spoke.close()
        cert = pki.load_cert_pem(base64.b64decode(stored["tls.crt"]))
        plane_ca = pki.load_cert_pem(
            (Path(control_plane.state_dir) / "pki" / "ca.crt").read_bytes()
        )
        assert pki.verify_issued_by(cert, plane_ca)  # the hub's own kube signer
        with warnings.catch_warnings():  # OCM's user is longer than X.509's 64-char CN bound
            warnings.simplefilter("ignore", UserWarning)
            names = {a.oid: a.value for a in cert.subject}
        assert names[NameOID.COMMON_NAME] == subject["user"]
        kubeconfig = yaml.safe_load(base64.b64decode(stored["kubeconfig"]))
        user = kubeconfig["users"][0]["user"]
        assert (user["client-certificate"], user["client-key"]) == ("tls.crt", "tls.key")
        # Nothing for our own signers came from OCM: no CustomSigner CSR exists.
        csrs = hub.get(
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            query={"labelSelector": f"open-cluster-management.io/addon-name={addon}"},
        )
        signers = {c["spec"]["signerName"] for c in (csrs or {}).get("items") or []}
        assert signers == {constants.KUBE_APISERVER_CLIENT_SIGNER}, signers

        # The agent pod runs; OCM's health check (WorkloadAvailability) makes the addon
        # Available and the registration controller labels the cluster.
        def available() -> bool:
            mca = hub.get(f"{ADDON_API}/namespaces/{cluster}/managedclusteraddons/{addon}") or {}
            conds = (mca.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Available" and c["status"] == "True" for c in conds)

        wait_for(available, 120, f"{addon} Available on {cluster}")
        print(f"\naddon enabled -> Available: {time.monotonic() - enabled_at:.1f}s")
        label = f"feature.open-cluster-management.io/addon-{addon}"

        def labelled() -> bool:
            mc = hub.get(f"/apis/{constants.CLUSTER_GROUP}/v1/managedclusters/{cluster}") or {}
            return (mc.get("metadata", {}).get("labels") or {}).get(label) == "available"

        wait_for(labelled, 60, f"the label {label}=available on {cluster}")
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
