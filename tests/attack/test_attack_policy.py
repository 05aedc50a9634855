"""Attacks on the admin's per-namespace policy (issue 12 items 3, 4 and 8): a tenant who may
create FederatedLearning resources in namespace team-a tries to use another team's data, a
writable mount, an image from elsewhere, a hub host directory, a certificate name of their
choosing, or a namespace the admin never granted.

Each is refused twice: by the controller (pure `hub_controller.policy.violations` and one
reconcile pass that applies nothing) and, on the real local kube-apiserver, by the chart's
ValidatingAdmissionPolicy at create time, with a message naming the field and the fix.
"""

from __future__ import annotations

import copy
import logging
import uuid
from typing import TYPE_CHECKING, Any

import kopf
import pytest

from hub_controller import policy
from hub_controller.api import FLRef, parse_spec
from hub_controller.operator import reconcile as reconciler
from hub_controller.operator.indexes import Indexes
from hub_controller.reports import NoReports
from ocmfl import constants, pki

if TYPE_CHECKING:
    from hack.controlplane.plane import ControlPlane
    from ocmfl.kube import Kube

pytestmark = pytest.mark.attack

OURS = "team-a.data.ocmfl.io"
THEIRS = "team-b.data.ocmfl.io"
GRANT: dict[str, Any] = {
    "allowedImagePrefixes": ["quay.io/ocm-fl/"],
    "allowedDataClaims": [OURS],
    "allowedAdvertiseDomains": ["fl.example.com"],
    "allowedAppPathPrefixes": [f"{constants.APPS_DIR}/"],
}


def tenant_spec() -> dict[str, Any]:
    """What team-a may run: its own claim, project images, PVC storage, read-only data."""
    return {
        "server": {
            "rounds": 1,
            "minAvailableClients": 9,
            "app": {"path": f"{constants.APPS_DIR}/digits"},
            "storage": {"type": "PVC", "size": "1Gi"},
        },
        "client": {
            "dataClaim": OURS,
            "placement": {
                "clusterSets": ["global"],
                "predicates": [
                    {
                        "requiredClusterSelector": {
                            "claimSelector": {
                                "matchExpressions": [{"key": OURS, "operator": "Exists"}]
                            }
                        }
                    }
                ],
            },
        },
    }


def _other_claim(s: dict[str, Any]) -> None:
    s["client"]["dataClaim"] = THEIRS


def _other_claim_by_placement(s: dict[str, Any]) -> None:
    """dataClaim left out: the claim the placement selects with Exists becomes the data."""
    del s["client"]["dataClaim"]
    s["client"]["placement"]["predicates"][0]["requiredClusterSelector"]["claimSelector"] = {
        "matchExpressions": [{"key": THEIRS, "operator": "Exists"}]
    }


def _writable(s: dict[str, Any]) -> None:
    s["client"]["dataMount"] = {"mountPath": "/data", "readOnly": False}


def _server_image(s: dict[str, Any]) -> None:
    s["server"]["image"] = "docker.io/attacker/miner:1"


def _client_image_lookalike(s: dict[str, Any]) -> None:
    s["client"]["image"] = "quay.io/ocm-fl-evil/workload:0.1.0"  # not under quay.io/ocm-fl/


def _host_path(s: dict[str, Any]) -> None:
    s["server"]["storage"] = {"type": "HostPath"}


def _advertise_elsewhere(s: dict[str, Any]) -> None:
    s["server"]["advertiseAddress"] = "login.bank.example.org:443"


def _advertise_lookalike(s: dict[str, Any]) -> None:
    s["server"]["advertiseAddress"] = "evilfl.example.com:443"  # not a subdomain


# (attack, field the refusal names, words of the fix)
ATTACKS = {
    "another team's claim": (_other_claim, "spec.client.dataClaim", "allowedDataClaims"),
    "another team's claim by placement": (
        _other_claim_by_placement,
        "spec.client.placement",
        "allowedDataClaims",
    ),
    "writable mount against policy": (
        _writable,
        "spec.client.dataMount.readOnly",
        "allowWritableDataMount: true",
    ),
    "server image outside prefixes": (_server_image, "spec.server.image", "allowedImagePrefixes"),
    "client image outside prefixes": (
        _client_image_lookalike,
        "spec.client.image",
        "allowedImagePrefixes",
    ),
    "HostPath store not allowed": (_host_path, "spec.server.storage.type", "allowHostPathStore"),
    "advertiseAddress outside policy": (
        _advertise_elsewhere,
        "spec.server.advertiseAddress",
        "allowedAdvertiseDomains",
    ),
    "advertiseAddress look-alike domain": (
        _advertise_lookalike,
        "spec.server.advertiseAddress",
        "allowedAdvertiseDomains",
    ),
}


