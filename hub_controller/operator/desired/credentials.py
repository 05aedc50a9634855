"""Per-FederatedLearning credentials: what the server pod and each cluster's client need.

Everything is issued by the resource's own Fleet CA, never by the hub CA: the gateway
certificate carries the tenant-chosen advertiseAddress, so the CA that signs it must be one
nothing but this federation's Flower traffic trusts (agents trust only the hub CA for the
aggregator; the aggregator accepts only hub-CA agent certificates). All of it is kept in one
hub Secret owned by the FederatedLearning resource, so a reconcile reuses what exists and only
issues what is missing, expiring, or no longer matches (a new cluster, a new gateway address,
a new Fleet CA):

* ``ca.crt``/``fleet-ca.key``: the federation's Fleet CA (made here, one per resource);
* ``superlink.crt/.key``: the SuperLink's TLS certificate, loopback only (DNS ``localhost``);
* ``gateway.crt/.key``: the Fleet gateway's server certificate for the names clusters dial;
* per cluster ``<c>.tls.crt/.key``: the cluster's client identity for the Fleet tunnel
  (CN ``fleet:<c>``, URI SAN naming the federation uid and cluster), and
  ``<c>.node.key/.node.pub``: its SuperNode authentication key pair (Flower's second factor;
  the server registers the public key under the cluster's name).

`reconcile_credentials` is pure apart from key generation; the operator stores its result.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from ocmfl import nodekeys, pki

CA = "ca.crt"
FLEET_CA_KEY = "fleet-ca.key"
SUPERLINK_CERT, SUPERLINK_KEY = "superlink.crt", "superlink.key"
GATEWAY_CERT, GATEWAY_KEY = "gateway.crt", "gateway.key"
# Renew anything with less than this share of its lifetime left.
RENEW_BELOW = 0.3


def cluster_keys(cluster: str) -> tuple[str, str, str, str]:
    """Secret keys of one cluster's material: (tls.crt, tls.key, node.key, node.pub)."""
    return (
        f"{cluster}.tls.crt",
        f"{cluster}.tls.key",
        f"{cluster}.node.key",
        f"{cluster}.node.pub",
    )


@dataclass(frozen=True)
class GatewayNames:
    """Names and addresses clusters use to reach the Fleet gateway (its certificate's SANs)."""

    dns: tuple[str, ...]
    ips: tuple[str, ...] = ()


def _fresh(
    data: Mapping[str, bytes], cert_key: str, ca: pki.CertAndKey, now: dt.datetime
) -> x509.Certificate | None:
    """The stored certificate if it is ours, valid and not due for renewal, else None."""
    pem = data.get(cert_key)
    if not pem:
        return None
    try:
        cert = pki.load_cert_pem(pem)
    except ValueError:
        return None
    if not pki.verify_issued_by(cert, ca.cert):
        return None
    if pki.remaining_fraction(cert, now) < RENEW_BELOW:
        return None
    return cert


