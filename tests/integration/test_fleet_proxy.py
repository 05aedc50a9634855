"""The Fleet API gateway and tunnel, as real nginx processes with certificates from ocmfl.pki.

The upstream here is a small HTTPS echo server standing in for the SuperLink, so each rule of
the gateway can be checked on its own; the federation and e2e tests run the real SuperLink
behind the same configuration.
"""

from __future__ import annotations

import http.server
import re
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from hack.controlplane import podplan
from hack.testing import free_port, wait_for
from ocmfl import pki
from workloads.fleet_proxy import (
    TLSFiles,
    fleet_gateway_conf,
    fleet_tunnel_conf,
    nginx_command,
)
from workloads.fleet_tls import start_gateway, start_tunnel


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@dataclass
class Pki:
    ca: pki.CertAndKey
    ca_file: str
    dir: Path

    def client(self, name: str, cluster: str, ca: pki.CertAndKey | None = None) -> tuple[str, str]:
        pair = pki.issue_fleet_client_cert(ca or self.ca, "fl-uid", cluster)
        return (
            _write(self.dir / f"{name}.crt", pair.cert_pem),
            _write(self.dir / f"{name}.key", pair.key_pem),
        )

    def server(self, name: str) -> TLSFiles:
        pair = pki.issue_server_cert(self.ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
        return TLSFiles(
            cert=_write(self.dir / f"{name}.crt", pair.cert_pem),
            key=_write(self.dir / f"{name}.key", pair.key_pem),
            ca=self.ca_file,
        )


@pytest.fixture
def certs(tmp_path: Path) -> Pki:
    ca = pki.create_ca("test-fl-ca")
    return Pki(ca=ca, ca_file=_write(tmp_path / "ca.crt", ca.cert_pem), dir=tmp_path)


HOLD_ME = b"hold-me"  # a body the echo answers with b"": an empty PullMessagesResponse


class _Echo(http.server.BaseHTTPRequestHandler):
    client_dns: list[str] = []  # the gateway's X-Ocm-Fl-Client-Dn of each HOLD_ME request

    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        payload = f"upstream {self.command} {self.path} {len(body)}".encode()
        if body == HOLD_ME:
            _Echo.client_dns.append(self.headers.get("X-Ocm-Fl-Client-Dn", ""))
            payload = b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = _reply
    do_POST = _reply

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream(certs: Pki) -> Iterator[str]:
    """An HTTPS server on 127.0.0.1 with a certificate from the test CA (like the SuperLink)."""
    tls = certs.server("upstream")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls.cert, tls.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _start_nginx(conf: str, workdir: Path, port: int) -> subprocess.Popen[bytes]:
    run_dir = workdir / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    conf_path = workdir / "nginx.conf"
    conf_path.write_text(conf)
    test = subprocess.run(
        [*nginx_command(str(conf_path))[:3], "-t"], capture_output=True, text=True, check=False
    )
    assert test.returncode == 0, test.stderr
    proc = subprocess.Popen(nginx_command(str(conf_path)), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        assert proc.poll() is None, "nginx exited at start"
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("nginx did not listen in time")


@pytest.fixture
def gateway(certs: Pki, upstream: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    conf = fleet_gateway_conf(
        listen=f"127.0.0.1:{port}",
        server_tls=certs.server("gateway"),
        superlink_address=upstream,
        superlink_ca=certs.ca_file,
        run_dir=str(tmp_path / "gw" / "run"),
    )
    proc = _start_nginx(conf, tmp_path / "gw", port)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


def _get(gateway: str, path: str, certs: Pki, cert: tuple[str, str] | None) -> httpx.Response:
    ctx = ssl.create_default_context(cafile=certs.ca_file)
    if cert:
        ctx.load_cert_chain(*cert)
    with httpx.Client(verify=ctx, timeout=5) as client:
        return client.post(f"https://{gateway}{path}", content=b"x" * 10)


def test_gateway_forwards_fleet_api_for_a_cluster_certificate(certs: Pki, gateway: str) -> None:
    r = _get(gateway, "/v1/fleet/pull-messages", certs, certs.client("c1", "cluster1"))
    assert r.status_code == 200
    assert r.text == "upstream POST /v1/fleet/pull-messages 10"


def test_gateway_refuses_control_and_runtime_apis_even_with_a_valid_certificate(
    certs: Pki, gateway: str
) -> None:
    cert = certs.client("c1", "cluster1")
    for path in ("/v1/control/start-run", "/v1/runtime/pull-messages", "/health", "/"):
        r = _get(gateway, path, certs, cert)
        assert r.status_code == 403, path
        assert not r.text.startswith("upstream")


def test_gateway_refuses_clients_without_a_certificate(certs: Pki, gateway: str) -> None:
    # nginx answers 400 "No required SSL certificate was sent" and never forwards.
    r = _get(gateway, "/v1/fleet/pull-messages", certs, None)
    assert r.status_code == 400
    assert not r.text.startswith("upstream")


def test_gateway_refuses_a_certificate_from_another_ca(certs: Pki, gateway: str) -> None:
    other = pki.create_ca("someone-else")
    r = _get(gateway, "/v1/fleet/pull-messages", certs, certs.client("x", "cluster1", ca=other))
    assert r.status_code == 400
    assert not r.text.startswith("upstream")


def test_gateway_refuses_a_project_certificate_that_names_no_cluster(
    certs: Pki, gateway: str
) -> None:
    # A server certificate of the same CA (CN=localhost) is not a cluster identity.
    tls = certs.server("not-a-cluster")
    ctx = ssl.create_default_context(cafile=certs.ca_file)
    ctx.load_cert_chain(tls.cert, tls.key)
    with httpx.Client(verify=ctx, timeout=5) as client:
        r = client.post(f"https://{gateway}/v1/fleet/pull-messages", content=b"x")
    # The server certificate has no clientAuth usage: refused at the handshake (400) or by
    # the subject rule (403); either way it never reaches the SuperLink.
    assert r.status_code in (400, 403)
    assert not r.text.startswith("upstream")


def test_gateway_refuses_an_agent_certificate_of_the_same_ca(certs: Pki, gateway: str) -> None:
    # An agent identity (CN=cluster:<c>) is not a Fleet identity, even from the right CA.
    pair = pki.issue_client_cert("cluster1", certs.ca)
    cert = _write(certs.dir / "agent.crt", pair.cert_pem)
    key = _write(certs.dir / "agent.key", pair.key_pem)
    r = _get(gateway, "/v1/fleet/pull-messages", certs, (cert, key))
    assert r.status_code == 403
    assert not r.text.startswith("upstream")


def test_tunnel_carries_plain_fleet_calls_over_mtls_with_the_cluster_identity(
    certs: Pki, gateway: str, tmp_path: Path
) -> None:
    cert, key = certs.client("c2", "cluster2")
    port = free_port()
    conf = fleet_tunnel_conf(
        listen=f"127.0.0.1:{port}",
        gateway_address=gateway,
        gateway_server_name="localhost",
        client_tls=TLSFiles(cert=cert, key=key, ca=certs.ca_file),
        run_dir=str(tmp_path / "tun" / "run"),
    )
    proc = _start_nginx(conf, tmp_path / "tun", port)
    try:
        with httpx.Client(timeout=5) as client:
            fleet = client.post(f"http://127.0.0.1:{port}/v1/fleet/push-messages", content=b"abc")
            control = client.post(f"http://127.0.0.1:{port}/v1/control/list-runs", content=b"")
        assert fleet.status_code == 200
        assert fleet.text == "upstream POST /v1/fleet/push-messages 3"
        assert control.status_code == 403
    finally:
        proc.terminate()
        proc.wait(10)


def test_tunnel_fails_closed_when_the_gateway_certificate_is_not_trusted(
    certs: Pki, gateway: str, tmp_path: Path
) -> None:
    other = pki.create_ca("impostor-trust")
    other_ca = _write(tmp_path / "other-ca.crt", other.cert_pem)
    cert, key = certs.client("c3", "cluster3")
    port = free_port()
    conf = fleet_tunnel_conf(
        listen=f"127.0.0.1:{port}",
        gateway_address=gateway,
        gateway_server_name="localhost",
        client_tls=TLSFiles(cert=cert, key=key, ca=other_ca),
        run_dir=str(tmp_path / "tun2" / "run"),
    )
    proc = _start_nginx(conf, tmp_path / "tun2", port)
    try:
        with httpx.Client(timeout=5) as client:
            r = client.post(f"http://127.0.0.1:{port}/v1/fleet/push-messages", content=b"abc")
        assert r.status_code == 502
    finally:
        proc.terminate()
        proc.wait(10)


def _mount(directory: Path, files: dict[str, bytes]) -> None:
    """A Secret volume as the kubelet writes and updates it (files behind `..data`)."""
    podplan.atomic_write(directory, {k: (v, 0o400) for k, v in files.items()})


def _served_serial(address: str) -> int:
    host, _, port = address.rpartition(":")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((host, int(port)), 5) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def test_gateway_and_tunnel_reload_each_new_pair_from_their_mounted_secret(
    certs: Pki, upstream: str, tmp_path: Path
) -> None:
    """Drill 5's mechanism on its own: both nginx read their pairs through the kubelet's
    `..data` link and reload on a new consistent pair; the tunnel then presents the new
    Fleet certificate (the gateway's access log carries its serial)."""
    ca = certs.ca.cert_pem

    def gateway_pair() -> pki.CertAndKey:
        return pki.issue_server_cert(certs.ca, dns_names=["localhost"])

    def client_pair() -> pki.CertAndKey:
        return pki.issue_fleet_client_cert(certs.ca, "fl-uid", "cluster1")

    gw_dir, tun_dir = tmp_path / "gw-tls", tmp_path / "tun-tls"
    gw, client = gateway_pair(), client_pair()
    _mount(gw_dir, {"gateway.crt": gw.cert_pem, "gateway.key": gw.key_pem, "ca.crt": ca})
    _mount(tun_dir, {"tls.crt": client.cert_pem, "tls.key": client.key_pem, "ca.crt": ca})
    gateway = start_gateway(
        listen=f"127.0.0.1:{free_port()}",
        certfile=gw_dir / "gateway.crt",
        keyfile=gw_dir / "gateway.key",
        client_ca_file=gw_dir / "ca.crt",
        superlink_address=upstream,
        superlink_ca_file=gw_dir / "ca.crt",
        run_dir=tmp_path / "gw-run",
    )
    tunnel = start_tunnel(
        gateway_address=gateway.listen,
        certfile=tun_dir / "tls.crt",
        keyfile=tun_dir / "tls.key",
        ca_file=tun_dir / "ca.crt",
        run_dir=tmp_path / "tun-run",
        server_name="localhost",
    )
    try:
        assert tunnel.local_ca is not None
        ctx = ssl.create_default_context(cafile=str(tunnel.local_ca))

        def presented() -> set[int]:
            with httpx.Client(verify=ctx, timeout=5) as http:
                r = http.post(f"https://{tunnel.listen}/v1/fleet/pull-messages", content=b"x")
            assert r.status_code == 200, r.text
            return {int(s, 16) for s in re.findall(r'fleet:cluster1[^"]*" ([0-9A-F]+) ',
                                                   gateway.log.read_text())}  # fmt: skip

        assert _served_serial(gateway.listen) == gw.cert.serial_number
        # nginx writes the access log line after the response has gone out: wait for it.
        wait_for(lambda: presented() == {client.cert.serial_number}, 20,
                 "the tunnel presenting its certificate in the gateway's log")  # fmt: skip
        for _ in range(2):
            gw, client = gateway_pair(), client_pair()
            _mount(gw_dir, {"gateway.crt": gw.cert_pem, "gateway.key": gw.key_pem, "ca.crt": ca})
            _mount(tun_dir, {"tls.crt": client.cert_pem, "tls.key": client.key_pem, "ca.crt": ca})
            want_gw, want_client = gw.cert.serial_number, client.cert.serial_number

            def gateway_serves(w: int = want_gw) -> bool:
                return _served_serial(gateway.listen) == w

            def tunnel_presents(w: int = want_client) -> bool:
                return w in presented()

            wait_for(gateway_serves, 20, "the gateway serving its new certificate")
            wait_for(tunnel_presents, 20, "the tunnel presenting its new certificate")
        assert (gateway.reloads, tunnel.reloads) == (2, 2)
    finally:
        tunnel.stop()
        gateway.stop()


def test_tunnel_holds_only_the_pull_and_carries_it_over_the_same_mtls(
    certs: Pki, gateway: str, tmp_path: Path
) -> None:
    """With the long poll the SuperNode's pull goes through the poller and back out over the
    tunnel's mTLS (the gateway's access log shows the cluster identity for each re-send);
    every other route passes straight through, and the internal listener carries only the
    pull."""
    cert, key = certs.client("c4", "cluster4")
    tunnel = start_tunnel(
        gateway_address=gateway,
        certfile=Path(cert),
        keyfile=Path(key),
        ca_file=Path(certs.ca_file),
        run_dir=tmp_path / "tun-lp",
        server_name="localhost",
        long_poll_hold_s=1.0,
    )
    try:
        assert tunnel.local_ca is not None and tunnel.long_poll is not None
        poller = tunnel.long_poll.poller
        ctx = ssl.create_default_context(cafile=str(tunnel.local_ca))
        with httpx.Client(verify=ctx, timeout=10) as client:
            push = client.post(f"https://{tunnel.listen}/v1/fleet/push-messages", content=b"abc")
            assert (push.status_code, push.text) == (200, "upstream POST /v1/fleet/push-messages 3")
            assert poller.sends == 0
            pull = client.post(f"https://{tunnel.listen}/v1/fleet/pull-messages", content=b"ab")
            # not protobuf: for Flower an answer it should see at once
            assert (pull.status_code, pull.text) == (200, "upstream POST /v1/fleet/pull-messages 2")
            assert poller.sends == 1
            _Echo.client_dns.clear()
            empty = client.post(f"https://{tunnel.listen}/v1/fleet/pull-messages", content=HOLD_ME)
            control = client.post(f"https://{tunnel.listen}/v1/control/list-runs", content=b"")
        # an empty answer: re-sent until the 1 s hold ended, each time with the cluster identity
        assert (empty.status_code, empty.content) == (200, b"")
        assert poller.sends >= 4
        assert len(_Echo.client_dns) == poller.sends - 1
        assert all("CN=fleet:cluster4" in dn for dn in _Echo.client_dns), _Echo.client_dns
        assert control.status_code == 403
        with httpx.Client(timeout=5) as plain:
            internal = poller.upstream
            other = plain.post(f"http://{internal}/v1/fleet/push-messages", content=b"")
        assert other.status_code == 403
    finally:
        tunnel.stop()
