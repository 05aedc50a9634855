"""``ocm-fl-client``: one cluster's FL client, a Flower SuperNode next to the cluster's data.

Checks the data directory first (a missing or empty one fails here, naming the path), reads
the SuperNode private key (or creates one with ``--generate-key``), then runs
``flower-supernode`` with TLS server verification and SuperNode authentication, passing the
cluster name, data directory, agent endpoint and the resource's per-cluster values to the
ClientApp as node config (workloads.sdk reads them). The app itself comes from the server
(Flower ships it); its dependencies must be in this image. Exits with
0 when stopped by a signal, 2 for bad input, 3 when the server refuses the node (Flower
exit code 305: key not registered), 4 when it cannot connect for --connect-timeout.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO

import tomli_w

from ocmfl.constants import (
    CLIENT_LOG_PATH,
    ENV_AGENT_ENDPOINT,
    ENV_CLUSTER_NAME,
    ENV_DATA_DIR,
    SUPERLINK_PORT,
    SUPERNODE_PORT,
)
from ocmfl.nodekeys import ensure_keypair, public_key_of
from ocmfl.privacy import ClientPrivacy, PrivacySettingError
from workloads import flower_env as fe
from workloads.fleet_longpoll import HOLD_S, INTERVAL_S
from workloads.fleet_proxy import FLEET_PATH
from workloads.fleet_tls import Proxy, ProxyError, free_loopback_port, start_tunnel
from workloads.sdk.platform import (
    NODE_AGENT_ENDPOINT,
    NODE_CLUSTER,
    NODE_DATA_DIR,
    RESERVED_NODE_KEYS,
)
from workloads.sdk.worker import SOCKET_ENV, socket_dir, write_exec_shim

PREFIX = "ocm-fl-client"
WORKER_START_TIMEOUT = 60.0  # seconds until its socket is there (imports Flower, then listens)
EXIT_BAD_INPUT = 2
EXIT_REFUSED = 3  # Flower's 305 (SuperNode not registered) does not fit an exit status
EXIT_DISCONNECTED = 4


def build_parser() -> argparse.ArgumentParser:
    """The CLI flags (cluster, data dir and agent endpoint default to the OCMFL_* env vars)."""
    p = argparse.ArgumentParser(prog=PREFIX, description=__doc__.split("\n")[0])
    p.add_argument(
        "--server-address",
        "--server",
        default=f"127.0.0.1:{SUPERLINK_PORT}",
        help="host:port of the SuperLink Fleet API (or the mTLS proxy in front)",
    )
    p.add_argument(
        "--root-certificates",
        required=True,
        type=Path,
        help="CA bundle that verifies the server certificate",
    )
    p.add_argument(
        "--auth-key",
        required=True,
        type=Path,
        help="SuperNode private key (OpenSSH ECDSA); public key must be registered",
    )
    p.add_argument(
        "--generate-key",
        action="store_true",
        help="create --auth-key (and .pub) when it does not exist",
    )
    p.add_argument("--cluster-name", "--cluster", default=os.environ.get(ENV_CLUSTER_NAME, ""))
    p.add_argument(
        "--run-config",
        "--node-config",
        type=Path,
        default=None,
        help="JSON object of this cluster's values for the ClientApp (node config)",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ[ENV_DATA_DIR]) if os.environ.get(ENV_DATA_DIR) else None,
        help="this cluster's partition (the path its ClusterClaim names)",
    )
    p.add_argument(
        "--agent-endpoint",
        default=os.environ.get(ENV_AGENT_ENDPOINT, ""),
        help="local addon agent, e.g. http://127.0.0.1:8088 (optional)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path("ocm-fl-client-state"),
        help="FLWR_HOME and node config for the SuperNode",
    )
    p.add_argument(
        "--client-certfile",
        type=Path,
        default=None,
        help="this cluster's certificate for the hub's mTLS Fleet gateway; with it the "
        "SuperNode reaches --server through a local nginx tunnel that presents it",
    )
    p.add_argument("--client-keyfile", type=Path, default=None)
    p.add_argument(
        "--server-name",
        default=None,
        help="name on the gateway's certificate (default: the --server host)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=SUPERNODE_PORT,
        help="SuperNode's local ClientAppIo port (loopback); 0: any free port",
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=600.0,
        help="give up after this many seconds without a connection (the SuperNode is "
        "restarted until then, e.g. while the server has not registered its key yet)",
    )
    p.add_argument(
        "--install-dependencies",
        action="store_true",
        help="let Flower install the app's dependencies at run time (off: the image has them)",
    )
    p.add_argument(
        "--worker-preload",
        default="numpy,torch",
        help="modules the long-lived ClientApp worker imports once (workloads.sdk.worker); "
        "apps whose ClientApp is forwarding_client_app(...) run there, not re-importing them "
        "per message",
    )
    p.add_argument(
        "--no-worker",
        action="store_true",
        help="start no ClientApp worker (every message imports the app in its own process)",
    )
    p.add_argument(
        "--no-exec-shim",
        action="store_true",
        help="keep Flower's own flwr-clientapp per message (a fresh interpreter that then "
        "forwards to the worker) instead of the shim that runs it in a fork of the worker",
    )
    p.add_argument(
        "--privacy",
        default="",
        help="this cluster's ClientPrivacy as JSON (ocmfl.privacy; the hub writes it from the "
        "resource's spec.privacy and the cluster's privacy ClusterClaim): the worker enforces "
        "it on every reply, and no message is answered without the worker",
    )
    p.add_argument(
        "--no-long-poll",
        action="store_true",
        help="let the tunnel pass the SuperNode's PullMessages straight through (Flower's own "
        "3 s sleep after each empty pull) instead of holding it until a message comes",
    )
    p.add_argument(
        "--long-poll-hold",
        type=float,
        default=HOLD_S,
        help="seconds the tunnel holds an empty PullMessages, re-sending it upstream every "
        f"{INTERVAL_S} s (default %(default)s; must stay well under Flower's 30 s HTTP timeout)",
    )
    p.add_argument(
        "--max-retries",
        type=int,
        default=None,
        help="SuperNode reconnect attempts (default: Flower's, unlimited)",
    )
    p.add_argument(
        "--max-wait-time",
        type=float,
        default=None,
        help="seconds the SuperNode keeps trying to reconnect",
    )
    return p


NodeValue = str | int | float | bool


def node_config(
    cluster: str,
    data_dir: Path,
    agent_endpoint: str,
    values: Mapping[str, NodeValue] | None = None,
) -> dict[str, NodeValue]:
    """Node config the ClientApp reads (``context.node_config``): the resource's values for
    this cluster, then the platform's keys (which they cannot replace)."""
    config: dict[str, NodeValue] = dict(values or {})
    config.update(
        {
            NODE_CLUSTER: cluster,
            NODE_DATA_DIR: str(data_dir.resolve()),
            NODE_AGENT_ENDPOINT: agent_endpoint,
        }
    )
    return config