def _san_matches(cert: x509.Certificate, names: GatewayNames) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    dns = set(san.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return dns == set(names.dns) and ips == set(names.ips)


def fleet_ca_name(namespace: str, name: str) -> str:
    """Common name of a resource's Fleet CA (says whose it is; trust comes from the key)."""
    return f"ocm-fl-fleet-ca {namespace}/{name}"


def fleet_ca(
    current: Mapping[str, bytes], common_name: str, now: dt.datetime | None = None
) -> pki.CertAndKey:
    """The stored Fleet CA while readable and not due for renewal, else a new one."""
    now = now or pki.utcnow()
    try:
        ca = pki.load_cert_and_key(current[CA], current[FLEET_CA_KEY])
    except (KeyError, ValueError):
        return pki.create_ca(common_name, key_kind="ec", now=now)
    if pki.remaining_fraction(ca.cert, now) < RENEW_BELOW:
        return pki.create_ca(common_name, key_kind="ec", now=now)
    return ca


def reconcile_credentials(
    current: Mapping[str, bytes],
    *,
    clusters: Sequence[str],
    gateway: GatewayNames,
    federation_uid: str,
    ca_name: str = "ocm-fl-fleet-ca",
    now: dt.datetime | None = None,
) -> dict[str, bytes]:
    """The Secret data to store: `current` where still good, newly issued where not.

    The Fleet CA comes from `current` (made when missing or expiring, which reissues all).
    Clusters no longer in `clusters` lose their material (their identity for this resource
    ends with their membership).
    """
    now = now or pki.utcnow()
    ca = fleet_ca(current, ca_name, now)
    out: dict[str, bytes] = {CA: pki.cert_to_pem(ca.cert), FLEET_CA_KEY: pki.key_to_pem(ca.key)}

    if _fresh(current, SUPERLINK_CERT, ca, now) and current.get(SUPERLINK_KEY):
        out[SUPERLINK_CERT], out[SUPERLINK_KEY] = current[SUPERLINK_CERT], current[SUPERLINK_KEY]
    else:
        pair = pki.issue_server_cert(
            ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"], now=now
        )
        out[SUPERLINK_CERT], out[SUPERLINK_KEY] = pair.cert_pem, pair.key_pem

    gw = _fresh(current, GATEWAY_CERT, ca, now)
    if gw is not None and _san_matches(gw, gateway) and current.get(GATEWAY_KEY):
        out[GATEWAY_CERT], out[GATEWAY_KEY] = current[GATEWAY_CERT], current[GATEWAY_KEY]
    else:
        pair = pki.issue_server_cert(
            ca, dns_names=list(gateway.dns), ip_addresses=list(gateway.ips), now=now
        )
        out[GATEWAY_CERT], out[GATEWAY_KEY] = pair.cert_pem, pair.key_pem

    for cluster in sorted(set(clusters)):
        crt, key, node_key, node_pub = cluster_keys(cluster)
        if _fresh(current, crt, ca, now) and current.get(key):
            out[crt], out[key] = current[crt], current[key]
        else:
            pair = pki.issue_fleet_client_cert(ca, federation_uid, cluster, now=now)
            out[crt], out[key] = pair.cert_pem, pair.key_pem
        if current.get(node_key) and current.get(node_pub):
            out[node_key], out[node_pub] = current[node_key], current[node_pub]
        else:
            out[node_key], out[node_pub] = nodekeys.generate_keypair(comment=cluster)
    return out


def client_bundle(data: Mapping[str, bytes], cluster: str) -> dict[str, bytes]:
    """What one cluster's client pod mounts: its identity, the CA and its SuperNode key."""
    crt, key, node_key, _ = cluster_keys(cluster)
    return {
        pki.CERT_FILE: data[crt],
        pki.KEY_FILE: data[key],
        pki.CA_FILE: data[CA],
        "node.key": data[node_key],
    }


def server_node_keys(data: Mapping[str, bytes]) -> dict[str, bytes]:
    """Public SuperNode keys as ``<cluster>.pub`` (the server launcher's key directory)."""
    suffix = ".node.pub"
    return {
        k[: -len(suffix)] + nodekeys.PUBLIC_SUFFIX: v for k, v in data.items() if k.endswith(suffix)
    }


def server_tls_bundle(data: Mapping[str, bytes]) -> dict[str, bytes]:
    """What the server pod's containers mount: SuperLink and gateway certificates and the CA."""
    return {k: data[k] for k in (CA, SUPERLINK_CERT, SUPERLINK_KEY, GATEWAY_CERT, GATEWAY_KEY)}


# --- objects on the hub --------------------------------------------------------------------
def credentials_secret_name(server_name: str) -> str:
    """The Secret holding all of a resource's credentials (the server pod mounts parts)."""
    return f"{server_name}-credentials"


def node_keys_secret_name(server_name: str) -> str:
    """The Secret of public SuperNode keys, mounted whole as the server's key directory."""
    return f"{server_name}-node-keys"


def _secret(meta: Mapping[str, Any], name: str, data: Mapping[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {**meta, "name": name},
        "data": {k: base64.b64encode(v).decode() for k, v in sorted(data.items())},
    }


def hub_secrets(
    meta: Mapping[str, Any], server_name: str, data: Mapping[str, bytes]
) -> list[dict[str, Any]]:
    """The credentials Secret and the node-keys Secret, with `meta` (namespace, labels,
    ownerReferences) from the server objects."""
    return [
        _secret(meta, credentials_secret_name(server_name), data),
        _secret(meta, node_keys_secret_name(server_name), server_node_keys(data)),
    ]


def secret_data(secret: Mapping[str, Any] | None) -> dict[str, bytes]:
    """Decoded data of a Secret as read from the API ({} when absent)."""
    if not secret:
        return {}
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
