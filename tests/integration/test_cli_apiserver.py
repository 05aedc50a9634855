"""`ocm-fl` against the real local hub kube-apiserver (no controller: the tests write status).

The FederatedLearning CRD is applied from crds/federatedlearnings.yaml (as the other
integration tests do); each test creates one resource in its own namespace, writes its status
through the status subresource and runs the CLI with --kubeconfig via CliRunner.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from hack.controlplane.plane import ControlPlane
from hack.localfed import grant_for, grant_namespace, install_crd
from ocmfl import constants
from ocmfl.kube import Kube
from ocmfl_cli import commands as cli
from ocmfl_cli import dashboard

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NAME = "digits"
runner = CliRunner()


@pytest.fixture
def hub(control_plane: ControlPlane) -> Iterator[Kube]:
    """The hub apiserver with the FederatedLearning CRD installed and established."""
    k = Kube(control_plane.hub_kubeconfig)
    install_crd(k)
    yield k
    k.close()


def fl_path(namespace: str, name: str = NAME) -> str:
    return f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{constants.PLURAL}/{name}"


def running_status(now: datetime) -> dict[str, Any]:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    status: dict[str, Any] = {
        "phase": "Running",
        "round": 2,
        "totalRounds": 3,
        "clients": "2/3",
        "accuracy": 0.9,
        "message": "round 2 of 3",
        "conditions": [
            {
                "type": "ClientsReady",
                "status": "False",
                "reason": "ClusterNoData",
                "message": "cluster3 has no ClusterClaim fl-data",
                "lastTransitionTime": stamp,
            }
        ],
        "clusters": [
            {
                "name": "cluster1",
                "phase": "Running",
                "dataPath": "/data/one",
                "samples": 1078,
                "round": 2,
                "loss": 0.25,
                "accuracy": 0.92,
                "lastReportTime": stamp,
            },
            {
                "name": "cluster2",
                "phase": "Running",
                "dataPath": "/data/two",
                "samples": 719,
                "round": 2,
                "loss": 0.31,
                "accuracy": 0.88,
                "lastReportTime": stamp,
            },
            {"name": "cluster3", "phase": "NoData", "reason": "no ClusterClaim fl-data"},
        ],
    }
    status["history"] = [
        {"round": r, "cluster": c, "loss": loss, "accuracy": acc, "samples": n}
        for r, c, loss, acc, n in [
            (1, "cluster1", 0.6, 0.8, 1078),
            (1, "cluster2", 0.7, 0.78, 719),
            (2, "cluster1", 0.25, 0.92, 1078),
            (2, "cluster2", 0.31, 0.88, 719),
            (2, "global", 0.27, 0.9, None),
        ]
    ]
    return status


class FL:
    """One FederatedLearning resource on the hub whose status the test writes."""

    def __init__(self, hub: Kube, namespace: str, kubeconfig: str) -> None:
        self.hub, self.namespace, self.kubeconfig = hub, namespace, kubeconfig
        self.path = fl_path(namespace)

    def set_status(self, status: dict[str, Any]) -> dict[str, Any]:
        return self.hub.patch(f"{self.path}/status", {"status": status})

    def cli(self, *args: str) -> Any:
        return runner.invoke(
            cli.app, [*args, "--kubeconfig", self.kubeconfig, "-n", self.namespace]
        )


@pytest.fixture
def fl(hub: Kube, namespace: str, control_plane: ControlPlane) -> FL:
    body = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {"server": {"rounds": 3}, "client": {"dataClaim": "fl-data"}},
    }
    grant_namespace(hub, namespace, **grant_for(body))
    hub.create(f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{constants.PLURAL}", body)
    res = FL(hub, namespace, control_plane.hub_kubeconfig)
    res.set_status(running_status(datetime.now(UTC)))
    return res


def test_status_shows_the_header_and_a_row_per_cluster(fl: FL) -> None:
    res = fl.cli("status", NAME)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()  # not a terminal: key=value lines
    assert lines[0].startswith(f"{fl.namespace}/{NAME} phase=Running round=2/3 clients=2/3")
    assert "condition=ClientsReady status=False reason=ClusterNoData" in lines[1]
    row1 = next(line for line in lines if line.startswith("cluster=cluster1 "))
    assert "data-path=/data/one" in row1 and "samples=1078" in row1 and "loss=0.2500" in row1
    assert 's ago"' in row1
    assert any(line.startswith("cluster=cluster3 phase=NoData") for line in lines)


def test_namespace_defaults_to_the_kubeconfig_context(fl: FL, tmp_path: Path) -> None:
    config = yaml.safe_load(Path(fl.kubeconfig).read_text())
    for ctx in config["contexts"]:
        ctx["context"]["namespace"] = fl.namespace
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    res = runner.invoke(cli.app, ["status", NAME, "--kubeconfig", str(kubeconfig), "-o", "json"])
    assert res.exit_code == 0, res.output
    assert len(yaml.safe_load(res.stdout)["clusters"]) == 3


def test_missing_resource_exits_two(fl: FL) -> None:
    res = fl.cli("status", "nope")
    assert res.exit_code == 2
    assert f"federatedlearning nope not found in namespace {fl.namespace}" in res.stderr


def test_model_exits_one_until_status_has_one(fl: FL) -> None:
    res = fl.cli("model", NAME)
    assert res.exit_code == 1 and "no model yet" in res.stderr
    fl.set_status(
        {
            "model": {
                "path": "/var/lib/ocm-fl/models/x/final.pt",
                "round": 3,
                "sha256": "cd" * 32,
                "metrics": {"accuracy": 0.93},
            }
        }
    )
    res = fl.cli("model", NAME)
    assert res.exit_code == 0, res.output
    assert "final.pt" in res.output and "cd" * 32 in res.output and "0.9300" in res.output


def test_plot_writes_a_png_from_the_history(fl: FL, tmp_path: Path) -> None:
    out = tmp_path / "metrics.png"
    res = fl.cli("plot", NAME, "-f", str(out))
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    obj = fl.hub.get(fl.path)
    assert obj is not None and len(dashboard.history_figure(obj).axes) == 2


def test_plot_without_history_exits_one(fl: FL, tmp_path: Path) -> None:
    fl.set_status({"history": None})
    res = fl.cli("plot", NAME, "-f", str(tmp_path / "m.png"))
    assert res.exit_code == 1 and "no per-round metrics yet" in res.stderr


def test_watch_follows_status_changes_until_completed(fl: FL, control_plane: ControlPlane) -> None:
    def finish() -> None:
        k = Kube(control_plane.hub_kubeconfig)
        try:
            time.sleep(1.5)
            k.patch(f"{fl.path}/status", {"status": {"round": 3, "message": "round 3 of 3"}})
            time.sleep(0.5)
            k.patch(f"{fl.path}/status", {"status": {"phase": "Completed", "message": "done"}})
        finally:
            k.close()

    t = threading.Thread(target=finish, daemon=True)
    t.start()
    started = time.monotonic()
    res = fl.cli("watch", NAME, "--timeout", "60")
    t.join(10)
    assert res.exit_code == 0, res.output
    assert "Completed" in res.output and "3/3" in res.output
    assert time.monotonic() - started < 30


def test_watch_gives_up_at_the_timeout_with_exit_one(fl: FL) -> None:
    started = time.monotonic()
    res = fl.cli("watch", NAME, "--timeout", "2")
    assert res.exit_code == 1
    assert "timed out after 2s" in res.stderr and "Running" in res.stderr
    assert 1.5 < time.monotonic() - started < 20


def test_watch_exits_one_when_failed(fl: FL) -> None:
    fl.set_status({"phase": "Failed", "message": "round 2 timed out"})
    res = fl.cli("watch", NAME, "--timeout", "30")
    assert res.exit_code == 1
    assert "failed: round 2 timed out" in res.stderr
