"""ocmfl.kube with a hub kubeconfig as OCM mounts it: relative client-certificate paths, files
renewed in place (a Secret volume's atomic symlink swap). Real TLS against a local HTTPS server
that requires client certificates; certificates made by ocmfl.pki."""

from __future__ import annotations

import datetime as dt
import json
import os
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from ocmfl import pki
from ocmfl.kube import Kube


class _Server(ThreadingHTTPServer):
    connections = 0


class _WhoAmI(BaseHTTPRequestHandler):
    """Answers every GET with the CN of the client certificate of its connection."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the apiserver

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        peer: Any = self.connection.getpeercert()
        cn = dict(x[0] for x in peer["subject"])["commonName"]
        body = json.dumps({"cn": cn}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[_Server, pki.CertAndKey]]:
    """An HTTPS server on 127.0.0.1 that requires a client certificate of its CA."""
    ca = pki.create_ca("hub-kube-ca", key_kind="ec")
    server_dir = pki.save_tls_dir(tmp_path / "server", pki.issue_server_cert(ca), ca.cert)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(server_dir / pki.CERT_FILE, server_dir / pki.KEY_FILE)
    ctx.load_verify_locations(server_dir / pki.CA_FILE)
    ctx.verify_mode = ssl.CERT_REQUIRED
    server = _Server(("127.0.0.1", 0), _WhoAmI)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, ca
    finally:
        server.shutdown()
        server.server_close()


def _client(ca: pki.CertAndKey, cn: str) -> pki.CertAndKey:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    return pki.issue_cert_for_subject(name, ca, lifetime=dt.timedelta(hours=1))


def _secret_volume(directory: Path, files: dict[str, bytes], generation: int) -> None:
    """Write `files` the way the kubelet updates a Secret volume: a new timestamped directory,
    `..data` swapped to it atomically, each file a symlink through `..data`."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = directory / f"..gen_{generation}"
    payload.mkdir()
    for name, data in files.items():
        (payload / name).write_bytes(data)
    tmp = directory / "..data_tmp"
    tmp.symlink_to(payload.name)
    os.replace(tmp, directory / "..data")
    for name in files:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


def _kubeconfig(port: int, ca_pem: bytes) -> bytes:
    import base64

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "hub",
                "cluster": {
                    "server": f"https://127.0.0.1:{port}",
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        # As OCM's registration agent writes it: the certificate files next to the kubeconfig.
        "users": [
            {"name": "agent", "user": {"client-certificate": "tls.crt", "client-key": "tls.key"}}
        ],
        "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "agent"}}],
        "current-context": "hub",
    }
    return json.dumps(config).encode()


def test_a_mounted_hub_kubeconfig_follows_its_renewed_certificate(
    hub: tuple[_Server, pki.CertAndKey], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, ca = hub
    mount = tmp_path / "managed" / "hub-kubeconfig"
    kubeconfig = _kubeconfig(server.server_address[1], ca.cert_pem)
    first = _client(ca, "agent-1")
    files = {"kubeconfig": kubeconfig, "tls.crt": first.cert_pem, "tls.key": first.key_pem}
    _secret_volume(mount, files, 1)
    monkeypatch.chdir(tmp_path)  # relative paths must not resolve against the working directory

    kube = Kube(str(mount / "kubeconfig"))
    try:
        assert kube.api.configuration.cert_file == str(mount / "tls.crt")
        assert kube.get("/whoami") == {"cn": "agent-1"}
        assert kube.get("/whoami") == {"cn": "agent-1"}
        assert server.connections == 1  # one kept-alive connection

        second = _client(ca, "agent-2")
        _secret_volume(mount, {**files, "tls.crt": second.cert_pem, "tls.key": second.key_pem}, 2)
        assert kube.get("/whoami") == {"cn": "agent-2"}  # not the pooled connection's agent-1
        assert kube.tls_reloads == 1 and server.connections == 2
        assert kube.get("/whoami") == {"cn": "agent-2"}
        assert kube.tls_reloads == 1
    finally:
        kube.close()
