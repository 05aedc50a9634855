"""X.509 material for the local control plane (test infrastructure), made with ocmfl.pki.

One CA signs every serving and client certificate; keys are ECDSA P-256 (fast to generate).
"""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from ocmfl import pki

VALIDITY = dt.timedelta(days=365)
KeyPair = pki.CertAndKey


def write(pair: KeyPair, directory: Path, stem: str) -> tuple[Path, Path]:
    """Write `<stem>.crt` and `<stem>.key` (mode 0600) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    crt, key = directory / f"{stem}.crt", directory / f"{stem}.key"
    pki.write_atomic(crt, pair.cert_pem)
    pki.write_atomic(key, pair.key_pem, 0o600)
    return crt, key


def write_kubeconfig(
    path: Path,
    server: str,
    ca: bytes,
    kp: KeyPair,
    user: str,
    tls_server_name: str | None = None,
) -> None:
    """A kubeconfig (mode 0600) for `user` with its client certificate, trusting `ca` at
    `server` (`tls_server_name`: the name to check on the server's certificate instead)."""

    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    cluster: dict[str, str] = {"server": server, "certificate-authority-data": b64(ca)}
    if tls_server_name is not None:
        cluster["tls-server-name"] = tls_server_name
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": user,
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(kp.cert_pem),
                    "client-key-data": b64(kp.key_pem),
                },
            }
        ],
        "contexts": [{"name": user, "context": {"cluster": "local", "user": user}}],
    }
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)


def make_ca(cn: str = "ocm-fl-local-ca") -> KeyPair:
    """A self-signed CA certificate."""
    return pki.create_ca(cn, lifetime=VALIDITY, key_kind="ec")


def issue(
    ca: KeyPair,
    cn: str,
    *,
    orgs: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
) -> KeyPair:
    """A leaf certificate signed by `ca` with the given subject, SANs and usages."""
    subject = x509.Name(
        [pki.name_attribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        + [pki.name_attribute(NameOID.COMMON_NAME, cn)]
    )
    return pki.issue_cert(
        ca,
        subject,
        client=client,
        server=server,
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        lifetime=VALIDITY,
    )


def make_signing_key() -> tuple[bytes, bytes]:
    """A (private PEM, public PEM) pair for service-account token signing."""
    key = pki.generate_key("ec")
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return pki.key_to_pem(key), pub