def attacked(name: str) -> dict[str, Any]:
    spec = tenant_spec()
    ATTACKS[name][0](spec)
    return spec


def grant() -> policy.FederationPolicySpec:
    return policy.parse_policy(GRANT)


# --- the controller's check ----------------------------------------------------------------
def test_the_tenants_own_spec_is_allowed() -> None:
    ok = tenant_spec()
    ok["server"]["advertiseAddress"] = "hub.fl.example.com:443"
    assert policy.violations(parse_spec(ok), grant(), "team-a") == []


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_controller_refuses_naming_the_field_and_the_fix(name: str) -> None:
    _, field, fix = ATTACKS[name]
    [found] = policy.violations(parse_spec(attacked(name)), grant(), "team-a")
    assert found.field == field
    assert fix in found.message and "team-a" in found.message


def test_no_policy_in_the_namespace_refuses_everything() -> None:
    [found] = policy.violations(parse_spec(tenant_spec()), None, "team-c")
    assert "no FederationPolicy named default" in found.message
    assert "hub admin must create one" in found.message


def test_advertise_address_refused_when_the_policy_names_no_domain() -> None:
    spec = tenant_spec()
    spec["server"]["advertiseAddress"] = "hub.fl.example.com:443"
    no_domains = policy.parse_policy({**GRANT, "allowedAdvertiseDomains": []})
    [found] = policy.violations(parse_spec(spec), no_domains, "team-a")
    assert found.field == "spec.server.advertiseAddress"


def test_default_storage_is_checked_as_the_controller_resolves_it() -> None:
    """storage left out: whatever type the API defaults to is what the policy judges."""
    spec = tenant_spec()
    del spec["server"]["storage"]
    parsed = parse_spec(spec)
    found = policy.violations(parsed, grant(), "team-a")
    is_host_path = parsed.server.storage.type.value == "HostPath"
    assert [v.field for v in found] == (["spec.server.storage.type"] if is_host_path else [])


