"""Where the aggregator's server certificate comes from: the Secret `ocm-fl-aggregator-tls`
that the signer part keeps current (signer/aggregator_cert.py). The aggregator reads it by
name and never sees the hub CA's key. (This module registers no kopf handler: the controller
imports it, and must not run the signer's issuer.)"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Protocol

from ocmfl import constants, pki
from ocmfl.kube import Kube, path_of


def secret_data(secret: Mapping[str, Any] | None) -> dict[str, bytes]:
    """A Secret's data, decoded (none for a missing Secret)."""
    raw = (secret or {}).get("data") or {}
    return {k: base64.b64decode(v) for k, v in raw.items() if isinstance(v, str)}


class ServerCertSource(Protocol):
    """The current certificate and key PEM, or None while there is none."""

    def read(self) -> tuple[bytes, bytes] | None: ...

    def where(self) -> str: ...


class SecretServerCert:
    """The Secret the signer writes, read through the API (`get` by name only)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace

    def where(self) -> str:
        return f"Secret {self.namespace}/{constants.AGGREGATOR_TLS_SECRET}"

    def read(self) -> tuple[bytes, bytes] | None:
        path = path_of("v1", "Secret", self.namespace, constants.AGGREGATOR_TLS_SECRET)
        data = secret_data(self.kube.get(path))
        cert, key = data.get(pki.CERT_FILE), data.get(pki.KEY_FILE)
        return (cert, key) if cert and key else None
