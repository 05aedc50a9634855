"""Drill 5: every certificate rotates several times during one run (docs/reliability.md).

The hub is restarted with `OCMFL_CERT_LIFETIME_SECONDS` (ocmfl.certlife), so the aggregator's
server certificate, the agents' certificates (from the hub's CSR signer), the Fleet client
certificates (Fleet signer) and the federation's gateway certificate all last LIFETIME_S.
The agents are restarted as freshly installed ones (no certificate yet), so theirs are short
from the start. Then one run trains while they rotate, its rounds held to a minimum
duration so that the run spans the rotations however fast rounds are.

What is observed is what each party actually uses, not the Secrets: the aggregator's and the
gateway's served certificates (TLS handshakes from the test), the agent certificate each
stream to the aggregator presents (the aggregator logs its serial), the Fleet client
certificate each tunnel presents to the gateway (the gateway's access log carries
`$ssl_client_serial`), and the pairs mounted in the pods (the local node refreshes Secret
volumes as the kubelet does, through `..data`). What must hold: each certificate of each kind
changed at least twice during the run, nginx reloaded on each new pair, the run Completed with
every round once in the history and every cluster's row at the last round, no report refused,
no request refused at the gateway (node activation conflicts, Flower's 412, are reported
apart), the agents' buffers drained.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import re
import signal
import socket
import ssl
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from examples.demo import demo_resource
from hack import controlplane as cp
from hack.localfed import FL_PATH, LocalFederation, create_fl, get_fl, prepare_data, wait_fl
from hack.testing import wait_for
from ocmfl import certlife, pki
from ocmfl.kube import Kube
from tests.drills.drills_support import drained, hub_metrics, restore

pytestmark = [pytest.mark.drill, pytest.mark.timeout(900)]

NS = "drill-certs"
NAME = "certs-rotate"
LIFETIME_S = 40
MIN_CHANGES = 2
# The run must last long enough for MIN_CHANGES rotations of each kind whatever the round
# speed: the digits app holds each round to at least ROUND_MIN_S (run config
# `round-min-seconds`), so the rounds alone last >= ROUNDS * ROUND_MIN_S. Each certificate
# is renewed with 20-30 % of its life left (agent 20 %: every ~32 s; the others 30 %: every
# ~28 s; plus the renewal's own latency), and never later than its expiry while the run's
# requests succeed, so MIN_CHANGES rotations take at most MIN_CHANGES * LIFETIME_S.
# (With 12 unpaced rounds a CI run lasted 88 s and an agent certificate changed once.)
ROUNDS = 20
ROUND_MIN_S = 5
assert ROUNDS * ROUND_MIN_S >= 1.25 * MIN_CHANGES * LIFETIME_S
POLL_S = 0.5

# The hub's log line (asctime first) for each agent stream the aggregator accepts.
AGENT_STREAM = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ .*stream from cluster (\S+), "
    r"certificate serial ([0-9a-f]+)",
    re.MULTILINE,
)
# log_format fleet: $remote_addr "$ssl_client_s_dn" $ssl_client_serial "$request" $status ...
GATEWAY_LINE = re.compile(r'"[^"]*CN=fleet:([^,"]+)[^"]*" ([0-9A-Fa-f]+) "[^"]*" (\d{3}) ')
RELOAD_LINE = "ocm-fl: new certificate"
# A gateway access line whose status is not 2xx (the request line says which Fleet call).
REFUSED_LINE = re.compile(r'" [0-9A-Fa-f-]+ "[^"]*" [^2]\d\d ')
# Flower answers 412 to a SuperNode that activates while its node is still online, or
# deactivates one already offline: a SuperNode reconnecting (its connection broke, e.g. when
# nginx reloaded), never a certificate refused (that fails the TLS handshake or answers
# 400/403/495/496/502).
NODE_CONFLICT_LINE = re.compile(r'"POST /v1/fleet/(?:de)?activate-node HTTP/1\.1" 412 ')
# The client launcher's "is the server up" probe (workloads.client_launcher.upstream_answers):
# a GET of the Fleet API's root that the SuperLink answers 404; not a refusal.
UPSTREAM_PROBE_LINE = re.compile(r'"GET /v1/fleet/ HTTP/1\.1" 404 ')


def served_serial(host: str, port: int) -> int | None:
    """The serial of the certificate a TLS server presents (None when it does not answer).
    The server wants a client certificate; it is sent only after the server's own, so the
    handshake shows it whatever happens next."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=2) as raw,
            ctx.wrap_socket(raw) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    except OSError:
        return None
    return x509.load_der_x509_certificate(der).serial_number if der else None


