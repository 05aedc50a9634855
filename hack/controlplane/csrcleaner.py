"""kube-controller-manager's csrcleaner on a short clock (TEST INFRASTRUCTURE).

A real hub deletes CertificateSigningRequests that were issued or denied an hour after the
decision (k8s pkg/controller/certificates/cleaner: approvedExpiration, deniedExpiration; fixed
constants, no flag). A test session reuses one plane for longer than that matters: OCM's
registration agent stops asking for an addon's hub kubeconfig once 10 CSRs of that addon and
cluster exist on the hub (ocm register/csr/options.go, addonCSRThreshold), and every
enable of the addon makes one. The supervisor therefore deletes decided CSRs after `MAX_AGE_S`
instead of an hour. It also means the hub controller's record of issued hub credentials
(docs/security.md) is exercised as on a real hub: the CSRs it learned them from go away.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Mapping
from typing import Any

from ocmfl.kube import Kube, KubeError

log = logging.getLogger(__name__)

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
MAX_AGE_S = 60.0
PERIOD_S = 10.0


def decided_at(csr: Mapping[str, Any]) -> dt.datetime | None:
    """When the CSR was issued, denied or failed (its condition's lastUpdateTime, else the
    CSR's creation); None while it is undecided (pending, or approved and not yet signed)."""
    status = csr.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    final = [c for t, c in conds.items() if t in ("Denied", "Failed")]
    if status.get("certificate") and "Approved" in conds:
        final.append(conds["Approved"])
    if not final:
        return None
    stamps = [c.get("lastUpdateTime") or c.get("lastTransitionTime") for c in final] + [
        (csr.get("metadata") or {}).get("creationTimestamp")
    ]
    for stamp in stamps:
        if stamp:
            return dt.datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    return None


def expired(csr: Mapping[str, Any], now: dt.datetime, max_age_s: float = MAX_AGE_S) -> bool:
    at = decided_at(csr)
    return at is not None and (now - at).total_seconds() > max_age_s


class CSRCleaner:
    """One thread: every PERIOD_S, delete the hub's decided CSRs older than MAX_AGE_S."""

    def __init__(self, hub: Kube, stop: threading.Event) -> None:
        self.hub = hub
        self.stop = stop
        self.thread = threading.Thread(target=self._run, name="csrcleaner", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def sweep(self) -> int:
        now = dt.datetime.now(dt.UTC)
        gone = 0
        for csr in (self.hub.get(CSRS) or {}).get("items") or []:
            if expired(csr, now):
                name = csr["metadata"]["name"]
                self.hub.delete(f"{CSRS}/{name}")
                gone += 1
        return gone

    def _run(self) -> None:
        while not self.stop.wait(PERIOD_S):
            try:
                if gone := self.sweep():
                    log.info("csrcleaner: %d decided CSRs deleted", gone)
            except (KubeError, OSError, ValueError) as e:
                log.warning("csrcleaner: %s", e)
