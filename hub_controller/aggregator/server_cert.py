"""Where the aggregator's server certificate comes from: the Secret `ocm-fl-aggregator-tls`
that the signer part keeps current (signer/aggregator_cert.py). The aggregator reads it by
name and never sees the hub CA's key."""

from __future__ import annotations

from typing import Protocol

from hub_controller.signer.aggregator_cert import secret_data
from ocmfl import constants, pki
from ocmfl.kube import Kube, path_of


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
