"""The agent process: local API + client watcher -> buffer -> hub stream."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from agent_addon.buffer import ReportBuffer
from agent_addon.hub_client import ClientTLSFiles, HubStreamer
from agent_addon.local_api import make_app
from agent_addon.phase import RunKey
from agent_addon.state import AgentState
from agent_addon.tokens import TokenCheck
from agent_addon.watcher import ClientWatcher, PhaseView
from ocmfl import constants, pki, tasks

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"
# Longest pause between two attempts to get the agent certificate after failures.
RENEW_BACKOFF_MAX_S = 120.0


@dataclass(frozen=True)
class AgentConfig:
    cluster: str
    hub_address: str
    cert_dir: Path
    ca_file: Path | None = None
    kubeconfig: str | None = None
    watch: bool = True
    watch_namespace: str | None = None
    listen_host: str = "0.0.0.0"
    port: int = constants.AGENT_LOCAL_PORT
    health_port: int | None = constants.AGENT_HEALTH_PORT
    buffer_size: int = 1000
    server_name: str | None = None
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    cert_check_interval_s: float = 2.0
    # The agent's one hub kubeconfig (OCM KubeClient registration: {{HUB_KUBECONFIG}}, i.e.
    # /managed/hub-kubeconfig/kubeconfig). With it the agent makes its key in cert_dir and
    # gets (and renews) its certificate from the hub's agent signer, and asks the Fleet
    # signer for its clients' certificates. Without it (tests only) the agent uses whatever
    # certificate cert_dir holds, and client pods get no Fleet identity.
    hub_kubeconfig: str | None = None
    csr_check_interval_s: float = 300.0
    # Unsent reports are saved here (and reloaded on start); None keeps them in memory only.
    state_dir: Path | None = None
    save_interval_s: float = 1.0
    # Whether a client's log tail (its launcher's POST /v1/client-log) goes to the hub; the
    # cluster's admin switches it off with the addon variable CLIENT_LOGS=off.
    client_logs: bool = True


def _env(*names: str, default: str | None = None) -> str | None:
    for n in names:
        v = os.environ.get(n)
        if v:
            return v
    return default


def _default_ca_file(cert_dir: Path) -> Path:
    """<cert-dir>/ca.crt when present; else the hub CA the AddOnTemplate mounts (the agent
    signer's answer carries no CA)."""
    own = cert_dir / "ca.crt"
    return own if own.exists() else Path(constants.AGENT_HUB_CA_DIR) / "ca.crt"


def _state_dir(flag: str | None) -> Path | None:
    if flag:
        return Path(flag)
    default = Path(constants.AGENT_STATE_DIR)
    return default if default.is_dir() else None


def parse_args(argv: list[str] | None = None) -> AgentConfig:
    """AgentConfig from flags, falling back to OCMFL_* env vars (and OCM's CLUSTER_NAME)."""
    p = argparse.ArgumentParser(prog="ocm-fl-agent", description=__doc__)
    p.add_argument("--cluster", default=_env(constants.ENV_CLUSTER_NAME, "CLUSTER_NAME"))
    p.add_argument(
        "--hub-address",
        default=_env(constants.ENV_HUB_AGGREGATOR_ADDRESS),
        help="host:port of the hub aggregator",
    )
    p.add_argument(
        "--cert-dir",
        default=_env(constants.ENV_AGENT_CERT_DIR, default=constants.AGENT_CERT_DIR),
        help="writable directory where the agent keeps its key (made here) and the "
        "certificate the hub's signer issues (tls.key, tls.crt)",
    )
    p.add_argument(
        "--ca-file",
        default=_env(constants.ENV_HUB_CA_FILE),
        help="hub CA PEM (default: <cert-dir>/ca.crt)",
    )
    p.add_argument(
        "--kubeconfig",
        default=_env("KUBECONFIG"),
        help="kubeconfig of this cluster (default: in-cluster)",
    )
    p.add_argument("--no-watch", action="store_true", help="do not watch client pods/jobs")
    p.add_argument("--watch-namespace", default=None)
    p.add_argument("--listen-host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=constants.AGENT_LOCAL_PORT)
    p.add_argument("--health-port", type=int, default=constants.AGENT_HEALTH_PORT)
    p.add_argument("--buffer-size", type=int, default=1000)
    p.add_argument("--server-name", default=None, help="TLS name expected on the hub cert")
    p.add_argument(
        "--hub-kubeconfig",
        default=_env(constants.ENV_HUB_KUBECONFIG),
        help="the agent's hub kubeconfig (OCM KubeClient registration): its certificate "
        "and its clients' Fleet certificates are asked from the hub's signers with it",
    )
    p.add_argument(
        "--state-dir",
        default=_env(constants.ENV_AGENT_STATE_DIR),
        help=f"keep unsent reports here (default {constants.AGENT_STATE_DIR} when it exists)",
    )
    p.add_argument(
        "--client-logs",
        default=_env(constants.ENV_CLIENT_LOGS, default="on"),
        help="on (default) or off: whether a failed client's last log lines go to the hub",
    )
    p.add_argument("--log-level", default=_env(constants.ENV_LOG_LEVEL, default="INFO"))
    a = p.parse_args(argv)
    logging.basicConfig(
        level=str(a.log_level).upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not a.cluster or not a.hub_address:
        p.error("--cluster and --hub-address (or their env vars) are required")
    return AgentConfig(
        cluster=a.cluster,
        hub_address=a.hub_address,
        cert_dir=Path(a.cert_dir),
        ca_file=Path(a.ca_file) if a.ca_file else _default_ca_file(Path(a.cert_dir)),
        kubeconfig=a.kubeconfig,
        watch=not a.no_watch,
        watch_namespace=a.watch_namespace,
        listen_host=a.listen_host,
        port=a.port,
        health_port=a.health_port or None,
        buffer_size=a.buffer_size,
        server_name=a.server_name,
        hub_kubeconfig=a.hub_kubeconfig,
        state_dir=_state_dir(a.state_dir),
        client_logs=client_logs_on(a.client_logs),
    )


def client_logs_on(value: str) -> bool:
    """The CLIENT_LOGS switch: only "off" (or false, no, 0) turns client logs off; an
    unset template variable (OCM leaves "{{CLIENT_LOGS}}" as is) keeps the default, on."""
    return value.strip().lower() not in ("off", "false", "no", "0")


class Agent:
    """Wires the pieces; `start()` returns once the local API listens."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.buffer = ReportBuffer(config.buffer_size)
        self.state = AgentState(config.cluster, self.buffer, agent_version=AGENT_VERSION)
        self.streamer = HubStreamer(
            config.hub_address,
            ClientTLSFiles.from_dir(config.cert_dir, config.ca_file),
            self.buffer,
            backoff_initial_s=config.backoff_initial_s,
            backoff_max_s=config.backoff_max_s,
            cert_check_interval_s=config.cert_check_interval_s,
            server_name=config.server_name,
        )
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._watcher: ClientWatcher | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._saver: asyncio.Task[None] | None = None
        self._fleet: asyncio.Task[None] | None = None

    @property
    def pending_file(self) -> Path | None:
        d = self.config.state_dir
        return d / "pending-reports.bin" if d else None

    def save(self) -> None:
        """Persist unsent reports now (no-op without a state dir)."""
        if self.pending_file is not None:
            try:
                self.buffer.save(self.pending_file)
            except OSError as e:
                log.warning("cannot save pending reports: %s", e)

    async def _save_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.save_interval_s)
            if self.buffer.dirty:
                self.save()

    def certificate_not_after(self) -> str | None:
        """When the agent's own certificate (from the hub's signer) expires, ISO 8601; None
        while it has none it can read."""
        try:
            cert = pki.load_cert_pem((self.config.cert_dir / pki.CERT_FILE).read_bytes())
        except (OSError, ValueError):
            return None
        return cert.not_valid_after_utc.isoformat()

    def health(self) -> dict[str, Any]:
        return {
            "cluster": self.config.cluster,
            # hubConnected: a report was acknowledged on the current stream (an idle agent
            # sends none); certificateNotAfter: it holds an identity from the hub's signer.
            "hubConnected": self.streamer.connected.is_set(),
            "certificateNotAfter": self.certificate_not_after(),
            "pending": len(self.buffer),
            "dropped": self.buffer.dropped,
            "delivered": self.buffer.acked,
            "lastError": self.streamer.last_error,
            "clientLogs": self.config.client_logs,
        }

    def client_at(self, address: str) -> tuple[RunKey, str] | None:
        """The run of the client pod at `address` (attribution of local metrics posts)."""
        return None if self._watcher is None else self._watcher.run_at(address)

    def _token_check(self) -> TokenCheck | None:
        """Posts need their federation's token whenever the agent reads its cluster's API
        (always, as deployed); without it (--no-watch, tests) nothing can be checked."""
        if not self.config.watch:
            log.warning("--no-watch: the local metrics API does not check federation tokens")
            return None
        from ocmfl.kube import Kube, path_of

        kube = Kube(self.config.kubeconfig, field_manager="ocm-fl-agent")
        return TokenCheck(lambda ns, name: kube.get(path_of("v1", "Secret", ns, name)))

    def on_phases(self, view: PhaseView) -> None:
        reports = self.state.on_phases(view)
        if any(r.final for r in reports):
            self.save()  # a final report must survive an agent restart

    async def start(self) -> None:
        if self.pending_file is not None:
            loaded = self.buffer.load(self.pending_file)
            if loaded:
                log.info("re-queued %d unsent reports from %s", loaded, self.pending_file)
            self._saver = asyncio.create_task(self._save_loop(), name="save-reports")
        tokens = self._token_check()
        self._runner = web.AppRunner(
            make_app(
                self.state,
                self.health,
                self.client_at,
                tokens,
                persist=self.save,
                client_logs=self.config.client_logs,
            )
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.listen_host, self.config.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if self.config.health_port:
            await web.TCPSite(
                self._runner, self.config.listen_host, self.config.health_port
            ).start()
        if self.config.watch:
            from ocmfl.kube import Kube

            self._watcher = ClientWatcher(
                Kube(self.config.kubeconfig, field_manager="ocm-fl-agent"),
                asyncio.get_running_loop(),
                self.on_phases,
                namespace=self.config.watch_namespace,
            )
            self._watcher.start()
        if self.config.hub_kubeconfig:
            self._renewer = asyncio.create_task(self._renew_loop(), name="csr-renewal")
            if self.config.watch:
                self._fleet = asyncio.create_task(self._fleet_loop(), name="fleet-identities")
        else:
            log.warning(
                "no hub kubeconfig (--hub-kubeconfig, %s): using the certificate in %s as it "
                "is; client pods get no Fleet identity",
                constants.ENV_HUB_KUBECONFIG,
                self.config.cert_dir,
            )
        self.streamer.start()
        log.info(
            "agent for cluster %s: local API on port %d, hub %s",
            self.config.cluster,
            self.port,
            self.config.hub_address,
        )

    def _hub(self) -> Any:
        """A client of the hub with the agent's hub kubeconfig (ocmfl.kube.Kube)."""
        from ocmfl.kube import Kube

        return Kube(self.config.hub_kubeconfig, field_manager="ocm-fl-agent")

    async def _renew_loop(self) -> None:
        """Get the client certificate and keep it fresh (the streamer picks up new files).
        A failed request (a denial, the hub unreachable) is retried with backoff, so an agent
        the hub refuses does not flood it with CSRs."""
        from agent_addon.csr import PendingCSR, RenewalError, next_check_s, renew_if_due

        hub = None
        pending: dict[str, PendingCSR] = {}  # a CSR not signed in time is waited for again
        failures = 0
        while True:
            try:
                hub = hub or self._hub()
                await renew_if_due(hub, self.config.cluster, self.config.cert_dir, pending=pending)
                failures = 0
            except (RenewalError, OSError, ValueError) as e:
                failures += 1
                log.warning("agent certificate: %s", e)
            except Exception:
                failures += 1
                log.exception("agent certificate request failed")
            # By the certificate's own dates, so a short-lived one is renewed in time.
            delay = next_check_s(self.config.cert_dir, self.config.csr_check_interval_s)
            if failures:
                delay = max(delay, min(RENEW_BACKOFF_MAX_S, 2.0 ** (failures - 1)))
            await asyncio.sleep(delay)

    async def _fleet_loop(self) -> None:
        """Each federation's client keys, made here; certificates from the hub's Fleet
        signer (agent_addon.fleet_identity)."""
        from agent_addon.fleet_identity import FleetIdentities
        from ocmfl.kube import Kube

        while True:
            try:
                hub, local = self._hub(), Kube(self.config.kubeconfig, field_manager="ocm-fl-agent")
                break
            except Exception:
                log.exception("Fleet identities: no client for the hub or this cluster yet")
                await asyncio.sleep(RENEW_BACKOFF_MAX_S / 4)
        await FleetIdentities(self.config.cluster, local, hub).run()

    async def stop(self, drain_s: float = 0.0) -> None:
        """Stop; first wait up to `drain_s` for pending reports to be delivered."""
        if drain_s > 0:
            await self.buffer.wait_empty(drain_s)
        if self._watcher is not None:
            self._watcher.stop()
        await tasks.cancel(self._renewer, self._saver, self._fleet)
        await self.streamer.stop()
        self.save()
        if self._runner is not None:
            await self._runner.cleanup()
