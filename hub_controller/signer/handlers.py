"""The project's CSR signer for agent identities, as kopf handlers in `ocm-fl-hub`.

kopf watches the hub's CertificateSigningRequests for our signer name (foreign CSRs never
reach the handler) and `Signer.handle` applies `policy.decide_csr` to each: approve and sign,
or deny. Who may get a certificate comes from the hub's one membership source, the
ManagedCluster and ManagedClusterAddOn indexes; the CA is the hub CA (`memo.ca`).
`ocm-fl-hub` imports this module only with OCMFL_RUN_CSR_SIGNER=true.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

from hub_controller.ca import HubCA
from hub_controller.membership import Registry
from hub_controller.operator.indexes import Indexes
from hub_controller.signer.csr_events import CSR_API_VERSION, handle_with_retries
from hub_controller.signer.policy import (
    Approve,
    Decision,
    Deny,
    Ignore,
    approval_condition,
    decide_csr,
    sign_request,
)
from ocmfl import certlife, constants, pki
from ocmfl.kube import Kube, path_of

log = logging.getLogger(__name__)


@dataclass
class Signer:
    """Writes the policy's decision on a CSR; kept in kopf's memo as `memo.signer`."""

    kube: Kube
    ca: HubCA
    clock: Callable[[], dt.datetime] = pki.utcnow
    # UIDs signed by this process: the watch still shows them approved-but-unsigned for one
    # more event, and a certificate can be set only once.
    signed: set[str] = field(default_factory=set)

    def handle(self, csr: dict[str, Any], members: Registry) -> Decision:
        """Decide on one CSR (as the API returns it) and write the outcome."""
        if (csr.get("spec") or {}).get("signerName") != constants.SIGNER_NAME:
            return Ignore("not our signer")
        decision = decide_csr(csr, members.registered(), certlife.lifetime_override())
        name, uid = csr["metadata"]["name"], csr["metadata"].get("uid", "")
        if isinstance(decision, Ignore):
            return decision
        if isinstance(decision, Approve) and uid in self.signed:
            return Ignore("signed by this signer already")
        path = path_of(CSR_API_VERSION, "CertificateSigningRequest", None, name)
        if isinstance(decision, Deny) or not decision.already_approved:
            status = dict(csr.get("status") or {})
            status["conditions"] = [
                *(status.get("conditions") or []),
                approval_condition(decision, self.clock()),
            ]
            csr = self.kube.put(f"{path}/approval", {**csr, "status": status})
            log.info("CSR %s: %s", name, decision)
        if isinstance(decision, Approve):
            cert = sign_request(csr, decision, self.ca.get())
            self.signed.add(uid)
            self.kube.patch(f"{path}/status", {"status": {"certificate": cert}})
            log.info("CSR %s signed for cluster %s (%s)", name, decision.cluster, decision.lifetime)
        return decision


@kopf.on.startup()
def start_signer(memo: kopf.Memo, **_: Any) -> None:
    memo.signer = Signer(Kube(field_manager="ocm-fl-signer"), memo.setdefault("ca", HubCA()))


@kopf.on.event(
    "certificates.k8s.io",
    "v1",
    "certificatesigningrequests",
    field="spec.signerName",
    value=constants.SIGNER_NAME,
)
def csr_changed(
    type: str | None, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **kwargs: Any
) -> None:
    """Every event of one of our CSRs (kopf runs sync handlers in its thread pool)."""
    if type == "DELETED":
        return
    signer: Signer = memo.signer
    members = Indexes.of(kwargs).members()

    def handle(csr: dict[str, Any]) -> None:
        signer.handle(csr, members)

    handle_with_retries(signer.kube, dict(body), handle, logger, "CSR")
