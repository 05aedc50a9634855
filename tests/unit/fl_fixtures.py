"""Builders shared by the hub-controller unit tests (no cluster needed)."""

from __future__ import annotations

from typing import Any

from hub_controller.api import FederatedLearningSpec, FLRef, claim_placement, parse_spec

REF = FLRef(namespace="team-a", name="digits", uid="0000-uid")


def spec_dict(**server: Any) -> dict[str, Any]:
    """A minimal valid spec as a user writes it (camelCase), with server fields overridden."""
    return {
        "server": {
            "rounds": 3,
            "minAvailableClients": 2,
            "app": {"path": "/opt/ocm-fl/apps/digits"},
            **server,
        },
        "client": {
            "dataClaim": "fl.data-path",
            "placement": claim_placement("fl.data-path"),
        },
    }


def spec(**server: Any) -> FederatedLearningSpec:
    return parse_spec(spec_dict(**server), REF.name)
