"""SuperNode authentication keys: ECDSA key pairs in OpenSSH format (what Flower expects).

Flow on OCM: each cluster's agent calls ``generate_keypair`` once per (FederatedLearning,
cluster) on that cluster and keeps the private key in the client namespace's identity Secret
(mounted into the client pod, passed to ``ocm-fl-client --auth-key``); the public key reaches
the hub inside the Fleet CSR (agent_addon.fleet_identity), and the server Job gets the public
keys as a directory of ``<cluster>.pub`` files (``ocm-fl-server --supernode-keys``), which
registers each under the cluster's name. The private key never leaves the cluster, and a key
is useless for any other FederatedLearning.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

PUBLIC_SUFFIX = ".pub"


def generate_keypair(comment: str = "") -> tuple[bytes, bytes]:
    """A new ECDSA P-384 key pair: (OpenSSH private key PEM, OpenSSH public key line)."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.OpenSSH,
        encryption_algorithm=serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        encoding=serialization.Encoding.OpenSSH,
        format=serialization.PublicFormat.OpenSSH,
    )
    if comment:
        public += b" " + comment.encode()
    return private, public + b"\n"


def public_key_of(private_openssh: bytes) -> bytes:
    """The OpenSSH public key line matching an OpenSSH private key."""
    key = serialization.load_ssh_private_key(private_openssh, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("SuperNode keys must be ECDSA")
    return (
        key.public_key().public_bytes(
            encoding=serialization.Encoding.OpenSSH,
            format=serialization.PublicFormat.OpenSSH,
        )
        + b"\n"
    )


def write_keypair(private_path: Path, comment: str = "") -> Path:
    """Write a new key pair to ``private_path`` (mode 0600) and ``private_path``.pub."""
    private, public = generate_keypair(comment)
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private)
    public_path = private_path.with_name(private_path.name + PUBLIC_SUFFIX)
    public_path.write_bytes(public)
    return public_path


def ensure_keypair(private_path: Path, comment: str = "") -> bytes:
    """Read the private key at ``private_path`` or create a new pair; return the public key."""
    if private_path.exists():
        return public_key_of(private_path.read_bytes())
    write_keypair(private_path, comment)
    return public_key_of(private_path.read_bytes())


def read_public_keys(directory: Path) -> dict[str, Path]:
    """Map cluster name -> public key file for every ``<cluster>.pub`` in ``directory``."""
    if not directory.is_dir():
        raise FileNotFoundError(f"SuperNode key directory {directory} does not exist")
    return {
        p.name[: -len(PUBLIC_SUFFIX)]: p
        for p in sorted(directory.iterdir())
        if p.name.endswith(PUBLIC_SUFFIX) and p.is_file() and not p.name.startswith(".")
    }
