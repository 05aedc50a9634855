"""Scan the hub for private keys of managed clusters (issue 12: keys born where they are used).

Reads every Secret, ConfigMap, ManifestWork and CertificateSigningRequest on the hub and
reports a finding for:
- any private key inside a ManifestWork or a CSR (both carry material to or from a cluster);
- any private key in a Secret or ConfigMap whose public key is one a cluster uses: a key
  some CSR asked a certificate for, or a SuperNode key (from a Fleet CSR or a node-keys
  Secret);
- any Secret or ConfigMap entry named like per-cluster private material (`<c>.tls.key`,
  `<c>.node.key`, the names the hub once used for them).
Hub-side keys (CAs, the gateway's, the SuperLink's) are not findings. Exits 1 when anything
is found. Usage: ``python -m hack.keyscan --kubeconfig HUB_KUBECONFIG``.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization

from ocmfl import constants, pki
from ocmfl.kube import Kube

SOURCES: dict[str, str] = {
    "Secret": "/api/v1/secrets",
    "ConfigMap": "/api/v1/configmaps",
    "ManifestWork": f"/apis/{constants.WORK_GROUP}/v1/manifestworks",
    "CertificateSigningRequest": "/apis/certificates.k8s.io/v1/certificatesigningrequests",
}
_PEM_KEY = re.compile(
    rb"-----BEGIN ([A-Z ]*)PRIVATE KEY-----.+?-----END \1PRIVATE KEY-----", re.DOTALL
)
_CLUSTER_KEY_NAME = re.compile(r"^[a-z0-9][-a-z0-9]*\.(tls|node)\.key$")
_SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True)
class Finding:
    kind: str
    namespace: str
    name: str
    why: str

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}: {self.why}"


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _blobs(obj: Mapping[str, Any]) -> Iterator[bytes]:
    """Every string of the object, and its base64 decoding where it is base64."""
    for s in _strings(obj):
        raw = s.encode()
        yield raw
        with contextlib.suppress(binascii.Error, ValueError):
            yield base64.b64decode(raw, validate=True)


def private_keys(obj: Mapping[str, Any]) -> list[bytes]:
    """PEM private keys (PKCS#1, SEC1, PKCS#8, OpenSSH) anywhere in the object."""
    return [m.group(0) for blob in _blobs(obj) for m in _PEM_KEY.finditer(blob)]


def public_of(private_pem: bytes) -> bytes | None:
    """SubjectPublicKeyInfo DER of a PEM or OpenSSH private key (None if unreadable)."""
    try:
        if b"OPENSSH" in private_pem:
            key: Any = serialization.load_ssh_private_key(private_pem, password=None)
        else:
            key = serialization.load_pem_private_key(private_pem, password=None)
        return bytes(key.public_key().public_bytes(*_SPKI))
    except (ValueError, TypeError):
        return None


def cluster_public_keys(
    csrs: Iterable[Mapping[str, Any]], node_pubs: Iterable[bytes]
) -> set[bytes]:
    """Public keys clusters use: every CSR's key, SuperNode keys from Fleet CSRs and from
    the given OpenSSH public key lines."""
    out: set[bytes] = set()
    lines = list(node_pubs)
    for csr in csrs:
        try:
            req = pki.load_csr_pem(base64.b64decode((csr.get("spec") or {}).get("request", "")))
        except (ValueError, pki.CSRError):
            continue
        out.add(bytes(req.public_key().public_bytes(*_SPKI)))
        for uri in pki.uris_of(req):
            if uri.startswith(constants.SUPERNODE_KEY_URI_PREFIX):
                with contextlib.suppress(ValueError):
                    lines.append(pki.supernode_key_from_uri(uri))
    for line in lines:
        with contextlib.suppress(ValueError, TypeError):
            out.add(bytes(serialization.load_ssh_public_key(line.strip()).public_bytes(*_SPKI)))
    return out


def scan(objects: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Finding]:
    """Findings over objects by kind (the SOURCES kinds)."""
    secrets, configmaps = objects.get("Secret", []), objects.get("ConfigMap", [])
    node_pubs = [
        base64.b64decode(v)
        for s in secrets
        for k, v in (s.get("data") or {}).items()
        if k.endswith(".pub")
    ]
    cluster_keys = cluster_public_keys(objects.get("CertificateSigningRequest", []), node_pubs)
    found: list[Finding] = []

    def finding(kind: str, obj: Mapping[str, Any], why: str) -> None:
        meta = obj.get("metadata") or {}
        found.append(Finding(kind, meta.get("namespace", ""), meta.get("name", ""), why))

    for kind in ("ManifestWork", "CertificateSigningRequest"):
        for obj in objects.get(kind, []):
            if private_keys(obj):
                finding(kind, obj, "carries a private key")
    for kind, items in (("Secret", secrets), ("ConfigMap", configmaps)):
        for obj in items:
            names = [k for k in (obj.get("data") or {}) if _CLUSTER_KEY_NAME.match(k)]
            if names:
                finding(kind, obj, f"per-cluster private key entries {sorted(names)}")
            for key in private_keys(obj):
                if public_of(key) in cluster_keys:
                    finding(kind, obj, "holds the private key of a key a cluster uses")
    return found


def read_hub(kube: Kube) -> dict[str, list[Mapping[str, Any]]]:
    return {kind: (kube.get(path) or {}).get("items") or [] for kind, path in SOURCES.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="keyscan", description=__doc__.split("\n")[0])
    p.add_argument("--kubeconfig", default=None, help="the hub's kubeconfig")
    args = p.parse_args(argv)
    kube = Kube(args.kubeconfig)
    try:
        objects = read_hub(kube)
    finally:
        kube.close()
    findings = scan(objects)
    counts = ", ".join(f"{len(v)} {k}s" for k, v in objects.items())
    for f in findings:
        print(f"keyscan: {f}")
    print(f"keyscan: scanned {counts}: {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
