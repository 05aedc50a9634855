"""``ocm-fl-server``: run one Flower app on the hub and exit with its outcome.

Steps: check the app directory (a missing or invalid one fails here, naming the path), start
``flower-superlink`` (TLS, SuperNode authentication, SQLite state in the state directory,
runtime dependency installation off unless ``--install-dependencies``), register the
SuperNode public keys it is given (``<cluster>.pub``, registered under the cluster's name),
submit the app with ``flwr run`` (the resource's run config, checked against the keys the app
declares) while waiting until ``--min-clients`` of them are online (the run is stopped if they
do not come in time), follow the run, and exit 0
when it completed or 1 otherwise, printing one line that says why. The app's ServerApp finds
the platform's settings (model store, initModel, rounds, minimum results, resource uid) in
its environment (workloads.sdk.platform). Restarted on the same ``--state-dir`` and storage it
stops the stale run and submits a new one, which resumes from the last checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import tomli_w

from ocmfl.constants import ENV_FL_UID, SERVER_FAILED_EXIT, SUPERLINK_PORT
from ocmfl.nodekeys import PUBLIC_SUFFIX, read_public_keys
from ocmfl.privacy import DpSettings, SecAggSettings
from workloads import flower_env as fe
from workloads.fleet_tls import Proxy, ProxyError, start_gateway
from workloads.flower_app import AppError, FlowerApp, RunConfigValue, inspect_app, run_config
from workloads.outcome import Outcome, RunLog, decide, one_line
from workloads.sdk.platform import ServerPlatform
from workloads.sdk.storage import StorageError
from workloads.sdk.store import ModelStore, ModelStoreError, StoreOwnedError

# The SuperLink answers /health in ~3.5 s on an idle 2-core machine; a loaded one (several
# servers starting at once) has been seen to need over a minute. wait_health fails at once if
# the process dies, so a long bound costs nothing.
SUPERLINK_START_TIMEOUT = 300.0
PREFIX = "ocm-fl-server"
# While the run's log stream is open the run is not finished (the SuperLink closes it then):
# its status is asked only this often, as a safety net.
STATUS_FALLBACK_S = 60.0
REGISTER_PARALLEL = 4  # SuperNode key registrations at once
CLIENTS_POLL_S = 0.5  # between node lists (one HTTPS request each) while waiting for clients
# How often the running launcher looks for SuperNode keys that appeared or changed (the key
# directory is a Secret volume, which the kubelet refreshes about every minute).
KEY_SYNC_S = 3.0


class LaunchError(Exception):
    """Training cannot go on; the message is the one-line reason."""


@dataclass(frozen=True)
class LaunchSettings:
    """The app and the platform's settings for one run."""

    app: FlowerApp
    run_config: dict[str, RunConfigValue]
    platform: ServerPlatform
    install_dependencies: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def min_clients(self) -> int:
        """Clients needed online to start, and successful results per round."""
        return self.platform.min_results


