"""Start, watch and stop the control-plane processes; the JSON state file that records them.

Every component runs in its own session (process group) with its output in ``logs/<name>.log``
under the state directory, so ``down`` can kill whole groups by id and leave no orphans.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

DEFAULT_STATE_DIR = "/dev/shm/ocm-fl-cp"
STATE_FILE = "state.json"


class ComponentFailed(RuntimeError):
    """A component exited or never became healthy; names it and its log file."""

    def __init__(self, name: str, log: Path, why: str) -> None:
        tail = ""
        with contextlib.suppress(OSError):
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        super().__init__(f"{name} {why}; log: {log}\n--- last lines ---\n{tail}")
        self.component = name
        self.log = log


def state_dir() -> Path:
    """The state directory: ``$OCMFL_CP_DIR`` or /dev/shm/ocm-fl-cp."""
    return Path(os.environ.get("OCMFL_CP_DIR") or DEFAULT_STATE_DIR)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on `host`."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """A started component as recorded in the state file."""

    name: str
    pid: int
    port: int
    log: str
    argv: list[str] = field(default_factory=list)


@dataclass
class State:
    """Everything `status`/`down` and the test fixtures need to find a running plane."""

    dir: str
    clusters: list[str]
    procs: list[Proc] = field(default_factory=list)
    kubeconfigs: dict[str, str] = field(default_factory=dict)  # "hub" / cluster name -> path
    # cluster -> the hub kubeconfig its registration agent got (also its work agent's)
    hub_access: dict[str, str] = field(default_factory=dict)
    # cluster -> seconds from its registration agent's start to Joined and Available
    joined_seconds: dict[str, float] = field(default_factory=dict)
    apiservers: dict[str, str] = field(default_factory=dict)  # "hub" / cluster -> https URL
    etcd_data: str = ""
    started_at: float = 0.0
    startup_seconds: float = 0.0
    ocm: bool = True  # OCM placement controller and work agents running
    addon_manager: bool = False  # OCM addon manager running on the hub (with `ocm`)
    slot: int = 0  # address slot: planes running at once get disjoint loopback ranges
    auto_stop: bool = False  # started by a test session: the last session to leave stops it
    kubelet: bool = False  # real kubelet + containerd nodes (hack/controlplane/kubelet.py)

    def save(self) -> None:
        path = Path(self.dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, directory: Path | None = None) -> State | None:
        path = (directory or state_dir()) / STATE_FILE
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        # Another worktree's plane may carry fields this version does not know: skip them.
        known, proc_known = {f.name for f in fields(cls)}, {f.name for f in fields(Proc)}
        raw = {k: v for k, v in raw.items() if k in known}
        raw["procs"] = [
            Proc(**{k: v for k, v in p.items() if k in proc_known}) for p in raw.get("procs", [])
        ]
        return cls(**raw)


def alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def spawn(name: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    """Start `argv` in a new session with stdout+stderr to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        p = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            close_fds=True,
        )
    return Proc(name=name, pid=p.pid, port=0, log=str(log), argv=list(argv))


def wait_until(
    proc: Proc, check: Callable[[], bool], timeout: float, what: str = "did not become ready"
) -> None:
    """Poll `check` until true; raise ComponentFailed if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(proc.pid):
            raise ComponentFailed(proc.name, Path(proc.log), "exited during startup")
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.2)
    raise ComponentFailed(proc.name, Path(proc.log), f"{what} within {timeout:.0f}s")


def http_ok(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 2.0) -> bool:
    """GET `url`; true on HTTP 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def client_tls(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """TLS context trusting `ca`, optionally presenting a client certificate."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert and key:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def insecure_tls() -> ssl.SSLContext:
    """TLS context that accepts any certificate (for self-signed controller health ports)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def kill_group(pid: int, grace: float = 5.0) -> None:
    """SIGTERM the process group led by `pid`, SIGKILL it after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
            if not alive(pid) and not _group_alive(pid):
                return
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    # Zombies still count for killpg(0); treat a group of zombies as dead.
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` plus all of its descendants (0 if gone)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        rss[int(entry)] = int(fields[21]) * page
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack.extend(children.get(p, []))
    return total