def read_values(path: Path | None) -> dict[str, NodeValue]:
    """This cluster's values from a JSON object file (numbers, booleans, strings)."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--run-config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--run-config {path}: expected a JSON object")
    out: dict[str, NodeValue] = {}
    for key, value in data.items():
        if key in RESERVED_NODE_KEYS:
            raise ValueError(f"--run-config {path}: {key} is set by the platform")
        if not isinstance(value, str | int | float):
            raise ValueError(f"--run-config {path}: {key} must be a number, boolean or string")
        out[key] = value
    return out


def check_data_dir(path: Path) -> str | None:
    """Why ``path`` cannot be this cluster's data directory, or None when it can."""
    if not path.exists():
        return f"data directory {path} does not exist"
    if not path.is_dir():
        return f"data directory {path} is not a directory"
    if not any(path.iterdir()):
        return f"data directory {path} is empty"
    return None


def supernode_command(
    args: argparse.Namespace, node_config_file: Path, tunnel: Proxy | None = None
) -> list[str]:
    """The flower-supernode command line (through the mTLS `tunnel` if given).

    Through the tunnel the SuperNode speaks TLS to the pod's loopback (trusting the tunnel's
    throwaway CA), and the tunnel carries it on over mutually authenticated TLS with the
    cluster's certificate (the SuperNode has no client-certificate option).
    """
    port = args.port or free_loopback_port()
    cmd = [fe.executable("flower-supernode")]
    if tunnel is not None:
        assert tunnel.local_ca is not None
        cmd += ["--superlink", tunnel.listen, "--root-certificates", str(tunnel.local_ca)]
    else:
        cmd += [
            "--superlink", args.server_address,
            "--root-certificates", str(Path(args.root_certificates).absolute()),
        ]  # fmt: skip
    # Mounted paths as they are (not resolved): a restarted SuperNode must read the Secret's
    # current files, not the kubelet's previous `..<timestamp>` directory (deleted on update).
    cmd += [
        "--auth-supernode-private-key", str(Path(args.auth_key).absolute()),
        "--node-config", str(node_config_file),
        "--port", str(port),
    ]  # fmt: skip
    if args.install_dependencies:
        cmd.append("--allow-runtime-dependency-installation")
    if args.max_retries is not None:
        cmd += ["--max-retries", str(args.max_retries)]
    if args.max_wait_time is not None:
        cmd += ["--max-wait-time", str(args.max_wait_time)]
    return cmd


