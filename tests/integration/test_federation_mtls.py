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
import time
from pathlib import Path

import pytest

from hack.testing import free_port
from hub_controller import credentials_layout
from hub_controller.operator.desired import credentials as cr
from hub_controller.signer import fleet_server
from ocmfl import nodekeys, pki
from workloads.data import partition

pytestmark = [pytest.mark.federation, pytest.mark.timeout(600)]

BIN = Path(sys.executable).parent
CLUSTERS = ("cluster1", "cluster2")
UID = "fl-uid"
DIGITS_APP = Path(__file__).resolve().parents[2] / "examples" / "apps" / "digits"


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
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


@pytest.mark.rotation(
    turn=2,
    covered_by=(
        "tests/e2e/test_e2e_federation.py::test_federation_trains_to_completion_over_mtls_and_cleans_up",
        "tests/integration/test_fleet_proxy.py::test_gateway_refuses_clients_without_a_certificate",
        "tests/integration/test_fleet_proxy.py::test_gateway_refuses_control_and_runtime_apis_even_with_a_valid_certificate",
    ),
)
def test_training_runs_end_to_end_through_the_mtls_gateway(tmp_path: Path) -> None:
    gateway_name = "fl-server.team.svc"
    gateway_names = credentials_layout.GatewayNames(dns=(gateway_name,))
    # What the signer part does: the federation's Fleet CA (kept in its own namespace) and
    # the server certificates it issues into the credentials Secret.
    fleet_ca, _ = fleet_server.fleet_ca({}, "fleet", pki.utcnow())
    tls = fleet_server.server_tls({}, fleet_ca, gateway_names, pki.utcnow())
    # What each cluster's agent and the hub's Fleet signer do: keys made "on the cluster",
    # the Fleet certificate from the federation's Fleet CA, the SuperNode key enrolled.
    bundles: dict[str, dict[str, bytes]] = {}
    enrolled: dict[str, bytes] = {}
    for cluster in CLUSTERS:
        key = pki.generate_key()
        node_private, node_public = nodekeys.generate_keypair(cluster)
        csr = pki.create_fleet_csr(UID, cluster, key, node_public)
        cert = pki.sign_fleet_csr(csr, fleet_ca, UID, cluster)
        bundles[cluster] = {
            pki.CERT_FILE: pki.cert_to_pem(cert),
            pki.KEY_FILE: pki.key_to_pem(key),
            pki.CA_FILE: tls[credentials_layout.CA],
            "node.key": node_private,
        }
        enrolled[f"{cluster}.node.pub"] = node_public
    data = cr.credentials(tls, clusters=list(CLUSTERS), enrolled=enrolled)
    server_tls = _write(tmp_path / "server-tls", cr.server_tls_bundle(data))
    node_keys = _write(tmp_path / "node-keys", cr.server_node_keys(data))
    partition(tmp_path / "data", list(CLUSTERS), split="iid", sizes="1,1", seed=0)
    superlink_port, gateway_port = free_port(), free_port()
    gateway = f"127.0.0.1:{gateway_port}"
    server_cmd = [
        str(BIN / "ocm-fl-server"),
        "--state-dir", str(tmp_path / "server-state"),
        "--superlink-address", f"127.0.0.1:{superlink_port}",
        "--ssl-ca-certfile", str(server_tls / credentials_layout.CA),
        "--ssl-certfile", str(server_tls / credentials_layout.SUPERLINK_CERT),
        "--ssl-keyfile", str(server_tls / credentials_layout.SUPERLINK_KEY),
        "--gateway-listen", gateway,
        "--gateway-certfile", str(server_tls / credentials_layout.GATEWAY_CERT),
        "--gateway-keyfile", str(server_tls / credentials_layout.GATEWAY_KEY),
        "--supernode-keys", str(node_keys),
        "--min-clients", "2",
        "--wait-clients-timeout", "240",
        "--status-interval", "3",
        "--rounds", "2",
        "--app-dir", str(DIGITS_APP),
        "--run-config", json.dumps({"fraction-evaluate": 0.0}),
        "--storage", str(tmp_path / "models"),
        "--result-file", str(tmp_path / "result.json"),
    ]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    try:
        server = _spawn(server_cmd, tmp_path / "server.log")
        procs.append(server)
        for cluster in CLUSTERS:
            bundle = _write(tmp_path / f"{cluster}-tls", bundles[cluster])
            client_cmd = [
                str(BIN / "ocm-fl-client"),
                "--server", gateway,
                "--server-name", gateway_name,
                "--root-certificates", str(bundle / pki.CA_FILE),
                "--client-certfile", str(bundle / pki.CERT_FILE),
                "--client-keyfile", str(bundle / pki.KEY_FILE),
                "--auth-key", str(bundle / "node.key"),
                "--cluster", cluster,
                "--data-dir", str(tmp_path / "data" / cluster),
                "--state-dir", str(tmp_path / f"client-{cluster}"),
                "--port", "0",
                "--connect-timeout", "240",
            ]  # fmt: skip
            procs.append(_spawn(client_cmd, tmp_path / f"{cluster}.log"))

        # A node with a registered key but no client certificate: refused by the gateway
        # before Flower sees it (it dials the gateway directly, TLS without a client cert).
        no_cert = tmp_path / "no-cert-tls"
        _write(no_cert, bundles[CLUSTERS[0]])
        rogue = subprocess.run(
            [
                str(BIN / "ocm-fl-client"),
                "--server",
                gateway,
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

        deadline = time.monotonic() + 480
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(2)
        log = (tmp_path / "server.log").read_text(errors="replace")
        assert server.returncode == 0, log[-4000:]
        result = json.loads((tmp_path / "result.json").read_text())
        assert result["ok"], result
        gateway_log = (tmp_path / "server-state" / "gateway" / "nginx.log").read_text()
        for cluster in CLUSTERS:
            # Every Fleet call came in with the cluster's Fleet certificate.
            assert f"CN=fleet:{cluster}" in gateway_log
        assert "/v1/control/" not in gateway_log
    finally:
        for proc in procs:
            _stop(proc)
