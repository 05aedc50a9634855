"""CSR events: kopf's filter for one signer's CSRs (the signers, the ledger, the indexes and
the controller), one event handled with retries, and the decision written on a CSR (the
agent signer and the Fleet signer)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, Protocol

from hub_controller.membership import Registry
from hub_controller.signer import csr_outcome
from hub_controller.signer.policy import Ignore
from ocmfl import constants
from ocmfl.kube import Kube, KubeError, path_of

ATTEMPTS: Final = 5  # a transient API failure is retried this often, then left to the next event
# kopf's (group, version, plural) of CertificateSigningRequests.
CSR_RESOURCE: Final = ("certificates.k8s.io", "v1", "certificatesigningrequests")


def of_signer(signer_name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """kopf's filter arguments for the CSRs addressed to `signer_name` (and with `labels`)."""
    return {"field": "spec.signerName", "value": signer_name, "labels": labels}


# The addon's hub-credential CSRs (OCM's KubeClient registration): the ledger and the index.
HUB_CREDENTIAL_CSRS: Final = of_signer(
    constants.KUBE_APISERVER_CLIENT_SIGNER, {constants.LABEL_OCM_ADDON_NAME: constants.ADDON_NAME}
)


def write_decision(
    kube: Kube, path: str, csr: dict[str, Any], condition: dict[str, Any]
) -> dict[str, Any]:
    """Add a signer's `condition` (Approved or Denied) to the CSR at `path` through its
    approval subresource; the CSR as written."""
    status = dict(csr.get("status") or {})
    status["conditions"] = [*(status.get("conditions") or []), condition]
    return kube.put(f"{path}/approval", {**csr, "status": status})


class CSRSigner(Protocol):
    """What `decide_with_retries` needs of a signer (handlers.Signer, fleet.FleetSigner)."""

    @property
    def kube(self) -> Kube: ...

    @property
    def clock(self) -> Callable[[], dt.datetime]: ...

    def handle(self, csr: dict[str, Any], members: Registry) -> object:
        """Decide on one CSR and write the outcome; the decision."""
        ...


def handle_with_retries(
    kube: Kube,
    csr: dict[str, Any],
    handle: Callable[[dict[str, Any]], str | None],
    logger: Any,
    label: str,
) -> None:
    """Run `handle` on `csr` until it returns None (done).

    A transient API failure, or `handle` returning a reason to wait, is retried up to
    ATTEMPTS times with a growing pause, each time on the CSR as it is now (what failed may
    have changed it; a CSR deleted meanwhile ends it). A lasting failure, or a wait that
    outlives the attempts, is logged and left to the CSR's next event.
    """
    name = csr["metadata"]["name"]
    path = path_of(constants.CSR_API_VERSION, "CertificateSigningRequest", None, name)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            if attempt > 1:
                fresh = kube.get(path)
                if fresh is None:
                    return
                csr = fresh
            waiting = handle(csr)
            if waiting is None:
                return
            if attempt == ATTEMPTS:
                logger.warning("%s %s: %s", label, name, waiting)
                return
        except KubeError as exc:
            if not exc.transient or attempt == ATTEMPTS:
                logger.error("%s %s: %s", label, name, exc)
                return
        time.sleep(attempt)


def decide_with_retries(
    signer: CSRSigner,
    csr: dict[str, Any],
    members: Registry,
    logger: Any,
    label: str,
    waits: Collection[str],
) -> None:
    """One event of a CSR of `signer`: mirror its outcome for the cluster's agent once it is
    decided (csr_outcome), and have `signer` decide on it, again (`handle_with_retries`) while
    the decision is to wait for one of `waits`."""

    def handle(csr: dict[str, Any]) -> str | None:
        csr_outcome.mirror(signer.kube, csr, members, signer.clock())  # once decided
        decision = signer.handle(csr, members)
        if isinstance(decision, Ignore) and decision.why in waits:
            return decision.why
        return None

    handle_with_retries(signer.kube, csr, handle, logger, label)
