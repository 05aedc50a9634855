"""The controller's command lines parse with the workload launchers' real parsers.

The TLS/key flags are not passed by the controller yet (credentials wiring is pending), so
placeholders stand in for them here.
"""

from __future__ import annotations

import json

import pytest
from fl_fixtures import REF, spec

from hub_controller.clusters import ClusterResolution
from hub_controller.server import server_args
from hub_controller.works import client_args

server_launcher = pytest.importorskip("workloads.server_launcher")
client_launcher = pytest.importorskip("workloads.client_launcher")

SERVER_CREDENTIALS = [
    "--state-dir", "/tmp/s",
    "--ssl-ca-certfile", "/c/ca.crt",
    "--ssl-certfile", "/c/tls.crt",
    "--ssl-keyfile", "/c/tls.key",
    "--supernode-keys", "/c/keys",
]  # fmt: skip
CLIENT_CREDENTIALS = ["--root-certificates", "/c/ca.crt", "--auth-key", "/c/node.key"]


def test_server_args_parse_with_the_server_launcher() -> None:
    s = spec(rounds=4, strategy={"name": "fedprox", "params": {"proximalMu": 0.1}})
    args = server_launcher.build_parser().parse_args(server_args(REF, s) + SERVER_CREDENTIALS)
    assert args.rounds == 4
    assert args.min_clients == 2
    assert args.strategy == "fedprox"
    assert json.loads(args.strategy_params)["proximalMu"] == 0.1
    assert args.task == "digits"
    assert args.wait_clients_timeout == s.server.timeouts.clients_ready_seconds


def test_client_args_parse_with_the_client_launcher() -> None:
    c = ClusterResolution("c1", "/srv/a", "")
    argv = client_args(spec(), c.name, "127.0.0.1:9443") + CLIENT_CREDENTIALS
    args = client_launcher.build_parser().parse_args(argv)
    assert args.server_address == "127.0.0.1:9443"
    assert args.cluster_name == "c1"
    assert str(args.data_dir) == "/data"
    assert str(args.run_config) == "/etc/ocm-fl/run-config.json"
