"""Desired OCM Placement for a FederatedLearning resource, and what its status says.

The Placement has the resource's name and namespace and is owned by it. The controller never
creates ManagedClusterSetBindings (that would let any FL author reach any cluster set); a
missing binding is reported as the PlacementSatisfied condition instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class PlacementState:
    """What the Placement's status says (all empty before the placement controller ran)."""

    exists: bool = False
    satisfied: str | None = None  # "True" | "False" | None (no condition yet)
    reason: str = ""
    message: str = ""
    selected: int | None = None

    @property
    def missing_binding(self) -> bool:
        return self.reason == "NoManagedClusterSetBindings"


def placement_state(placement: Mapping[str, Any] | None) -> PlacementState:
    """Read a Placement object's status into a PlacementState."""
    if placement is None:
        return PlacementState()
    status = placement.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PlacementSatisfied":
            return PlacementState(
                exists=True,
                satisfied=str(cond.get("status")),
                reason=str(cond.get("reason") or ""),
                message=str(cond.get("message") or ""),
                selected=status.get("numberOfSelectedClusters"),
            )
    return PlacementState(exists=True, selected=status.get("numberOfSelectedClusters"))


def placement_condition(
    state: PlacementState, spec: FederatedLearningSpec, namespace: str
) -> tuple[str, str, str]:
    """(status, reason, message) for the resource's PlacementSatisfied condition."""
    if not state.exists:
        return "Unknown", "PlacementPending", "Placement not created yet"
    if state.satisfied is None:
        return "Unknown", "PlacementPending", "waiting for the OCM placement controller"
    if state.missing_binding:
        sets = spec.client.placement.cluster_sets or ["<any set>"]
        return (
            "False",
            "NoManagedClusterSetBindings",
            f"no ManagedClusterSetBinding in namespace {namespace} for cluster set(s) "
            f"{', '.join(sets)}: a hub admin must bind them (e.g. `clusteradm clusterset bind "
            f"{sets[0]} --namespace {namespace}`); the controller never creates bindings",
        )
    reason = state.reason or ("Satisfied" if state.satisfied == "True" else "NotSatisfied")
    return state.satisfied, reason, state.message
