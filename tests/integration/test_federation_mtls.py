"""Flower traffic over mutual TLS: SuperNodes -> local tunnel -> hub gateway -> SuperLink.

Real processes on 127.0.0.1: `ocm-fl-server` with its nginx Fleet gateway (client
certificates required, only /v1/fleet/ forwarded) and two `ocm-fl-client`s, each with the
cluster certificate the hub issues (hub_controller.operator.desired.credentials) and its nginx
tunnel. A client without a certificate cannot reach the Fleet API at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

import numpy as np
import pytest

from hack.testing import free_port
from hub_controller import credentials_layout
from hub_controller.operator.desired import credentials as cr
from hub_controller.signer import fleet_server
from ocmfl import nodekeys, pki
from workloads.data import partition
from workloads.sdk import ModelStore

pytestmark = [pytest.mark.federation, pytest.mark.timeout(600)]

BIN = Path(sys.executable).parent
CLUSTERS = ("cluster1", "cluster2")
UID = "fl-uid"
DIGITS_APP = Path(__file__).resolve().parents[2] / "examples" / "apps" / "digits"
# Float32 arrays of a size the run config sets; each client adds a known step (tests/apps).
LARGE_APP = Path(__file__).resolve().parents[1] / "apps" / "large"
GATEWAY_NAME = "fl-server.team.svc"


def _spawn(cmd: list[str], log: Path) -> Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _write(directory: Path, files: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
        (directory / name).chmod(0o600)
    return directory


@dataclass
class Federation:
    """What the hub's signer and each cluster's agent would have made: the server's TLS
    files and enrolled SuperNode keys, each cluster's Fleet certificate bundle, the data."""

    root: Path
    server_tls: Path
    node_keys: Path
    bundles: dict[str, Path]
    gateway: str = field(default_factory=lambda: f"127.0.0.1:{free_port()}")

    def server_cmd(self, app: Path, rounds: int, run_config: dict[str, object]) -> list[str]:
        return [
            str(BIN / "ocm-fl-server"),
            "--state-dir", str(self.root / "server-state"),
            "--superlink-address", f"127.0.0.1:{free_port()}",
            "--ssl-ca-certfile", str(self.server_tls / credentials_layout.CA),
            "--ssl-certfile", str(self.server_tls / credentials_layout.SUPERLINK_CERT),
            "--ssl-keyfile", str(self.server_tls / credentials_layout.SUPERLINK_KEY),
            "--gateway-listen", self.gateway,
            "--gateway-certfile", str(self.server_tls / credentials_layout.GATEWAY_CERT),
            "--gateway-keyfile", str(self.server_tls / credentials_layout.GATEWAY_KEY),
            "--supernode-keys", str(self.node_keys),
            "--min-clients", "2",
            "--wait-clients-timeout", "240",
            "--status-interval", "3",
            "--rounds", str(rounds),
            "--app-dir", str(app),
            "--run-config", json.dumps(run_config),
            "--storage", str(self.root / "models"),
            "--result-file", str(self.root / "result.json"),
        ]  # fmt: skip

    def client_cmd(self, cluster: str) -> list[str]:
        bundle = self.bundles[cluster]
        return [
            str(BIN / "ocm-fl-client"),
            "--server", self.gateway,
            "--server-name", GATEWAY_NAME,
            "--root-certificates", str(bundle / pki.CA_FILE),
            "--client-certfile", str(bundle / pki.CERT_FILE),
            "--client-keyfile", str(bundle / pki.KEY_FILE),
            "--auth-key", str(bundle / "node.key"),
            "--cluster", cluster,
            "--data-dir", str(self.root / "data" / cluster),
            "--state-dir", str(self.root / f"client-{cluster}"),
            "--port", "0",
            "--connect-timeout", "240",
        ]  # fmt: skip

    def start(self, app: Path, rounds: int, run_config: dict[str, object]) -> list[Popen[bytes]]:
        """The server and both clients, the server first."""
        procs = [_spawn(self.server_cmd(app, rounds, run_config), self.root / "server.log")]
        procs += [_spawn(self.client_cmd(c), self.root / f"{c}.log") for c in CLUSTERS]
        return procs

    def finish(self, server: Popen[bytes]) -> dict[str, object]:
        """Wait for the server to end on its own; its result, after checking that it
        succeeded and that every Fleet call came through the gateway with a cluster's Fleet
        certificate."""
        server.wait(timeout=480)
        log = (self.root / "server.log").read_text(errors="replace")
        assert server.returncode == 0, log[-4000:]
        result: dict[str, object] = json.loads((self.root / "result.json").read_text())
        assert result["ok"], result
        gateway_log = (self.root / "server-state" / "gateway" / "nginx.log").read_text()
        for cluster in CLUSTERS:
            assert f"CN=fleet:{cluster}" in gateway_log
        assert "/v1/control/" not in gateway_log
        return result


