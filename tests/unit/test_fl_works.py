"""Per-cluster ManifestWorks: content, overrides, names, leavers."""

from __future__ import annotations

import json
from typing import Any

from fl_fixtures import REF, spec, spec_dict

from hub_controller import credentials_layout
from hub_controller.api import FLRef, parse_spec
from hub_controller.membership import ClusterResolution
from hub_controller.operator.desired.works import (
    SPEC_HASH_ANNOTATION,
    WorkCache,
    client_args,
    client_namespace,
    desired_work,
    desired_works,
    spec_hash,
    work_name,
    works_to_delete,
)
from ocmfl import constants
from ocmfl.kube import Encoded, encode_body
from ocmfl.names import hub_side_name, safe_name

C1 = ClusterResolution("c1", "/srv/digits-a", "why", {"zone": "eu", "gpu": "yes"})
C2 = ClusterResolution("c2", None, "no claim")
ADDR = "127.0.0.1:9443"
SNI = "fl-x-server.team.svc"


def _manifest(work: dict[str, Any], kind: str) -> dict[str, Any]:
    [m] = [m for m in work["spec"]["workload"]["manifests"] if m["kind"] == kind]
    manifest: dict[str, Any] = m
    return manifest


def _container(work: dict[str, Any]) -> dict[str, Any]:
    job = _manifest(work, "Job")
    container: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][0]
    return container


def _env(work: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in _container(work)["env"]}


def test_one_work_per_cluster_with_data_in_the_cluster_namespace() -> None:
    works = desired_works(REF, spec(), [C1, C2], ADDR, server_name=SNI)
    assert list(works) == ["c1"]
    work = works["c1"]
    assert work["metadata"]["namespace"] == "c1"
    assert work["metadata"]["name"] == work_name(REF)
    labels = work["metadata"]["labels"]
    assert labels[constants.LABEL_OWNER_NAME] == REF.name
    assert labels[constants.LABEL_OWNER_NAMESPACE] == REF.namespace
    assert labels[constants.LABEL_OWNER_UID] == REF.uid
    assert labels[constants.LABEL_CLUSTER] == "c1"
    kinds = [m["kind"] for m in work["spec"]["workload"]["manifests"]]
    assert kinds == [
        "Namespace",
        "ResourceQuota",
        "ServiceAccount",
        "ConfigMap",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "Job",
    ]


def test_client_job_mounts_the_claimed_path_read_only_at_mount_path() -> None:
    work = desired_work(REF, spec(), C1, ADDR, server_name=SNI)
    pod = _manifest(work, "Job")["spec"]["template"]["spec"]
    [data] = [v for v in pod["volumes"] if v["name"] == "data"]
    # Through a claim pre-bound to a hostPath PV: a restricted pod may not name a hostPath.
    pvc, pv = _manifest(work, "PersistentVolumeClaim"), _manifest(work, "PersistentVolume")
    assert data["persistentVolumeClaim"] == {"claimName": pvc["metadata"]["name"], "readOnly": True}
    assert pv["spec"]["hostPath"] == {"path": "/srv/digits-a", "type": "Directory"}
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["claimRef"]["name"] == pvc["metadata"]["name"]
    assert pv["spec"]["claimRef"]["namespace"] == pvc["metadata"]["namespace"]
    assert pv["spec"]["accessModes"] == pvc["spec"]["accessModes"] == ["ReadOnlyMany"]
    [mount] = [m for m in _container(work)["volumeMounts"] if m["name"] == "data"]
    assert mount == {"name": "data", "mountPath": "/data", "readOnly": True}


def test_client_runs_ocm_fl_client_with_server_cluster_and_data_dir() -> None:
    container = _container(desired_work(REF, spec(), C1, ADDR, server_name=SNI))
    assert container["command"] == ["ocm-fl-client"]
    assert container["args"] == client_args(spec(), "c1", ADDR, SNI)
    args = container["args"]
    assert args[args.index("--server") + 1] == ADDR
    assert args[args.index("--cluster") + 1] == "c1"
    assert args[args.index("--data-dir") + 1] == "/data"