def _fail(reason: str) -> int:
    print(f"{PREFIX}: failed: {reason}", flush=True)
    return EXIT_BAD_INPUT


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ocm-fl-client``."""
    args = build_parser().parse_args(argv)
    if not args.cluster_name:
        return _fail(f"--cluster-name (or ${ENV_CLUSTER_NAME}) is required")
    if args.data_dir is None:
        return _fail(f"--data-dir (or ${ENV_DATA_DIR}) is required")
    problem = check_data_dir(Path(args.data_dir))
    if problem is not None:
        return _fail(problem)
    try:
        overrides = read_values(args.run_config)
    except ValueError as exc:
        return _fail(str(exc))
    if not 0 < args.long_poll_hold <= 20:
        return _fail(f"--long-poll-hold {args.long_poll_hold}: give 0 < seconds <= 20 "
                     "(Flower's SuperNode gives up on a call after 30 s)")  # fmt: skip
    privacy: ClientPrivacy | None = None
    if args.privacy:
        try:
            privacy = ClientPrivacy.from_json(args.privacy)
        except PrivacySettingError as exc:
            return _fail(f"--privacy: {exc}")
        if args.no_worker or args.no_exec_shim:
            return _fail("--privacy needs the ClientApp worker and its exec shim, which enforce "
                         "it: drop --no-worker and --no-exec-shim")  # fmt: skip
    if not Path(args.root_certificates).is_file():
        return _fail(f"--root-certificates {args.root_certificates} does not exist")
    key_path = Path(args.auth_key)
    try:
        if args.generate_key:
            ensure_keypair(key_path, comment=args.cluster_name)
        public_key_of(key_path.read_bytes())
    except (OSError, ValueError) as exc:
        return _fail(f"SuperNode key {key_path}: {exc}")

    state = Path(args.state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    config_file = state / "node-config.toml"
    config_file.write_text(
        tomli_w.dumps(node_config(args.cluster_name, args.data_dir, args.agent_endpoint, overrides))
    )
    env = fe.flower_env(state / "flwr-home")
    print(
        f"{PREFIX}: cluster {args.cluster_name}: data in {Path(args.data_dir).resolve()}; "
        f"connecting to {args.server_address}",
        flush=True,
    )
    tunnel: Proxy | None = None
    if args.client_certfile is not None:
        if args.client_keyfile is None:
            return _fail("--client-certfile needs --client-keyfile")
        try:
            tunnel = start_tunnel(
                gateway_address=args.server_address,
                certfile=Path(args.client_certfile),
                keyfile=Path(args.client_keyfile),
                ca_file=Path(args.root_certificates),
                run_dir=state / "tunnel",
                server_name=args.server_name,
                long_poll_hold_s=None if args.no_long_poll else args.long_poll_hold,
            )
        except ProxyError as exc:
            return _fail(f"Fleet tunnel: {exc}")
        held = "" if tunnel.long_poll is None else f", pulls held {args.long_poll_hold:g} s"
        print(f"{PREFIX}: mTLS tunnel to {args.server_address} on {tunnel.listen}{held}",
              flush=True)  # fmt: skip
    worker: subprocess.Popen[bytes] | None = None
    socket_path: Path | None = None
    try:
        if not args.no_worker:
            worker, socket_path = start_worker(args.worker_preload, env, args.cluster_name,
                                               privacy)  # fmt: skip
            if privacy is not None and not socket_path.exists():
                return _fail("the ClientApp worker that enforces --privacy did not start; "
                             "no message is answered without it")  # fmt: skip
            env[SOCKET_ENV] = str(socket_path)
            if socket_path.exists() and not args.no_exec_shim:  # SuperExec starts the shim
                fallback = None if privacy is None else refusing_clientapp(socket_path.parent)
                shim_dir = write_exec_shim(socket_path.parent / "bin", socket_path, fallback)
                env["PATH"] = os.pathsep.join([str(shim_dir), env.get("PATH", os.defpath)])
            print(f"{PREFIX}: ClientApp worker (preloads {args.worker_preload}) on "
                  f"{socket_path}", flush=True)  # fmt: skip
        connect_timeout = args.connect_timeout
        if tunnel is not None and tunnel.local_ca is not None:
            # Flower's SuperNode backs off exponentially (up to 20 s) while the server is
            # not there yet, which it rarely is when a federation starts: start it once a
            # request through the tunnel gets an answer from past the gateway.
            # The wait counts against --connect-timeout.
            began = time.monotonic()
            if wait_upstream(tunnel.listen, tunnel.local_ca, connect_timeout):
                print(f"{PREFIX}: the server answers through the tunnel "
                      f"(after {time.monotonic() - began:.1f}s)", flush=True)  # fmt: skip
            connect_timeout = max(1.0, connect_timeout - (time.monotonic() - began))
        command = supernode_command(args, config_file, tunnel)
        return supervise(command, env, connect_timeout, args.agent_endpoint or "")
    finally:
        fe.stop(worker, timeout=5.0)
        if socket_path is not None:
            shutil.rmtree(socket_path.parent, ignore_errors=True)
        if tunnel is not None:
            tunnel.stop()


# nginx's answers when the next hop (the hub's gateway, or the SuperLink behind it) is not up
UPSTREAM_DOWN = frozenset({502, 503, 504})
UPSTREAM_PROBE_S = 0.5


def upstream_answers(listen: str, ca_file: Path, timeout: float = 5.0) -> bool:
    """One GET of the Fleet API's root through the tunnel's loopback listener (TLS, trusting
    the tunnel's own CA): True when something past the gateway answered (the SuperLink's
    404 and the like), False for nginx's 502/503/504 or no connection. It carries no node
    credentials; the tunnel adds the cluster's mTLS identity as for any Fleet request."""
    host, _, port = listen.rpartition(":")
    context = ssl.create_default_context(cafile=str(ca_file))
    conn = http.client.HTTPSConnection(host, int(port), timeout=timeout, context=context)
    try:
        conn.request("GET", FLEET_PATH)
        return conn.getresponse().status not in UPSTREAM_DOWN
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def wait_upstream(listen: str, ca_file: Path, timeout: float) -> bool:
    """Poll `upstream_answers` every UPSTREAM_PROBE_S for up to `timeout` s; False if it
    never did (the SuperNode then starts anyway and `supervise` judges the connection)."""
    deadline = time.monotonic() + timeout
    while not upstream_answers(listen, ca_file):
        if time.monotonic() >= deadline:
            return False
        time.sleep(UPSTREAM_PROBE_S)
    return True


