"""The rendered hub chart installs on a real kube-apiserver with the real OCM CRDs.

Every object of `helm template` goes through a server-side dry-run first (schema, defaults,
validation of OCM's ClusterManagementAddOn / AddOnTemplate / AddOnDeploymentConfig and of the
RBAC objects), then is created for real. The CA hook's code runs against the same apiserver,
and the ServiceAccount's permissions are checked with SubjectAccessReviews, so RBAC is judged
by the apiserver's own authorizer, not by reading YAML.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.controlplane.plane import ControlPlane
from hack.helm import helm_binary
from hack.testing import wait_for
from hub_controller.bootstrap import ca_init, rbac
from ocmfl import constants
from ocmfl.kube import Kube

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "ocm-federated-learning"

# kind -> (API path prefix, plural, namespaced)
_PATHS: dict[str, tuple[str, str, bool]] = {
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Service": ("/api/v1", "services", True),
    "Secret": ("/api/v1", "secrets", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "ClusterManagementAddOn": (
        f"/apis/{constants.ADDON_GROUP}/v1alpha1",
        "clustermanagementaddons",
        False,
    ),
    "AddOnTemplate": (f"/apis/{constants.ADDON_GROUP}/v1alpha1", "addontemplates", False),
    "AddOnDeploymentConfig": (
        f"/apis/{constants.ADDON_GROUP}/v1alpha1",
        "addondeploymentconfigs",
        True,
    ),
    "CustomResourceDefinition": (
        "/apis/apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        False,
    ),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
}


def _collection(obj: dict[str, Any]) -> str:
    prefix, plural, namespaced = _PATHS[obj["kind"]]
    if namespaced:
        return f"{prefix}/namespaces/{obj['metadata']['namespace']}/{plural}"
    return f"{prefix}/{plural}"


def _helm() -> str:
    path = helm_binary()
    if path is None:
        pytest.skip("helm binary absent: build it with `bash hack/tools/build-helm.sh`")
    return path


@pytest.fixture
def hub(control_plane: ControlPlane) -> Iterator[Kube]:
    kube = Kube(control_plane.hub_kubeconfig)
    yield kube
    kube.close()


@pytest.fixture
def fl_namespace(hub: Kube) -> Iterator[str]:
    """The tenants' namespace (rbac.flNamespaces), another than the release's: the chart
    refuses to grant the controller Secrets where the CA Secrets are."""
    name = f"t-fl-{uuid.uuid4().hex[:6]}"
    hub.create("/api/v1/namespaces", {"metadata": {"name": name}}, exist_ok=False)
    yield name
    hub.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def rendered(
    namespace: str, fl_namespace: str, hub: Kube
) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    """(release, addon, objects) rendered for `namespace` with FederatedLearning resources in
    `fl_namespace`; cluster-scoped ones deleted after."""
    suffix = uuid.uuid4().hex[:6]
    release, addon = f"t{suffix}", f"fl-test-{suffix}"
    cmd = [
        _helm(),
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--include-crds",
        "--set",
        "hub.replicas=0",  # the chart's objects, not a second running controller
        "--set",
        f"addon.name={addon}",
        "--set",
        f"rbac.flNamespaces={{{fl_namespace}}}",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    yield release, addon, docs
    for d in docs:
        if not _PATHS[d["kind"]][2] and d["kind"] != "CustomResourceDefinition":
            hub.delete(f"{_collection(d)}/{d['metadata']['name']}")


def test_rendered_chart_passes_server_side_dry_run_and_installs(
    hub: Kube, namespace: str, rendered: tuple[str, str, list[dict[str, Any]]]
) -> None:
    _, addon, docs = rendered
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    for crd in crds:  # shared by every test: create once, never replace
        hub.create(_collection(crd), crd, exist_ok=True)
    objects = [
        d
        for d in docs
        if d["kind"] != "CustomResourceDefinition"
        and "helm.sh/hook" not in d["metadata"].get("annotations", {})
    ]
    for obj in objects:
        hub.request("POST", _collection(obj), obj, query={"dryRun": "All"})
    for obj in objects:
        hub.create(_collection(obj), obj, exist_ok=False)
    cma = hub.get(f"/apis/{constants.ADDON_GROUP}/v1alpha1/clustermanagementaddons/{addon}")
    assert cma is not None
    assert cma["spec"]["installStrategy"]["type"] == "Manual"
    # The admission policy's CEL type-checks against the real CRD schemas (its params too).
    vap = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    vap_path = f"{_collection(vap)}/{vap['metadata']['name']}"

    def checked() -> dict[str, Any] | None:
        live = hub.get(vap_path) or {}
        status = live.get("status") or {}
        done = status.get("observedGeneration") == live["metadata"]["generation"]
        return status if done else None

    status = wait_for(checked, 60, "the admission policy to be type-checked")
    assert not (status.get("typeChecking") or {}).get("expressionWarnings"), status
    template_name = next(d for d in docs if d["kind"] == "AddOnTemplate")["metadata"]["name"]
    template = hub.get(f"/apis/{constants.ADDON_GROUP}/v1alpha1/addontemplates/{template_name}")
    assert template is not None
    # Only KubeClient: OCM's addon manager signs nothing for the project (no CustomSigner,
    # whose CSRs it would approve from anyone; docs/security.md).
    assert template["spec"]["registration"] == [{"type": "KubeClient"}]
    assert len(template["spec"]["agentSpec"]["workload"]["manifests"]) >= 5
    # Hook objects are valid too.
    for hook in [d for d in docs if "helm.sh/hook" in d["metadata"].get("annotations", {})]:
        hub.request("POST", _collection(hook), hook, query={"dryRun": "All"})


def test_each_hub_part_is_allowed_exactly_what_rbac_py_declares(
    hub: Kube,
    namespace: str,
    fl_namespace: str,
    rendered: tuple[str, str, list[dict[str, Any]]],
) -> None:
    """The controller's and the signer's ServiceAccounts, judged by the apiserver's own
    authorizer: each may do what rbac.py declares for its part, and the controller can
    neither sign nor read a CA Secret."""
    _, addon, docs = rendered
    for obj in docs:
        if obj["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding") or (
            obj["kind"] in ("Role", "RoleBinding")
            and "helm.sh/hook" not in obj["metadata"].get("annotations", {})
        ):
            hub.create(_collection(obj), obj, exist_ok=False)
    accounts = {
        d["spec"]["template"]["spec"]["containers"][0]["args"][0]: d["spec"]["template"]["spec"][
            "serviceAccountName"
        ]
        for d in docs
        if d["kind"] == "Deployment"
    }
    assert set(accounts) == {"--role=controller", "--role=signer"}, accounts

    def allowed(
        sa: str, rule: rbac.Rule, verb: str, ns: str | None, name: str | None = None
    ) -> bool:
        resource, _, subresource = rule.resource.partition("/")
        attrs: dict[str, Any] = {
            "group": rule.group,
            "resource": resource,
            "subresource": subresource,
            "verb": verb,
        }
        if ns:
            attrs["namespace"] = ns
        if name:
            attrs["name"] = name
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{namespace}:{sa}",
                "resourceAttributes": attrs,
            },
        }
        res = hub.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        return bool(res["status"].get("allowed"))

    denied = []
    for role, rules in (
        ("--role=controller", rbac.CONTROLLER_RULES),
        ("--role=signer", rbac.SIGNER_RULES),
    ):
        for rule in rules:
            ns = {
                rbac.Scope.CLUSTER: None,
                rbac.Scope.FL_NAMESPACES: fl_namespace,  # rbac.flNamespaces above
                rbac.Scope.RELEASE_NAMESPACE: namespace,
            }[rule.scope]
            for verb in rule.verbs:
                names = rule.resource_names or (None,)
                if rule.resource == "clusterroles":  # named after this release's addon
                    names = tuple(str(n).replace(constants.ADDON_NAME, addon) for n in names)
                if not all(allowed(accounts[role], rule, verb, ns, n) for n in names):
                    denied.append(f"{role}: {verb} {rule.group}/{rule.resource} in {ns}")
    assert not denied, denied
    controller, signer = accounts["--role=controller"], accounts["--role=signer"]
    # Least privilege: FL-namespace grants do not leak to other namespaces, other signers fail.
    jobs = next(r for r in rbac.CONTROLLER_RULES if r.resource == "jobs")
    assert not allowed(controller, jobs, "create", "kube-system")
    signers = next(r for r in rbac.SIGNER_RULES if r.resource == "signers")
    assert not allowed(signer, signers, "sign", None, "kubernetes.io/kube-apiserver-client")
    # The controller (it parses tenant specs, serves gRPC) signs nothing, reads no CA.
    assert not allowed(controller, signers, "sign", None, constants.SIGNER_NAME)
    approval = next(r for r in rbac.SIGNER_RULES if r.resource.endswith("/approval"))
    assert not allowed(controller, approval, "update", None)
    secret = rbac.Rule("", "secrets", ("get",))
    for ca in (rbac.DEFAULT_CA_SECRET, rbac.DEFAULT_AGENT_CA_SECRET):
        assert not allowed(controller, secret, "get", namespace, ca), ca
        assert not allowed(signer, secret, "get", namespace, ca), ca  # mounted, never read


def test_ca_hook_creates_the_ca_once_and_publishes_it_to_the_deployment_config(
    control_plane: ControlPlane,
    hub: Kube,
    namespace: str,
    rendered: tuple[str, str, list[dict[str, Any]]],
) -> None:
    _, _, docs = rendered
    adc = next(d for d in docs if d["kind"] == "AddOnDeploymentConfig")
    hub.create(_collection(adc), adc, exist_ok=False)
    env = {**os.environ, "KUBECONFIG": control_plane.hub_kubeconfig}

    def hook(*args: str) -> str:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "hub_controller.bootstrap.ca_init",
                *args,
                "--namespace",
                namespace,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    made = hook("ensure-secret", "--secret", "ocm-fl-ca", "--agent-secret", "ocm-fl-agent-ca")
    assert "created" in made
    secret = hub.get(f"/api/v1/namespaces/{namespace}/secrets/ocm-fl-ca")
    agent_ca = hub.get(f"/api/v1/namespaces/{namespace}/secrets/ocm-fl-agent-ca")
    assert secret is not None and secret["type"] == "kubernetes.io/tls"
    assert agent_ca is not None and agent_ca["type"] == "kubernetes.io/tls"
    assert agent_ca["data"]["tls.crt"] != secret["data"]["tls.crt"]  # two CAs
    again_out = hook("ensure-secret", "--secret", "ocm-fl-ca", "--agent-secret", "ocm-fl-agent-ca")
    assert "exists" in again_out
    again = hub.get(f"/api/v1/namespaces/{namespace}/secrets/ocm-fl-ca")
    assert again is not None and again["data"] == secret["data"]  # never overwritten
    again_agent = hub.get(f"/api/v1/namespaces/{namespace}/secrets/ocm-fl-agent-ca")
    assert again_agent is not None and again_agent["data"] == agent_ca["data"]

    hook("publish", "--secret", "ocm-fl-ca", "--adc", adc["metadata"]["name"])
    live = hub.get(
        f"/apis/{constants.ADDON_GROUP}/v1alpha1/namespaces/{namespace}/addondeploymentconfigs/"
        f"{adc['metadata']['name']}"
    )
    assert live is not None
    variables = live["spec"]["customizedVariables"]
    # Agents get the hub CA (the aggregator's server certificate) and never the agent CA.
    assert ca_init.join_bundle(variables) == base64.b64decode(secret["data"]["tls.crt"])
    names = [v["name"] for v in variables]
    assert constants.ADDON_VAR_IMAGE in names and constants.ADDON_VAR_LOG_LEVEL in names
