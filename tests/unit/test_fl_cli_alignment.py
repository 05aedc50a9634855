"""The controller's command lines parse with the workload launchers' real parsers.

Every flag the launchers require (TLS files, keys, state dirs) comes from the controller.
"""

from __future__ import annotations

import json

from fl_fixtures import REF, spec

from hub_controller.membership import ClusterResolution
from hub_controller.operator.desired.server import server_args
from hub_controller.operator.desired.works import client_args
from ocmfl import constants
from workloads import client_launcher, server_launcher


def test_server_args_parse_with_the_server_launcher() -> None:
    app = {"path": "/opt/ocm-fl/apps/digits", "runConfig": {"strategy": "fedprox"}}
    s = spec(rounds=4, app=app, initModel="base.pth")
    args = server_launcher.build_parser().parse_args(server_args(REF, s))
    assert args.rounds == 4
    assert args.min_clients == 2
    assert str(args.app_dir) == "/opt/ocm-fl/apps/digits"
    assert json.loads(args.run_config) == {"strategy": "fedprox"}
    assert args.storage == "/var/lib/ocm-fl/models" and args.init_model == "base.pth"
    assert args.install_dependencies is False
    assert args.wait_clients_timeout == s.server.timeouts.clients_ready_seconds
    assert args.gateway_listen.endswith(":9443")
    assert str(args.gateway_certfile).endswith("gateway.crt")


def test_client_args_parse_with_the_client_launcher() -> None:
    c = ClusterResolution("c1", "/srv/a", "")
    argv = client_args(spec(), c.name, "127.0.0.1:9443", "fl-x-server.team.svc")
    args = client_launcher.build_parser().parse_args(argv)
    assert args.server_address == "127.0.0.1:9443"
    assert args.server_name == "fl-x-server.team.svc"
    assert str(args.client_certfile).endswith("tls.crt")
    assert args.port == constants.SUPERNODE_PORT  # its default, on the pod's own loopback
    assert args.cluster_name == "c1"
    assert str(args.data_dir) == "/data"
    assert str(args.run_config) == "/etc/ocm-fl/run-config.json"
    assert args.install_dependencies is False
    app = {"path": "/opt/ocm-fl/apps/x", "installDependencies": True}
    argv = client_args(spec(app=app), c.name, "127.0.0.1:9443", "fl-x-server.team.svc")
    args = client_launcher.build_parser().parse_args(argv)
    assert args.install_dependencies is True