REFUSING_CLIENTAPP = """#!/bin/sh
echo "ocm-fl-client: the ClientApp worker that enforces this cluster's privacy is gone; \
this message is not answered" >&2
exit 1
"""


def refusing_clientapp(directory: Path) -> Path:
    """What the exec shim runs when the worker is gone and the cluster has --privacy: a
    refusal (exit 1), never the app outside the worker."""
    path = directory / "refuse-clientapp"
    path.write_text(REFUSING_CLIENTAPP)
    path.chmod(0o700)
    return path


def start_worker(
    preload: str,
    env: Mapping[str, str],
    cluster: str = "",
    privacy: ClientPrivacy | None = None,
) -> tuple[subprocess.Popen[bytes], Path]:
    """The long-lived ClientApp worker (workloads.sdk.worker) on a Unix socket in a private
    directory under $TMPDIR (the pod's scratch dir); returns it and the socket path once the
    socket is there (it listens before its preload). A worker that does not come up is only
    logged: the thin ClientApps then run the app in their own process."""
    path = socket_dir() / "worker.sock"
    cmd = [sys.executable, "-m", "workloads.clientapp_worker", "--socket", str(path),
           "--preload", preload, "--cluster", cluster]  # fmt: skip
    if privacy is not None:
        cmd += ["--privacy", privacy.to_json()]
    proc = fe.start(cmd, env, None)
    deadline = time.monotonic() + WORKER_START_TIMEOUT
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not path.exists():
        print(f"{PREFIX}: the ClientApp worker did not come up (exit {proc.poll()}); "
              "ClientApps will import the app themselves", flush=True)  # fmt: skip
    return proc, path


