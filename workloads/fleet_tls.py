"""Run the Fleet API gateway (server side) and tunnel (client side) as nginx child processes.

The configurations come from `workloads.fleet_proxy`; this module starts nginx, checks that
it came up, reloads it (SIGHUP) when its mounted certificate pair is replaced, and stops it.
The launchers own these processes next to the SuperLink/SuperNode, so one container carries
each end of the mutually authenticated connection.

Certificates are named by the path they are mounted at, never by its resolved target: the
kubelet updates a Secret volume by pointing `..data` at a new `..<timestamp>` directory and
deleting the old one, so a resolved path goes on naming the old pair (and then nothing).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ocmfl import pki
from workloads.fleet_longpoll import LongPoller, LongPollServer, start_long_poll
from workloads.fleet_proxy import TLSFiles, fleet_gateway_conf, fleet_tunnel_conf, nginx_command


class ProxyError(RuntimeError):
    """nginx could not be configured or started; the message names the file or address."""


RELOAD_CHECK_S = 1.0  # how often the mounted certificate files are looked at

# (mtime_ns, size, inode) of each watched file, through symlinks
FilesSig = tuple[tuple[int, int, int], ...]


def files_signature(paths: tuple[Path, ...]) -> FilesSig:
    """What changes when any of `paths` is replaced (OSError when one is missing)."""
    out = []
    for p in paths:
        st = os.stat(p)  # follows the kubelet's ..data symlink
        out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


@dataclass
class PairWatch:
    """A certificate, its key and a CA bundle as mounted; `poll` says when they became a new
    consistent set (a half-written update, a key that does not match, is waited out)."""

    cert: Path
    key: Path
    ca: Path
    seen: FilesSig | None = None

    def __post_init__(self) -> None:
        with contextlib.suppress(OSError):
            self.seen = files_signature((self.cert, self.key, self.ca))

    def poll(self) -> int | None:
        """The new certificate's serial number once the files changed since the last set
        this returned (or since start) and cert and key match; else None."""
        try:
            sig = files_signature((self.cert, self.key, self.ca))
            if sig == self.seen:
                return None
            pair = pki.load_cert_and_key(self.cert.read_bytes(), self.key.read_bytes())
            pki.load_certs_pem(self.ca.read_bytes())
        except (OSError, ValueError):
            return None  # mid-update or unreadable: look again at the next poll
        self.seen = sig
        return int(pair.cert.serial_number)


@dataclass
class Proxy:
    """A running nginx and the address it listens on."""

    process: subprocess.Popen[bytes]
    listen: str
    log: Path
    local_ca: Path | None = None  # tunnel only: the CA of its loopback listener
    reloads: int = 0  # SIGHUPs sent for a new certificate pair
    long_poll: LongPollServer | None = None  # tunnel only: the PullMessages poller
    _stop: threading.Event = field(default_factory=threading.Event)

    def check(self) -> None:
        if self.process.poll() is not None:
            raise ProxyError(f"nginx exited with {self.process.returncode}; log {self.log}")

    def watch(self, pair: PairWatch, interval_s: float = RELOAD_CHECK_S) -> None:
        """Reload nginx (SIGHUP: new workers read the files again, old ones finish their
        requests) whenever `pair` is replaced by a consistent new set."""

        def loop() -> None:
            while not self._stop.wait(interval_s):
                serial = pair.poll()
                if serial is None or self.process.poll() is not None:
                    continue
                self.process.send_signal(signal.SIGHUP)
                self.reloads += 1
                with self.log.open("a") as fh:  # next to nginx's own "reconfiguring" line
                    fh.write(f"ocm-fl: new certificate {pair.cert} serial {serial:x}: reload\n")

        threading.Thread(target=loop, name="nginx-reload", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self.long_poll is not None:
            self.long_poll.stop()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def free_loopback_port() -> int:
    """A free TCP port on 127.0.0.1 (for the pod-local tunnel listener)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ProxyError(f"expected host:port, got {address!r}")
    return host.strip("[]"), int(port)


def _check_files(**files: Path) -> None:
    for flag, path in files.items():
        if not Path(path).is_file():
            raise ProxyError(f"--{flag.replace('_', '-')} {path} does not exist")


