"""Per-FederatedLearning credentials: what the server pod and each cluster's client need.

Everything is issued by the resource's own Fleet CA, never by the hub CA: the gateway
certificate carries the tenant-chosen advertiseAddress, so the CA that signs it must be one
nothing but this federation's Flower traffic trusts (agents trust only the hub CA for the
aggregator; the aggregator accepts only hub-CA agent certificates). The Fleet CA and its key
live only in the signer part (hub_controller.signer.fleet_server), never here: this process
parses tenant specs. The controller asks for the server certificates by naming the gateway on
the resource's credentials Secret (`credentials_request`); the signer writes into that Secret:

* ``ca.crt``: the federation's Fleet CA certificate (no key);
* ``superlink.crt/.key``: the SuperLink's TLS certificate, loopback only (DNS ``localhost``);
* ``gateway.crt/.key``: the Fleet gateway's server certificate for the names clusters dial.

Per cluster only ``<c>.node.pub``: its SuperNode public key, which the Fleet signer
(hub_controller.signer.fleet) stored from the cluster's CSR; the server registers it under the
cluster's name. The cluster's Fleet key and SuperNode key are made on the cluster by its agent
(agent_addon.fleet_identity) and never reach the hub. These public keys are spread over
`NODE_KEY_SHARDS` Secrets by a stable hash of the cluster name (the signer's enrolled-keys
shards, the operator's node-keys shards), so no Secret grows with the fleet past about
N / NODE_KEY_SHARDS keys (docs/scale.md); the server pod mounts the node-keys shards as one
directory.

`credentials`, `tls_ready` and the Secret builders are pure.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from hub_controller.credentials_layout import (
    CA,
    GATEWAY_CERT,
    GATEWAY_NAMES_ANNOTATION,
    LABEL_KEYS,
    NODE_KEY_SHARDS,
    NODE_PUB_SUFFIX,
    SERVER_TLS,
    SUPERLINK_CERT,
    TLS_KEYS,
    GatewayNames,
    cluster_keys,
    credentials_secret_name,
    encoded_data,
    fresh_cert,
    key_shard,
    names_match,
    node_keys_secret_name,
    secret_data,
)
from ocmfl import nodekeys, pki


def credentials(
    current: Mapping[str, bytes],
    *,
    clusters: Sequence[str],
    enrolled: Mapping[str, bytes] | None = None,
) -> dict[str, bytes]:
    """What the server gets: the server certificates the signer wrote into the credentials
    Secret (`current`, as they are), and the SuperNode public keys the Fleet signer took from
    the CSRs of `clusters` (`enrolled`), for members only: a cluster's identity for this
    resource ends with its membership."""
    out = {k: current[k] for k in SERVER_TLS if current.get(k)}
    enrolled = enrolled or {}
    for cluster in sorted(set(clusters)):
        _, _, _, node_pub = cluster_keys(cluster)
        if enrolled.get(node_pub):
            out[node_pub] = enrolled[node_pub]
    return out


def tls_ready(data: Mapping[str, bytes], gateway: GatewayNames, now: dt.datetime) -> str | None:
    """Why the server cannot start with `data`'s certificates yet (None: it can): each must
    be there, issued by the Fleet CA in ``ca.crt``, not due for renewal, and the gateway's must
    name `gateway`."""
    missing = [k for k in SERVER_TLS if not data.get(k)]
    if missing:
        return f"the signer has not issued {', '.join(missing)} yet"
    try:
        ca = pki.load_cert_pem(data[CA])
    except ValueError:
        return "ca.crt is not a certificate"
    for key in (SUPERLINK_CERT, GATEWAY_CERT):
        if fresh_cert(data, key, ca, now) is None:
            return f"{key} is not a current certificate of the Fleet CA"
    gateway_cert = pki.load_cert_pem(data[GATEWAY_CERT])
    if not names_match(gateway_cert, gateway):
        return "gateway.crt does not name the gateway's current names yet"
    return None


def server_node_keys(data: Mapping[str, bytes]) -> dict[str, bytes]:
    """Public SuperNode keys as ``<cluster>.pub`` (the server launcher's key directory)."""
    suffix = NODE_PUB_SUFFIX
    return {
        k[: -len(suffix)] + nodekeys.PUBLIC_SUFFIX: v for k, v in data.items() if k.endswith(suffix)
    }


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
    return {k: data[k] for k in SERVER_TLS}


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
        "data": encoded_data(data),
    }


def credentials_request(
    meta: Mapping[str, Any], server_name: str, gateway: GatewayNames
) -> dict[str, Any]:
    """The credentials Secret as the controller applies it: no data (the signer owns its
    entries), labelled for the signer and naming the gateway, with `meta` (namespace, labels,
    ownerReferences) from the server objects."""
    labels = {**(meta.get("labels") or {}), LABEL_KEYS: TLS_KEYS}
    annotations = {GATEWAY_NAMES_ANNOTATION: gateway.to_annotation()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            **meta,
            "name": credentials_secret_name(server_name),
            "labels": labels,
            "annotations": annotations,
        },
    }


def hub_secrets(
    meta: Mapping[str, Any], server_name: str, gateway: GatewayNames, data: Mapping[str, bytes]
) -> list[dict[str, Any]]:
    """The credentials Secret's request (`credentials_request`) and the NODE_KEY_SHARDS
    node-keys Secrets, with `meta` (namespace, labels, ownerReferences) from the server
    objects."""
    return [
        credentials_request(meta, server_name, gateway),
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
