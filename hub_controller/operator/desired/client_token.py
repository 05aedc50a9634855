"""The federation's token for the agents' local metrics API (pure apart from `new_token`).

Each FederatedLearning gets one random token, kept in a hub Secret in its own namespace (owned
by the resource, so it goes with it) and delivered by its ManifestWorks into the client
namespace on each cluster (`works.desired_work(client_token=...)`), where only that
federation's client pod mounts it. The agent accepts a metrics post for a federation only with
that federation's token: another tenant's pod on the same cluster cannot write its status.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Mapping
from typing import Any, Final

from hub_controller.api import FLRef
from ocmfl import constants
from ocmfl.names import hub_side_name

COMPONENT: Final = "client"
TOKEN_BYTES: Final = 32


def token_secret_name(ref: FLRef) -> str:
    """The hub Secret (in the resource's namespace) that keeps the token."""
    return hub_side_name(ref.name, "client-token")


def new_token() -> str:
    """A fresh random token (URL-safe text, 256 bits)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_from_secret(secret: Mapping[str, Any] | None, ref: FLRef) -> str | None:
    """The token the hub Secret holds for this resource, or None (none, unreadable, or the
    Secret belongs to another uid: never reuse another resource's token)."""
    if secret is None:
        return None
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if labels.get(constants.LABEL_OWNER_UID) != ref.uid:
        return None
    raw = (secret.get("data") or {}).get(constants.CLIENT_TOKEN_KEY)
    try:
        token = base64.b64decode(str(raw), validate=True).decode() if raw else ""
    except (binascii.Error, UnicodeDecodeError):
        return None
    return token if len(token) >= TOKEN_BYTES else None


def owned_by_other(secret: Mapping[str, Any] | None, ref: FLRef) -> bool:
    """A Secret of that name exists and another resource (uid) owns it."""
    if secret is None:
        return False
    labels = (secret.get("metadata") or {}).get("labels") or {}
    return labels.get(constants.LABEL_OWNER_UID) != ref.uid


def desired_token_secret(ref: FLRef, token: str) -> dict[str, Any]:
    """The hub Secret holding `token`, owned by the resource."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": token_secret_name(ref),
            "namespace": ref.namespace,
            "labels": ref.labels(COMPONENT),
            "ownerReferences": [ref.owner_reference()],
        },
        "data": {constants.CLIENT_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }
