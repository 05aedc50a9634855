"""The project's CSR signer for agent identities, as kopf handlers in `ocm-fl-hub`.

kopf watches the hub's CertificateSigningRequests for our signer name (foreign CSRs never
reach the handler) and `Signer.handle` applies `policy.decide_csr` to each: approve and sign,
or deny. Who may get a certificate comes from the hub's one membership source, the
ManagedCluster and ManagedClusterAddOn indexes, and which hub credentials were issued to each
cluster's agent from the ledger and the live addon CSRs (`hub_identity`); the CA is the agent
CA (`memo.agent_ca`, $OCMFL_AGENT_CA_DIR), never the hub CA. `ocm-fl-hub` imports this
module unless OCMFL_RUN_CSR_SIGNER=false.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from hub_controller.ca import CADir, CAUnavailable
from hub_controller.membership import Registry
from hub_controller.membership_indexes import members_of
from hub_controller.signer.addon_status import Outcome
from hub_controller.signer.csr_events import (
    CSR_RESOURCE,
    decide_with_retries,
    of_signer,
    write_decision,
)
from hub_controller.signer.policy import (
    WAITING_FOR_LEDGER,
    Approve,
    Decision,
    Deny,
    Ignore,
    approval_condition,
    check_requester,
    decide_csr,
    defer_unverified,
    sign_request,
)
from ocmfl import certlife, constants, pki
from ocmfl.kube import Kube, path_of

log = logging.getLogger(__name__)


@dataclass
class Signer:
    """Writes the policy's decision on a CSR; kept in kopf's memo as `memo.signer`."""

    kube: Kube
    ca: CADir  # the agent CA
    clock: Callable[[], dt.datetime] = pki.utcnow
    # UIDs signed by this process: the watch still shows them approved-but-unsigned for one
    # more event, and a certificate can be set only once.
    signed: set[str] = field(default_factory=set)
    # Told each decision on a cluster's CSR (its ManagedClusterAddOn's condition).
    report: Callable[[str, Outcome], None] | None = None

    def handle(self, csr: dict[str, Any], members: Registry) -> Decision:
        """Decide on one CSR (as the API returns it) and write the outcome."""
        if (csr.get("spec") or {}).get("signerName") != constants.SIGNER_NAME:
            return Ignore("not our signer")
        now = self.clock()
        decision = decide_csr(csr, members, certlife.lifetime_override(), now)
        name, uid = csr["metadata"]["name"], csr["metadata"].get("uid", "")
        if isinstance(decision, Ignore):
            return decision
        waiting = defer_unverified(csr, decision, now)
        if waiting is not None:
            return waiting
        if isinstance(decision, Approve) and uid in self.signed:
            return Ignore("signed by this signer already")
        ca: pki.CertAndKey | None = None
        if isinstance(decision, Approve):
            try:
                ca = self.ca.get()
            except CAUnavailable as e:
                log.error("CSR %s left pending: %s", name, e)
                return Ignore(str(e))
        path = path_of(constants.CSR_API_VERSION, "CertificateSigningRequest", None, name)
        if isinstance(decision, Deny) or not decision.already_approved:
            csr = write_decision(self.kube, path, csr, approval_condition(decision, self.clock()))
            log.info("CSR %s: %s", name, decision)
        if isinstance(decision, Approve) and ca is not None:
            cert = sign_request(csr, decision, ca)
            self.signed.add(uid)
            self.kube.patch(f"{path}/status", {"status": {"certificate": cert}})
            log.info("CSR %s signed for cluster %s (%s)", name, decision.cluster, decision.lifetime)
        self._report(csr, decision, members, now)
        return decision

    def _report(
        self, csr: Mapping[str, Any], decision: Approve | Deny, members: Registry, now: dt.datetime
    ) -> None:
        """Tell the cluster's addon condition what became of its agent's CSR: only of a CSR its
        genuine agent sent (anyone else's refused request says nothing about that cluster)."""
        labels = (csr.get("metadata") or {}).get("labels") or {}
        cluster = labels.get(constants.LABEL_CLUSTER)
        if self.report is None or not cluster:
            return
        identities = members.hub_identities(str(cluster))
        if check_requester(csr, str(cluster), identities, now) is not None:
            return
        if isinstance(decision, Approve):
            until = (self.clock() + decision.lifetime).strftime("%Y-%m-%dT%H:%M:%SZ")
            outcome = Outcome(
                "AgentIdentityIssued", f"agent identity issued, valid until {until}", ok=True
            )
        else:
            outcome = Outcome(
                f"AgentIdentity{decision.reason}",
                f"CSR {csr['metadata']['name']}: {decision.reason}: {decision.message}",
            )
        self.report(str(cluster), outcome)


@kopf.on.startup()
def start_signer(memo: kopf.Memo, **_: Any) -> None:
    def report(cluster: str, outcome: Outcome) -> None:
        status = memo.get("addon_status")  # hub_controller.signer.addon_status, when loaded
        if status is not None:
            status.agent(cluster, outcome)

    memo.signer = Signer(
        Kube(field_manager="ocm-fl-signer"),
        memo.setdefault("agent_ca", CADir.agent()),
        report=report,
    )


@kopf.on.event(*CSR_RESOURCE, **of_signer(constants.SIGNER_NAME))
def csr_changed(
    type: str | None, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **kwargs: Any
) -> None:
    """Every event of one of our CSRs (kopf runs sync handlers in its thread pool)."""
    if type == "DELETED":
        return
    # A requester's hub credential issued a moment ago: look again (the indexes fill in).
    signer: Signer = memo.signer
    decide_with_retries(signer, dict(body), members_of(kwargs), logger, "CSR", [WAITING_FOR_LEDGER])
