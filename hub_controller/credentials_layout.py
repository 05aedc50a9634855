"""Where a federation's credentials live on the hub: the names of its Secrets and of their keys.

Shared by the controller, which writes the credentials (hub_controller.operator.desired
.credentials), and the Fleet signer, which reads the Fleet CA and writes the clusters' SuperNode
public keys (hub_controller.signer.fleet): neither reaches into the other for them.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from typing import Any, Final

from hub_controller.api import FLRef
from ocmfl import constants
from ocmfl.names import hub_side_name

# The server's component label, on its Job, Service and credentials.
SERVER_COMPONENT: Final = "server"
CA: Final = "ca.crt"
FLEET_CA_KEY: Final = "fleet-ca.key"
SUPERLINK_CERT: Final = "superlink.crt"
SUPERLINK_KEY: Final = "superlink.key"
GATEWAY_CERT: Final = "gateway.crt"
GATEWAY_KEY: Final = "gateway.key"
# Public SuperNode keys are spread over this many Secrets (~340 B per key as stored): at
# 3,500 clusters the largest shard measured 49 KB, far below the apiserver's 1 MiB per object.
NODE_KEY_SHARDS: Final = 32
NODE_PUB_SUFFIX: Final = ".node.pub"
# Label on the key shard Secrets: "enrolled" (the signer's) or "node" (the server's copy).
LABEL_KEYS: Final = f"{constants.LABEL_PREFIX}/keys"


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


def secret_data(secret: Mapping[str, Any] | None) -> dict[str, bytes]:
    """Decoded data of a Secret as read from the API ({} when absent)."""
    if not secret:
        return {}
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