def test_client_env_carries_agent_endpoint_cluster_and_owner() -> None:
    env = _env(
        desired_work(REF, spec(), C1, ADDR, agent_endpoint="http://127.0.0.1:8088", server_name=SNI)
    )
    assert env[constants.ENV_AGENT_ENDPOINT] == "http://127.0.0.1:8088"
    assert env[constants.ENV_CLUSTER_NAME] == "c1"
    assert env[constants.ENV_DATA_DIR] == "/data"
    assert env[constants.ENV_FL_UID] == REF.uid


def test_feedback_rules_read_job_counters_and_delete_is_foreground() -> None:
    work = desired_work(REF, spec(), C1, ADDR, server_name=SNI)
    [cfg] = [c for c in work["spec"]["manifestConfigs"] if c["resourceIdentifier"]["group"]]
    job = _manifest(work, "Job")
    assert cfg["resourceIdentifier"] == {
        "group": "batch",
        "resource": "jobs",
        "namespace": job["metadata"]["namespace"],
        "name": job["metadata"]["name"],
    }
    types = [r["type"] for r in cfg["feedbackRules"]]
    assert types == ["WellKnownStatus", "JSONPaths"]
    names = [p["name"] for p in cfg["feedbackRules"][1]["jsonPaths"]]
    assert names == ["active", "succeeded", "failed"]
    assert work["spec"]["deleteOption"] == {"propagationPolicy": "Foreground"}


def _with_overrides(overrides: list[dict[str, Any]]) -> Any:
    raw = spec_dict()
    raw["client"]["runConfig"] = {"localEpochs": 1, "batchSize": 32}
    raw["client"]["resources"] = {"limits": {"cpu": "1"}}
    raw["client"]["overrides"] = overrides
    return parse_spec(raw)


def test_overrides_by_name_and_label_apply_in_order_later_wins() -> None:
    s = _with_overrides(
        [
            {
                "clusterSelector": {"matchLabels": {"zone": "eu"}},
                "runConfig": {"localEpochs": 2},
                "env": [{"name": "A", "value": "label"}],
            },
            {
                "clusterName": "c1",
                "runConfig": {"localEpochs": 5},
                "resources": {"limits": {"cpu": "4", "memory": "2Gi"}},
                "env": [{"name": "A", "value": "name"}],
            },
            {"clusterName": "other", "runConfig": {"localEpochs": 99}},
        ]
    )
    work = desired_work(REF, s, C1, ADDR, server_name=SNI)
    run_config = json.loads(_manifest(work, "ConfigMap")["data"]["run-config.json"])
    assert run_config == {"localEpochs": 5, "batchSize": 32}
    assert _env(work)["A"] == "name"
    assert _container(work)["resources"] == {"limits": {"cpu": "4", "memory": "2Gi"}}


def test_label_selector_expressions_select_overrides() -> None:
    s = _with_overrides(
        [
            {
                "clusterSelector": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                "runConfig": {"batchSize": 128},
            },
            {
                "clusterSelector": {
                    "matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["eu"]}]
                },
                "runConfig": {"batchSize": 1},
            },
        ]
    )
    work = desired_work(REF, s, C1, ADDR, server_name=SNI)
    run_config = json.loads(_manifest(work, "ConfigMap")["data"]["run-config.json"])
    assert run_config["batchSize"] == 128


def test_changed_pod_template_gets_a_new_job_name() -> None:
    a = _manifest(desired_work(REF, spec(), C1, ADDR, server_name=SNI), "Job")["metadata"]["name"]
    b = _manifest(desired_work(REF, spec(), C1, "127.0.0.2:9443", server_name=SNI), "Job")[
        "metadata"
    ]["name"]
    assert a != b and a.startswith("fl-client-")


def test_spec_hash_is_stable_and_stored_on_the_work() -> None:
    w1, w2 = (
        desired_work(REF, spec(), C1, ADDR, server_name=SNI),
        desired_work(REF, spec(), C1, ADDR, server_name=SNI),
    )
    assert spec_hash(w1) == spec_hash(w2)
    assert spec_hash(w1) in w1["metadata"]["annotations"].values()


