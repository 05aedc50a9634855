"""Launcher pieces that need no processes: flags -> run config and platform env, node config."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from ocmfl.constants import ENV_FL_UID as OCMFL_FL_UID
from workloads import client_launcher, server_launcher
from workloads.flower_env import flower_env, write_connection

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "apps" / "digits"
BASE = ["--state-dir", "st", "--ssl-ca-certfile", "ca", "--ssl-certfile", "c",
        "--ssl-keyfile", "k", "--supernode-keys", "keys", "--storage", "store",
        "--app-dir", str(DIGITS)]  # fmt: skip


def test_server_flags_become_run_config_and_the_apps_platform_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(OCMFL_FL_UID, "uid-7")
    args = server_launcher.build_parser().parse_args(
        [*BASE, "--rounds", "5", "--min-clients", "3", "--run-config", '{"lr": 0.05}',
         "--init-model", "base.pth", "--round-timeout", "60"]
    )  # fmt: skip
    settings = server_launcher.settings_from_args(args)
    assert settings.run_config == {"lr": 0.05, "num-server-rounds": 5}
    env = settings.platform.to_env()
    assert Path(env["OCMFL_STORAGE"]).is_absolute() and env["OCMFL_INIT_MODEL"] == "base.pth"
    assert (env["OCMFL_ROUNDS"], env["OCMFL_MIN_CLIENTS"]) == ("5", "3")
    assert env["OCMFL_FL_UID"] == "uid-7" and env["OCMFL_NODE_NAMES"].endswith("nodes.json")
    assert not settings.install_dependencies


def test_controller_style_aliases_are_accepted() -> None:
    args = server_launcher.build_parser().parse_args(
        [*BASE, "--model-dir", "s3://bucket/fl", "--clients-ready-timeout", "30"]
    )
    assert args.storage == "s3://bucket/fl" and args.wait_clients_timeout == 30.0
    assert server_launcher.settings_from_args(args).platform.storage == "s3://bucket/fl"


def test_a_missing_app_fails_fast_naming_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*BASE[:-1], str(tmp_path / "no-app"), "--termination-log", str(tmp_path / "t")]
    (tmp_path / "t").write_text("")
    assert server_launcher.main(argv) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        f"ocm-fl-server: failed: invalid app or settings: app directory {tmp_path / 'no-app'} "
        "does not exist in the server image"
    ]
    message = json.loads((tmp_path / "t").read_text())
    assert message["ok"] is False and str(tmp_path / "no-app") in message["reason"]


def test_bad_settings_fail_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert server_launcher.main([*BASE, "--run-config", '{"nope": 1}']) == 1
    out = capsys.readouterr().out.strip()
    assert "run config keys ['nope'] are not declared" in out


def test_online_count_only_counts_our_online_nodes() -> None:
    nodes = {"nodes": [{"node-id": "1", "status": "online"},
                       {"node-id": "2", "status": "registered"},
                       {"node-id": "3", "status": "online"}]}  # fmt: skip
    assert server_launcher.online_count(nodes, {"1", "2"}) == 1


def test_flower_env_is_absolute_and_quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", raising=False)
    env = flower_env(Path("rel"))
    assert env["FLWR_HOME"] == str(tmp_path / "rel")
    assert env["FLWR_TELEMETRY_ENABLED"] == "0"
    assert env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.1"
    text = write_connection(tmp_path / "h", "127.0.0.1:9092", Path("ca.crt")).read_text()
    assert 'address = "127.0.0.1:9092"' in text and str(tmp_path / "ca.crt") in text


def test_client_node_config_carries_cluster_data_and_the_clusters_values(tmp_path: Path) -> None:
    values_file = tmp_path / "rc.json"
    values_file.write_text(json.dumps({"lr": 0.01, "tokenizer": "bpe", "augment": True}))
    values = client_launcher.read_values(values_file)
    assert values == {"lr": 0.01, "tokenizer": "bpe", "augment": True}
    config = client_launcher.node_config("c1", Path("d"), "http://127.0.0.1:8088", values)
    assert config["cluster-name"] == "c1" and Path(str(config["data-dir"])).is_absolute()
    assert config["agent-endpoint"] == "http://127.0.0.1:8088" and config["tokenizer"] == "bpe"
    values_file.write_text(json.dumps({"data-dir": "/elsewhere"}))
    with pytest.raises(ValueError, match="data-dir is set by the platform"):
        client_launcher.read_values(values_file)


def test_client_fails_fast_naming_a_missing_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = client_launcher.main(
        ["--root-certificates", "ca", "--auth-key", "k", "--cluster", "c1",
         "--data-dir", str(tmp_path / "missing")]
    )  # fmt: skip
    assert code == client_launcher.EXIT_BAD_INPUT
    assert f"data directory {tmp_path / 'missing'} does not exist" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    code = client_launcher.main(
        ["--root-certificates", "ca", "--auth-key", "k", "--cluster", "c1",
         "--data-dir", str(tmp_path / "empty")]
    )  # fmt: skip
    assert code == client_launcher.EXIT_BAD_INPUT
    assert f"data directory {tmp_path / 'empty'} is empty" in capsys.readouterr().out


def test_client_refuses_a_long_poll_hold_near_flowers_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x").write_text("1")
    base = ["--root-certificates", "ca", "--auth-key", "k", "--cluster", "c1",
            "--data-dir", str(tmp_path / "data")]  # fmt: skip
    for bad in ("25", "0"):
        assert (
            client_launcher.main([*base, "--long-poll-hold", bad]) == client_launcher.EXIT_BAD_INPUT
        )
        assert f"--long-poll-hold {float(bad)}: give 0 < seconds <= 20" in capsys.readouterr().out
    args = client_launcher.build_parser().parse_args([*base, "--no-long-poll"])
    assert args.no_long_poll and args.long_poll_hold == 10.0


def test_flower_exit_code_is_read_from_its_log_line() -> None:
    assert client_launcher.flower_exit_code("\x1b[91mERROR \x1b[0m: Exit Code: 305") == 305
    assert client_launcher.flower_exit_code("INFO: all good") is None


def test_a_reply_for_a_run_that_no_longer_runs_restarts_the_supernode() -> None:
    # After a server restart mid-message Flower logs this and its ClientApp can hang forever;
    # the launcher must react (restart the SuperNode) instead of waiting.
    import io

    from workloads.client_launcher import STALE_RUN_MARKER, _Output

    calls: list[str] = []
    out = _Output(lambda: calls.append("restart"))
    out.pump(io.StringIO(f"INFO: Run ID 42 {STALE_RUN_MARKER} abc.\nINFO: {STALE_RUN_MARKER}\n"))
    assert out.stale_run is True
    assert calls == ["restart"]  # once per SuperNode process, not per line


def test_only_runs_lost_to_unavailable_nodes_are_resubmitted() -> None:
    from workloads.server_launcher import transient_failure

    unavailable = (
        "run 1 finished:failed: ServerApp failed with exception: round 1 train: 0 successful "
        "client results, minimum is 2 (node 1: Error: Node Unavailable — no heartbeat; "
        "node 2: Error: Node Unavailable — no heartbeat)"
    )
    assert transient_failure(unavailable)
    crashed = (
        "run 1 finished:failed: ServerApp failed with exception: round 1 train: 1 successful "
        "client results, minimum is 2 (node 2: Error: ClientAppException: bad data)"
    )
    assert not transient_failure(crashed)
    mixed = unavailable.replace("node 2: Error: Node Unavailable", "node 2: Error: ValueError")
    assert not transient_failure(mixed)


def test_waiting_for_the_superlink_ends_at_once_when_it_dies(tmp_path: Path) -> None:
    """The start bound is long (a busy hub starts SuperLinks slowly); a dead one fails now."""
    import subprocess
    import time

    from ocmfl import pki

    (tmp_path / "ca").write_bytes(pki.create_ca("test").cert_pem)
    args = server_launcher.build_parser().parse_args(
        [*BASE[:1], str(tmp_path / "st"), "--ssl-ca-certfile", str(tmp_path / "ca"), *BASE[4:]]
    )
    launcher = server_launcher.Launcher(args, server_launcher.settings_from_args(args))
    launcher.state.mkdir(parents=True)
    (launcher.state / "superlink.log").write_text("address already in use\n")
    launcher.superlink = subprocess.Popen(["sh", "-c", "sleep 1; exit 1"])
    started = time.monotonic()
    with pytest.raises(server_launcher.LaunchError, match=r"SuperLink exited.*already in use"):
        launcher.wait_health(server_launcher.SUPERLINK_START_TIMEOUT)
    assert time.monotonic() - started < 10
    assert server_launcher.SUPERLINK_START_TIMEOUT >= 300


def test_a_flwr_call_that_hangs_fails_with_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workloads import flower_env

    slow = tmp_path / "flwr"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setattr(flower_env, "executable", lambda name: str(slow))
    with pytest.raises(flower_env.FlwrCliError, match=r"^flwr supernode register: no answer"):
        flower_env.flwr_json(["supernode", "register", "k.pub"], {}, timeout=0.5)
    assert flower_env.FLWR_CLI_TIMEOUT >= 300


def test_the_supernode_database_and_node_map_go_to_persist_dir(tmp_path: Path) -> None:
    # A replacement server pod finds the killed pod's node ids there (its --state-dir is new).
    args = server_launcher.build_parser().parse_args(
        [*BASE, "--persist-dir", str(tmp_path / "kept")]
    )
    settings = server_launcher.settings_from_args(args)
    assert settings.platform.node_names_file == str(tmp_path / "kept" / "nodes.json")
    assert server_launcher.persist_dir(args) == tmp_path / "kept"
    plain = server_launcher.build_parser().parse_args(BASE)
    assert server_launcher.persist_dir(plain) == Path("st").resolve()


def test_a_supernode_that_exits_0_by_itself_is_restarted(tmp_path: Path) -> None:
    # First run: connects, then exits 0 on its own (as Flower does after a 401 from a new
    # SuperLink). It must be restarted, not taken as "stopped"; the second run never connects,
    # so the launcher gives up after --connect-timeout with "could not connect".
    runs = tmp_path / "runs"
    script = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1]); n = len(p.read_text()) "
        "if p.exists() else 0; p.write_text('x' * (n + 1)); "
        "print('SuperNode ID: 1', flush=True) if n == 0 else None; sys.exit(0 if n == 0 else 1)"
    )
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = client_launcher.supervise(
            [sys.executable, "-c", script, str(runs)], dict(os.environ), connect_timeout=0.5
        )
    finally:  # supervise forwards these to the SuperNode: give pytest its own back
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert code == client_launcher.EXIT_DISCONNECTED
    assert len(runs.read_text()) >= 2


def test_server_registers_keys_that_appear_or_change_but_keeps_those_that_leave(
    tmp_path: Path,
) -> None:
    """The running launcher's key sync: a joining cluster's key and a changed key are to be
    registered; a key that disappeared is not acted on (Flower keeps an unregistered key in
    use, so unregistering it would refuse the same cluster's return)."""
    pub = tmp_path / "c1.pub"
    pub.write_bytes(b"ecdsa-sha2-nistp384 AAAAkey1 c1\n")
    assert server_launcher._key_line(pub) == b"ecdsa-sha2-nistp384 AAAAkey1"
    registered = {"c1": b"k1", "c2": b"k2"}
    assert server_launcher.key_changes(registered, {"c1": b"k1", "c2": b"k2"}) == []
    assert server_launcher.key_changes(registered, {"c1": b"k1", "c2": b"k2", "c3": b"k3"}) == [
        "c3"
    ]
    assert server_launcher.key_changes(registered, {"c1": b"k1b", "c3": b"k3"}) == ["c1", "c3"]
    assert server_launcher.key_changes(registered, {}) == []


def test_a_key_registered_mid_run_reaches_the_node_map_the_serverapp_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cluster joins the running federation: its key is registered and its node id goes
    # into the node map the ServerApp reads (platform.node_names_file, on --persist-dir).
    keys = tmp_path / "keys"
    keys.mkdir()
    args = server_launcher.build_parser().parse_args(
        [*BASE, "--state-dir", str(tmp_path / "st"), "--supernode-keys", str(keys),
         "--persist-dir", str(tmp_path / "kept")]
    )  # fmt: skip
    settings = server_launcher.settings_from_args(args)
    launcher = server_launcher.Launcher(args, settings)
    (tmp_path / "kept").mkdir()
    calls: list[tuple[str, ...]] = []

    def flwr(*argv: str) -> dict[str, str]:
        calls.append(argv)
        return {"node-id": "42"}

    monkeypatch.setattr(launcher, "flwr", flwr)
    (keys / "cluster3.pub").write_bytes(b"ecdsa-sha2-nistp384 AAAAkey3 cluster3\n")
    assert launcher.sync_nodes() == ["cluster3: joined, node 42"]
    assert calls[0][:2] == ("supernode", "register")
    names = json.loads(Path(settings.platform.node_names_file).read_text())
    assert names == {"cluster3": "42"}


def test_upstream_probe_tells_nginx_down_answers_from_an_answer_past_the_gateway(
    tmp_path: Path,
) -> None:
    """The client's wait before starting the SuperNode: a real TLS listener (the tunnel's
    loopback side) answering 502 means the hub is not there yet; a 404 from past it means
    it is; a closed port is not."""
    import http.server
    import ssl
    import threading
    import time

    from ocmfl import pki

    ca = pki.create_ca("probe-test", key_kind="ec")
    pair = pki.issue_server_cert(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    tls = pki.save_tls_dir(tmp_path / "tls", pair, ca.cert)
    status = [502]
    paths: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            paths.append(self.path)
            self.send_response(status[0])
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls / "tls.crt", tls / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        listen = f"127.0.0.1:{server.server_address[1]}"
        assert not client_launcher.upstream_answers(listen, tls / "ca.crt")
        began = time.monotonic()
        assert not client_launcher.wait_upstream(listen, tls / "ca.crt", 0.6)
        assert time.monotonic() - began >= 0.6
        status[0] = 404
        assert client_launcher.wait_upstream(listen, tls / "ca.crt", 5.0)
        assert set(paths) == {"/v1/fleet/"}
    finally:
        server.shutdown()
        server.server_close()
    assert not client_launcher.upstream_answers(listen, tls / "ca.crt")
