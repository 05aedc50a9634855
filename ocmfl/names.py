"""Names of what the hub creates on the managed clusters, shared by the controller (which
creates them) and the agent (which looks them up)."""

from __future__ import annotations

import hashlib


def safe_name(*parts: str, max_len: int = 63) -> str:
    """Join parts with '-' into a DNS label; long names are cut and get a hash suffix."""
    full = "-".join(parts).lower().replace(".", "-").strip("-")
    if len(full) <= max_len:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    return f"{full[: max_len - 9].rstrip('-')}-{digest}"


def cluster_side_name(namespace: str, name: str) -> str:
    """`fl-<ns>-<name>-<digest of ns/name>`: the FederatedLearning's ManifestWork and client
    namespace. The digest keeps it one-to-one. Without it, tenant `team-a`'s `x` and tenant
    `team`'s `a-x` (or `x.y` and `x-y`) would share a ManifestWork and a client namespace on
    every cluster and overwrite each other."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:8]
    return safe_name("fl", namespace, name, digest)