# --- one reconcile pass: Failed, naming the field, nothing applied --------------------------
class RecordingKube:
    """Records every write the controller makes."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []
        self.status_patches: list[dict[str, Any]] = []

    def apply(self, obj: dict[str, Any], path: str | None = None) -> dict[str, Any]:
        self.writes.append(("apply", obj))
        return obj

    def create(self, path: str, body: dict[str, Any], exist_ok: bool = True) -> dict[str, Any]:
        self.writes.append(("create", body))
        return body

    def delete(self, path: str, query: Any = None, body: Any = None) -> None:
        self.writes.append(("delete", path))

    def get(self, path: str) -> None:
        return None

    def patch(self, path: str, body: Any, content_type: str = "") -> dict[str, Any]:
        assert path.endswith("/status"), path
        self.status_patches.append(body["status"])
        return {}


REF = FLRef(namespace="team-a", name="digits", uid="uid-1")


def _indexes(policy_spec: dict[str, Any] | None) -> Indexes:
    return Indexes.of(
        {
            "placement_idx": {},
            "decision_idx": {(REF.namespace, REF.name): [("c1",)]},
            "cluster_idx": {},
            "addon_idx": {},
            "work_idx": {},
            "server_job_idx": {},
            "server_service_idx": {},
            "server_pod_idx": {},
            "policy_idx": {REF.namespace: [policy_spec]} if policy_spec is not None else {},
        }
    )


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> RecordingKube:
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(kopf, "warn", lambda body, reason, message: events.append((reason, "")))
    monkeypatch.setattr(kopf, "info", lambda body, reason, message: None)
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    fake = RecordingKube()
    fake.events = events  # type: ignore[attr-defined]
    return fake


def _reconcile(
    kube: RecordingKube, tmp: Any, spec: dict[str, Any], grant_spec: dict[str, Any] | None
) -> reconciler.Run:
    pki.save_tls_dir(tmp / "ca", pki.create_ca("attack-ca"), None)
    op = reconciler.Operator(kube=kube)  # type: ignore[arg-type]
    body = {
        "metadata": {"namespace": REF.namespace, "name": REF.name, "uid": REF.uid, "generation": 1},
        "spec": spec,
    }
    state = reconciler.Run(REF, status={})
    log = logging.getLogger("attack")
    reconciler.reconcile(op, NoReports(), body, _indexes(grant_spec), state, log)
    return state


@pytest.mark.parametrize(
    ("name", "grant_spec"),
    [("another team's claim", GRANT), ("HostPath store not allowed", GRANT), ("none", None)],
)
def test_reconcile_fails_the_resource_and_creates_nothing(
    kube: RecordingKube, tmp_path: Any, name: str, grant_spec: dict[str, Any] | None
) -> None:
    spec = attacked(name) if name in ATTACKS else tenant_spec()
    _reconcile(kube, tmp_path, spec, grant_spec)
    assert kube.writes == []  # no Placement, Service, Secret, PVC, work or Job
    [status] = kube.status_patches
    assert status["phase"] == "Failed"
    [cond] = status["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "Validated",
        "False",
        "PolicyViolation",
    )
    field = ATTACKS[name][1] if name in ATTACKS else "FederationPolicy named default"
    assert field in status["message"]
    assert kube.events == [("PolicyViolation", "")]  # type: ignore[attr-defined]


def test_reconcile_of_the_granted_spec_proceeds(kube: RecordingKube, tmp_path: Any) -> None:
    _reconcile(kube, tmp_path, tenant_spec(), GRANT)
    assert [w[1]["kind"] for w in kube.writes if w[0] == "apply"][:2] == ["Placement", "Service"]
    assert kube.status_patches[-1]["phase"] != "Failed"


# --- the apiserver refuses at create time (real kube-apiserver, the chart's CEL) ------------
@pytest.fixture
def team_a(hub: Kube, namespace: str) -> str:
    """A tenant namespace granted GRANT by the admin."""
    from hack.localfed import grant_namespace

    grant_namespace(
        hub,
        namespace,
        image_prefixes=GRANT["allowedImagePrefixes"],
        data_claims=GRANT["allowedDataClaims"],
        advertise_domains=GRANT["allowedAdvertiseDomains"],
    )
    return namespace


def fl_path(namespace: str, name: str = "") -> str:
    base = f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{constants.PLURAL}"
    return f"{base}/{name}" if name else base


def fl_body(namespace: str, spec: dict[str, Any], name: str = "digits") -> dict[str, Any]:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def refusal(hub: Kube, namespace: str, spec: dict[str, Any]) -> str:
    """The apiserver's message refusing to create a resource with `spec` in `namespace`."""
    from ocmfl.kube import KubeError

    with pytest.raises(KubeError) as exc:
        hub.create(fl_path(namespace), fl_body(namespace, spec, f"x-{uuid.uuid4().hex[:6]}"))
    assert exc.value.status in (403, 422), exc.value
    return exc.value.message


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_apiserver_refuses_every_attack_at_create_time(hub: Kube, team_a: str) -> None:
    for name, (_, field, fix) in sorted(ATTACKS.items()):
        message = refusal(hub, team_a, attacked(name))
        assert field in message and fix in message, (name, message)
        assert "ValidatingAdmissionPolicy" in message, (name, message)
    # The same tenant's own spec is admitted; nothing above was.
    hub.create(fl_path(team_a), fl_body(team_a, tenant_spec()), exist_ok=False)
    names = [i["metadata"]["name"] for i in (hub.get(fl_path(team_a)) or {})["items"]]
    assert names == ["digits"]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_apiserver_refuses_a_spec_change_into_an_attack_but_not_metadata_changes(
    hub: Kube, team_a: str
) -> None:
    """Admitted first, then patched: the spec change is refused; a metadata-only change (the
    controller's finalizer) still passes, even after the admin removed the policy."""
    from ocmfl.kube import KubeError

    hub.create(fl_path(team_a), fl_body(team_a, tenant_spec()), exist_ok=False)
    path = fl_path(team_a, "digits")
    with pytest.raises(KubeError) as exc:
        hub.patch(path, {"spec": {"client": {"dataMount": {"readOnly": False}}}})
    assert "spec.client.dataMount.readOnly" in exc.value.message
    policy_path = (
        f"/apis/{constants.API_VERSION}/namespaces/{team_a}/{policy.PLURAL}/{policy.POLICY_NAME}"
    )
    hub.delete(policy_path)
    hub.patch(path, {"metadata": {"finalizers": ["example.com/keep"]}})
    hub.patch(path, {"metadata": {"finalizers": None}})
    hub.delete(path)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_apiserver_refuses_a_namespace_without_policy(hub: Kube, namespace: str) -> None:
    message = refusal(hub, namespace, copy.deepcopy(tenant_spec()))
    # The apiserver names only the binding here; its name carries the fix.
    assert "needs-federationpolicy-default-in-namespace" in message, message
    assert "no params found" in message, message


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_controller_refuses_what_the_policy_no_longer_allows_and_applies_nothing(
    control_plane: ControlPlane,
    hub: Kube,
    team_a: str,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Admitted under the old policy, then the admin withdrew the claim before the controller
    saw the resource: the controller (kopf, in-process, on the real hub) fails it naming the
    field and creates nothing, on the hub or for any cluster."""
    from kopf.testing import KopfRunner

    from hack.localfed import grant_namespace
    from hack.testing import kopf_registry, wait_for

    hub.create(fl_path(team_a), fl_body(team_a, tenant_spec()), exist_ok=False)
    grant_namespace(
        hub, team_a, image_prefixes=GRANT["allowedImagePrefixes"], data_claims=["other.claim"]
    )
    monkeypatch.setenv("KUBECONFIG", control_plane.hub_kubeconfig)
    pki.save_tls_dir(tmp_path / "hub-ca", pki.create_ca("attack-hub-ca"), None)
    monkeypatch.setenv(constants.ENV_CA_DIR, str(tmp_path / "hub-ca"))
    watched = [f"--namespace={n}" for n in (team_a, *control_plane.clusters)]
    registry = kopf_registry("hub_controller.operator.handlers")
    path = fl_path(team_a, "digits")
    with KopfRunner(["run", "--standalone", *watched], registry=registry, timeout=60) as runner:

        def failed() -> dict[str, Any] | None:
            status = (hub.get(path) or {}).get("status") or {}
            return status if status.get("phase") == "Failed" else None

        status = wait_for(failed, 60, "the resource Failed by policy")
        hub.delete(path)
        wait_for(lambda: hub.get(path) is None, 60, "the resource gone")
    assert runner.exception is None, runner.exception
    assert "spec.client.dataClaim" in status["message"], status
    assert "allowedDataClaims" in status["message"], status
    [cond] = status["conditions"]
    assert cond["reason"] == "PolicyViolation"
    for kind_path in (
        f"/apis/{constants.CLUSTER_GROUP}/v1beta1/namespaces/{team_a}/placements",
        f"/api/v1/namespaces/{team_a}/services",
        f"/api/v1/namespaces/{team_a}/persistentvolumeclaims",
        f"/apis/batch/v1/namespaces/{team_a}/jobs",
    ):
        assert not (hub.get(kind_path) or {}).get("items"), kind_path
    selector = f"{constants.LABEL_OWNER_NAMESPACE}={team_a}"
    works = hub.get(f"/apis/{constants.WORK_GROUP}/v1/manifestworks", {"labelSelector": selector})
    assert not (works or {}).get("items")


# --- privacy the admin requires (issue 33): for a data claim, or the whole namespace --------
PRIVACY_RULE: dict[str, Any] = {"mode": "central", "maxClippingNorm": 2.0,
                                "minNoiseMultiplier": 1.0}  # fmt: skip
GOOD_DP: dict[str, Any] = {"mode": "central", "clippingNorm": 1.0, "noiseMultiplier": 1.2}
# (the resource's differentialPrivacy, the field the refusal names, words of the refusal)
PRIVACY_CASES: dict[str, tuple[dict[str, Any] | None, str, str]] = {
    "no privacy": (None, "spec.privacy.differentialPrivacy", "is required"),
    "local where central is required": (
        {"mode": "local", "clippingNorm": 1.0, "epsilon": 0.5},
        "spec.privacy.differentialPrivacy.mode",
        "is not allowed",
    ),
    "a clipping norm over the cap": (
        {**GOOD_DP, "clippingNorm": 5.0},
        "spec.privacy.differentialPrivacy.clippingNorm",
        "too large",
    ),
    "too little noise": (
        {**GOOD_DP, "noiseMultiplier": 0.5},
        "spec.privacy.differentialPrivacy.noiseMultiplier",
        "too small",
    ),
    "adaptive clipping under a norm cap": (
        {**GOOD_DP, "clipping": "adaptive", "clippedCountStddev": 1.0},
        "spec.privacy.differentialPrivacy.clipping",
        "adaptive clipping is not allowed",
    ),
}


def with_privacy(dp: dict[str, Any] | None) -> dict[str, Any]:
    spec = tenant_spec()
    if dp is not None:
        spec["privacy"] = {"differentialPrivacy": dp}
    return spec


@pytest.mark.parametrize("name", sorted(PRIVACY_CASES))
def test_controller_requires_the_privacy_the_policy_names_for_the_data_claim(name: str) -> None:
    dp, field, words = PRIVACY_CASES[name]
    rules = policy.parse_policy({**GRANT, "requirePrivacyForClaims": {OURS: PRIVACY_RULE}})
    [found] = policy.violations(parse_spec(with_privacy(dp)), rules, "team-a")
    assert found.field == field and words in found.message
    assert f"requirePrivacyForClaims[{OURS}]" in found.message and "team-a" in found.message
    assert policy.violations(parse_spec(with_privacy(GOOD_DP)), rules, "team-a") == []


def test_a_namespace_wide_privacy_rule_holds_local_dp_to_its_epsilon() -> None:
    rules = policy.parse_policy({**GRANT, "requirePrivacy": {"maxEpsilon": 0.3}})
    local = {"mode": "local", "clippingNorm": 1.0, "epsilon": 0.5}
    [found] = policy.violations(parse_spec(with_privacy(local)), rules, "team-a")
    assert found.field == "spec.privacy.differentialPrivacy.epsilon"
    assert "requirePrivacy: mode central or local, epsilon <= 0.3 (local)" in found.message
    assert policy.violations(parse_spec(with_privacy({**local, "epsilon": 0.2})), rules,
                             "team-a") == []  # fmt: skip
    [missing] = policy.violations(parse_spec(tenant_spec()), rules, "team-a")
    assert missing.field == "spec.privacy.differentialPrivacy"


def test_a_privacy_rule_can_require_secure_aggregation_as_well() -> None:
    rules = policy.parse_policy({**GRANT, "requirePrivacy": {"secureAggregation": True}})
    spec = with_privacy(GOOD_DP)
    [found] = policy.violations(parse_spec(spec), rules, "team-a")
    assert found.field == "spec.privacy.secureAggregation"
    assert "secure aggregation is required in namespace team-a" in found.message
    spec["privacy"]["secureAggregation"] = {"reconstructionThreshold": 2}
    assert policy.violations(parse_spec(spec), rules, "team-a") == []


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_apiserver_requires_the_privacy_the_policy_names(hub: Kube, team_a: str) -> None:
    policy_path = (
        f"/apis/{constants.API_VERSION}/namespaces/{team_a}/{policy.PLURAL}/{policy.POLICY_NAME}"
    )
    hub.patch(policy_path, {"spec": {"requirePrivacyForClaims": {OURS: PRIVACY_RULE}}})
    for name, (dp, field, words) in sorted(PRIVACY_CASES.items()):
        message = refusal(hub, team_a, with_privacy(dp))
        assert field in message and words in message, (name, message)
        assert f"requirePrivacyForClaims[{OURS}]" in message, (name, message)
    hub.create(fl_path(team_a), fl_body(team_a, with_privacy(GOOD_DP)), exist_ok=False)
    hub.patch(policy_path, {"spec": {"requirePrivacy": {"maxEpsilon": 0.3}}})
    local = {"mode": "local", "clippingNorm": 1.0, "epsilon": 0.5}
    hub.patch(policy_path, {"spec": {"requirePrivacyForClaims": None}})
    message = refusal(hub, team_a, with_privacy(local))
    assert "spec.privacy.differentialPrivacy.epsilon is too large" in message, message
    assert "requirePrivacy" in message, message
    # The same rule can require SecAgg+ as well.
    hub.patch(policy_path, {"spec": {"requirePrivacy": {"secureAggregation": True}}})
    message = refusal(hub, team_a, with_privacy({**local, "epsilon": 0.2}))
    assert "spec.privacy.secureAggregation: secure aggregation is required" in message, message
