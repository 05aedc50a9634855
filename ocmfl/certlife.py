"""Certificate lifetimes: one setting shortens every leaf certificate the platform issues
(drills, rotation tests), and renewal times follow from each certificate's own dates.

`OCMFL_CERT_LIFETIME_SECONDS` (hub controller; Helm `certificates.lifetimeSeconds`) caps the
lifetime of the agent certificates the hub's CSR signer issues, the Fleet client
certificates of the Fleet signer, each federation's gateway certificate and the aggregator's
server certificate. Unset: their defaults (24 h, 24 h, 30 d, 7 d). CAs and the SuperLink's
loopback certificate keep theirs (Flower reads the SuperLink's pair once, at start).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from typing import Final

from cryptography import x509

ENV_CERT_LIFETIME: Final = "OCMFL_CERT_LIFETIME_SECONDS"
# Below this a renewal (CSR round trip, kubelet's Secret refresh, nginx reload) cannot be
# counted on to land before the old certificate expires.
MIN_LIFETIME_S: Final = 30


class CertLifetimeError(ValueError):
    """The setting is not a whole number of seconds at or above MIN_LIFETIME_S."""


def lifetime_override(env: Mapping[str, str] | None = None) -> dt.timedelta | None:
    """The configured cap on leaf certificate lifetimes (None when unset or empty)."""
    raw = (os.environ if env is None else env).get(ENV_CERT_LIFETIME, "").strip()
    if not raw:
        return None
    try:
        seconds = int(raw)
    except ValueError:
        raise CertLifetimeError(
            f"{ENV_CERT_LIFETIME}={raw!r} is not a whole number of seconds; set e.g. 3600, "
            "or unset it for the default lifetimes"
        ) from None
    if seconds < MIN_LIFETIME_S:
        raise CertLifetimeError(
            f"{ENV_CERT_LIFETIME}={seconds} is below the minimum of {MIN_LIFETIME_S} s "
            "(a renewal must land before the old certificate expires); set at least "
            f"{MIN_LIFETIME_S}"
        )
    return dt.timedelta(seconds=seconds)


def leaf_lifetime(default: dt.timedelta, env: Mapping[str, str] | None = None) -> dt.timedelta:
    """`default`, capped by the setting when it is set."""
    cap = lifetime_override(env)
    return default if cap is None else min(default, cap)


def renew_in(cert: x509.Certificate, renew_below: float, now: dt.datetime) -> float:
    """Seconds until less than `renew_below` of the certificate's lifetime is left (0 when
    that is already so)."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    due = end - (end - start) * renew_below
    return max(0.0, (due - now).total_seconds())