def flower_exit_code(line: str) -> int | None:
    """Flower's own exit code from an "Exit Code: N" log line (the process exits 1)."""
    marker = "Exit Code:"
    if marker not in line:
        return None
    tail = line.split(marker, 1)[1].strip().split()
    return int(tail[0]) if tail and tail[0].isdigit() else None


# Flower's SuperNode log line when it holds a reply for a run the SuperLink no longer runs:
# the server restarted while this node was mid-message. Its ClientApp can then wait forever
# and block every later message, so the launcher restarts the SuperNode (fresh state, same
# key) and it picks up the resumed run.
STALE_RUN_MARKER = "is not in `RUNNING` status. Ignoring reply message"


# Flower's log line when a ClientApp raised (flwr.supernode.runtime.run_clientapp: "ClientApp
# raised an exception", the traceback follows): the launcher then sends the log's last lines
# to the agent, which reports them to the hub unless the cluster's admin switched that off.
APP_ERROR_MARKER = "ClientApp raised an exception"
LOG_TAIL_LINES = 200  # lines kept for that (the agent keeps the last 4096 characters)
LOG_SETTLE_S = 1.0  # wait for the traceback after the marker line
LOG_MIN_INTERVAL_S = 30.0  # at most one post per this many seconds (every round may raise)


class LogReporter:
    """Sends the SuperNode output's last lines to the agent (POST /v1/client-log), shortly
    after a ClientApp raised, at most once per LOG_MIN_INTERVAL_S."""

    def __init__(
        self,
        endpoint: str,
        tail: Callable[[], list[str]],
        *,
        settle_s: float = LOG_SETTLE_S,
        min_interval_s: float = LOG_MIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint, self.tail = endpoint, tail
        self.settle_s, self.min_interval_s, self.clock = settle_s, min_interval_s, clock
        self._lock = threading.Lock()
        self._pending = False
        self._last: float | None = None
        self.sent = 0

    def app_raised(self) -> None:
        """Post the tail in `settle_s` (once the traceback is out), unless one is pending or
        was posted less than `min_interval_s` ago."""
        with self._lock:
            now = self.clock()
            recent = self._last is not None and now - self._last < self.min_interval_s
            if self._pending or recent or not self.endpoint:
                return
            self._pending = True
        timer = threading.Timer(self.settle_s, self.post)
        timer.daemon = True
        timer.start()

    def post(self) -> str:
        """Post the tail now: post_json's answer ("taken", "refused", "transient")."""
        from workloads.sdk.metrics import post_json

        lines = self.tail()
        try:
            got = post_json(self.endpoint, CLIENT_LOG_PATH, {"log": "".join(lines)}, 5.0)
        finally:
            with self._lock:
                self._pending, self._last = False, self.clock()
        self.sent += got == "taken"
        print(f"{PREFIX}: sent the last {len(lines)} log lines to the agent: {got}", flush=True)
        return got


class _Output:
    """Echoes the SuperNode's output and notes what it says about connecting and exiting;
    keeps its last LOG_TAIL_LINES lines."""

    def __init__(
        self,
        on_stale_run: Callable[[], None] | None = None,
        on_app_error: Callable[[], None] | None = None,
        tail: deque[str] | None = None,
    ) -> None:
        self.connected_at: float | None = None
        self.flower_code: int | None = None
        self.stale_run = False
        self._on_stale_run = on_stale_run
        self._on_app_error = on_app_error
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES) if tail is None else tail

    def pump(self, stream: IO[str] | None) -> None:
        if stream is None:
            return
        for line in stream:
            sys.stdout.write(line)
            self.tail.append(line)
            if APP_ERROR_MARKER in line and self._on_app_error is not None:
                self._on_app_error()
            if "SuperNode ID:" in line:
                self.connected_at = time.monotonic()
            if STALE_RUN_MARKER in line and not self.stale_run:
                self.stale_run = True
                if self._on_stale_run is not None:
                    self._on_stale_run()
            self.flower_code = flower_exit_code(line) or self.flower_code


