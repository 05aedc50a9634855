"""A long-lived ClientApp worker: the model stack is imported once per cluster, not per message.

Flower 1.42 starts a fresh ``flwr-clientapp`` process for every message, and each one imports
the app's model stack again (torch: 2.5-4.4 s and about 1 GB). With this module:

- ``ocm-fl-client`` starts ``python -m workloads.clientapp_worker`` by the SuperNode. It imports
  the heavy modules once (``--preload``, default torch and numpy), listens on a Unix socket in a
  private (0700) directory under ``$TMPDIR`` (the pod's scratch directory), and hands the socket
  path to Flower's processes as ``$OCMFL_WORKER_SOCKET``.
- The app's ClientApp module is thin: ``app = forwarding_client_app("pkg.client_impl:app")``.
  In Flower's per-message process it imports only Flower and this module; it sends the message
  and the context to the worker (Flower's own object encoding) and returns the reply.
- The worker forks a child per message, with torch already in memory (copy-on-write): the
  child imports the app (from the same installed app directory Flower gave the thin process),
  runs it, answers and exits. Messages stay isolated from each other, as in Flower.
- Without ``$OCMFL_WORKER_SOCKET`` (stock Flower, ``flwr run`` on a laptop, tests) the thin
  app imports the real one and runs it in its own process: the app works the same anywhere.

- Faster still, the launcher puts a tiny ``flwr-clientapp`` first on the SuperExec's PATH
  (``write_exec_shim``): Flower's SuperExec starts it per message as it would Flower's own, it
  passes its arguments, environment and standard streams to the worker, and the worker forks a
  child that runs Flower's own ``flwr-clientapp`` entry point with them (Flower and torch
  already imported: no interpreter start, no imports). The thin app then finds no socket in
  its environment and runs the real one in that child. If the worker is gone, the shim execs
  Flower's real ``flwr-clientapp``.

Privacy (workloads/sdk/privacy.py): every ClientApp the worker runs, through the shim or a thin
app, is wrapped in ``privacy_mod`` with the cluster's ``ClientPrivacy`` (``--privacy``): the
reply of a train message is clipped to the norm the server or the cluster asks for and noised
as the cluster requires, whatever the app does, and a message whose server does not run the
DP the cluster requires is refused. With ``--privacy`` the launcher points the shim's fallback
at a refusal, so no message is answered outside the worker.

Security: the socket directory is 0700 and the socket 0600, and the worker serves only peers
with its own uid (SO_PEERCRED); nothing listens on the network; the worker runs as the
launcher's (non-root) user with the same read-only root and scratch directory.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import signal
import socket
import struct
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common.serde import context_from_proto, context_to_proto
from flwr.proto.message_pb2 import Context as ProtoContext  # pylint: disable=E0611
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from flwr.supercore.task_identity import TaskIdentity

from ocmfl.privacy import ClientPrivacy
from workloads.sdk.privacy import privacy_mod
from workloads.sdk.secagg import secagg_mod

log = logging.getLogger(__name__)

SOCKET_ENV = "OCMFL_WORKER_SOCKET"
DEFAULT_PRELOAD = ("numpy", "torch")
# Always imported by the worker: what the exec shim's children run.
_FLOWER_PRELOAD = ("flwr.supernode.cli",)
_LEN = struct.Struct("!Q")


class WorkerError(RuntimeError):
    """The worker could not run the message (connection, protocol); the message says why."""


# --- wire format: length-prefixed frames ------------------------------------------------
def _send(sock: socket.socket, header: dict[str, Any], blobs: Sequence[bytes]) -> None:
    head = json.dumps({**header, "sizes": [len(b) for b in blobs]}).encode()
    sock.sendall(_LEN.pack(len(head)) + head)
    for blob in blobs:
        sock.sendall(blob)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise WorkerError("the worker connection closed mid-frame")
        got += n
    return bytes(buf)


def _recv(sock: socket.socket) -> tuple[dict[str, Any], list[bytes]]:
    header, blobs, _ = _recv_with_fds(sock)
    return header, blobs


def _recv_with_fds(sock: socket.socket) -> tuple[dict[str, Any], list[bytes], list[int]]:
    """A frame and the file descriptors its sender attached to the first bytes (the shim
    sends its standard streams that way; a thin ClientApp sends none)."""
    first, fds, _, _ = socket.recv_fds(sock, _LEN.size, 3)
    if not first:
        raise WorkerError("the worker connection closed before a frame")
    (size,) = _LEN.unpack(first + _recv_exact(sock, _LEN.size - len(first)))
    header = json.loads(_recv_exact(sock, size))
    blobs = [_recv_exact(sock, n) for n in header.pop("sizes")]
    return header, blobs, list(fds)


def message_blobs(msg: Message) -> tuple[dict[str, Any], list[bytes]]:
    """A message as Flower's object encoding: root id, message id, object ids + contents."""
    objects = get_all_nested_objects(msg)
    ids = list(objects)
    header = {"root": msg.object_id, "message_id": msg.metadata.message_id, "ids": ids}
    return header, [objects[i].deflate() for i in ids]


