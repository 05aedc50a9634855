"""The chart's ValidatingAdmissionPolicy is generated from hub_controller.policy, renders as
built there, and no role in the chart lets anyone but the admin write FederationPolicies."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from hack.codegen import admissiongen
from hub_controller import policy
from hub_controller.api import parse_spec

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "ocm-federated-learning"
RELEASE = "ocm-fl"
WRITE = {"create", "update", "patch", "delete", "deletecollection", "*"}


def render(helm: str, *sets: str) -> list[dict[str, Any]]:
    cmd = [helm, "template", RELEASE, str(CHART), "--namespace", "ocm-fl-system"]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_committed_template_is_generated_from_the_policy_module() -> None:
    assert admissiongen.TEMPLATE.read_text() == admissiongen.render(), (
        "the admission policy template is stale: run `python -m hack.codegen.admissiongen > "
        f"{admissiongen.TEMPLATE.relative_to(CHART.parents[2])}`"
    )


def test_rendered_policy_and_bindings_are_the_policy_modules(helm: str) -> None:
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    docs = [d for d in render(helm) if d["kind"] in kinds]
    fullname = f"{RELEASE}-ocm-federated-learning"
    want = policy.admission_objects(fullname)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        (w["kind"], w["metadata"]["name"]) for w in want
    ]
    for got, expected in zip(docs, want, strict=True):
        assert got["spec"] == expected["spec"]
        assert got["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    [binding] = [d for d in bindings if d["spec"]["paramRef"]["parameterNotFoundAction"] == "Deny"]
    # The apiserver's only words when the namespace has no policy are the binding's name.
    assert "needs-federationpolicy-default" in binding["metadata"]["name"]
    assert binding["spec"]["matchResources"]["resourceRules"][0]["operations"] == ["CREATE"]


def test_admission_policy_can_be_turned_off(helm: str) -> None:
    docs = render(helm, "admissionPolicy.enabled=false")
    assert not [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")]


def test_no_role_in_the_chart_writes_federation_policies(helm: str) -> None:
    """Tenants get no way to write their own policy from the chart; the controller reads."""
    docs = render(helm, "rbac.flNamespaces={team-a}")
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    assert roles
    readers = 0
    for role in roles:
        assert "aggregationRule" not in role, role["metadata"]["name"]
        labels = role["metadata"].get("labels") or {}
        assert not [k for k in labels if "aggregate-to" in k], role["metadata"]["name"]
        for rule in role.get("rules") or []:
            resources = set(rule.get("resources") or [])
            if not resources & {policy.PLURAL, "*"}:
                continue
            assert not WRITE & set(rule["verbs"]), (role["metadata"]["name"], rule)
            readers += 1
    assert readers == 1  # the controller's ClusterRole: get, list, watch


def test_advertise_domain_rule() -> None:
    allows = policy.domain_allows
    assert allows("fl.example.com", "fl.example.com")
    assert allows("fl.example.com", "hub.fl.example.com")
    assert allows("FL.Example.com", "hub.fl.example.com")
    assert not allows("fl.example.com", "evilfl.example.com")
    assert not allows("fl.example.com", "fl.example.com.evil.io")
    assert allows("127.0.0.1", "127.0.0.1")
    assert not allows("0.0.1", "127.0.0.1")  # an IP entry is never a suffix
    assert policy.advertised_host("[::1]:9443") == "::1"
    assert policy.advertised_host("Hub.Example.com:443") == "hub.example.com"


def test_example_policy_allows_the_example_resource_and_the_demos_apply_it() -> None:
    root = CHART.parents[2]
    doc = yaml.safe_load((root / "examples" / "federationpolicy.yaml").read_text())
    assert (doc["kind"], doc["metadata"]["name"]) == (policy.KIND, policy.POLICY_NAME)
    fl = yaml.safe_load((root / "examples" / "federatedlearning.yaml").read_text())
    assert doc["metadata"]["namespace"] == fl["metadata"]["namespace"]
    spec = parse_spec(fl["spec"], fl["metadata"]["name"])
    assert policy.violations(spec, policy.parse_policy(doc["spec"]), "fl") == []
    assert "examples/federationpolicy.yaml" in (root / "examples" / "kind" / "demo.sh").read_text()
    assert "federationpolicy.yaml" in (root / "examples" / "demo.py").read_text()