def make_federation(root: Path) -> Federation:
    gateway_names = credentials_layout.GatewayNames(dns=(GATEWAY_NAME,))
    # What the signer part does: the federation's Fleet CA (kept in its own namespace) and
    # the server certificates it issues into the credentials Secret.
    fleet_ca, _ = fleet_server.fleet_ca({}, "fleet", pki.utcnow())
    tls = fleet_server.server_tls({}, fleet_ca, gateway_names, pki.utcnow())
    # What each cluster's agent and the hub's Fleet signer do: keys made "on the cluster",
    # the Fleet certificate from the federation's Fleet CA, the SuperNode key enrolled.
    bundles: dict[str, Path] = {}
    enrolled: dict[str, bytes] = {}
    for cluster in CLUSTERS:
        key = pki.generate_key()
        node_private, node_public = nodekeys.generate_keypair(cluster)
        csr = pki.create_fleet_csr(UID, cluster, key, node_public)
        cert = pki.sign_fleet_csr(csr, fleet_ca, UID, cluster)
        files = {
            pki.CERT_FILE: pki.cert_to_pem(cert),
            pki.KEY_FILE: pki.key_to_pem(key),
            pki.CA_FILE: tls[credentials_layout.CA],
            "node.key": node_private,
        }
        bundles[cluster] = _write(root / f"{cluster}-tls", files)
        enrolled[f"{cluster}.node.pub"] = node_public
    data = cr.credentials(tls, clusters=list(CLUSTERS), enrolled=enrolled)
    partition(root / "data", list(CLUSTERS), split="iid", sizes="1,1", seed=0)
    return Federation(
        root,
        server_tls=_write(root / "server-tls", cr.server_tls_bundle(data)),
        node_keys=_write(root / "node-keys", cr.server_node_keys(data)),
        bundles=bundles,
    )


@pytest.mark.rotation(
    turn=2,
    covered_by=(
        "tests/e2e/test_e2e_federation.py::test_federation_trains_to_completion_over_mtls_and_cleans_up",
        "tests/integration/test_federation_mtls.py::test_a_model_in_many_chunks_crosses_gateway_and_tunnels_whole_and_is_stored",
        "tests/integration/test_fleet_proxy.py::test_gateway_refuses_clients_without_a_certificate",
        "tests/integration/test_fleet_proxy.py::test_gateway_refuses_control_and_runtime_apis_even_with_a_valid_certificate",
    ),
)
def test_training_runs_end_to_end_through_the_mtls_gateway(tmp_path: Path) -> None:
    fed = make_federation(tmp_path)
    procs = fed.start(DIGITS_APP, 2, {"fraction-evaluate": 0.0})
    try:
        # A node with a registered key but no client certificate: refused by the gateway
        # before Flower sees it (it dials the gateway directly, TLS without a client cert).
        no_cert = fed.bundles[CLUSTERS[0]]
        rogue = subprocess.run(
            [
                str(BIN / "ocm-fl-client"),
                "--server",
                fed.gateway,
                "--root-certificates",
                str(no_cert / pki.CA_FILE),
                "--auth-key",
                str(no_cert / "node.key"),
                "--cluster",
                CLUSTERS[0],
                "--data-dir",
                str(tmp_path / "data" / CLUSTERS[0]),
                "--state-dir",
                str(tmp_path / "client-no-cert"),
                "--port",
                "0",
                "--connect-timeout",
                "15",
                "--max-retries",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert rogue.returncode != 0, rogue.stdout[-2000:]
        fed.finish(procs[0])
    finally:
        for proc in procs:
            _stop(proc)


def test_a_model_in_many_chunks_crosses_gateway_and_tunnels_whole_and_is_stored(
    tmp_path: Path,
) -> None:
    """16 MB of float32 in two arrays of 8 MB: each is cut into Flower's 5 MiB chunks (one
    object per chunk, pushed and pulled one request each through the tunnels and the
    gateway). The app adds 0.1 and 0.2 on the two clusters, so after FedAvg every number
    grows by exactly 0.15 a round: the ServerApp fails the run if any number differs, and
    the stored checkpoints and final model must hold the same."""
    _large_model_round_trip(tmp_path, "float32", atol=1e-5, bits=32)


def test_the_model_as_float16_on_the_wire_crosses_the_same_path_and_is_stored_as_float32(
    tmp_path: Path,
) -> None:
    """The same run with `run_strategy(..., wire_dtype="float16")`: the arrays cross the
    tunnels and the gateway as float16 both ways (workloads.sdk.wire), the app and the
    store see float32, and every number is right to float16's rounding (the ServerApp checks
    it too)."""
    _large_model_round_trip(tmp_path, "float16", atol=2e-3, bits=16)


def _large_model_round_trip(tmp_path: Path, wire: str, atol: float, bits: int) -> None:
    fed = make_federation(tmp_path)
    params, rounds = 4_000_000, 2
    procs = fed.start(LARGE_APP, rounds, {"params": params, "layers": 2, "wire-dtype": wire})
    try:
        fed.finish(procs[0])
    finally:
        for proc in procs:
            _stop(proc)
    store = ModelStore(tmp_path / "models")
    final = store.final()
    assert final is not None and final.round == rounds
    arrays = {name: array.numpy() for name, array in final.arrays.items()}
    assert sorted(arrays) == ["layer0", "layer1"]
    assert sum(a.size for a in arrays.values()) == params
    # Round 2 added 0.15 to every number of round 1's model; the numbers differ from one
    # another (so every 5 MiB chunk crossed on its own: Flower sends a chunk once per content).
    checkpoints = store.manifest()["checkpoints"]
    first = store.read_model(checkpoints[0]["path"])
    # What crossed the wire, as each client's outermost mod saw it, both ways, every round.
    for entry in checkpoints:
        for cluster, metrics in entry["metrics"]["train"].items():
            got = (metrics["wire-bits-in"], metrics["wire-bits-out"])
            assert got == (bits, bits), (entry["round"], cluster, got)
    for name, values in arrays.items():
        assert values.dtype == np.float32
        assert np.unique(values[:100_000]).size > 2_000  # (float16 has ~2,350 in [0.3, 1.3])
        assert np.allclose(values - first[name].numpy(), 0.15, atol=atol)
