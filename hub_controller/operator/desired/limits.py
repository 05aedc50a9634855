"""Pure: the client namespace's LimitRange and ResourceQuota, from the policy's per-pod caps.

The hub refuses a spec over its namespace's FederationPolicy `maxPodResources`; these objects
make each managed cluster hold the client namespace to the same caps on its own:

* a LimitRange (when cpu, memory or ephemeral-storage is capped): a container over a cap is
  refused, and one that states no limit gets the cap as its limit and at most
  `DEFAULT_REQUESTS` as its request (left to Kubernetes, the request would default to the
  cap, and a client that asked for nothing would reserve a whole cap on every cluster);
* a ResourceQuota: at most `CLIENT_PODS` pods, and `CLIENT_PODS` times each cap in total
  (limits for cpu, memory and ephemeral-storage; requests for extended resources such as
  nvidia.com/gpu, the only form a quota takes for them).

Uncapped cpu, memory and ephemeral-storage stay unbounded, as the policy says.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from hub_controller.api import Quantity
from hub_controller.policy import UNCAPPED_RESOURCES, parse_quantity

LIMIT_RANGE_NAME: Final = "fl-client-limits"
QUOTA_NAME: Final = "fl-client-quota"
# Kind -> API resource (a ManifestWork's manifestConfigs name objects by resource).
RESOURCES: Final[Mapping[str, str]] = {
    "LimitRange": "limitranges",
    "ResourceQuota": "resourcequotas",
}
# The client Job's pod and the one its backoff makes while the failed one is still going.
CLIENT_PODS: Final = 2
# A container that states no request asks for this much, or the cap when that is lower.
DEFAULT_REQUESTS: Final[Mapping[str, Quantity]] = {
    "cpu": "100m",
    "memory": "256Mi",
    "ephemeral-storage": "256Mi",
}


def caps_key(caps: Mapping[str, Quantity]) -> tuple[tuple[str, str], ...]:
    """The caps as a hashable, order-free value: what a cached work or pass compares."""
    return tuple(sorted((k, str(v)) for k, v in caps.items()))


def _plain(value: Decimal) -> str:
    """A quantity as a plain decimal string, which every Kubernetes version accepts."""
    return format(value.normalize(), "f")


def _quota_key(resource: str) -> str | None:
    """The ResourceQuota key that bounds `resource` over the namespace (None: none does)."""
    if resource in UNCAPPED_RESOURCES:
        return f"limits.{resource}"
    # Extended resources (a domain-prefixed name) and huge pages are bounded by request only.
    if "/" in resource or resource.startswith("hugepages-"):
        return f"requests.{resource}"
    return None


def limit_range(
    caps: Mapping[str, Quantity], namespace: str, labels: Mapping[str, str]
) -> dict[str, Any] | None:
    """The client namespace's LimitRange (None: cpu, memory and ephemeral-storage uncapped)."""
    capped = {r: caps[r] for r in UNCAPPED_RESOURCES if r in caps}
    if not capped:
        return None
    requests = {
        r: str(cap)
        if parse_quantity(cap) <= parse_quantity(DEFAULT_REQUESTS[r])
        else str(DEFAULT_REQUESTS[r])
        for r, cap in capped.items()
    }
    limits = {r: str(cap) for r, cap in capped.items()}
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": LIMIT_RANGE_NAME, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "limits": [
                {"type": "Container", "max": limits, "default": limits, "defaultRequest": requests}
            ]
        },
    }


def resource_quota(
    caps: Mapping[str, Quantity], namespace: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    """The client namespace's ResourceQuota: CLIENT_PODS pods, CLIENT_PODS times each cap."""
    hard: dict[str, str] = {"pods": str(CLIENT_PODS)}
    for resource, cap in sorted(caps.items()):
        key = _quota_key(resource)
        if key is not None:
            hard[key] = _plain(parse_quantity(cap) * CLIENT_PODS)
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": QUOTA_NAME, "namespace": namespace, "labels": dict(labels)},
        "spec": {"hard": hard},
    }


def client_limits(
    caps: Mapping[str, Quantity], namespace: str, labels: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The LimitRange (when any compute resource is capped) and the ResourceQuota, in the
    order a work applies them: both before the client Job, so its pod is admitted under them."""
    limits = limit_range(caps, namespace, labels)
    return [*([limits] if limits is not None else []), resource_quota(caps, namespace, labels)]
