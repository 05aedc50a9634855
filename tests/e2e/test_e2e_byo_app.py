"""A user's own Flower app, unknown to the controller, on the local plane (issue 10).

The app lives in tests/apps/byo (the one docs/apps.md builds) and imports nothing from this
project but the public SDK, workloads.sdk. It reaches the server pod the way a user's image
would carry it: a test-only image whose /opt/ocm-fl/apps holds tests/apps (the local node maps
it, hack/controlplane/podplan.register_local_image). One federation checks every platform
feature it gets: mTLS gateway and SuperNode auth (the platform path every run takes), data by
claim (dataClaim left out: inferred from the placement, the incumbent's rule), per-cluster
values as node config, agent metrics in the status, checkpoints and manifest with the
resource uid, a pretrained .pth as initModel, the outcome (model path, sha256, metrics) and
pod settings. Then an app whose ClientApp raises and a missing app path, side by side, both
Failed with their own reason.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from hack import controlplane as cp
from hack.controlplane.podplan import register_local_image
from hack.localfed import (
    LocalFederation,
    create_fl,
    get_fl,
    prepare_data,
    set_cluster_claim,
    wait_fl,
)
from hack.testing import wait_for
from hub_controller.api import claim_placement
from ocmfl import constants
from ocmfl.kube import Kube
from ocmfl.privacy import PRIVACY_CLAIM, ClientPrivacy, DpSettings
from ocmfl_cli import commands as cli
from tests.apps.byo.myapp.model import accuracy, load, make_model
from workloads.sdk import ModelStore
from workloads.sdk.privacy import spent

pytestmark = [pytest.mark.e2e, pytest.mark.byo_app, pytest.mark.timeout(1800)]

APPS = Path(__file__).resolve().parents[1] / "apps"
IMAGE = "localhost/ocm-fl-test-apps:byo"  # "FROM workload; COPY tests/apps /opt/ocm-fl/apps"
NAMESPACE = "fl-byo"
CLAIM = "byo.data.federated-learning.io"
PRIORITY = "fl-test-priority"
POD = {
    "labels": {"kueue.x-k8s.io/queue-name": "team-a"},
    "annotations": {"example.com/owner": "ml-team"},
    "schedulerName": "default-scheduler",
    "priorityClassName": PRIORITY,
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


def resource(name: str, app: str, **server: Any) -> dict[str, Any]:
    """A FederatedLearning for our test image's app; no dataClaim (from the placement)."""
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name},
        "spec": {
            "server": {
                "image": IMAGE,
                "app": {"path": f"{constants.APPS_DIR}/{app}"},
                "rounds": 2,
                "minAvailableClients": 2,
                "storage": {"type": "HostPath"},
                "timeouts": {"clientsReadySeconds": 600, "roundSeconds": 600},
                **server,
            },
            "client": {
                "image": IMAGE,
                "placement": claim_placement(CLAIM),
            },
        },
    }


def _pretrained(path: Path) -> float:
    """Pretrain the app's model on a public slice of digits, save its state_dict as a .pth
    (what a user brings), and return its accuracy on the held-out data."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data[:300] / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target[:300], dtype=torch.long)
    torch.manual_seed(1)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(40):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return accuracy(model, *load(path.parent.parent / "data" / "test"))


DP = {"mode": "central", "clippingNorm": 1000.0, "noiseMultiplier": 1e-5, "delta": 1e-5}
REQUIRED = "clipping,clip=1000"


def _claims(hub: Kube, cluster: str) -> dict[str, str]:
    """The ClusterClaims OCM copied into the ManagedCluster's status."""
    mc = hub.get(f"/apis/{constants.CLUSTER_GROUP}/v1/managedclusters/{cluster}") or {}
    return {
        c["name"]: c.get("value", "") for c in (mc.get("status") or {}).get("clusterClaims") or []
    }


def _settled(hub: Kube, name: str, phase: str, what: str | None = None) -> dict[str, Any]:
    """The status once the phase is reached and carries the server's own outcome: `what` in
    the message, or (None) the model. The pod's termination message can be folded in a
    moment after the Job's condition."""

    def ready() -> dict[str, Any] | None:
        status = ((get_fl(hub, NAMESPACE, name) or {}).get("status")) or {}
        if status.get("phase") != phase:
            return None
        done = status.get("model") if what is None else what in status.get("message", "")
        return status if done else None

    return wait_for(ready, 90, f"{name}: {phase} with {what!r}")