def message_from_blobs(header: dict[str, Any], blobs: Sequence[bytes]) -> Message:
    contents = dict(zip(header["ids"], blobs, strict=True))
    msg = cast(Message, inflate_object_from_contents(header["root"], contents))
    # The encoding leaves out the message's own id (its object id when Flower sent it).
    msg.metadata.__dict__["_message_id"] = header["message_id"]
    return msg


# --- the thin side (Flower's per-message process) --------------------------------------
def load_app(ref: str) -> ClientApp:
    """Import ``module:attribute`` and check it is a ClientApp."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ValueError(f"ClientApp reference {ref!r} must look like 'package.module:app'")
    app = getattr(importlib.import_module(module_name), attr)
    if not isinstance(app, ClientApp):
        raise TypeError(f"{ref} is a {type(app).__name__}, not a flwr ClientApp")
    return app


def _remote_error(kind: str, text: str) -> Exception:
    """The app's exception, under its own class name (Flower reports "<class ...>:<'text'>")."""
    return cast(Exception, type(kind, (RuntimeError,), {"__module__": "app"})(text))


class ForwardingClientApp(ClientApp):
    """A ClientApp that runs ``ref`` in the cluster's worker when there is one, else here."""

    def __init__(self, ref: str, app_dir: Path | None = None) -> None:
        super().__init__()
        self.ref = ref
        self.app_dir = app_dir

    def __call__(self, message: Message, context: Context) -> Message:
        """Forward to the worker ($OCMFL_WORKER_SOCKET) or run the app in this process."""
        path = os.environ.get(SOCKET_ENV, "")
        if not path:
            return load_app(self.ref)(message, context)
        return self.forward(Path(path), message, context)

    def forward(self, path: Path, message: Message, context: Context) -> Message:
        header, blobs = message_blobs(message)
        header.update(
            ref=self.ref,
            app_dir=str(self.app_dir or _app_dir(self.ref)),
            task=[TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id],
        )
        blobs.append(context_to_proto(context).SerializeToString())
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(str(path))
            except OSError as exc:  # no worker (stopped, not started): run it here
                log.warning("ClientApp worker at %s unreachable (%s): running here", path, exc)
                return load_app(self.ref)(message, context)
            _send(sock, header, blobs)
            reply_header, reply_blobs = _recv(sock)
        if "error" in reply_header:
            raise _remote_error(reply_header.get("type", "WorkerError"), reply_header["error"])
        # The app may have changed context.state: Flower keeps it for the next message.
        context.state = context_from_proto(ProtoContext.FromString(reply_blobs[-1])).state
        return message_from_blobs(reply_header, reply_blobs[:-1])


def _app_dir(ref: str) -> Path:
    """The directory Flower put on sys.path for this app (the top package's parent)."""
    top = importlib.import_module(ref.partition(":")[0].split(".")[0])
    return Path(cast(str, top.__file__)).resolve().parent.parent


def forwarding_client_app(ref: str) -> ForwardingClientApp:
    """The thin ClientApp an app exports: ``app = forwarding_client_app("pkg.impl:app")``.

    Keep the module that calls this free of heavy imports (torch): that is what the
    per-message process then skips.
    """
    return ForwardingClientApp(ref)


# --- the worker --------------------------------------------------------------------------
class GuardedClientApp(ClientApp):
    """Any ClientApp, run inside the cluster's SecAgg+ mod and, within it, its privacy mod
    (clipping and local noise come before masking)."""

    def __init__(self, inner: ClientApp, privacy: ClientPrivacy) -> None:
        super().__init__()
        self.inner = inner
        self.mod = secagg_mod(privacy, privacy_mod(privacy))

    def __call__(self, message: Message, context: Context) -> Message:
        return self.mod(message, context, self.inner.__call__)