def _start(conf: str, run_dir: Path, listen: str, timeout: float = 15.0) -> Proxy:
    if shutil.which("nginx") is None:
        raise ProxyError("nginx is not installed (the workload image carries it)")
    run_dir.mkdir(parents=True, exist_ok=True)
    conf_path = run_dir / "nginx.conf"
    conf_path.write_text(conf)
    test = subprocess.run(
        [*nginx_command(str(conf_path))[:3], "-t"], capture_output=True, text=True, check=False
    )
    if test.returncode != 0:
        raise ProxyError(f"nginx rejected {conf_path}: {test.stderr.strip()}")
    log = run_dir / "nginx.log"
    with log.open("ab") as fh:
        proc = subprocess.Popen(nginx_command(str(conf_path)), stdout=fh, stderr=subprocess.STDOUT)
    proxy = Proxy(proc, listen, log)
    host, port = _split(listen)
    dial = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    deadline = time.monotonic() + timeout
    while True:
        proxy.check()
        with socket.socket() as s, contextlib.suppress(OSError):
            s.settimeout(0.5)
            if s.connect_ex((dial, port)) == 0:
                return proxy
        if time.monotonic() > deadline:
            proxy.stop()
            raise ProxyError(f"nginx did not listen on {listen} within {timeout:.0f}s; log {log}")
        time.sleep(0.1)


def start_gateway(
    *,
    listen: str,
    certfile: Path,
    keyfile: Path,
    client_ca_file: Path,
    superlink_address: str,
    superlink_ca_file: Path,
    run_dir: Path,
) -> Proxy:
    """The hub-side gateway: mTLS on `listen`, only /v1/fleet/ forwarded to the SuperLink."""
    _check_files(
        gateway_certfile=certfile,
        gateway_keyfile=keyfile,
        client_ca_file=client_ca_file,
        ssl_ca_certfile=superlink_ca_file,
    )
    host, port = _split(superlink_address)
    dial = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    conf = fleet_gateway_conf(
        listen=listen,
        server_tls=TLSFiles(
            cert=str(certfile.absolute()),
            key=str(keyfile.absolute()),
            ca=str(client_ca_file.absolute()),
        ),
        superlink_address=f"{dial}:{port}",
        superlink_ca=str(superlink_ca_file.absolute()),
        run_dir=str(run_dir.resolve()),
    )
    proxy = _start(conf, run_dir, listen)
    proxy.watch(PairWatch(certfile.absolute(), keyfile.absolute(), client_ca_file.absolute()))
    return proxy


def start_tunnel(
    *,
    gateway_address: str,
    certfile: Path,
    keyfile: Path,
    ca_file: Path,
    run_dir: Path,
    server_name: str | None = None,
    long_poll_hold_s: float | None = None,
) -> Proxy:
    """The client-side tunnel: TLS on a free 127.0.0.1 port, mTLS to the gateway.

    The loopback side uses a throwaway CA and certificate made here (`Proxy.local_ca` is what
    the SuperNode trusts): Flower requires TLS for SuperNode authentication, and nothing but
    loopback reaches this listener. With `long_poll_hold_s` the SuperNode's PullMessages is
    held up to that long by a poller thread (`workloads.fleet_longpoll`).
    """
    _check_files(client_certfile=certfile, client_keyfile=keyfile, root_certificates=ca_file)
    host, _ = _split(gateway_address)
    listen = f"127.0.0.1:{free_loopback_port()}"
    local_ca = pki.create_ca("ocm-fl-tunnel-loopback", key_kind="ec")
    local = pki.issue_server_cert(local_ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    tls_dir = pki.save_tls_dir(run_dir / "loopback-tls", local, local_ca.cert)
    poll: LongPollServer | None = None
    if long_poll_hold_s is not None:
        internal = f"127.0.0.1:{free_loopback_port()}"
        poll = start_long_poll(LongPoller(upstream=internal, hold_s=long_poll_hold_s))
    conf = fleet_tunnel_conf(
        listen=listen,
        gateway_address=gateway_address,
        gateway_server_name=server_name or host,
        client_tls=TLSFiles(
            cert=str(certfile.absolute()), key=str(keyfile.absolute()), ca=str(ca_file.absolute())
        ),
        listen_tls=TLSFiles(
            cert=str((tls_dir / pki.CERT_FILE).resolve()),
            key=str((tls_dir / pki.KEY_FILE).resolve()),
            ca=str((tls_dir / pki.CA_FILE).resolve()),
        ),
        long_poll=(poll.address, poll.poller.upstream) if poll else None,
        run_dir=str(run_dir.resolve()),
    )
    try:
        proxy = _start(conf, run_dir, listen)
    except ProxyError:
        if poll is not None:
            poll.stop()
        raise
    proxy.long_poll = poll
    proxy.local_ca = tls_dir / pki.CA_FILE
    proxy.watch(PairWatch(certfile.absolute(), keyfile.absolute(), ca_file.absolute()))
    return proxy
