"""Names of what the hub creates on the managed clusters, shared by the controller (which
creates them) and the agent (which looks them up)."""

from __future__ import annotations

import hashlib
from typing import Final

# Hex digits of a name's digest (64 bits): finding a name whose digest equals another's takes
# about 2^64 tries, so no tenant can make its names collide with another's on purpose.
DIGEST_HEX: Final = 16


def digest(text: str) -> str:
    """The first DIGEST_HEX hex digits of sha256(text)."""
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_HEX]


def safe_name(*parts: str, max_len: int = 63) -> str:
    """Join parts with '-' into a DNS label; long names are cut and get a hash suffix."""
    full = "-".join(parts).lower().replace(".", "-").strip("-")
    if len(full) <= max_len:
        return full
    return f"{full[: max_len - DIGEST_HEX - 1].rstrip('-')}-{digest(full)}"


def cluster_side_name(namespace: str, name: str) -> str:
    """`fl-<ns>-<name>-<digest of ns/name>`: the FederatedLearning's ManifestWork and client
    namespace. The digest keeps it one-to-one. Without it, tenant `team-a`'s `x` and tenant
    `team`'s `a-x` (or `x.y` and `x-y`) would share a ManifestWork and a client namespace on
    every cluster and overwrite each other."""
    return safe_name("fl", namespace, name, digest(f"{namespace}/{name}"))


def hub_side_name(name: str, suffix: str) -> str:
    """`<name>-<suffix>-<digest of name>`: an object the controller makes for a
    FederatedLearning in its own namespace (server Job and Service, PVC, Secrets). The digest
    keeps `x.y` and `x-y` (both `x-y-...` once dots become dashes) apart."""
    return safe_name(name, suffix, digest(name))
