"""Who may post metrics for a federation: whoever holds its token (pure apart from the clock).

The hub's ManifestWork puts the federation's token in Secret `constants.CLIENT_TOKEN_SECRET`
in the federation's client namespace on this cluster, and only that federation's client pod
mounts it. A metrics post for federation (namespace, name) is accepted only with
`Authorization: Bearer <that token>`; the agent reads the Secret (its RBAC allows `get` on
Secrets of that one name) and keeps it for a short while.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from agent_addon.phase import RunKey
from agent_addon.state import Forbidden, Unauthorized
from ocmfl import constants
from ocmfl.names import cluster_side_name

TOKEN_TTL_S: Final = 30.0  # a known token is trusted this long before it is read again
MIN_REREAD_S: Final = 1.0  # a wrong or missing token reads the Secret at most this often

SecretReader = Callable[[str, str], Mapping[str, Any] | None]  # (namespace, name) -> Secret


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


@dataclass(frozen=True)
class _Known:
    token: str | None  # None: no usable Secret
    uid: str
    read_at: float


def _token_of(secret: Mapping[str, Any] | None) -> tuple[str | None, str]:
    if secret is None:
        return None, ""
    labels = (secret.get("metadata") or {}).get("labels") or {}
    raw = (secret.get("data") or {}).get(constants.CLIENT_TOKEN_KEY)
    try:
        token = base64.b64decode(str(raw), validate=True).decode() if raw else ""
    except (binascii.Error, UnicodeDecodeError):
        token = ""
    return token or None, str(labels.get(constants.LABEL_OWNER_UID) or "")


class TokenCheck:
    """Checks a post's token against its federation's Secret on this cluster."""

    def __init__(self, read_secret: SecretReader, clock: Callable[[], float] = time.monotonic):
        self._read = read_secret
        self._clock = clock
        self._lock = threading.Lock()
        self._known: dict[RunKey, _Known] = {}

    def _lookup(self, run: RunKey, presented: str) -> _Known:
        now = self._clock()
        with self._lock:
            known = self._known.get(run)
        if known is not None:
            age = now - known.read_at
            fresh = known.token is not None and hmac.compare_digest(known.token, presented)
            if (fresh and age < TOKEN_TTL_S) or (not fresh and age < MIN_REREAD_S):
                return known
        token, uid = _token_of(self._read(cluster_side_name(*run), constants.CLIENT_TOKEN_SECRET))
        known = _Known(token, uid, now)
        with self._lock:
            self._known[run] = known
            if len(self._known) > 10_000:  # runs come and go: forget the oldest
                oldest = min(self._known, key=lambda k: self._known[k].read_at)
                del self._known[oldest]
        return known

    def verify(self, run: RunKey, presented: str | None) -> str:
        """The uid of federation `run` when `presented` is its token; else Unauthorized (no
        token) or Forbidden (no such federation here, or another token)."""
        ns, name = run
        if not presented:
            raise Unauthorized(
                "Authorization: a bearer token is required: the client sends the token the "
                f"controller mounts at {constants.CLIENT_TOKEN_DIR} (workloads.sdk does)"
            )
        known = self._lookup(run, presented)
        where = f"Secret {constants.CLIENT_TOKEN_SECRET} in namespace {cluster_side_name(*run)}"
        if known.token is None:
            raise Forbidden(f"fl_namespace, fl_name: {ns}/{name} has no client here (no {where})")
        if not hmac.compare_digest(known.token, presented):
            raise Forbidden(f"Authorization: not the token of {ns}/{name} ({where})")
        return known.uid
