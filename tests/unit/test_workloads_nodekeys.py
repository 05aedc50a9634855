"""SuperNode keys: OpenSSH ECDSA pairs Flower accepts, and the <cluster>.pub directory."""

from __future__ import annotations

import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ocmfl.nodekeys import (
    ensure_keypair,
    generate_keypair,
    public_key_of,
    read_public_keys,
    write_keypair,
)


def test_generated_keys_are_openssh_ecdsa_and_match() -> None:
    private, public = generate_keypair("cluster1")
    assert private.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    assert public.startswith(b"ecdsa-sha2-nistp384 ") and public.endswith(b" cluster1\n")
    key = serialization.load_ssh_private_key(private, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert isinstance(serialization.load_ssh_public_key(public), ec.EllipticCurvePublicKey)
    assert public.startswith(public_key_of(private).strip())


def test_written_private_key_is_owner_only(tmp_path: Path) -> None:
    pub = write_keypair(tmp_path / "k" / "node")
    mode = stat.S_IMODE((tmp_path / "k" / "node").stat().st_mode)
    assert mode == 0o600 and pub.name == "node.pub"


def test_ensure_keypair_reuses_an_existing_key(tmp_path: Path) -> None:
    first = ensure_keypair(tmp_path / "node")
    assert ensure_keypair(tmp_path / "node") == first


def test_public_key_directory_maps_cluster_names(tmp_path: Path) -> None:
    for name in ("cluster1", "cluster2"):
        (tmp_path / f"{name}.pub").write_bytes(generate_keypair()[1])
    (tmp_path / "README").write_text("ignored")
    (tmp_path / ".hidden.pub").write_text("ignored")
    keys = read_public_keys(tmp_path)
    assert sorted(keys) == ["cluster1", "cluster2"]
