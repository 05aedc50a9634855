"""Process plumbing shared by the launchers: Flower's environment, child processes, flwr CLI."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

CONNECTION = "ocmfl"  # name of the SuperLink connection in $FLWR_HOME/config.toml

# Speed knob Flower reads: how often a SuperExec asks for a task to start (default 1 s). Each
# ask is a local HTTP request that both ends serve in Python; at 0.1 s the three SuperExecs of
# a 2-cluster run cost about 5 s more CPU per run (SuperLink, SuperNodes, SuperExecs) and made
# rounds no faster on 2 cores (bench_federation: 3.6-5.2 s per round against 3.1 s (twice) at
# 0.5 s, 3.6 s at 1 s). The SuperNode's idle 3 s is fixed in Flower 1.42; the ServerApp
# grid's 3 s is replaced by workloads.sdk's 0.2 s reply polling.
DEFAULT_ENV: Mapping[str, str] = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.5",
}


def flower_env(flwr_home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for Flower processes: telemetry off, absolute FLWR_HOME, our poll knob.

    Values already set in the caller's environment win over our defaults.
    """
    env = dict(os.environ)
    for key, value in DEFAULT_ENV.items():
        env.setdefault(key, value)
    env["FLWR_HOME"] = str(flwr_home.resolve())
    # Flower starts flower-superexec / flwr-* by name: put this Python's scripts first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if extra:
        env.update(extra)
    return env


def executable(name: str) -> str:
    """Path of a console script: next to this Python first (the venv), then PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} or on PATH")
    return found


def write_connection(flwr_home: Path, address: str, root_certificates: Path) -> Path:
    """Write $FLWR_HOME/config.toml with one TLS connection named CONNECTION as default.

    The CA is named by its mounted path, not resolved: the kubelet replaces a Secret's files
    by switching `..data` to a new directory and deleting the old one, and every `flwr`
    command of the run reads this file again."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    path.write_text(
        "[superlink]\n"
        f'default = "{CONNECTION}"\n\n'
        f"[superlink.{CONNECTION}]\n"
        f'address = "{address}"\n'
        f'root-certificates = "{root_certificates.absolute()}"\n'
    )
    return path


def start(
    cmd: Sequence[str], env: Mapping[str, str], log: IO[bytes] | None
) -> subprocess.Popen[bytes]:
    """Start a Flower child process (its own helpers watch its pid and exit with it)."""
    return subprocess.Popen(
        list(cmd),
        env=dict(env),
        stdout=log if log is not None else None,
        stderr=subprocess.STDOUT if log is not None else None,
    )


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM a child (Flower stops its own helpers), SIGKILL when it does not go in time."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)


def descendants(pid: int) -> list[int]:
    """Pids of a process's descendants, children first (Linux /proc; [] when unreadable)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            with contextlib.suppress(OSError, ValueError):
                children = Path(f"/proc/{parent}/task/{tid}/children").read_text().split()
                out += [int(c) for c in children]
                todo += [int(c) for c in children]
    return out


def kill(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a child and every process under it (a SuperLink and the SuperExec and
    ServerApp it started), for when nothing they hold is needed any more: Flower's graceful
    stop of a SuperLink takes 0.5-0.8 s."""
    if proc is None or proc.poll() is not None:
        return
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


class FlwrCliError(RuntimeError):
    """A `flwr` CLI call or a Control API request failed."""


# Each call is a fresh Python process that imports Flower: about 2.5 s idle, over a minute
# seen on a 2-core hub running several servers at once. A hang is still bounded.
FLWR_CLI_TIMEOUT = 300.0