def _guard_flower_loader(privacy: ClientPrivacy) -> None:
    """In the forked child that becomes ``flwr-clientapp``: the ClientApp Flower loads from
    the app is run inside the privacy mod (Flower's runtime looks its loader up at call time)."""
    from flwr.supernode.runtime import run_clientapp as runtime

    make_loader = runtime.get_load_client_app_fn  # type: ignore[attr-defined]

    def guarded_loader(*args: Any, **kwargs: Any) -> Any:
        load = make_loader(*args, **kwargs)
        return lambda *a, **k: GuardedClientApp(load(*a, **k), privacy)

    runtime.get_load_client_app_fn = guarded_loader  # type: ignore[attr-defined]


def _handle(conn: socket.socket, privacy: ClientPrivacy) -> None:
    """In the forked child: run one message through the app and answer."""
    header, blobs, fds = _recv_with_fds(conn)
    if "exec" in header:
        _guard_flower_loader(privacy)
        _exec_flower_clientapp(conn, header, fds)
        return
    try:
        task_id, run_id, node_id = header["task"]
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = (
            task_id,
            run_id,
            node_id,
        )
        context = context_from_proto(ProtoContext.FromString(blobs[-1]))
        message = message_from_blobs(header, blobs[:-1])
        if header["app_dir"] not in sys.path:
            sys.path.insert(0, header["app_dir"])
        reply = GuardedClientApp(load_app(header["ref"]), privacy)(message, context)
        reply_header, reply_blobs = message_blobs(reply)
        reply_blobs.append(context_to_proto(context).SerializeToString())
        _send(conn, reply_header, reply_blobs)
    except Exception as exc:  # the app's error goes back as the reply
        _send(conn, {"error": str(exc), "type": type(exc).__name__}, [])
    _join_app_threads()


def _join_app_threads(timeout_s: float = 5.0) -> None:
    """Let background work the app started (the agent_metrics POST) finish before the child
    exits with os._exit, which, unlike a normal interpreter exit, does not wait for it."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(timeout=timeout_s)


def _exec_flower_clientapp(conn: socket.socket, header: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: be the ``flwr-clientapp`` process the shim stands for (its
    arguments, environment and standard streams), then send its exit code back."""
    sys.stdout.flush()
    sys.stderr.flush()
    for target, fd in zip((0, 1, 2), fds, strict=False):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    # Without the socket the thin app runs the real one here, in this child.
    os.environ.update({k: v for k, v in header["env"].items() if k != SOCKET_ENV})
    sys.argv = ["flwr-clientapp", *header["exec"]]
    from flwr.supernode.cli import flwr_clientapp  # preloaded by the worker

    code: int = 0
    try:
        flwr_clientapp()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception:  # Flower's own handling failed; the shim reports the exit code
        log.exception("flwr-clientapp failed in the worker")
        code = 1
    finally:
        _join_app_threads()
        sys.stdout.flush()
        sys.stderr.flush()
        with contextlib.suppress(OSError):
            _send(conn, {"exit": code}, [])


# The shim runs with -I -S (no site, no user paths): stdlib only, about 20 ms to start.
_SHIM = """#!{python} -IS
# flwr-clientapp for Flower's SuperExec: runs Flower's own entry point in the ClientApp
# worker (workloads.sdk.worker) with this process's arguments, environment and streams.
import json, os, socket, struct, sys
LEN = struct.Struct("!Q")
for fd in (0, 1, 2):  # a closed standard stream becomes /dev/null (open takes the lowest)
    try:
        os.fstat(fd)
    except OSError:
        os.open(os.devnull, os.O_RDWR)
try:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect({socket_path!r})
except OSError:
    os.execv({real!r}, [{real!r}, *sys.argv[1:]])
head = json.dumps({{"exec": sys.argv[1:], "env": dict(os.environ), "sizes": []}}).encode()
frame = LEN.pack(len(head)) + head
socket.send_fds(sock, [frame[:LEN.size]], [0, 1, 2])
sock.sendall(frame[LEN.size:])
buf = b""
while True:
    chunk = sock.recv(65536)
    if not chunk:
        sys.exit(1)  # the child died without an answer
    buf += chunk
    if len(buf) >= LEN.size and len(buf) >= LEN.size + LEN.unpack(buf[:LEN.size])[0]:
        break
sys.exit(json.loads(buf[LEN.size:LEN.size + LEN.unpack(buf[:LEN.size])[0]])["exit"])
"""


