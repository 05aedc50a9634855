"""Attacks through the fields that reach a pod or its store (issue 29 item 1): a tenant whose
FederationPolicy grants the project's images, one data claim and a few named pod settings tries
to preempt system pods, tolerate every taint, land on control-plane nodes, set the platform's
own labels, take GPUs or CPUs beyond the caps, run hundreds of rounds on every cluster, ship its
own code from a volume it wrote to, install packages next to the data, set env of its
choosing, or send the model (and with it what the data taught it) to a bucket or an address of
its choosing: the cloud metadata service, the node's loopback, another tenant's Service.

Each is refused twice with the same message naming the field and the fix: by the controller
(`hub_controller.policy.violations`) and, on the real local kube-apiserver, by the chart's
ValidatingAdmissionPolicy at create time. The granted settings themselves are admitted by both.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from hub_controller import policy
from hub_controller.api import parse_spec
from ocmfl import constants
from tests.attack.test_attack_policy import (
    GRANT,
    fl_body,
    fl_path,
    refusal,
    tenant_spec,
)

if TYPE_CHECKING:
    from ocmfl.kube import Kube

pytestmark = pytest.mark.attack

POD_GRANT: dict[str, Any] = {
    **GRANT,
    "allowedPriorityClasses": ["fl-batch"],
    "allowedSchedulerNames": ["volcano"],
    "allowedTolerationKeys": ["nvidia.com/gpu"],
    "allowedPlacementTolerationKeys": ["cluster.open-cluster-management.io/unreachable"],
    "allowedNodeSelectorKeys": ["kubernetes.io/arch"],
    "allowedLabelPrefixes": ["kueue.x-k8s.io/"],
    "allowedAnnotationPrefixes": ["example.com/"],
    # One cap, so the refusal's list of caps reads the same from CEL and from the controller.
    "maxPodResources": {"cpu": "4"},
    "allowedClusterSets": ["global"],
    "maxClusters": 5,
    "maxRounds": 10,
    "allowedAppPathPrefixes": [f"{constants.APPS_DIR}/"],
    "allowedEnv": ["MYAPP_*"],
    "allowedS3Buckets": ["team-a-models"],
    "allowedS3Endpoints": ["https://s3.example.com/"],
}


def within_grant() -> dict[str, Any]:
    """The tenant's plain spec, on at most POD_GRANT's clusters: what each attack changes."""
    spec = tenant_spec()
    spec["server"]["minAvailableClients"] = 2
    spec["client"]["placement"]["numberOfClusters"] = 2
    return spec


def granted_spec() -> dict[str, Any]:
    """Everything POD_GRANT allows, used at once: admitted by both checks."""
    spec = within_grant()
    spec["server"]["pod"] = {
        "priorityClassName": "fl-batch",
        "schedulerName": "volcano",
        "labels": {"kueue.x-k8s.io/queue-name": "team-a"},
        "annotations": {"example.com/owner": "team-a"},
    }
    spec["server"]["resources"] = {"requests": {"cpu": "4", "memory": "64Gi"}}
    spec["client"]["pod"] = {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "nodeSelector": {"kubernetes.io/arch": "amd64"},
    }
    spec["client"]["resources"] = {"limits": {"cpu": "2500m"}}
    spec["client"]["overrides"] = [
        {"clusterName": "c1", "env": [{"name": "MYAPP_MODE", "value": "fast"}]}
    ]
    spec["client"]["placement"]["numberOfClusters"] = 5
    spec["client"]["placement"]["tolerations"] = [
        {"key": "cluster.open-cluster-management.io/unreachable", "operator": "Exists"}
    ]
    return spec


def s3_spec(endpoint: str | None = "https://S3.example.com", bucket: str = "team-a-models") -> Any:
    """An S3 store the grant allows (the endpoint's case and trailing / do not matter)."""
    s3 = {"bucketName": bucket, **({"endpoint": endpoint} if endpoint else {})}
    return {"type": "S3", "s3": s3}


def _set(*path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An attack that sets spec[path...] = value (creating the dicts on the way)."""

    def attack(spec: dict[str, Any]) -> None:
        node = spec
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = copy.deepcopy(value)

    return attack


CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
# attack -> (what it does, field the refusal names, words of the fix)
ATTACKS: dict[str, tuple[Callable[[dict[str, Any]], None], str, str]] = {
    "server preempts the hub's system pods": (
        _set("server", "pod", "priorityClassName", value="system-cluster-critical"),
        "spec.server.pod.priorityClassName",
        "allowedPriorityClasses",
    ),
    "clients preempt the clusters' node pods": (
        _set("client", "pod", "priorityClassName", value="system-node-critical"),
        "spec.client.pod.priorityClassName",
        "allowedPriorityClasses",
    ),
    "a scheduler of the tenant's choosing": (
        _set("client", "pod", "schedulerName", value="tenant-scheduler"),
        "spec.client.pod.schedulerName",
        "allowedSchedulerNames",
    ),
    "clients tolerate every taint": (
        _set("client", "pod", "tolerations", value=[{"operator": "Exists"}]),
        "spec.client.pod.tolerations",
        "allowKeylessTolerations: true",
    ),
    "server tolerates the control plane's taint": (
        _set("server", "pod", "tolerations", value=[{"key": CONTROL_PLANE, "operator": "Exists"}]),
        "spec.server.pod.tolerations",
        "allowedTolerationKeys",
    ),
    "clients pick control-plane nodes": (
        _set("client", "pod", "nodeSelector", value={CONTROL_PLANE: ""}),
        "spec.client.pod.nodeSelector",
        "allowedNodeSelectorKeys",
    ),
    "a platform label on the clients": (
        # The API itself refuses the platform's own prefix; a subdomain of it slipped past.
        _set("client", "pod", "labels", value={f"x.{constants.LABEL_PREFIX}/uid": "someone"}),
        "spec.client.pod.labels",
        "the platform's own",
    ),
    "a platform annotation on the server": (
        _set("server", "pod", "annotations", value={f"x.{constants.GROUP}/owner": "me"}),
        "spec.server.pod.annotations",
        "the platform's own",
    ),
    "a label outside the allowed prefixes": (
        _set("server", "pod", "labels", value={"team": "a"}),
        "spec.server.pod.labels",
        "allowedLabelPrefixes",
    ),
    "an AppArmor-off annotation": (
        _set(
            "client",
            "pod",
            "annotations",
            value={"container.apparmor.security.beta.kubernetes.io/client": "unconfined"},
        ),
        "spec.client.pod.annotations",
        "allowedAnnotationPrefixes",
    ),
    "eight GPUs on every cluster": (
        _set("client", "resources", value={"limits": {"nvidia.com/gpu": 8}}),
        "spec.client.resources.limits",
        "maxPodResources",
    ),
    "64 CPUs for the server": (
        _set("server", "resources", value={"requests": {"cpu": "64"}}),
        "spec.server.resources.requests",
        "maxPodResources",
    ),
    "GPUs on one cluster by override": (
        _set(
            "client",
            "overrides",
            value=[{"clusterName": "c1", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
        ),
        "spec.client.overrides[].resources.requests",
        "maxPodResources",
    ),
    "a thousand rounds": (
        _set("server", "rounds", value=1000),
        "spec.server.rounds",
        "spec.maxRounds",
    ),
    "every cluster (numberOfClusters unset)": (
        lambda s: s["client"]["placement"].pop("numberOfClusters"),
        "spec.client.placement.numberOfClusters",
        "spec.maxClusters",
    ),
    "five hundred clusters": (
        _set("client", "placement", "numberOfClusters", value=500),
        "spec.client.placement.numberOfClusters",
        "spec.maxClusters",
    ),
    "the app from the server's own model volume": (
        _set("server", "app", "path", value="/var/lib/ocm-fl/models/evil-app"),
        "spec.server.app.path",
        "use a directory inside the server image",
    ),
    "the app through .. into the volume": (
        _set("server", "app", "path", value=f"{constants.APPS_DIR}/../../../var/lib/ocm-fl/x"),
        "spec.server.app.path",
        "write it without them",
    ),
    "the app from a path the policy does not list": (
        _set("server", "app", "path", value="/srv/tenant-app"),
        "spec.server.app.path",
        "allowedAppPathPrefixes",
    ),
    "packages installed next to the data": (
        _set("server", "app", "installDependencies", value=True),
        "spec.server.app.installDependencies",
        "allowInstallDependencies: true",
    ),
    "env the policy does not list": (
        _set("client", "overrides", value=[{"clusterName": "c1", "env": [{"name": "OTHER"}]}]),
        "spec.client.overrides[].env",
        "allowedEnv",
    ),
    "placement tolerates every cluster taint": (
        _set("client", "placement", "tolerations", value=[{"operator": "Exists"}]),
        "spec.client.placement.tolerations",
        "allowKeylessTolerations: true",
    ),
    "placement tolerates an unlisted cluster taint": (
        _set(
            "client",
            "placement",
            "tolerations",
            value=[{"key": "cluster.open-cluster-management.io/unavailable", "operator": "Exists"}],
        ),
        "spec.client.placement.tolerations",
        "allowedPlacementTolerationKeys",
    ),
    "clusters from another team's cluster set": (
        _set("client", "placement", "clusterSets", value=["global", "team-b-clusters"]),
        "spec.client.placement.clusterSets",
        "use sets from [global], or ask the hub admin to add it to FederationPolicy "
        "default.spec.allowedClusterSets",
    ),
    "clusters from every set bound to the namespace": (
        _set("client", "placement", "clusterSets", value=[]),
        "spec.client.placement.clusterSets",
        "unset (every set bound to the namespace)",
    ),
    "the model to a bucket the policy does not list": (
        _set("server", "storage", value=s3_spec(bucket="attacker-bucket")),
        "spec.server.storage.s3.bucketName",
        "allowedS3Buckets",
    ),
    "S3 at the cloud metadata address": (
        _set("server", "storage", value=s3_spec("http://169.254.169.254")),
        "spec.server.storage.s3.endpoint",
        "outside the cluster's and the node's own addresses",
    ),
    "S3 on the node's loopback (IPv6)": (
        _set("server", "storage", value=s3_spec("http://[::1]:9000")),
        "spec.server.storage.s3.endpoint",
        "loopback",
    ),
    "S3 at another tenant's Service": (
        _set("server", "storage", value=s3_spec("http://minio.tenant-b.svc:9000")),
        "spec.server.storage.s3.endpoint",
        "cluster-internal",
    ),
    "S3 at a numeric name for 127.0.0.1": (
        _set("server", "storage", value=s3_spec("http://127.1:9000")),
        "spec.server.storage.s3.endpoint",
        "ends in a number",
    ),
    "S3 at an endpoint the policy does not list": (
        _set("server", "storage", value=s3_spec("https://s3.attacker.example.org")),
        "spec.server.storage.s3.endpoint",
        "allowedS3Endpoints",
    ),
    "initModel from a bucket the policy does not list": (
        _set("server", "initModel", value="s3://someone-else/model.pth"),
        "spec.server.initModel",
        "allowedS3Buckets",
    ),
    "initModel from the service account token": (
        _set("server", "initModel", value="/var/run/secrets/kubernetes.io/serviceaccount/token"),
        "spec.server.initModel",
        "the platform's mount",
    ),
    "initModel from another run's store": (
        _set("server", "initModel", value="../other-run/model.pth"),
        "spec.server.initModel",
        "write it without them",
    ),
}


def attacked(name: str) -> dict[str, Any]:
    spec = within_grant()
    ATTACKS[name][0](spec)
    return spec


def granted_s3_spec() -> dict[str, Any]:
    """An S3 store and an initModel from it that POD_GRANT allows."""
    spec = within_grant()
    spec["server"]["storage"] = s3_spec()
    spec["server"]["initModel"] = "s3://team-a-models/base.pth"
    return spec


def grant() -> policy.FederationPolicySpec:
    return policy.parse_policy(POD_GRANT)


def test_the_granted_pod_settings_are_allowed() -> None:
    assert policy.violations(parse_spec(granted_spec()), grant(), "team-a") == []


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_controller_refuses_naming_the_field_and_the_fix(name: str) -> None:
    [found] = policy.violations(parse_spec(attacked(name)), grant(), "team-a")
    _, field, fix = ATTACKS[name]
    assert found.field == field
    assert fix in found.message, found.message


def test_the_granted_s3_store_and_init_model_are_allowed() -> None:
    spec = granted_s3_spec()
    assert policy.violations(parse_spec(spec), grant(), "team-a") == []
    spec["server"]["storage"] = s3_spec(endpoint=None)  # AWS itself
    spec["server"]["initModel"] = "base/model.pth"  # inside the store
    assert policy.violations(parse_spec(spec), grant(), "team-a") == []


def test_an_empty_policy_refuses_every_pod_setting_and_any_gpu() -> None:
    """The defaults allow none of it: only the fields of the original grant."""
    bare = policy.parse_policy({**GRANT, "allowedAppPathPrefixes": [f"{constants.APPS_DIR}/"]})
    found = {v.field for v in policy.violations(parse_spec(granted_spec()), bare, "team-a")}
    assert found == {
        "spec.server.pod.priorityClassName",
        "spec.server.pod.schedulerName",
        "spec.server.pod.labels",
        "spec.server.pod.annotations",
        "spec.client.pod.tolerations",
        "spec.client.pod.nodeSelector",
        "spec.client.overrides[].env",
        "spec.client.placement.tolerations",
    }
    gpu = attacked("eight GPUs on every cluster")
    assert [v.field for v in policy.violations(parse_spec(gpu), bare, "team-a")] == [
        "spec.client.resources.limits"
    ]


def test_app_paths_under_the_platforms_mounts_are_refused_even_when_listed() -> None:
    everything = policy.parse_policy({**POD_GRANT, "allowedAppPathPrefixes": ["/"]})
    for path in (*constants.PLATFORM_MOUNT_DIRS, "/var/run/secrets/kubernetes.io/x", "/a//b"):
        spec = attacked("the app from a path the policy does not list")
        spec["server"]["app"]["path"] = path
        [found] = policy.violations(parse_spec(spec), everything, "team-a")
        assert found.field == "spec.server.app.path", path


def test_every_mount_of_the_platforms_pods_is_under_a_refused_directory() -> None:
    """PLATFORM_MOUNT_DIRS covers what the server and client pods mount (but the data and the
    apps): an app path can never point at a volume a tenant could have written."""
    from hub_controller.operator.desired import server, works

    mounts = {
        server.MODEL_DIR,
        server.STATE_DIR,
        server.TLS_DIR,
        server.NODE_KEYS_DIR,
        works.CONFIG_DIR,
        works.TLS_DIR,
        works.STATE_DIR,
        constants.CLIENT_TOKEN_DIR,
        constants.SCRATCH_DIR,
    }
    for mount in mounts:
        assert any(mount == d or mount.startswith(d + "/") for d in constants.PLATFORM_MOUNT_DIRS)


# --- the apiserver: the chart's CEL, the same messages ----------------------------------------
@pytest.fixture
def team_a(hub: Kube, namespace: str) -> str:
    from hack.localfed import apply_policy

    apply_policy(hub, namespace, POD_GRANT)
    return namespace


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_apiserver_refuses_every_attack_with_the_controllers_message(
    hub: Kube, team_a: str
) -> None:
    for name in sorted(ATTACKS):
        spec = attacked(name)
        message = refusal(hub, team_a, spec)
        [found] = policy.violations(parse_spec(spec), grant(), team_a)
        assert "ValidatingAdmissionPolicy" in message, (name, message)
        assert message.endswith(str(found)), (name, message, str(found))
    hub.create(fl_path(team_a), fl_body(team_a, granted_spec()), exist_ok=False)
    hub.create(fl_path(team_a), fl_body(team_a, granted_s3_spec(), "s3"), exist_ok=False)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_apiserver_refuses_reserved_env_even_when_the_policy_lists_everything(
    hub: Kube, namespace: str
) -> None:
    from hack.localfed import apply_policy

    apply_policy(hub, namespace, {**POD_GRANT, "allowedEnv": ["*"]})
    for name in ("HTTPS_PROXY", "pip_index_url", "OPENSSL_CONF", "GLIBC_TUNABLES", "LD_PRELOAD"):
        spec = attacked("env the policy does not list")
        spec["client"]["overrides"][0]["env"] = [{"name": name}]
        message = refusal(hub, namespace, spec)
        assert f"names [{name}] are reserved" in message, message


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_apiserver_refuses_unbounded_input_naming_the_field(hub: Kube, team_a: str) -> None:
    """The CRD bounds every spec string, list and map (issue 29 item 2)."""
    from hub_controller.api import SPEC_MAX_ITEMS, SPEC_MAX_PROPERTIES, SPEC_MAX_STRING

    cases = {
        "spec.server.initModel": _set("server", "initModel", value="m" * (SPEC_MAX_STRING + 1)),
        "spec.client.overrides": _set(
            "client",
            "overrides",
            value=[{"clusterName": f"c{i}"} for i in range(SPEC_MAX_ITEMS + 1)],
        ),
        "spec.client.pod.labels": _set(
            "client",
            "pod",
            "labels",
            value={f"kueue.x-k8s.io/l{i}": "v" for i in range(SPEC_MAX_PROPERTIES + 1)},
        ),
    }
    for field, attack in cases.items():
        spec = within_grant()
        attack(spec)
        message = refusal(hub, team_a, spec)
        assert field in message and ("Too long" in message or "Too many" in message), message