def file_serial(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(pki.load_cert_pem(path.read_bytes()).serial_number)
    return None


class Observer:
    """Polls served and mounted certificates in the background: kind -> serials in order."""

    def __init__(self, plane: cp.ControlPlane, fed: LocalFederation, hub: Kube) -> None:
        self.pods = Path(plane.state_dir) / "pods"
        self.fed, self.hub = fed, hub
        self.seen: dict[str, list[int]] = defaultdict(list)
        # kind -> monotonic time each serial was first seen (for the failure message)
        self.at: dict[str, list[float]] = defaultdict(list)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cert-observer")
        self.gateway: tuple[str, int] | None = None
        self._earlier: set[Path] = set()

    def __enter__(self) -> Observer:
        # Pods of earlier runs in this plane (the local node keeps their directories) are
        # not this run's.
        self._earlier = {p.relative_to(self.pods) for p in self.pods.glob("*/*")}
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _add(self, kind: str, serial: int | None) -> None:
        if serial is not None and (not self.seen[kind] or self.seen[kind][-1] != serial):
            self.seen[kind].append(serial)
            self.at[kind].append(time.monotonic())

    def _gateway_address(self) -> tuple[str, int] | None:
        services = self.hub.get(f"/api/v1/namespaces/{NS}/services") or {}
        for svc in services.get("items") or []:
            ingress = ((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
            if svc["spec"].get("type") == "LoadBalancer" and ingress:
                return ingress[0]["ip"], int(svc["spec"]["ports"][0]["port"])
        return None

    def _run(self) -> None:
        host, _, port = self.fed.aggregator_address.rpartition(":")
        while not self._stop.wait(POLL_S):
            self._add("aggregator served", served_serial(host, int(port)))
            if self.gateway is None:
                with contextlib.suppress(Exception):
                    self.gateway = self._gateway_address()
            if self.gateway is not None:
                self._add("gateway served", served_serial(*self.gateway))
            for crt in self.files(f"*/{NS}_*/volumes/tls/gateway.crt"):
                self._add("gateway mounted", file_serial(crt))
            for crt in self.files(f"*/fl-{NS}-*_*/volumes/tls/tls.crt"):
                self._add(f"fleet mounted {crt.parts[-5]}", file_serial(crt))

    def files(self, pattern: str) -> list[Path]:
        """This run's pods' files matching `pattern` (under pods/<node>/<pod>/)."""
        return sorted(
            p
            for p in self.pods.glob(pattern)
            if Path(*p.relative_to(self.pods).parts[:2]) not in self._earlier
        )


def test_drill_certificates_rotate_mid_run(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    clusters = plane.clusters[:2]
    body = demo_resource(rounds=ROUNDS, min_clients=2)
    body["spec"]["server"]["app"]["runConfig"]["round-min-seconds"] = ROUND_MIN_S
    body["metadata"]["name"] = NAME
    prepare_data(plane, tmp_path / "data", clusters, body["spec"]["client"]["dataClaim"])
    hub_log = fed.log_file("hub")
    try:
        # Short lifetimes from here: the hub's signer part (the aggregator certificate, both
        # CSR signers, the gateway and SuperLink certificates), its controller part, and
        # freshly installed agents (no certificate, so theirs come from the short signer).
        fed.hub_env[certlife.ENV_CERT_LIFETIME] = str(LIFETIME_S)
        fed.kill("hub", signal.SIGTERM)
        fed.kill("signer", signal.SIGTERM)
        log_from = hub_log.stat().st_size
        fed.start_hub()
        for c in clusters:
            fed.replace_agent(c)
        with Observer(plane, fed, hub) as seen:
            create_fl(hub, NS, body)
            started, run_from = time.monotonic(), dt.datetime.now().replace(microsecond=0)
            final = wait_fl(hub, NS, NAME, 600, fed=fed)
            took, run_to = time.monotonic() - started, dt.datetime.now()
        status: dict[str, Any] = final["status"]
        assert status["phase"] == "Completed", status.get("message")

        # Nothing lost: every round once, every cluster's row at the last round.
        history = status.get("history") or []
        rounds = sorted(h["round"] for h in history if h["cluster"] == "global")
        assert rounds == list(range(1, ROUNDS + 1)), history
        for c in clusters:
            mine = sorted(h["round"] for h in history if h["cluster"] == c)
            assert mine == list(range(1, ROUNDS + 1)), (c, history)
        rows = {r["name"]: r for r in status["clusters"]}
        assert all(rows[c].get("round") == ROUNDS for c in clusters), rows
        for c in clusters:
            wait_for(functools.partial(drained, fed, c), 120, f"{c}'s reports acknowledged")
        # Nothing refused: no report at the aggregator, no request at the gateway. A stream
        # the restarted hub answered "hub starting" (its clusters not listed yet) refused
        # nothing: the agent came back and its reports are acknowledged (checked above).
        metrics = hub_metrics(fed)
        rejected = {
            k: v
            for k, v in metrics.items()
            if k[0] == "ocmfl_reports_rejected_total"
            and v
            and dict(k[1]).get("reason") != "hub_starting"
        }
        assert not rejected, rejected

        # What each party actually used.
        observed = dict(seen.seen)
        # The certificate each agent uses at the run's start is the one of its last stream
        # opened before it (a stream lasts until the certificate changes or it breaks).
        agent_streams: dict[str, list[int]] = defaultdict(list)
        for m in AGENT_STREAM.finditer(hub_log.read_bytes()[log_from:].decode(errors="replace")):
            at = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")  # the hub's local time
            mine, serial = agent_streams[m.group(2)], int(m.group(3), 16)
            if at < run_from:
                mine[:] = [serial]
            elif at <= run_to and serial not in mine:
                mine.append(serial)
        for c in clusters:
            observed[f"agent presented {c}"] = agent_streams[c]
        [gateway_log] = seen.files(f"*/{NS}_*/volumes/state/gateway/nginx.log")
        gateway_text = gateway_log.read_text(errors="replace")
        fleet_presented: dict[str, list[int]] = defaultdict(list)
        statuses: dict[str, int] = defaultdict(int)
        for m in GATEWAY_LINE.finditer(gateway_text):
            serial = int(m.group(2), 16)
            statuses[m.group(3)] += 1
            if serial not in fleet_presented[m.group(1)]:
                fleet_presented[m.group(1)].append(serial)
        for c in clusters:
            observed[f"fleet presented {c}"] = fleet_presented[c]
        reloads = {"gateway": gateway_text.count(RELOAD_LINE)}
        for log in seen.files(f"*/fl-{NS}-*_*/volumes/state/tunnel/nginx.log"):
            reloads[f"tunnel {log.parts[-6]}"] = log.read_text(errors="replace").count(RELOAD_LINE)
        changes = {kind: len(serials) - 1 for kind, serials in observed.items()}
        # For a failure: when the observer saw each served/mounted certificate change.
        times = {k: ", ".join(f"+{t - started:.0f}s" for t in ts[1:]) for k, ts in seen.at.items()}
        print(
            f"\nDRILL 5: lifetime {LIFETIME_S}s, {ROUNDS} rounds (>= {ROUND_MIN_S}s each) "
            f"Completed {took:.1f}s after the resource was created; certificate changes seen "
            f"{changes}; nginx reloads {reloads}; gateway answers by status {dict(statuses)}; "
            f"0 reports refused\nchanges seen at (from the create): {times}"
        )
        expected = {
            "aggregator served",
            "gateway served",
            "gateway mounted",
            *(f"agent presented {c}" for c in clusters),
            *(f"fleet presented {c}" for c in clusters),
        }
        assert expected <= set(changes), (expected - set(changes), changes)
        assert sum(1 for k in changes if k.startswith("fleet mounted")) == len(clusters), changes
        short = {k: n for k, n in changes.items() if n < MIN_CHANGES}
        serials = {k: [f"{n:x}" for n in observed[k]] for k in short}
        assert not short, (
            f"certificates that changed fewer than {MIN_CHANGES} times in the {took:.0f}s run: "
            f"{short}; their serials in order: {serials}; changes seen at {times}"
        )
        assert all(n >= MIN_CHANGES for n in reloads.values()), reloads
        assert len(reloads) == 1 + len(clusters), reloads
        not_2xx = [line for line in gateway_text.splitlines() if REFUSED_LINE.search(line)]
        conflicts = [line for line in not_2xx if NODE_CONFLICT_LINE.search(line)]
        if conflicts:
            print("node (de)activation conflicts (not certificate refusals):", *conflicts, sep="\n")
        probes = [line for line in not_2xx if UPSTREAM_PROBE_LINE.search(line)]
        refused = [line for line in not_2xx if line not in conflicts and line not in probes]
        assert not refused, "the gateway refused requests:\n" + "\n".join(refused[:20])
    finally:
        fed.hub_env.pop(certlife.ENV_CERT_LIFETIME, None)
        restore(fed)
        with contextlib.suppress(Exception):
            hub.delete(f"{FL_PATH.format(ns=NS)}/{NAME}")
            wait_for(lambda: get_fl(hub, NS, NAME) is None, 180, f"{NAME} deleted")
        # The later drills run with the default lifetimes again.
        for part in ("hub", "signer"):
            if any(p.name == part for p in fed.procs):
                fed.kill(part, signal.SIGTERM)
        fed.start_hub()
