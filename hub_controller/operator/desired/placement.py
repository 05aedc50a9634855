"""Desired OCM Placement for a FederatedLearning resource, and what its status says.

The Placement has the resource's name and namespace and is owned by it. The controller never
creates ManagedClusterSetBindings (that would let any FL author reach any cluster set); a
missing binding is reported as the PlacementSatisfied condition instead.
"""

from __future__ import annotations

from typing import Any, Final

from hub_controller.api import FederatedLearningSpec, FLRef
from ocmfl import constants

PLACEMENT_API_VERSION: Final = f"{constants.CLUSTER_GROUP}/v1beta1"
PLACEMENT_LABEL: Final = f"{constants.CLUSTER_GROUP}/placement"
COMPONENT: Final = "placement"


def placement_name(ref: FLRef) -> str:
    return ref.name


def desired_placement(ref: FLRef, spec: FederatedLearningSpec) -> dict[str, Any]:
    """The Placement object: the embedded PlacementSpec as written, owned by the resource."""
    placement_spec = spec.client.placement.model_dump(by_alias=True, exclude_none=True, mode="json")
    # Empty lists mean "not set" for OCM; leave them out so the Placement reads as written.
    placement_spec = {k: v for k, v in placement_spec.items() if v != []}
    return {
        "apiVersion": PLACEMENT_API_VERSION,
        "kind": "Placement",
        "metadata": {
            "name": placement_name(ref),
            "namespace": ref.namespace,
            "labels": ref.labels(COMPONENT),
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": placement_spec,
    }