def write_exec_shim(directory: Path, socket_path: Path, fallback: Path | None = None) -> Path:
    """Write the ``flwr-clientapp`` shim into `directory` (put it first on the SuperNode's
    PATH) for the worker on `socket_path`; returns the directory. Without a worker the shim
    execs `fallback` (default: Flower's own ``flwr-clientapp`` next to this Python)."""
    real = fallback or Path(sys.executable).parent / "flwr-clientapp"
    directory.mkdir(mode=0o700, exist_ok=True)
    shim = directory / "flwr-clientapp"
    shim.write_text(
        _SHIM.format(python=sys.executable, socket_path=str(socket_path), real=str(real))
    )
    shim.chmod(0o700)
    return directory


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def listen(path: Path) -> socket.socket:
    """A Unix socket only this user may connect to (0600, created under umask 0177). It is
    bound and listening under a temporary name first, then renamed: `path` appears only once
    a connect to it is taken (between bind and listen a connect is refused, and a client that
    waits for the file would then run the message itself)."""
    staging = path.with_name(path.name + ".new")
    for stale in (path, staging):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        server.bind(str(staging))
    finally:
        os.umask(old)
    os.chmod(staging, 0o600)
    server.listen(64)
    os.rename(staging, path)
    return server


def serve(server: socket.socket, path: Path, privacy: ClientPrivacy) -> None:
    """Fork a child per connection until SIGTERM (peers of another uid are turned away)."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uid = os.getuid()
    try:
        while True:
            conn, _ = server.accept()
            if _peer_uid(conn) != uid:
                conn.close()
                continue
            if os.fork() == 0:
                server.close()
                # The app gets a normal process: it may start and wait for its own children.
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                code = 0
                try:
                    _handle(conn, privacy)
                except BaseException:
                    code = 1
                finally:
                    os._exit(code)
            conn.close()
    finally:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def warm_torch() -> None:
    """Build a torch optimizer once here, so that no forked child pays torch's first-use cost.

    `import torch` leaves most of its compiler stack unloaded; the first optimizer a process
    builds imports it (torch._dynamo, sympy, mpmath: about 900 modules, 1.2-1.7 s of CPU with
    torch 2.x). A child forked per message would pay that on every message, which made a
    digits round cost 1.4 s of CPU per cluster instead of 0.1 s. No backward pass: it starts
    autograd's threads, and a torch that saw them (Debian's 2.6, in the workload image)
    refuses autograd in every forked child ("Unable to handle autograd's threading in
    combination with fork-based multiprocessing").
    """
    import torch

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    optimizer.step()  # no gradient: nothing to update, but the step's wrappers are built
    optimizer.zero_grad()


def socket_dir() -> Path:
    """A private (0700) directory for the socket under $TMPDIR (the pod's scratch dir)."""
    return Path(tempfile.mkdtemp(prefix="ocmfl-worker-"))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m workloads.clientapp_worker --socket PATH [--preload torch,numpy]``."""
    parser = argparse.ArgumentParser(prog="python -m workloads.clientapp_worker")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--preload", default=",".join(DEFAULT_PRELOAD),
                        help="modules to import once, comma separated")  # fmt: skip
    parser.add_argument("--cluster", default="", help="the cluster's name (for refusals)")
    parser.add_argument("--privacy", default="",
                        help="the cluster's ClientPrivacy as JSON (ocmfl.privacy)")  # fmt: skip
    args = parser.parse_args(argv)
    privacy = ClientPrivacy.from_json(args.privacy) if args.privacy else ClientPrivacy(args.cluster)
    # Listen first: a message that comes while the preload runs waits in the backlog.
    server = listen(args.socket)
    names = [*filter(None, (m.strip() for m in args.preload.split(","))), *_FLOWER_PRELOAD]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"ocm-fl-worker: not preloading {name}: {exc}", flush=True)
    if "torch" in sys.modules:
        warm_torch()
    serve(server, args.socket, privacy)
    return 0