def _snapshot(lines: deque[str]) -> list[str]:
    """A copy of a deque another thread appends to."""
    for _ in range(10):
        try:
            return list(lines)
        except RuntimeError:  # appended to while copied
            continue
    return []


def supervise(
    cmd: list[str], env: dict[str, str], connect_timeout: float, agent_endpoint: str = ""
) -> int:
    """Run the SuperNode; restart it while it cannot connect, until ``connect_timeout``.

    The server may register this node's key after the client starts (exit code 305 until
    then) or be restarting; the clock restarts whenever the SuperNode got connected. Only a
    signal stops it for good (exit 0): a SuperNode that exits 0 by itself is restarted too.
    """
    stopping = False
    proc: subprocess.Popen[str] | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    last_connected = time.monotonic()
    backoff = 1.0
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)  # across restarts of the SuperNode
    reporter = LogReporter(agent_endpoint, lambda: _snapshot(tail))
    while True:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

        def restart_stale(p: subprocess.Popen[str] = proc) -> None:
            # Its SuperExec follows it (--parent-pid); a stuck ClientApp stays in our process
            # group, so it still ends with the pod.
            print(f"{PREFIX}: the server restarted mid-message: restarting the SuperNode",
                  flush=True)  # fmt: skip
            p.kill()

        seen = _Output(restart_stale, reporter.app_raised, tail)
        reader = threading.Thread(target=seen.pump, args=(proc.stdout,), daemon=True)
        reader.start()
        # Wait on the process, not on its output: its SuperExec helper inherits the pipe
        # and only exits once the SuperNode has been reaped.
        code = proc.wait()
        reader.join(timeout=2.0)
        sys.stdout.flush()
        flower_code = seen.flower_code
        if seen.connected_at is not None:  # it was connected: count from when it ended
            last_connected = time.monotonic()
            backoff = 1.0
        if seen.stale_run and not stopping:
            last_connected = time.monotonic()
            backoff = 1.0
            continue
        if stopping:
            print(f"{PREFIX}: SuperNode stopped (exit {code})", flush=True)
            return code
        if code == 0:
            # Flower stops the SuperNode cleanly when the SuperLink refuses its node id (401:
            # a replacement server pod whose database is new); started again, it activates
            # its key with that server. Nobody asked it to stop, so the node must go on.
            print(f"{PREFIX}: the SuperNode stopped on its own: restarting it", flush=True)
        waited = time.monotonic() - last_connected
        if waited >= connect_timeout:
            reason = {305: "the server refused this node (is its public key registered?)"}.get(
                flower_code or 0, "the SuperNode could not stay connected"
            )
            print(
                f"{PREFIX}: failed: {reason}; Flower exit code {flower_code}, "
                f"not connected for {waited:.0f}s",
                flush=True,
            )
            tail.append(f"{PREFIX}: failed: {reason}\n")
            if agent_endpoint:
                reporter.post()
            return EXIT_REFUSED if flower_code == 305 else EXIT_DISCONNECTED
        time.sleep(backoff)
        backoff = min(backoff * 2, 10.0)


if __name__ == "__main__":
    sys.exit(main())
