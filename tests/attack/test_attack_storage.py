"""Issue 12, storage and pod security: a tenant who may create a FederatedLearning in their
namespace tries to reach the hub node's files, another resource's checkpoints, or code
execution in the platform's processes, and to run client pods outside the restricted profile.

Pure tests build what the controller would build; the one plane test shows the real apiserver's
Pod Security admission admitting a ManifestWork's client pod and refusing a hostPath pod.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hub_controller.api import FLRef, SpecError, parse_spec
from hub_controller.membership import ClusterResolution
from hub_controller.operator.desired import server, works
from ocmfl import constants
from workloads import server_launcher
from workloads.sdk.store import ModelStore, ModelStoreError

pytestmark = pytest.mark.attack

REF = FLRef(namespace="team-a", name="digits", uid="11111111-aaaa")
DIGITS = Path(__file__).resolve().parents[2] / "examples" / "apps" / "digits"
# Namespace labels for Pod Security admission at the restricted level.
PSA_LABELS = {
    f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")
}


def spec_dict(
    server_fields: Mapping[str, Any] | None = None, env: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    client: dict[str, Any] = {
        "dataClaim": "fl.data-path",
        "placement": {"clusterSets": ["global"]},
    }
    if env is not None:
        client["overrides"] = [{"clusterName": "cluster1", "env": env}]
    return {
        "server": {"app": {"path": f"{constants.APPS_DIR}/digits"}, **(server_fields or {})},
        "client": client,
    }


# --- the restricted Pod Security profile, as the apiserver checks it ----------------------------
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod: Mapping[str, Any]) -> list[str]:
    """What Pod Security `restricted` (baseline included) refuses in a pod spec."""
    out = []
    psc = pod.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(host):
            out.append(host)
    for vol in pod.get("volumes") or []:
        kinds = set(vol) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {vol['name']}: {sorted(kinds)}")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    for c in [*(pod.get("initContainers") or []), *pod["containers"]]:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation != false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities {caps.get('add')}")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{name}: runAsNonRoot != true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{name}: hostPort")
    return out


def _client_work() -> dict[str, Any]:
    spec = parse_spec(spec_dict(), REF.name)
    resolution = ClusterResolution("cluster1", "/srv/data/digits", "claim", {})
    return works.desired_work(REF, spec, resolution, "10.0.0.1:9443", server_name="fl.example")


def _manifest(work: Mapping[str, Any], kind: str) -> dict[str, Any]:
    [m] = [m for m in work["spec"]["workload"]["manifests"] if m["kind"] == kind]
    return dict(m)


# --- 1. host paths ---------------------------------------------------------------------------
def test_a_tenant_cannot_mount_the_hub_nodes_root_filesystem() -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec(spec_dict({"storage": {"type": "HostPath", "path": "/"}}), "digits")
    [problem] = exc.value.problems
    assert problem.startswith("spec.server.storage.path (/) cannot be set")
    assert "hub admin's root" in problem and "remove path" in problem
    # What the controller builds for HostPath: the resource's own directory under the root.
    spec = parse_spec(spec_dict({"storage": {"type": "HostPath"}}), "digits")
    job = server.desired_job(REF, spec, "/var/lib/ocm-fl/models")
    volumes = job["spec"]["template"]["spec"]["volumes"]
    [models] = [v for v in volumes if v["name"] == "models"]
    assert models["hostPath"]["path"] == f"/var/lib/ocm-fl/models/team-a/digits-{REF.uid}"
    assert [v["hostPath"]["path"] for v in volumes if "hostPath" in v] == [
        models["hostPath"]["path"]
    ]


# --- 2. another resource's store ----------------------------------------------------------------
def test_a_recreated_resource_cannot_resume_or_poison_the_old_ones_checkpoints(
    tmp_path: Path,
) -> None:
    first = REF
    again = FLRef(REF.namespace, REF.name, "22222222-bbbb")  # same name, re-created: new uid
    spec = parse_spec(spec_dict({"storage": {"type": "HostPath"}}), "digits")
    root = str(tmp_path)
    # Different directories on the hub node, keyed by namespace, name and uid.
    paths = {
        v["hostPath"]["path"]
        for ref in (first, again)
        for v in server.desired_job(ref, spec, root)["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    assert paths == {f"{root}/team-a/digits-{first.uid}", f"{root}/team-a/digits-{again.uid}"}
    # And a store that holds another uid's manifest (a PVC or bucket named twice, a planted
    # store) is refused: nothing resumed, nothing overwritten.
    store = tmp_path / "shared"
    ModelStore(store, first.uid).save_checkpoint(3, {"w": np.ones((2, 2), np.float32)}, {})
    before = (store / "manifest.json").read_bytes()
    thief = ModelStore(store, again.uid)
    with pytest.raises(ModelStoreError, match=f"belongs to resource uid '{first.uid}'"):
        thief.latest()
    with pytest.raises(ModelStoreError, match="refusing to resume, overwrite or set aside"):
        thief.save_checkpoint(1, {"w": np.zeros((2, 2), np.float32)}, {})
    assert (store / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in store.iterdir()) == ["checkpoints", "manifest.json"]


def test_the_server_fails_before_training_on_another_resources_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    ModelStore(store, "uid-a").save_checkpoint(2, {"w": np.ones((2, 2), np.float32)}, {})
    monkeypatch.setenv(constants.ENV_FL_UID, "uid-b")
    result = tmp_path / "result.json"
    code = server_launcher.main(
        [
            "--state-dir", str(tmp_path / "state"), "--ssl-ca-certfile", "ca",
            "--ssl-certfile", "c", "--ssl-keyfile", "k", "--supernode-keys", "keys",
            "--storage", str(store), "--app-dir", str(DIGITS),
            "--result-file", str(result), "--termination-log", str(tmp_path / "none"),
        ]
    )  # fmt: skip
    assert code == 1
    outcome = json.loads(result.read_text())
    assert not outcome["ok"]
    assert "belongs to resource uid 'uid-a'" in outcome["reason"]
    assert not (tmp_path / "state").exists()  # refused before the SuperLink started


# --- 3. env injection -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["LD_PRELOAD", constants.ENV_DATA_DIR, "PYTHONPATH", "HOME"])
def test_reserved_env_in_overrides_is_refused_naming_the_field(name: str) -> None:
    env = [{"name": "MY_SETTING", "value": "1"}, {"name": name, "value": "/data/evil.so"}]
    with pytest.raises(SpecError) as exc:
        parse_spec(spec_dict(env=env), "digits")
    [problem] = exc.value.problems
    assert problem.startswith(f"spec.client.overrides[0].env[1].name ({name}) is reserved")
    assert problem.endswith("use another name")
    # An ordinary name is still fine.
    parse_spec(spec_dict(env=env[:1]), "digits")


def test_the_s3_credentials_secret_cannot_inject_env_into_the_server() -> None:
    s3 = {"bucketName": "models", "credentialsSecret": "creds"}
    spec = parse_spec(spec_dict({"storage": {"type": "S3", "s3": s3}}), "digits")
    [container] = server.desired_job(REF, spec)["spec"]["template"]["spec"]["containers"]
    # Not envFrom (every key of a tenant's Secret, LD_PRELOAD included, would become env):
    # the three AWS keys, each by name.
    assert "envFrom" not in container
    from_secret = {
        e["valueFrom"]["secretKeyRef"]["key"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert from_secret == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}


# --- 4. pod security --------------------------------------------------------------------------
def test_client_pods_meet_the_restricted_profile_in_a_restricted_namespace() -> None:
    work = _client_work()
    pod = _manifest(work, "Job")["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["automountServiceAccountToken"] is False
    [container] = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["HOME"] == env["TMPDIR"] == constants.SCRATCH_DIR
    assert {"name": "scratch", "mountPath": constants.SCRATCH_DIR} in container["volumeMounts"]
    labels = _manifest(work, "Namespace")["metadata"]["labels"]
    assert {k: labels[k] for k in PSA_LABELS} == PSA_LABELS
    # The data stays read-only: on the volume, the mount and the PV's access mode.
    [data] = [v for v in pod["volumes"] if v["name"] == "data"]
    assert data["persistentVolumeClaim"]["readOnly"] is True
    assert _manifest(work, "PersistentVolume")["spec"]["accessModes"] == ["ReadOnlyMany"]


def test_server_pods_run_restricted_apart_from_the_admins_hostpath_store() -> None:
    pvc = parse_spec(spec_dict({"storage": {"type": "PVC", "size": "1Gi"}}), "digits")
    pod = server.desired_job(REF, pvc)["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["automountServiceAccountToken"] is False
    hostpath = parse_spec(spec_dict({"storage": {"type": "HostPath"}}), "digits")
    pod = server.desired_job(REF, hostpath)["spec"]["template"]["spec"]
    # Only the store volume and the init container that hands it to the workload uid (the
    # platform's image, CAP_CHOWN only) are outside the profile; the tenant's image is not.
    [init] = pod["initContainers"]
    assert init["image"] == constants.WORKLOAD_IMAGE
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert restricted_violations(pod) == [
        "volume models: ['hostPath']",
        "store-owner: adds capabilities ['CHOWN']",
        "store-owner: runAsNonRoot != true",
        "store-owner: runAsUser 0",
    ]


# --- the same on the plane: the apiserver's Pod Security admission ---------------------------
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_on_the_plane_the_work_client_pod_is_admitted_and_a_hostpath_pod_refused(
    hub_and_spoke: tuple[Any, Any, str], tmp_path: Path
) -> None:
    from hack.testing import wait_for
    from ocmfl.kube import KubeError

    hub, spoke, cluster = hub_and_spoke
    ref = FLRef("attack", f"psa-{uuid.uuid4().hex[:6]}", str(uuid.uuid4()))
    data = tmp_path / "data"
    data.mkdir()
    spec = parse_spec(spec_dict(), ref.name)
    resolution = ClusterResolution(cluster, str(data), "claim", {})
    work = works.desired_work(ref, spec, resolution, "127.0.0.1:1", server_name="fl.example")
    works_path = f"/apis/{constants.WORK_GROUP}/v1/namespaces/{cluster}/manifestworks"
    namespace = works.client_namespace(ref)
    pods_path = f"/api/v1/namespaces/{namespace}/pods"
    hub.create(works_path, work)
    try:
        # The Job controller's pod passed the restricted admission of its namespace.
        pods = wait_for(
            lambda: (spoke.get(pods_path) or {}).get("items"), 120, "client pod created"
        )
        assert pods[0]["spec"]["securityContext"]["runAsNonRoot"] is True
        ns = spoke.get(f"/api/v1/namespaces/{namespace}") or {}
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        # The data claim is bound to the work's PV (the PV controller on the cluster).
        claim = _manifest(work, "PersistentVolumeClaim")["metadata"]["name"]
        claim_path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}"

        def bound() -> bool:
            return ((spoke.get(claim_path) or {}).get("status") or {}).get("phase") == "Bound"

        wait_for(bound, 60, "data claim Bound")
        # The old shape, the data path as a hostPath volume in the pod, is refused there.
        template = _manifest(work, "Job")["spec"]["template"]
        pod_spec = template["spec"]
        pod_spec["volumes"] = [
            {"name": "data", "hostPath": {"path": str(data), "type": "Directory"}}
            if v["name"] == "data"
            else v
            for v in pod_spec["volumes"]
        ]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "hostpath", "namespace": namespace},
            "spec": pod_spec,
        }
        with pytest.raises(KubeError) as exc:
            spoke.create(pods_path, pod)
        assert exc.value.status == 403
        assert 'violates PodSecurity "restricted:latest"' in exc.value.message
        assert 'restricted volume type "hostPath"' in exc.value.message
    finally:
        hub.delete(f"{works_path}/{works.work_name(ref)}")
    # Deleting the work removes the namespace, the claim and the cluster-scoped PV.
    pv = _manifest(work, "PersistentVolume")["metadata"]["name"]
    wait_for(lambda: spoke.get(f"/api/v1/namespaces/{namespace}") is None, 180, "ns gone")
    wait_for(lambda: spoke.get(f"/api/v1/persistentvolumes/{pv}") is None, 60, "PV gone")
