"""Where a federation's credentials live on the hub: the names of its Secrets and of their keys,
and what makes a stored certificate still good.

Shared by the controller (hub_controller.operator.desired.credentials), which asks for the
federation's server certificates by naming its gateway on the credentials Secret and copies
members' SuperNode keys to the server, and the signer part, which keeps each federation's Fleet
CA in its own namespace, issues the server certificates into the credentials Secret
(hub_controller.signer.fleet_server) and writes the clusters' SuperNode public keys
(hub_controller.signer.fleet): neither reaches into the other for them.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from cryptography import x509

from hub_controller.api import FLRef
from ocmfl import constants, pki
from ocmfl.names import hub_side_name

# The server's component label, on its Job, Service and credentials.
SERVER_COMPONENT: Final = "server"
CA: Final = "ca.crt"  # the Fleet CA's certificate (its key never leaves the signer's namespace)
SUPERLINK_CERT: Final = "superlink.crt"
SUPERLINK_KEY: Final = "superlink.key"
GATEWAY_CERT: Final = "gateway.crt"
GATEWAY_KEY: Final = "gateway.key"
# Public SuperNode keys are spread over this many Secrets (~340 B per key as stored): at
# 3,500 clusters the largest shard measured 49 KB, far below the apiserver's 1 MiB per object.
NODE_KEY_SHARDS: Final = 32
NODE_PUB_SUFFIX: Final = ".node.pub"
# Each federation's Fleet CA (about 1 KB) is kept in one of this many Secrets in the signer's
# namespace: fixed names the chart's RBAC grants by name (the CA Secrets share that namespace),
# room for about 14,000 federations below the apiserver's 1 MiB per object.
FLEET_CA_SHARDS: Final = 16
# Label on the key shard Secrets: "enrolled" (the signer's) or "node" (the server's copy); on
# the credentials Secret: "tls" (the server certificates the signer issues into it).
LABEL_KEYS: Final = f"{constants.LABEL_PREFIX}/keys"
TLS_KEYS: Final = "tls"
# On the credentials Secret, written by the controller: the names clusters dial the gateway by
# (JSON {"dns": [...], "ips": [...]}), which the signer puts in the gateway certificate.
GATEWAY_NAMES_ANNOTATION: Final = f"{constants.LABEL_PREFIX}/gateway-names"
# Renew a certificate with less than this share of its lifetime left.
RENEW_BELOW: Final = 0.3
# The server certificates' entries of the credentials Secret, all issued by the signer.
SERVER_TLS: Final = (CA, SUPERLINK_CERT, SUPERLINK_KEY, GATEWAY_CERT, GATEWAY_KEY)


@dataclass(frozen=True)
class GatewayNames:
    """Names and addresses clusters use to reach the Fleet gateway (its certificate's SANs)."""

    dns: tuple[str, ...]
    ips: tuple[str, ...] = ()

    def to_annotation(self) -> str:
        return json.dumps({"dns": list(self.dns), "ips": list(self.ips)}, sort_keys=True)

    @classmethod
    def from_annotation(cls, text: str) -> GatewayNames:
        """The names the annotation holds; ValueError when it is not a JSON object of two
        lists of at most 64 strings each (a malformed or hostile request)."""
        value = json.loads(text)
        if not isinstance(value, dict) or set(value) - {"dns", "ips"}:
            raise ValueError('expected {"dns": [...], "ips": [...]}')
        lists = [value.get("dns") or [], value.get("ips") or []]
        for names in lists:
            if not isinstance(names, list) or len(names) > 64:
                raise ValueError("dns and ips must be lists of at most 64 names")
            if not all(isinstance(n, str) and 0 < len(n) <= 253 for n in names):
                raise ValueError("every name must be a string of 1 to 253 characters")
        if not lists[0] and not lists[1]:
            raise ValueError("no name")
        return cls(dns=tuple(lists[0]), ips=tuple(lists[1]))


def fresh_cert(
    data: Mapping[str, bytes], cert_key: str, ca: x509.Certificate, now: dt.datetime
) -> x509.Certificate | None:
    """The stored certificate if `ca` issued it, it is valid and not due for renewal, else
    None."""
    pem = data.get(cert_key)
    if not pem:
        return None
    try:
        cert = pki.load_cert_pem(pem)
    except ValueError:
        return None
    if not pki.verify_issued_by(cert, ca):
        return None
    if pki.remaining_fraction(cert, now) < RENEW_BELOW:
        return None
    return cert


def names_match(cert: x509.Certificate, names: GatewayNames) -> bool:
    """Whether the certificate names exactly `names` (DNS and IP SANs)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    dns = set(san.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return dns == set(names.dns) and ips == set(names.ips)


def server_name(ref: FLRef) -> str:
    """Name of the server Job and Service, and the stem of the credentials' Secrets."""
    return hub_side_name(ref.name, "server")


def cluster_keys(cluster: str) -> tuple[str, str, str, str]:
    """Names of one cluster's material: (tls.crt, tls.key, node.key, node.pub); only the
    last is ever stored on the hub (the others name what must never be there)."""
    return (
        f"{cluster}.tls.crt",
        f"{cluster}.tls.key",
        f"{cluster}.node.key",
        f"{cluster}.node.pub",
    )


def key_shard(cluster: str) -> int:
    """The key shard of a cluster: a stable hash of its name (the same in every process)."""
    return int.from_bytes(hashlib.sha256(cluster.encode()).digest()[:4], "big") % NODE_KEY_SHARDS


def credentials_secret_name(server_name: str) -> str:
    """The Secret holding all of a resource's credentials (the server pod mounts parts)."""
    return f"{server_name}-credentials"


def fleet_ca_shard(uid: str) -> int:
    """The Fleet CA shard of a federation: a stable hash of its uid."""
    return int.from_bytes(hashlib.sha256(uid.encode()).digest()[:4], "big") % FLEET_CA_SHARDS


def fleet_ca_secret_name(shard: int) -> str:
    """One of the FLEET_CA_SHARDS Secrets in the signer's own namespace that hold the
    federations' Fleet CAs (fixed names, so RBAC can grant exactly these)."""
    return f"ocm-fl-fleet-cas-{shard}"


def fleet_ca_keys(uid: str) -> tuple[str, str, str]:
    """A federation's entries in its Fleet CA shard: (certificate, key, owner), by uid (names
    in the tenant's namespace could be reused); the owner entry says ``namespace/name``."""
    return f"{uid}.crt", f"{uid}.key", f"{uid}.owner"


def enrolled_keys_secret_name(server_name: str, cluster: str) -> str:
    """The Secret (one of NODE_KEY_SHARDS) where the Fleet signer puts `cluster`'s SuperNode
    public key from its CSR; the operator copies members' keys to the node-keys shards."""
    return f"{server_name}-enrolled-keys-{key_shard(cluster)}"


def node_keys_secret_name(server_name: str, shard: int) -> str:
    """One of the NODE_KEY_SHARDS Secrets of members' public SuperNode keys; the server pod
    mounts them all as one directory (a projected volume)."""
    return f"{server_name}-node-keys-{shard}"


def enrolled_selector(uid: str) -> str:
    """Label selector of a resource's enrolled-keys shards (the signer labels them so)."""
    return f"{constants.LABEL_OWNER_UID}={uid},{LABEL_KEYS}=enrolled"


def encoded_data(data: Mapping[str, bytes]) -> dict[str, str]:
    """A Secret's `data` field for `data` (base64, keys sorted): `secret_data`'s inverse."""
    return {k: base64.b64encode(v).decode() for k, v in sorted(data.items())}


def secret_data(secret: Mapping[str, Any] | None) -> dict[str, bytes]:
    """Decoded data of a Secret as read from the API ({} when absent)."""
    if not secret:
        return {}
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