def test_a_work_carries_its_own_encoding_and_the_hash_spec_hash_gives() -> None:
    # One dump serves the stamped hash and the request body: both must say what the dict
    # holds (a drifted hash would rewrite every work once; a drifted text would send
    # something else than the dict the controller compares).
    for token in (None, "tok"):
        work = desired_work(REF, spec(), C1, ADDR, server_name=SNI, client_token=token)
        assert isinstance(work, Encoded)
        assert json.loads(work.text) == work
        assert encode_body(work) == work.text
        assert work["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == spec_hash(dict(work))
    assert json.loads(encode_body({"a": 1})) == {"a": 1}


def test_long_names_are_cut_to_a_dns_label_with_a_hash() -> None:
    ref = FLRef(namespace="n" * 63, name="m" * 63, uid="u")
    name = work_name(ref)
    assert len(name) <= 63
    assert name != work_name(FLRef(namespace="n" * 63, name="m" * 62, uid="u"))
    assert safe_name("fl", "a", "b") == "fl-a-b"


def test_hub_side_names_of_dotted_and_dashed_names_differ() -> None:
    """`x.y` and `x-y` in one namespace once shared a Job, Service, Secrets and PVC."""
    from hub_controller.operator.desired import client_token, server

    dotted, dashed = (FLRef(namespace="t", name=n, uid="u") for n in ("x.y", "x-y"))
    for name_of in (
        credentials_layout.server_name,
        lambda r: credentials_layout.credentials_secret_name(credentials_layout.server_name(r)),
        client_token.token_secret_name,
        lambda r: server.model_claim_name(
            r, parse_spec(spec_dict(storage={"type": "PVC", "size": "1Gi"}))
        ),
    ):
        a, b = name_of(dotted), name_of(dashed)
        assert a is not None
        assert a != b and len(a) <= 63, (a, b)
        assert len(hub_side_name("z" * 80, "server")) <= 63


def test_two_tenants_never_share_a_work_or_a_client_namespace() -> None:
    pairs = [
        (
            FLRef(namespace="team-a", name="x", uid="1"),
            FLRef(namespace="team", name="a-x", uid="2"),
        ),
        (FLRef(namespace="ns", name="x.y", uid="1"), FLRef(namespace="ns", name="x-y", uid="2")),
    ]
    for one, other in pairs:
        assert work_name(one) != work_name(other)
        assert client_namespace(one) != client_namespace(other)
    ref = FLRef(namespace="team-a", name="digits", uid="u")
    assert work_name(ref).startswith("fl-team-a-digits-") and len(work_name(ref)) <= 63


def test_clusters_that_left_have_their_works_deleted() -> None:
    desired = desired_works(REF, spec(), [C1], ADDR, server_name=SNI)
    existing = [("c1", work_name(REF)), ("c9", work_name(REF))]
    assert works_to_delete(existing, desired) == [("c9", work_name(REF))]


def test_client_gets_its_cluster_identity_and_reaches_the_server_only_through_mtls() -> None:
    work = desired_work(REF, spec(), C1, ADDR, server_name=SNI)
    # The work carries no key: the identity Secret is written on the cluster by its agent.
    assert not [m for m in work["spec"]["workload"]["manifests"] if m["kind"] == "Secret"]
    assert "PRIVATE KEY" not in json.dumps(work)
    container = _container(work)
    args = container["args"]
    flag = {args[i]: args[i + 1] for i in range(0, len(args) - 1) if args[i].startswith("--")}
    assert flag["--server"] == ADDR
    assert flag["--server-name"] == SNI
    assert flag["--client-certfile"].endswith("/tls.crt")
    assert flag["--auth-key"].endswith("/node.key")
    assert "--port" not in flag  # the SuperNode's default port, on the pod's own loopback
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["tls"]["readOnly"] is True
    pod = _manifest(work, "Job")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == constants.CLIENT_IDENTITY_SECRET


def test_client_job_is_server_side_applied_so_resyncs_never_touch_its_selector() -> None:
    work = desired_work(REF, spec(), C1, ADDR, server_name=SNI)
    [config] = [c for c in work["spec"]["manifestConfigs"] if c["resourceIdentifier"]["group"]]
    assert config["resourceIdentifier"]["resource"] == "jobs"
    assert config["updateStrategy"] == {"type": "ServerSideApply"}


def test_client_pods_get_the_pod_settings_and_cluster_values_as_node_config() -> None:
    raw = spec_dict()
    raw["client"]["pod"] = {
        "labels": {"kueue.x-k8s.io/queue-name": "edge"},
        "schedulerName": "volcano",
        "priorityClassName": "fl-low",
        "nodeSelector": {"zone": "a"},
        "tolerations": [{"key": "edge", "operator": "Exists"}],
        "annotations": {"a": "b"},
    }
    raw["client"]["runConfig"] = {"tokenizer": "bpe", "lr": 0.1}
    raw["client"]["overrides"] = [{"clusterName": "c1", "runConfig": {"lr": 0.01}}]
    work = desired_work(REF, parse_spec(raw), C1, ADDR, server_name=SNI)
    template = _manifest(work, "Job")["spec"]["template"]
    assert template["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "edge"
    assert template["metadata"]["labels"][constants.LABEL_CLUSTER] == "c1"
    assert template["metadata"]["annotations"] == {"a": "b"}
    pod = template["spec"]
    assert (pod["schedulerName"], pod["priorityClassName"]) == ("volcano", "fl-low")
    assert pod["nodeSelector"] == {"zone": "a"}
    assert pod["tolerations"] == [{"key": "edge", "operator": "Exists"}]
    config = json.loads(_manifest(work, "ConfigMap")["data"]["run-config.json"])
    assert config == {"tokenizer": "bpe", "lr": 0.01}  # node config for the ClientApp


CAPS = {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"}


def test_the_client_namespace_is_held_to_the_policy_caps_before_the_job_starts() -> None:
    work = desired_work(REF, spec(), C1, ADDR, server_name=SNI, caps=CAPS)
    kinds = [m["kind"] for m in work["spec"]["workload"]["manifests"]]
    # Applied in order: both exist before the Job's pod is admitted.
    assert kinds.index("LimitRange") < kinds.index("Job")
    assert kinds.index("ResourceQuota") < kinds.index("Job")
    namespace = client_namespace(REF)
    limits = _manifest(work, "LimitRange")
    assert limits["metadata"]["namespace"] == namespace
    [item] = limits["spec"]["limits"]
    assert item["type"] == "Container"
    assert item["max"] == item["default"] == {"cpu": "4", "memory": "8Gi"}
    # A container that asks for nothing reserves little, not a whole cap.
    assert item["defaultRequest"] == {"cpu": "100m", "memory": "256Mi"}
    quota = _manifest(work, "ResourceQuota")
    assert quota["metadata"]["namespace"] == namespace
    assert quota["spec"]["hard"] == {
        "pods": "2",
        "limits.cpu": "8",
        "limits.memory": str(16 * 2**30),
        "requests.nvidia.com/gpu": "2",
    }
    # Server-side applied: the apiserver's canonical quantities are no change to resend.
    applied = {
        c["resourceIdentifier"]["resource"]: c["updateStrategy"]["type"]
        for c in work["spec"]["manifestConfigs"]
    }
    assert applied["limitranges"] == applied["resourcequotas"] == "ServerSideApply"


def test_a_cap_below_the_default_request_is_the_request_too() -> None:
    work = desired_work(REF, spec(), C1, ADDR, server_name=SNI, caps={"cpu": "50m"})
    [item] = _manifest(work, "LimitRange")["spec"]["limits"]
    assert item["defaultRequest"] == {"cpu": "50m"}
    assert _manifest(work, "ResourceQuota")["spec"]["hard"] == {"pods": "2", "limits.cpu": "0.1"}


def test_without_compute_caps_no_limit_range_and_the_quota_counts_pods_only() -> None:
    work = desired_work(REF, spec(), C1, ADDR, server_name=SNI, caps={})
    kinds = [m["kind"] for m in work["spec"]["workload"]["manifests"]]
    assert "LimitRange" not in kinds
    assert _manifest(work, "ResourceQuota")["spec"]["hard"] == {"pods": "2"}


def test_a_changed_cap_rebuilds_the_cached_work() -> None:
    cache = WorkCache()
    first = dict(cache.each(1, REF, spec(), [C1], ADDR, server_name=SNI, caps={"cpu": "4"}))
    again = dict(cache.each(1, REF, spec(), [C1], ADDR, server_name=SNI, caps={"cpu": "4"}))
    assert again["c1"] is first["c1"]
    changed = dict(cache.each(1, REF, spec(), [C1], ADDR, server_name=SNI, caps={"cpu": "2"}))
    assert spec_hash(changed["c1"]) != spec_hash(first["c1"])
    [item] = _manifest(changed["c1"], "LimitRange")["spec"]["limits"]
    assert item["max"] == {"cpu": "2"}