def flwr_json(
    args: Sequence[str], env: Mapping[str, str], timeout: float = FLWR_CLI_TIMEOUT
) -> Any:
    """Run ``flwr <args> --format json`` and return its parsed JSON output."""
    cmd = [executable("flwr"), *args, "--format", "json"]
    try:
        done = subprocess.run(
            cmd, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise FlwrCliError(f"flwr {' '.join(args[:2])}: no answer within {timeout:.0f}s") from None
    try:
        data = json.loads(done.stdout)
    except ValueError:
        raise FlwrCliError(
            f"flwr {' '.join(args[:2])}: exit {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-500:]}"
        ) from None
    if isinstance(data, dict) and data.get("success") is False:
        raise FlwrCliError(f"flwr {' '.join(args[:2])}: {data.get('error-message', data)}")
    return data


# The Control API's protobuf-over-HTTP transport, as Flower's own ControlHttpClient speaks it
# (flwr.supercore.control, flwr.supercore.protobuf.constants).
PROTOBUF_MEDIA_TYPE = "application/protobuf"
LIST_RUNS_PATH = "/v1/control/list-runs"
LIST_NODES_PATH = "/v1/control/list-nodes"
REGISTER_NODE_PATH = "/v1/control/register-node"
UNREGISTER_NODE_PATH = "/v1/control/unregister-node"
STREAM_LOGS_PATH = "/v1/control/stream-logs"
PROTOBUF_STREAM_MEDIA_TYPE = "application/flower-protobuf-stream"
FRAME_HEADER_SIZE = 4  # a stream frame: the payload's size (big endian), then the payload
MAX_FRAME = 64 << 20  # a log chunk is text the SuperLink buffered for 0.5 s; far below this


def _control_headers(accept: str) -> dict[str, str]:
    from flwr.supercore.runtime_version_compatibility import RuntimeVersionMetadata

    headers = {"content-type": PROTOBUF_MEDIA_TYPE, "accept": accept}
    headers.update(dict(RuntimeVersionMetadata.from_local_component("ocm-fl-server").as_metadata()))
    return headers


def control_call(
    address: str, ca_file: Path, path: str, request: Any, answer: Any, timeout: float = 30.0
) -> Any:
    """One unary Control API call: POST ``request`` (a protobuf message) to
    https://<address><path>, TLS verified against ``ca_file``, and parse the answer into
    ``answer`` (an empty message of the response type), which it returns. What a `flwr` CLI
    command sends, without a process that spends ~2.5 s importing Flower. Raises
    FlwrCliError."""
    import ssl
    import urllib.error
    import urllib.request

    name = path.rsplit("/", 1)[-1]
    call = urllib.request.Request(
        f"https://{address}{path}",
        data=request.SerializeToString(deterministic=True),
        headers=_control_headers(PROTOBUF_MEDIA_TYPE),
        method="POST",
    )
    context = ssl.create_default_context(cafile=str(ca_file))
    try:
        with urllib.request.urlopen(call, timeout=timeout, context=context) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace").strip()[-500:]
        raise FlwrCliError(f"Control API {name}: HTTP {exc.code}: {text}") from None
    except OSError as exc:
        raise FlwrCliError(f"Control API {name} at {address}: {exc}") from None
    try:
        answer.ParseFromString(body)
    except ValueError as exc:  # protobuf's DecodeError
        raise FlwrCliError(f"Control API {name}: unreadable answer: {exc}") from None
    return answer


def run_rows(response: Any) -> list[dict[str, Any]]:
    """A ListRunsResponse as the rows `flwr ls --format json` prints: run-id, status
    ("finished:completed", "running", ...), status-details, fab and timestamps."""
    rows = []
    for run in sorted(response.run_dict.values(), key=lambda r: r.pending_at, reverse=True):
        status = run.status.status
        rows.append(
            {
                "run-id": str(run.run_id),
                "fab-id": run.fab_id,
                "fab-version": run.fab_version,
                "fab-hash": run.fab_hash,
                "status": f"{status}:{run.status.sub_status}" if run.status.sub_status else status,
                "status-details": run.status.details,
                "pending-at": run.pending_at,
                "starting-at": run.starting_at,
                "running-at": run.running_at,
                "finished-at": run.finished_at,
            }
        )
    return rows


def list_runs(address: str, ca_file: Path, run_id: int | None = None) -> list[dict[str, Any]]:
    """The SuperLink's runs (one, with ``run_id``) as `flwr ls --format json` rows, from one
    Control API request (control_call). Raises FlwrCliError."""
    from flwr.proto.control_pb2 import ListRunsRequest, ListRunsResponse

    request = ListRunsRequest(run_id=run_id) if run_id is not None else ListRunsRequest()
    return run_rows(control_call(address, ca_file, LIST_RUNS_PATH, request, ListRunsResponse()))


def node_key_bytes(key_file: Path) -> bytes:
    """A SuperNode's OpenSSH public key file as the Control API takes it (PEM
    SubjectPublicKeyInfo), refused as `flwr supernode register` refuses it: not EC, or not a
    NIST curve. Raises FlwrCliError naming the file."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes, uses_nist_ec_curve

    try:
        key = serialization.load_ssh_public_key(key_file.read_bytes())
    except (OSError, ValueError, UnsupportedAlgorithm) as exc:
        raise FlwrCliError(f"{key_file}: not an OpenSSH public key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not uses_nist_ec_curve(key):
        raise FlwrCliError(f"{key_file}: not an EC public key on a NIST curve")
    return public_key_to_bytes(key)


def register_node(address: str, ca_file: Path, key_file: Path, name: str) -> str:
    """Register the SuperNode key in ``key_file`` under ``name`` (`flwr supernode register`,
    as one Control API request); its node id. Raises FlwrCliError ("... already in use"
    for a key registered before)."""
    from flwr.proto.control_pb2 import RegisterNodeRequest, RegisterNodeResponse

    request = RegisterNodeRequest(public_key=node_key_bytes(key_file), name=name)
    answer = control_call(address, ca_file, REGISTER_NODE_PATH, request, RegisterNodeResponse())
    if not answer.node_id:
        raise FlwrCliError(f"Control API RegisterNode: no node id for {key_file}")
    return str(answer.node_id)


def unregister_node(address: str, ca_file: Path, node_id: str) -> None:
    """Unregister a SuperNode (`flwr supernode unregister`, one Control API request)."""
    from flwr.proto.control_pb2 import UnregisterNodeRequest, UnregisterNodeResponse

    request = UnregisterNodeRequest(node_id=int(node_id))
    control_call(address, ca_file, UNREGISTER_NODE_PATH, request, UnregisterNodeResponse())


def list_nodes(address: str, ca_file: Path) -> dict[str, str]:
    """Every SuperNode's status ("registered", "online", "offline", ...) by node id
    (`flwr supernode ls`, one Control API request)."""
    from flwr.proto.control_pb2 import ListNodesRequest, ListNodesResponse

    answer = control_call(
        address, ca_file, LIST_NODES_PATH, ListNodesRequest(), ListNodesResponse()
    )
    return {str(node.node_id): node.status for node in answer.nodes_info}


def read_frames(stream: IO[bytes]) -> Iterator[bytes]:
    """The payloads of a protobuf-over-HTTP stream (FRAME_HEADER_SIZE bytes of size, then
    the payload), until its end. Raises ValueError for a cut or oversized frame."""
    while header := stream.read(FRAME_HEADER_SIZE):
        if len(header) < FRAME_HEADER_SIZE:
            raise ValueError("log stream cut inside a frame header")
        size = int.from_bytes(header, "big")
        if size > MAX_FRAME:
            raise ValueError(f"log stream frame of {size} bytes, over {MAX_FRAME}")
        payload = stream.read(size)
        if len(payload) < size:
            raise ValueError("log stream cut inside a frame")
        yield payload


class LogStream:
    """A run's log from its start, as `flwr log --stream` gets it (the Control API's
    StreamLogs, one HTTPS request read in a thread, TLS verified against ``ca_file``): every
    complete line goes to ``sink`` as it comes. ``done`` is set when the stream ends (the
    SuperLink ends it once the run finished) or broke (``error`` says why)."""

    def __init__(
        self, address: str, ca_file: Path, run_id: str, sink: Callable[[str], None]
    ) -> None:
        self.address, self.ca_file, self.run_id, self.sink = address, ca_file, run_id, sink
        self.done = threading.Event()
        self.error: str | None = None
        self._closed = False
        self._sock: Any = None
        threading.Thread(target=self._read, daemon=True, name="log-stream").start()

    def _read(self) -> None:
        import http.client
        import ssl

        from flwr.proto.control_pb2 import StreamLogsRequest, StreamLogsResponse

        host, _, port = self.address.rpartition(":")
        context = ssl.create_default_context(cafile=str(self.ca_file))
        conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=30.0)
        pending = ""
        try:
            headers = _control_headers(PROTOBUF_STREAM_MEDIA_TYPE)
            headers["accept-encoding"] = "identity"
            request = StreamLogsRequest(run_id=int(self.run_id), after_timestamp=0.0)
            conn.request("POST", STREAM_LOGS_PATH, request.SerializeToString(), headers)
            # The connection drops its socket once the answer is read to its end; the
            # answer's reader keeps using it.
            self._sock = conn.sock
            if self._closed:
                return
            response = conn.getresponse()
            if response.status != 200:
                text = response.read().decode(errors="replace").strip()[-500:]
                raise FlwrCliError(f"Control API stream-logs: HTTP {response.status}: {text}")
            self._sock.settimeout(None)  # a run's log may stay quiet for long
            for payload in read_frames(response):
                chunk = StreamLogsResponse()
                chunk.ParseFromString(payload)
                *lines, pending = (pending + chunk.log_output).split("\n")
                for line in lines:
                    self.sink(line + "\n")
        except Exception as exc:  # any end but the server's is a broken stream
            if not self._closed:
                self.error = str(exc) or type(exc).__name__
        finally:
            if pending:
                self.sink(pending + "\n")
            conn.close()
            self.done.set()

    def close(self) -> None:
        """Stop reading (the thread ends at once) and close the connection."""
        self._closed = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(2)  # socket.SHUT_RDWR