def build_parser() -> argparse.ArgumentParser:
    """The CLI flags."""
    p = argparse.ArgumentParser(prog=PREFIX, description=__doc__.split("\n")[0])
    g = p.add_argument_group("SuperLink")
    g.add_argument(
        "--state-dir",
        required=True,
        type=Path,
        help="SuperLink database, FLWR_HOME, logs, node map",
    )
    g.add_argument(
        "--persist-dir",
        type=Path,
        default=None,
        help="where the SuperLink database and node map live instead, when --state-dir does "
        "not outlive this process's pod (a replacement pod then keeps the node ids, so the "
        "SuperNodes reconnect on their own)",
    )
    g.add_argument(
        "--superlink-address",
        default=f"127.0.0.1:{SUPERLINK_PORT}",
        help="host:port the SuperLink binds (all its APIs)",
    )
    g.add_argument("--ssl-ca-certfile", required=True, type=Path)
    g.add_argument(
        "--ssl-certfile",
        required=True,
        type=Path,
        help="server certificate (SAN 127.0.0.1 and the service names)",
    )
    g.add_argument("--ssl-keyfile", required=True, type=Path)
    g.add_argument(
        "--supernode-keys",
        required=True,
        type=Path,
        help="directory of <cluster>.pub SuperNode public keys (OpenSSH ECDSA)",
    )
    g.add_argument(
        "--min-clients",
        type=int,
        default=1,
        help="clients needed online to start, and successful results per round",
    )
    g.add_argument(
        "--wait-clients-timeout",
        "--clients-ready-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for --min-clients online SuperNodes",
    )
    g.add_argument(
        "--run-timeout",
        type=float,
        default=0.0,
        help="seconds the run may take once submitted (0: no limit)",
    )
    g.add_argument(
        "--status-interval", type=float, default=15.0, help="seconds between run status checks"
    )
    g.add_argument("--run-id", default="", help="label for logs (e.g. NAMESPACE/NAME)")
    g.add_argument(
        "--fleet-port",
        type=int,
        default=None,
        help="port the mTLS proxy exposes to clusters (informational: the proxy, not this "
        "launcher, listens there)",
    )
    g.add_argument(
        "--termination-log",
        type=Path,
        default=Path("/dev/termination-log"),
        help="when this file exists, write the outcome JSON to it (Kubernetes)",
    )
    gw = p.add_argument_group(
        "Fleet gateway (mTLS in front of the SuperLink; only /v1/fleet/ is forwarded)"
    )
    gw.add_argument(
        "--gateway-listen",
        default="",
        help="host:port the gateway serves clusters on; empty: no gateway (tests only)",
    )
    gw.add_argument("--gateway-certfile", type=Path, default=None)
    gw.add_argument("--gateway-keyfile", type=Path, default=None)
    gw.add_argument(
        "--client-ca-file",
        type=Path,
        default=None,
        help="CA that cluster certificates must chain to (default: --ssl-ca-certfile)",
    )
    g.add_argument("--result-file", type=Path, default=None, help="write the outcome as JSON here")
    r = p.add_argument_group("the app and its run")
    r.add_argument(
        "--app-dir", required=True, type=Path, help="the Flower app directory (pyproject.toml)"
    )
    r.add_argument(
        "--run-config",
        default="{}",
        help="JSON object of run config values; keys must be declared by the app",
    )
    r.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds to run (also set as num-server-rounds when the app declares it)",
    )
    r.add_argument(
        "--round-timeout",
        type=float,
        default=None,
        help="seconds a round waits for client replies (apps using workloads.sdk)",
    )
    r.add_argument(
        "--storage",
        "--storage-dir",
        "--model-dir",
        required=True,
        help="model store: an absolute directory or s3://bucket/prefix",
    )
    r.add_argument(
        "--init-model",
        default="",
        help="starting model: a path inside the store, an absolute path or s3:// URL "
        "(.npz, .arrayrecord, .pt/.pth, .safetensors)",
    )
    r.add_argument(
        "--privacy",
        default="",
        help="JSON of spec.privacy.differentialPrivacy: run_strategy applies it "
        "(workloads.sdk.privacy)",
    )
    r.add_argument(
        "--secure-aggregation",
        default="",
        help="JSON of spec.privacy.secureAggregation: run_strategy runs SecAgg+ in every train "
        "phase (workloads.sdk.secagg)",
    )
    r.add_argument(
        "--install-dependencies",
        action="store_true",
        help="let Flower install the app's dependencies at run time (off: the image has them)",
    )
    return p


def settings_from_args(args: argparse.Namespace) -> LaunchSettings:
    """Check the app and the flags; AppError/ValueError name what is wrong."""
    app = inspect_app(args.app_dir)
    try:
        overrides = json.loads(args.run_config or "{}")
    except ValueError as exc:
        raise ValueError(f"--run-config is not JSON: {exc}") from None
    if not isinstance(overrides, dict):
        raise ValueError("--run-config must be a JSON object")
    if args.rounds is not None and args.rounds < 1:
        raise ValueError("--rounds must be >= 1")
    if args.min_clients < 1:
        raise ValueError("--min-clients must be >= 1")
    if args.privacy:
        try:
            DpSettings.from_spec(json.loads(args.privacy))
        except (ValueError, AttributeError) as exc:  # PrivacySettingError is a ValueError
            raise ValueError(f"--privacy: {exc}") from None
    if args.secure_aggregation:
        try:
            SecAggSettings.from_spec(json.loads(args.secure_aggregation))
        except (ValueError, AttributeError) as exc:
            raise ValueError(f"--secure-aggregation: {exc}") from None
    storage = str(args.storage)
    if not storage.startswith("s3://"):
        storage = str(Path(storage).resolve())
    platform = ServerPlatform(
        storage=storage,
        init_model=args.init_model,
        resource_uid=os.environ.get(ENV_FL_UID, ""),
        rounds=args.rounds,
        min_results=args.min_clients,
        round_timeout=args.round_timeout,
        node_names_file=str(persist_dir(args) / "nodes.json"),
        privacy=args.privacy,
        secure_aggregation=args.secure_aggregation,
    )
    return LaunchSettings(
        app=app,
        run_config=run_config(app, overrides, args.rounds),
        platform=platform,
        install_dependencies=bool(args.install_dependencies),
    )


