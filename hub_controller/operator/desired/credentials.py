"""Per-FederatedLearning credentials: what the server pod and each cluster's client need.

Everything is issued by the resource's own Fleet CA, never by the hub CA: the gateway
certificate carries the tenant-chosen advertiseAddress, so the CA that signs it must be one
nothing but this federation's Flower traffic trusts (agents trust only the hub CA for the
aggregator; the aggregator accepts only hub-CA agent certificates). All of it is kept in one
hub Secret owned by the FederatedLearning resource, so a reconcile reuses what exists and only
issues what is missing, expiring, or no longer matches (a new cluster, a new gateway address,
a new Fleet CA). Its size does not depend on the number of clusters:

* ``ca.crt``/``fleet-ca.key``: the federation's Fleet CA (made here, one per resource);
* ``superlink.crt/.key``: the SuperLink's TLS certificate, loopback only (DNS ``localhost``);
* ``gateway.crt/.key``: the Fleet gateway's server certificate for the names clusters dial;
* per cluster only ``<c>.node.pub``: its SuperNode public key, which the Fleet signer
  (hub_controller.signer.fleet) stored from the cluster's CSR; the server registers it under
  the cluster's name. The cluster's Fleet key and SuperNode key are made on the cluster by
  its agent (agent_addon.fleet_identity) and never reach the hub. These public keys are not
  kept in the credentials Secret: they are spread over `NODE_KEY_SHARDS` Secrets by a stable
  hash of the cluster name (the signer's enrolled-keys shards, the operator's node-keys
  shards), so no Secret grows with the fleet past about N / NODE_KEY_SHARDS keys
  (docs/scale.md); the server pod mounts the node-keys shards as one directory.

`reconcile_credentials` is pure apart from key generation; the operator stores its result.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from hub_controller.credentials_layout import (
    CA,
    FLEET_CA_KEY,
    GATEWAY_CERT,
    GATEWAY_KEY,
    LABEL_KEYS,
    NODE_KEY_SHARDS,
    NODE_PUB_SUFFIX,
    SUPERLINK_CERT,
    SUPERLINK_KEY,
    cluster_keys,
    credentials_secret_name,
    key_shard,
    node_keys_secret_name,
    secret_data,
)
from ocmfl import certlife, nodekeys, pki

# Renew anything with less than this share of its lifetime left.
RENEW_BELOW = 0.3


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
    enrolled: Mapping[str, bytes] | None = None,
    now: dt.datetime | None = None,
    gateway_lifetime: dt.timedelta = pki.DEFAULT_SERVER_LIFETIME,
) -> dict[str, bytes]:
    """The Secret data to store: `current` where still good, newly issued where not (a new
    gateway certificate lasts `gateway_lifetime`).

    The Fleet CA comes from `current` (made when missing or expiring, which reissues all).
    Clusters no longer in `clusters` lose their material (their identity for this resource
    ends with their membership).
    """
    now = now or pki.utcnow()
    enrolled = enrolled or {}
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
            ca,
            dns_names=list(gateway.dns),
            ip_addresses=list(gateway.ips),
            now=now,
            lifetime=gateway_lifetime,
        )
        out[GATEWAY_CERT], out[GATEWAY_KEY] = pair.cert_pem, pair.key_pem

    # Per cluster only public material: the SuperNode key the Fleet signer took from the
    # cluster's CSR (`enrolled`), for members only. Keys are made on the cluster (agent).
    for cluster in sorted(set(clusters)):
        _, _, _, node_pub = cluster_keys(cluster)
        if enrolled.get(node_pub):
            out[node_pub] = enrolled[node_pub]
    return out


def renew_in_s(data: Mapping[str, bytes], now: dt.datetime) -> float | None:
    """Seconds until the first of the Fleet CA, SuperLink and gateway certificates in `data`
    is due for renewal (RENEW_BELOW of its lifetime left); None when none is readable. The
    reconcile loop comes back by then: renewal happens by time, not only on a change."""
    due = []
    for key in (CA, SUPERLINK_CERT, GATEWAY_CERT):
        try:
            cert = pki.load_cert_pem(data[key])
        except (KeyError, ValueError):
            continue
        due.append(certlife.renew_in(cert, RENEW_BELOW, now))
    return min(due) if due else None


def server_node_keys(data: Mapping[str, bytes]) -> dict[str, bytes]:
    """Public SuperNode keys as ``<cluster>.pub`` (the server launcher's key directory)."""
    suffix = NODE_PUB_SUFFIX
    return {
        k[: -len(suffix)] + nodekeys.PUBLIC_SUFFIX: v for k, v in data.items() if k.endswith(suffix)
    }


def without_node_keys(data: Mapping[str, bytes]) -> dict[str, bytes]:
    """The credentials Secret's data: everything but the per-cluster public keys."""
    return {k: v for k, v in data.items() if not k.endswith(NODE_PUB_SUFFIX)}


def node_key_shards(data: Mapping[str, bytes]) -> list[dict[str, bytes]]:
    """The server's key directory split into NODE_KEY_SHARDS parts (`key_shard`), each
    ``<cluster>.pub`` -> key; every shard is present, empty or not."""
    shards: list[dict[str, bytes]] = [{} for _ in range(NODE_KEY_SHARDS)]
    suffix = nodekeys.PUBLIC_SUFFIX
    for name, key in server_node_keys(data).items():
        shards[key_shard(name[: -len(suffix)])][name] = key
    return shards


def server_tls_bundle(data: Mapping[str, bytes]) -> dict[str, bytes]:
    """What the server pod's containers mount: SuperLink and gateway certificates and the CA."""
    return {k: data[k] for k in (CA, SUPERLINK_CERT, SUPERLINK_KEY, GATEWAY_CERT, GATEWAY_KEY)}


def _secret(
    meta: Mapping[str, Any], name: str, data: Mapping[str, bytes], keys: str = ""
) -> dict[str, Any]:
    labels = dict(meta.get("labels") or {})
    if keys:
        labels[LABEL_KEYS] = keys
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {**meta, "name": name, "labels": labels},
        "data": {k: base64.b64encode(v).decode() for k, v in sorted(data.items())},
    }


def hub_secrets(
    meta: Mapping[str, Any], server_name: str, data: Mapping[str, bytes]
) -> list[dict[str, Any]]:
    """The credentials Secret (without per-cluster keys) and the NODE_KEY_SHARDS node-keys
    Secrets, with `meta` (namespace, labels, ownerReferences) from the server objects."""
    return [
        _secret(meta, credentials_secret_name(server_name), without_node_keys(data)),
        *(
            _secret(meta, node_keys_secret_name(server_name, i), shard, keys="node")
            for i, shard in enumerate(node_key_shards(data))
        ),
    ]


def enrolled_data(secrets: Sequence[Mapping[str, Any]]) -> dict[str, bytes]:
    """The union of the enrolled-keys shards' data (``<cluster>.node.pub`` -> key), each key
    taken only from the shard its cluster hashes to (a key elsewhere was not put there by the
    signer)."""
    out: dict[str, bytes] = {}
    for secret in secrets:
        name = str((secret.get("metadata") or {}).get("name") or "")
        for key, value in secret_data(secret).items():
            if not key.endswith(NODE_PUB_SUFFIX):
                continue
            cluster = key[: -len(NODE_PUB_SUFFIX)]
            if name.endswith(f"-enrolled-keys-{key_shard(cluster)}"):
                out[key] = value
    return out
