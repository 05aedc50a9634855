"""Launcher pieces that need no processes: flags -> run config and platform env, node config."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.controlplane.processes import alive
from ocmfl.constants import ENV_FL_UID as OCMFL_FL_UID
from workloads import client_launcher, server_launcher
from workloads.flower_env import descendants, flower_env, kill, write_connection

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "apps" / "digits"
BASE = ["--state-dir", "st", "--ssl-ca-certfile", "ca", "--ssl-certfile", "c",
        "--ssl-keyfile", "k", "--supernode-keys", "keys", "--storage", "store",
        "--app-dir", str(DIGITS)]  # fmt: skip


@contextlib.contextmanager
def https_server(handler: type[http.server.BaseHTTPRequestHandler], tls: Path) -> Iterator[str]:
    """A threaded HTTPS server on 127.0.0.1 answering with `handler`, its certificate from
    `tls` (tls.crt, tls.key); yields its host:port and stops it after."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls / "tls.crt", tls / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


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
    nodes = {"1": "online", "2": "registered", "3": "online"}
    assert server_launcher.online_count(nodes, {"1", "2"}) == 1


def test_flower_env_is_absolute_and_quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", raising=False)
    env = flower_env(Path("rel"))
    assert env["FLWR_HOME"] == str(tmp_path / "rel")
    assert env["FLWR_TELEMETRY_ENABLED"] == "0"
    assert env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.5"
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
    calls: list[tuple[str, Path]] = []

    def register_key(cluster: str, key: Path) -> str:
        calls.append((cluster, key))
        return "42"

    monkeypatch.setattr(launcher, "register_key", register_key)
    (keys / "cluster3.pub").write_bytes(b"ecdsa-sha2-nistp384 AAAAkey3 cluster3\n")
    assert launcher.sync_nodes() == ["cluster3: joined, node 42"]
    assert calls == [("cluster3", keys / "cluster3.pub")]
    names = json.loads(Path(settings.platform.node_names_file).read_text())
    assert names == {"cluster3": "42"}


def test_upstream_probe_tells_nginx_down_answers_from_an_answer_past_the_gateway(
    tmp_path: Path,
) -> None:
    """The client's wait before starting the SuperNode: a real TLS listener (the tunnel's
    loopback side) answering 502 means the hub is not there yet; a 404 from past it means
    it is; a closed port is not."""
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

    with https_server(Handler, tls) as listen:
        assert not client_launcher.upstream_answers(listen, tls / "ca.crt")
        began = time.monotonic()
        assert not client_launcher.wait_upstream(listen, tls / "ca.crt", 0.6)
        assert time.monotonic() - began >= 0.6
        status[0] = 404
        assert client_launcher.wait_upstream(listen, tls / "ca.crt", 5.0)
        assert set(paths) == {"/v1/fleet/"}
    assert not client_launcher.upstream_answers(listen, tls / "ca.crt")