def persist_dir(args: argparse.Namespace) -> Path:
    """Where the SuperLink database and the node map live (--persist-dir, else --state-dir)."""
    return Path(args.persist_dir or args.state_dir).resolve()


def online_count(nodes: Mapping[str, str], node_ids: set[str]) -> int:
    """How many of ``node_ids`` are online in ``nodes`` (node id -> status, list_nodes)."""
    return sum(1 for node, status in nodes.items() if node in node_ids and status == "online")


def _key_line(path: Path) -> bytes:
    """The key of an OpenSSH public key file, without its comment (the cluster's name)."""
    return b" ".join(path.read_bytes().split()[:2])


def key_changes(registered: Mapping[str, bytes], found: Mapping[str, bytes]) -> list[str]:
    """Clusters whose key in ``found`` is new or differs from the one ``registered``, in
    order; clusters that are no longer found are not listed (see Launcher.sync_nodes)."""
    return sorted(c for c, key in found.items() if registered.get(c) != key)


class Launcher:
    """Owns the SuperLink process and talks to its Control API (`flwr run` and `flwr stop`:
    through the flwr CLI)."""

    def __init__(self, args: argparse.Namespace, settings: LaunchSettings) -> None:
        self.args = args
        self.settings = settings
        self.state = Path(args.state_dir).resolve()
        self.persist = persist_dir(args)
        self.flwr_home = self.state / "flwr-home"
        self.ca_file = Path(args.ssl_ca_certfile)  # the SuperLink's CA: every TLS call to it
        # The SuperLink's SuperExec starts the ServerApp with this environment: it carries
        # the platform's settings to workloads.sdk.
        self.env = fe.flower_env(self.flwr_home, settings.platform.to_env())
        self.superlink: subprocess.Popen[bytes] | None = None
        self.gateway: Proxy | None = None
        self.run_id: str | None = None
        self.fresh_database = False  # start_superlink: its database did not exist before
        self.keys: dict[str, bytes] = {}  # cluster -> the public key registered for it
        self.nodes: dict[str, str] = {}  # cluster -> its node id (nodes.json)
        host, _, port = str(args.superlink_address).rpartition(":")
        if not host or not port.isdigit():
            raise LaunchError(
                f"--superlink-address must be host:port, got {args.superlink_address}"
            )
        self.host, self.port = host, int(port)
        dial = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
        self.address = f"{dial}:{port}"

    def log(self, text: str) -> None:
        print(f"{PREFIX}: {text}", flush=True)

    # --- SuperLink ---------------------------------------------------------------------
    def check_store(self) -> None:
        """Refuse (LaunchError) a model store whose manifest belongs to another resource uid,
        before anything trains: its checkpoints are never resumed or overwritten."""
        platform = self.settings.platform
        if not platform.storage:
            return
        try:
            ModelStore(platform.storage, platform.resource_uid).check_owner()
        except StoreOwnedError as exc:
            raise LaunchError(str(exc)) from None
        except (ModelStoreError, StorageError) as exc:
            # An unreadable store fails later with the app's own message; not our call here.
            self.log(f"model store not checked: {exc}")

    def start_superlink(self) -> None:
        a = self.args
        for flag, path in (
            ("--ssl-ca-certfile", a.ssl_ca_certfile),
            ("--ssl-certfile", a.ssl_certfile),
            ("--ssl-keyfile", a.ssl_keyfile),
        ):
            if not Path(path).is_file():
                raise LaunchError(f"{flag} {path} does not exist")
        self.state.mkdir(parents=True, exist_ok=True)
        self.persist.mkdir(parents=True, exist_ok=True)
        fe.write_connection(self.flwr_home, self.address, self.ca_file)
        # A database made by this start holds no run to stop (see stop_stale_runs).
        self.fresh_database = not (self.persist / "superlink.db").exists()
        cmd = [
            fe.executable("flower-superlink"),
            "--ssl-ca-certfile",
            str(self.ca_file.absolute()),
            "--ssl-certfile",
            str(Path(a.ssl_certfile).absolute()),
            "--ssl-keyfile",
            str(Path(a.ssl_keyfile).absolute()),
            "--enable-supernode-auth",
            "--database",
            str(self.persist / "superlink.db"),
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]
        cmd.append(
            "--allow-runtime-dependency-installation"
            if self.settings.install_dependencies
            else "--disable-runtime-dependency-installation"
        )
        log = (self.state / "superlink.log").open("ab")
        started = time.monotonic()
        self.superlink = fe.start(cmd, self.env, log)
        self.wait_health(SUPERLINK_START_TIMEOUT)
        self.log(
            f"SuperLink up on {self.host}:{self.port} after {time.monotonic() - started:.0f}s "
            f"(log {self.state / 'superlink.log'})"
        )

    def start_gateway(self) -> None:
        """The mTLS gateway clusters connect to (nginx; Control/Runtime APIs stay local)."""
        a = self.args
        if not a.gateway_listen:
            return
        if a.gateway_certfile is None or a.gateway_keyfile is None:
            raise LaunchError("--gateway-listen needs --gateway-certfile and --gateway-keyfile")
        try:
            self.gateway = start_gateway(
                listen=a.gateway_listen,
                certfile=Path(a.gateway_certfile),
                keyfile=Path(a.gateway_keyfile),
                client_ca_file=Path(a.client_ca_file or a.ssl_ca_certfile),
                superlink_address=self.address,
                superlink_ca_file=self.ca_file,
                run_dir=self.state / "gateway",
            )
        except ProxyError as exc:
            raise LaunchError(f"Fleet gateway: {exc}") from exc
        self.log(f"Fleet gateway (mTLS) on {a.gateway_listen}")

    def check_superlink(self) -> None:
        if self.superlink is None or self.superlink.poll() is not None:
            tail = ""
            log = self.state / "superlink.log"
            if log.exists():
                tail = one_line(log.read_text(errors="replace")[-600:], 300)
            raise LaunchError(f"SuperLink exited ({tail})")
        if self.gateway is not None:
            try:
                self.gateway.check()
            except ProxyError as exc:
                raise LaunchError(f"Fleet gateway: {exc}") from exc

    def wait_health(self, timeout: float) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        deadline = time.monotonic() + timeout
        while True:
            self.check_superlink()
            try:
                with urllib.request.urlopen(
                    f"https://{self.address}/health", timeout=2, context=context
                ) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise LaunchError(f"SuperLink not healthy on {self.address} after {timeout:.0f}s")
            # Every step after this one waits for it; a refused connect costs next to nothing.
            time.sleep(0.1)

    def stop_superlink(self, finished: bool = False) -> None:
        """Stop the gateway and the SuperLink. With `finished` (the run's outcome is known and
        written to the SuperLink's database, which SQLite keeps across a kill) the SuperLink
        and its helpers are killed at once instead of stopped gracefully."""
        if self.gateway is not None:
            self.gateway.stop()
            self.gateway = None
        if finished:
            fe.kill(self.superlink)
        else:
            fe.stop(self.superlink)
        self.superlink = None

    def flwr(self, *args: str) -> Any:
        return fe.flwr_json(args, self.env)

    # Node and run bookkeeping goes straight to the Control API (one HTTPS request each):
    # a `flwr` CLI process spends ~2.5 s importing Flower, several of them on the way to
    # the first round and one after the last.
    def register_key(self, cluster: str, key: Path) -> str:
        """Register ``key`` under ``cluster``'s name; its node id."""
        return fe.register_node(self.address, self.ca_file, key, cluster)

    def unregister_node(self, node_id: str) -> None:
        fe.unregister_node(self.address, self.ca_file, node_id)

    def list_nodes(self) -> dict[str, str]:
        """Node id -> status of every SuperNode."""
        return fe.list_nodes(self.address, self.ca_file)

    # --- nodes -------------------------------------------------------------------------
    def register_nodes(self) -> dict[str, str]:
        """Register every <cluster>.pub; return cluster -> node id (kept in nodes.json)."""
        keys = read_public_keys(Path(self.args.supernode_keys))
        if len(keys) < self.settings.min_clients:
            raise LaunchError(
                f"{self.args.supernode_keys} has {len(keys)} SuperNode keys, "
                f"--min-clients is {self.settings.min_clients}"
            )
        path = self.persist / "nodes.json"
        known: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}

        def register(cluster: str, key: Path) -> str:
            try:
                return self.register_key(cluster, key)
            except fe.FlwrCliError as exc:
                if "already in use" in str(exc) and cluster in known:
                    return known[cluster]
                raise LaunchError(f"registering {key}: {one_line(str(exc))}") from None

        # A few requests at once: each SuperLink answer is a database write.
        with ThreadPoolExecutor(max(1, min(REGISTER_PARALLEL, len(keys)))) as pool:
            nodes = dict(zip(keys, pool.map(register, keys, keys.values()), strict=True))
        for cluster, key in keys.items():
            self.keys[cluster] = _key_line(key)
        self.nodes = dict(nodes)
        path.write_text(json.dumps(nodes, indent=2) + "\n")
        self.log(f"registered SuperNodes {', '.join(sorted(nodes))}")
        return nodes

    def sync_nodes(self) -> list[str]:
        """Register the keys that appeared or changed in the key directory since the last
        look (a cluster that joined the running federation, or came back with a new key);
        a changed key's previous node is unregistered, so the old key is refused. A key
        that disappeared (the cluster left) stays registered: Flower keeps an unregistered
        key in use, so the same key could never be registered again if the cluster came
        back; the cluster's client is gone with its work anyway. Returns what it did, one
        line per cluster."""
        try:
            found = {
                c: _key_line(p) for c, p in read_public_keys(Path(self.args.supernode_keys)).items()
            }
        except OSError as exc:
            return [f"key directory unreadable: {exc}"]
        done: list[str] = []
        for cluster in key_changes(self.keys, found):
            path = Path(self.args.supernode_keys) / f"{cluster}{PUBLIC_SUFFIX}"
            try:
                node = self.register_key(cluster, path)
            except fe.FlwrCliError as exc:
                done.append(f"{cluster}: key not registered: {one_line(str(exc))}")
                continue
            old = self.nodes.get(cluster)
            self.nodes[cluster] = node
            self.keys[cluster] = found[cluster]
            line = f"{cluster}: {'new key' if old else 'joined'}, node {node}"
            if old:
                try:
                    self.unregister_node(old)
                    line += f" (node {old} of its previous key unregistered)"
                except fe.FlwrCliError as exc:
                    line += (
                        f" (node {old} of its previous key not unregistered: {one_line(str(exc))})"
                    )
            done.append(line)
        if done:
            path = self.persist / "nodes.json"
            tmp = path.with_name(".nodes.json.tmp")
            tmp.write_text(json.dumps(self.nodes, indent=2) + "\n")
            tmp.replace(path)  # the ServerApp reads it after every round
        return done

    def watch_keys(self, stop: threading.Event) -> None:
        """Until ``stop``: look at the key directory every KEY_SYNC_S (sync_nodes)."""
        while not stop.wait(KEY_SYNC_S):
            for line in self.sync_nodes():
                self.log(f"SuperNode keys: {line}")

    def wait_for_clients(self, nodes: Mapping[str, str]) -> None:
        need = self.settings.min_clients
        ids = set(nodes.values())
        deadline = time.monotonic() + self.args.wait_clients_timeout
        seen = -1
        while True:
            self.check_superlink()
            count = online_count(self.list_nodes(), ids)
            if count != seen:
                self.log(f"{count}/{need} clients online")
                seen = count
            if count >= need:
                return
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"only {count} of {need} clients online after "
                    f"{self.args.wait_clients_timeout:.0f}s"
                )
            time.sleep(CLIENTS_POLL_S)

    # --- the run -----------------------------------------------------------------------
    def stop_stale_runs(self) -> None:
        """Stop the runs a previous server left unfinished in this database: none in one
        this start created, until a run of its own."""
        if self.fresh_database and self.run_id is None:
            return
        for run in self.list_runs():
            if not str(run.get("status", "")).startswith("finished"):
                self.log(f"stopping stale run {run['run-id']} ({run.get('status')})")
                try:
                    self.flwr("stop", str(run["run-id"]), fe.CONNECTION)
                except fe.FlwrCliError as exc:
                    self.log(f"could not stop run {run['run-id']}: {one_line(str(exc))}")

    def submit(self) -> str:
        config_path = self.state / "run-config.toml"
        config_path.write_text(tomli_w.dumps(self.settings.run_config))
        out = self.flwr(
            "run",
            str(self.settings.app.path),
            fe.CONNECTION,
            "--run-config",
            str(config_path),
        )
        self.run_id = str(out["run-id"])
        rounds = self.settings.platform.rounds
        self.log(
            f"submitted run {self.run_id}: app {self.settings.app.name} "
            f"{self.settings.app.version} from {self.settings.app.path}"
            + (f", {rounds} rounds" if rounds else "")
        )
        return self.run_id

    def list_runs(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """What `flwr ls` would list, from one Control API request (no CLI process)."""
        return fe.list_runs(self.address, self.ca_file, int(run_id) if run_id else None)

    def start_run(self) -> str:
        """Submit the run while waiting for ``--min-clients`` clients online; its run id.

        `flwr run` (a CLI process, ~2.5 s of imports) and the ServerApp's start overlap the
        clusters' connecting instead of following it: the strategy waits for its minimum of
        nodes itself before round 1. When too few clients come in time the submitted run is
        stopped and the wait's error raised, as before."""
        with ThreadPoolExecutor(1, thread_name_prefix="submit") as pool:
            submitted = pool.submit(self.submit)
            try:
                self.wait_for_clients(dict(self.nodes))
            except BaseException:
                with contextlib.suppress(Exception):
                    self.flwr("stop", submitted.result(), fe.CONNECTION)
                raise
            return submitted.result()

    def run_status(self, run_id: str) -> dict[str, Any]:
        runs = self.list_runs(run_id)
        if not runs:
            raise LaunchError(f"run {run_id} is unknown to the SuperLink")
        status: dict[str, Any] = runs[0]
        return status

    def follow(self, run_id: str) -> tuple[dict[str, Any], RunLog]:
        """Stream the run's log to stdout until it finishes; return its final status and
        what the log said.

        The log comes from the Control API's StreamLogs in a thread of this process (no
        `flwr log` process: its imports cost ~2.5 s of CPU just as the ServerApp starts,
        and its piped output came only at its exit). The SuperLink ends the stream when
        the run finishes, so the status is asked when the stream ends, and otherwise only
        every STATUS_FALLBACK_S as a safety net."""
        timeout = self.args.run_timeout
        deadline = time.monotonic() + timeout if timeout > 0 else None
        run_log = RunLog(min_results=self.settings.min_clients)
        stream: fe.LogStream | None = None
        opened = checked = time.monotonic()
        try:
            while True:
                self.check_superlink()
                if stream is None or stream.done.is_set():
                    if stream is not None and stream.error:
                        self.log(f"run log stream broke ({one_line(stream.error)}); reopening")
                    # A broken stream is not reopened more than once a second.
                    time.sleep(max(0.0, opened + 1.0 - time.monotonic()))
                    # A fresh stream replays the log from the start: count it once.
                    run_log = RunLog(min_results=self.settings.min_clients)
                    opened = time.monotonic()
                    stream = fe.LogStream(
                        self.address,
                        self.ca_file,
                        run_id,
                        functools.partial(_tee, run_log),
                    )
                ended = stream.done.wait(timeout=self.args.status_interval)
                if ended or time.monotonic() - checked >= STATUS_FALLBACK_S:
                    checked = time.monotonic()
                    status = self.run_status(run_id)
                    if str(status.get("status", "")).startswith("finished"):
                        return status, run_log
                if deadline is not None and time.monotonic() > deadline:
                    self.flwr("stop", run_id, fe.CONNECTION)
                    raise LaunchError(f"run {run_id} exceeded --run-timeout {timeout:.0f}s")
        finally:
            if stream is not None:
                stream.close()

    def outcome(self, status: Mapping[str, Any], run_log: RunLog) -> Outcome:
        """The run's outcome from its status, its log and the model store's manifest."""
        platform = self.settings.platform
        store = ModelStore(platform.storage, platform.resource_uid)
        try:
            manifest = store.manifest()
        except ModelStoreError as exc:
            self.log(f"cannot read the model store's manifest: {exc}")
            manifest = None
        final = (manifest or {}).get("final")
        url = store.url(final) if isinstance(final, dict) and final.get("path") else None
        return decide(
            status,
            manifest,
            run_log,
            rounds=platform.rounds,
            uid=platform.resource_uid,
            model_url=url,
        )


def _tee(run_log: RunLog, line: str) -> None:
    """Echo one line of the run's log to stdout and feed it to ``run_log``."""
    sys.stdout.write(line)
    sys.stdout.flush()
    run_log.feed(line)


# A run that failed only because nodes were briefly unreachable (e.g. right after this server
# restarted, before every SuperNode heartbeated again) is resubmitted; the model store makes the
# new run resume from the last checkpoint. Client errors and too few clients are not retried.
TRANSIENT_MARKER = "Node Unavailable"
MAX_RUN_ATTEMPTS = 3
RETRY_PAUSE_S = 15.0


def transient_failure(reason: str) -> bool:
    """True when a failed run's reason names only node unavailability, nothing else."""
    return TRANSIENT_MARKER in reason and "Error: " not in reason.replace(
        f"Error: {TRANSIENT_MARKER}", ""
    )


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ocm-fl-server``."""
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(args)
    except (AppError, ValueError) as exc:
        result = Outcome(False, one_line(f"invalid app or settings: {exc}"))
        return finish(args, result)
    signal.signal(signal.SIGTERM, _raise_exit)
    launcher: Launcher | None = None
    keys_stop = threading.Event()
    finished = False  # the run's outcome is known: nothing the SuperLink holds is needed
    try:
        launcher = Launcher(args, settings)
        if args.run_id:
            launcher.log(f"training {args.run_id}")
        if args.fleet_port is not None:
            launcher.log(
                f"clusters reach the Fleet API through the proxy on port {args.fleet_port}"
            )
        launcher.check_store()
        launcher.start_superlink()
        # Keys first: clusters start their SuperNodes once the gateway answers, and one that
        # came before its key is registered is refused and restarted after a backoff.
        launcher.register_nodes()
        launcher.start_gateway()
        threading.Thread(
            target=launcher.watch_keys, args=(keys_stop,), daemon=True, name="keys"
        ).start()
        attempt = 1
        while True:
            launcher.stop_stale_runs()
            run_id = launcher.start_run()
            result = launcher.outcome(*launcher.follow(run_id))
            if result.ok or not transient_failure(result.reason) or attempt >= MAX_RUN_ATTEMPTS:
                break
            attempt += 1
            launcher.log(
                f"nodes were unavailable ({result.reason[:160]}); resuming from the last "
                f"checkpoint in {RETRY_PAUSE_S:.0f}s (attempt {attempt}/{MAX_RUN_ATTEMPTS})"
            )
            time.sleep(RETRY_PAUSE_S)
        finished = True
    except (LaunchError, fe.FlwrCliError, OSError, ValueError) as exc:
        result = Outcome(False, one_line(str(exc)))
    except SystemExit as exc:
        result = Outcome(False, f"terminated (exit {exc.code})")
    finally:
        keys_stop.set()
        if launcher is not None:
            launcher.stop_superlink(finished)
    return finish(args, result)


def finish(args: argparse.Namespace, result: Outcome) -> int:
    """Write the outcome (result file, termination message, last stdout line); exit code."""
    message = result.termination_message()
    if args.result_file is not None:
        args.result_file.parent.mkdir(parents=True, exist_ok=True)
        args.result_file.write_text(
            json.dumps({**message, "details": dict(result.details)}, indent=2, default=str) + "\n"
        )
    if args.termination_log.is_file():
        with contextlib.suppress(OSError):
            args.termination_log.write_text(json.dumps(message))
    print(f"{PREFIX}: {'completed' if result.ok else 'failed'}: {result.reason}", flush=True)
    return 0 if result.ok else SERVER_FAILED_EXIT


if __name__ == "__main__":
    sys.exit(main())