def _job_template(obj: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = obj["spec"]["template"]
    return template


def _assert_pod_settings(template: dict[str, Any]) -> None:
    assert template["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert template["metadata"]["annotations"] == POD["annotations"]
    spec = template["spec"]
    for key in ("schedulerName", "priorityClassName", "nodeSelector", "tolerations"):
        assert spec[key] == POD[key], key


@pytest.fixture(scope="module")
def data(plane: cp.ControlPlane, fed: LocalFederation) -> dict[str, Path]:
    root = fed.workdir.parent / "byo"
    register_local_image(Path(plane.state_dir), IMAGE, APPS)
    for kubeconfig in (plane.hub_kubeconfig, *plane.cluster_kubeconfigs.values()):
        k = Kube(kubeconfig)
        try:
            k.create(
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": PRIORITY},
                    "value": 1000,
                },
            )
        finally:
            k.close()
    return prepare_data(plane, root / "data", plane.clusters[:2], CLAIM)


def test_a_foreign_app_trains_to_completed_with_every_platform_feature(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, data: dict[str, Path]
) -> None:
    root = fed.workdir.parent / "byo"
    # The pretrained model is a file the server sees (the local node's pods see the host's
    # files, as an image's own files): the HostPath store is the hub's, per resource, and a
    # tenant cannot put files into it before the resource exists.
    base = root / "pretrained" / "base.pth"
    pretrained_accuracy = _pretrained(base)
    assert pretrained_accuracy > 0.5  # really pretrained, not a random start
    body = resource("byo", "byo", initModel=str(base), pod=POD)
    body["spec"]["server"]["app"]["runConfig"] = {"test-dir": str(root / "data" / "test")}
    body["spec"]["client"]["pod"] = POD
    first = plane.clusters[0]
    body["spec"]["client"]["overrides"] = [{"clusterName": first, "runConfig": {"lr": 0.02}}]
    # Differential privacy through the real path (docs/privacy.md; its properties are tested
    # in tests/unit/test_privacy.py): the resource's central DP, and the first cluster's own
    # requirement by ClusterClaim. Settings that do not move this test's model: the norm is
    # far above a fine-tuning update, the noise tiny.
    body["spec"]["privacy"] = {"differentialPrivacy": DP}
    set_cluster_claim(plane, first, PRIVACY_CLAIM, REQUIRED)
    wait_for(lambda: _claims(hub, first).get(PRIVACY_CLAIM) == REQUIRED, 120,
             f"{first}: the privacy claim on its ManagedCluster")  # fmt: skip
    try:
        created = create_fl(hub, NAMESPACE, body)
        uid = created["metadata"]["uid"]
        final = wait_fl(hub, NAMESPACE, "byo", 1500, fed=fed)
    finally:
        set_cluster_claim(plane, first, PRIVACY_CLAIM, None)
    assert final["status"]["phase"] == "Completed", final["status"].get("message")
    status = _settled(hub, "byo", "Completed")
    assert status["round"] == status["totalRounds"] == 2
    # The privacy spent, as the server's accountant gave it for the resource's settings.
    assert status["privacy"]["mode"] == "central" and status["privacy"]["rounds"] == 2
    expected = spent(DpSettings.from_spec(DP), 2)["epsilon"]
    assert status["privacy"]["epsilon"] == pytest.approx(expected), status["privacy"]

    # Data by claim, the incumbent's way: dataClaim unset, the placement's one Exists key.
    [valid] = [c for c in status["conditions"] if c["type"] == "Validated"]
    assert valid["reason"] == "DataClaimFromPlacement" and CLAIM in valid["message"]
    # Agent metrics (the SDK's ClientApp mod -> agent -> aggregator -> status).
    rows = {r["name"]: r for r in status["clusters"]}
    assert set(rows) == set(data)
    for cluster, path in data.items():
        manifest = json.loads((path / "manifest.json").read_text())
        assert rows[cluster]["samples"] == manifest["samples"], rows[cluster]
        assert rows[cluster]["round"] == 2 and rows[cluster]["accuracy"] is not None
        assert rows[cluster]["dataPath"] == str(path)
    assert status.get("history")

    # The outcome: model path and sha256 in the status, the app's own metric names.
    model = status["model"]
    assert hashlib.sha256(Path(model["path"]).read_bytes()).hexdigest() == model["sha256"]
    # The app's own held-out metric: two rounds of fine-tuning from a pretrained start (over
    # 0.5, asserted above) keep the model far above chance (0.1 for ten digits).
    assert model["metrics"]["test-accuracy"] > 0.5, model
    # Checkpoints and manifest with the resource uid; training started from the .pth: the
    # model before round 1 scored what the pretrained file scores on the held-out data.
    store = ModelStore(fed.store_dir(created), uid)
    manifest = store.manifest()
    assert manifest["uid"] == uid
    assert [c["round"] for c in manifest["checkpoints"]] == [1, 2]
    assert all(c["uid"] == uid for c in manifest["checkpoints"])
    assert set(manifest["checkpoints"][0]["metrics"]["train"]) == set(data)
    [start] = manifest["info"]["starts"]
    assert start["from"] == f"initModel {base}"
    assert start["server"]["test-accuracy"] == pytest.approx(pretrained_accuracy, abs=1e-6)

    # Pod settings on the server Job and on each cluster's client Job.
    job_path = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
    owner = f"{constants.LABEL_OWNER_UID}={uid}"
    [server_job] = (hub.get(job_path, {"labelSelector": owner}) or {})["items"]
    _assert_pod_settings(_job_template(server_job))
    works_path = f"/apis/{constants.WORK_GROUP}/v1/namespaces/{first}/manifestworks"
    [work] = (hub.get(works_path, {"labelSelector": owner}) or {})["items"]
    manifests = work["spec"]["workload"]["manifests"]
    client_job = _job_template(next(m for m in manifests if m["kind"] == "Job"))
    _assert_pod_settings(client_job)
    # The first cluster's requirement reached its client, merged with the resource's DP.
    [container] = [c for c in client_job["spec"]["containers"] if c["name"] == "client"]
    args = container["args"]
    enforced = ClientPrivacy.from_json(args[args.index("--privacy") + 1])
    assert enforced.cluster == first and enforced.clip == 1000.0, enforced
    assert enforced.requirement == "clipping (updates clipped to 1000)", enforced
    # Per-cluster values reach the ClientApp as node config.
    [config] = [m for m in manifests if m["kind"] == "ConfigMap"]
    assert json.loads(config["data"]["run-config.json"]) == {"lr": 0.02}


def test_a_stock_flower_app_without_the_sdk_shows_its_rounds_and_history(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, data: dict[str, Path]
) -> None:
    """tests/apps/stock: FedAvg's own loop, nothing from this project. `kubectl get fl` reads
    3/3 when it is done, and the history has each round's values, from Flower's log."""
    create_fl(hub, NAMESPACE, resource("stock", "stock", rounds=3))
    final = wait_fl(hub, NAMESPACE, "stock", 900, fed=fed)
    assert final["status"]["phase"] == "Completed", final["status"].get("message")

    def shown() -> dict[str, Any] | None:
        """The status once the server's termination message (its log's rounds) is folded."""
        st: dict[str, Any] = (get_fl(hub, NAMESPACE, "stock") or {}).get("status") or {}
        return st if st.get("round") == 3 and st.get("history") else None

    status = wait_for(shown, 90, "stock: 3 rounds and their history in the status")
    assert status["phase"] == "Completed" and status["totalRounds"] == 3
    rows = [h for h in status["history"] if h["cluster"] == "global"]
    assert [h["round"] for h in rows] == [1, 2, 3], status["history"]
    # The app's own metric names (eval_loss, eval_acc) became loss and accuracy; it learns.
    assert all(h["loss"] >= 0 and 0 <= h["accuracy"] <= 1 for h in rows), rows
    assert rows[-1]["loss"] < rows[0]["loss"], rows
    assert "model" not in status  # it stored none: nothing is made up
    hub.delete(f"/apis/{constants.API_VERSION}/namespaces/{NAMESPACE}/{constants.PLURAL}/stock")
    wait_for(lambda: get_fl(hub, NAMESPACE, "stock") is None, 180, "stock deleted")


def test_a_raising_clientapp_and_a_missing_app_fail_with_their_own_reason(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, data: dict[str, Path]
) -> None:
    create_fl(hub, NAMESPACE, resource("raising", "raising"))
    create_fl(hub, NAMESPACE, resource("lost", "does-not-exist"))
    assert wait_fl(hub, NAMESPACE, "lost", 900, fed=fed)["status"]["phase"] == "Failed"
    missing = f"app directory {constants.APPS_DIR}/does-not-exist does not exist"
    assert missing in _settled(hub, "lost", "Failed", missing)["message"]
    assert wait_fl(hub, NAMESPACE, "raising", 1200, fed=fed)["status"]["phase"] == "Failed"
    raising = _settled(hub, "raising", "Failed", "ValueError: cannot parse")
    assert "no column 'label'" in raising["message"]
    # Each cluster's launcher sent its ClientApp's traceback (issue 35): on its status row,
    # the last line in its reason, and through `ocm-fl logs`.

    def logged() -> dict[str, Any] | None:
        status = (get_fl(hub, NAMESPACE, "raising") or {}).get("status") or {}
        rows = status.get("clusters") or []
        return next((r for r in rows if "cannot parse" in (r.get("clientLog") or "")), None)

    row = wait_for(logged, 120, "a cluster's client log on raising's status")
    assert "ClientApp raised an exception" in row["clientLog"], row["clientLog"]
    assert "Traceback (most recent call last)" in row["clientLog"], row["clientLog"]
    assert "no column 'label'" in row["reason"] and row["reason"].endswith("(ocm-fl logs)")
    shown = CliRunner().invoke(
        cli.app,
        ["logs", "raising", "-n", NAMESPACE, "--cluster", row["name"],
         "--kubeconfig", plane.hub_kubeconfig],
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.startswith(f"==> {row['name']} <==\n") and "cannot parse" in shown.stdout
    for other in ("byo", "lost"):  # no other resource's view holds any of it
        rows = ((get_fl(hub, NAMESPACE, other) or {}).get("status") or {}).get("clusters") or []
        assert not any(r.get("clientLog") for r in rows), other
    for name in ("byo", "raising", "lost"):
        hub.delete(
            f"/apis/{constants.API_VERSION}/namespaces/{NAMESPACE}/{constants.PLURAL}/{name}"
        )
    for name in ("byo", "raising", "lost"):

        def deleted(n: str = name) -> bool:
            return get_fl(hub, NAMESPACE, n) is None

        wait_for(deleted, 180, f"{name} deleted")
    for cluster in data:
        set_cluster_claim(plane, cluster, CLAIM, None)