def test_run_status_comes_from_one_control_api_request_as_flwr_ls_shows_it(
    tmp_path: Path,
) -> None:
    """The launcher learns a run's final status from the Control API's ListRuns (protobuf over
    verified HTTPS, what `flwr ls` sends) instead of a `flwr ls` process: the rows read as
    `flwr ls --format json` rows, a refusal is a FlwrCliError naming the HTTP status."""
    from flwr.proto.control_pb2 import ListRunsRequest, ListRunsResponse, StreamLogsResponse
    from flwr.proto.run_pb2 import Run, RunStatus

    from ocmfl import pki
    from workloads import flower_env

    ca = pki.create_ca("control-test", key_kind="ec")
    pair = pki.issue_server_cert(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    tls = pki.save_tls_dir(tmp_path / "tls", pair, ca.cert)
    answer = ListRunsResponse(now="2026-12-01T00:00:10+00:00")
    answer.run_dict[7].CopyFrom(
        Run(run_id=7, fab_id="ocmfl/digits", fab_version="1.0.0", pending_at="2026-12-01T00:00:00",
            status=RunStatus(status="finished", sub_status="failed", details="ServerApp error"))
    )  # fmt: skip
    seen: list[tuple[str, str, int]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            asked = ListRunsRequest()
            asked.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers["content-type"], asked.run_id))
            known = asked.run_id in (0, 7)
            body = answer.SerializeToString() if known else b'{"detail": "Run ID 8 not found"}'
            if self.path == "/v1/control/stream-logs" and known:
                # Two frames, a line cut between them, the last line without its newline.
                body = b"".join(
                    len(p).to_bytes(4, "big") + p
                    for p in (
                        StreamLogsResponse(
                            log_output="[ROUND 1/3]\nconfigure_tr"
                        ).SerializeToString(),
                        StreamLogsResponse(log_output="ain: Sampled 2\nlast").SerializeToString(),
                    )
                )
            self.send_response(200 if known else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with https_server(Handler, tls) as address:
        rows = flower_env.list_runs(address, tls / "ca.crt", 7)
        assert seen == [("/v1/control/list-runs", "application/protobuf", 7)]
        assert rows == [
            {"run-id": "7", "fab-id": "ocmfl/digits", "fab-version": "1.0.0", "fab-hash": "",
             "status": "finished:failed", "status-details": "ServerApp error",
             "pending-at": "2026-12-01T00:00:00", "starting-at": "", "running-at": "",
             "finished-at": ""}
        ]  # fmt: skip
        with pytest.raises(flower_env.FlwrCliError, match=r"HTTP 404: .*Run ID 8 not found"):
            flower_env.list_runs(address, tls / "ca.crt", 8)
        other = pki.save_tls_dir(tmp_path / "other", pair, pki.create_ca("other").cert)
        with pytest.raises(flower_env.FlwrCliError, match="CERTIFICATE_VERIFY_FAILED"):
            flower_env.list_runs(address, other / "ca.crt", 7)
        # The run's log: whole lines, in order, then done (the server ended the stream).
        lines: list[str] = []
        stream = flower_env.LogStream(address, tls / "ca.crt", "7", lines.append)
        assert stream.done.wait(10) and stream.error is None
        assert lines == ["[ROUND 1/3]\n", "configure_train: Sampled 2\n", "last\n"]
        assert seen[-1] == ("/v1/control/stream-logs", "application/protobuf", 7)
        broken = flower_env.LogStream(address, other / "ca.crt", "7", lines.append)
        assert broken.done.wait(10) and "CERTIFICATE_VERIFY_FAILED" in str(broken.error)
        missing = flower_env.LogStream(address, tls / "ca.crt", "8", lines.append)
        assert missing.done.wait(10) and "HTTP 404" in str(missing.error)
        assert len(lines) == 3


def test_a_supernode_key_goes_to_the_control_api_as_flwr_would_send_it(tmp_path: Path) -> None:
    """register_node sends the key as `flwr supernode register` does (PEM SubjectPublicKeyInfo
    of the OpenSSH EC key); a file that is no such key fails naming the file."""
    from cryptography.hazmat.primitives import serialization

    from ocmfl import nodekeys
    from workloads import flower_env

    public = nodekeys.write_keypair(tmp_path / "cluster1", "cluster1")
    pem = flower_env.node_key_bytes(public)
    assert pem.startswith(b"-----BEGIN PUBLIC KEY-----")
    ssh = serialization.load_ssh_public_key(public.read_bytes())
    assert serialization.load_pem_public_key(pem).public_numbers() == ssh.public_numbers()  # type: ignore[union-attr]
    bad = tmp_path / "bad.pub"
    bad.write_text("not a key\n")
    with pytest.raises(flower_env.FlwrCliError, match=r"bad\.pub: not an OpenSSH public key"):
        flower_env.node_key_bytes(bad)


def test_a_cut_log_stream_frame_is_an_error_not_a_short_line() -> None:
    import io

    from workloads.flower_env import read_frames

    frames = (3).to_bytes(4, "big") + b"abc" + (2).to_bytes(4, "big") + b"de"
    assert list(read_frames(io.BytesIO(frames))) == [b"abc", b"de"]
    with pytest.raises(ValueError, match=r"cut inside a frame$"):
        list(read_frames(io.BytesIO(frames[:-1])))
    with pytest.raises(ValueError, match="frame header"):
        list(read_frames(io.BytesIO(frames[:9])))
    with pytest.raises(ValueError, match="over"):
        list(read_frames(io.BytesIO((1 << 30).to_bytes(4, "big"))))


def test_kill_takes_the_whole_tree_a_superlink_started() -> None:
    # A SuperLink's SuperExec and ServerApp are its children and grandchildren: a finished
    # run's SuperLink is killed with all of them, not left to Flower's graceful stop.
    code = (
        "import subprocess, sys, time\n"
        'inner = \'import subprocess, time; subprocess.Popen(["sleep", "60"]); time.sleep(60)\'\n'
        "subprocess.Popen([sys.executable, '-c', inner])\n"
        "time.sleep(60)\n"
    )
    # Its own process group, so that an interrupted or failed test leaves nothing behind.
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(tree := descendants(proc.pid)) < 2:
            assert time.monotonic() < deadline, f"tree did not start: {tree}"
            time.sleep(0.05)
        kill(proc)
        assert proc.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in tree):
            assert time.monotonic() < deadline, f"left running: {[p for p in tree if alive(p)]}"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
