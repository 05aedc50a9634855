"""The hub-identity ledger as `ocm-fl-hub` keeps it: the kopf edge of `hub_identity`.

Every event of the addon's hub-credential CSRs (OCM KubeClient registration: signer
kubernetes.io/kube-apiserver-client, label open-cluster-management.io/addon-name =
federated-learning) goes through `Ledger.observe`:

- a credential issued to cluster <c> through <c>'s own registration agent is recorded in the
  annotation `hub_identity.ANNOTATION` of <c>'s ManagedClusterAddOn, so the record outlives
  the CSR (the hub's kube-controller-manager deletes issued CSRs an hour after approval) and
  this process. Only the hub controller writes it: registration agents may patch only
  `managedclusteraddons/status`, and a status update ignores metadata;
- a forged one (anyone else asked for <c>'s addon credential) is logged and posted as a
  Warning Event `ForgedAddonIdentity` on the CSR, once when seen and once when issued. It is
  never recorded, so the signers never trust that certificate.

The hub controller only watches these CSRs: it has no approve or deny right on
kubernetes.io/kube-apiserver-client (OCM's addon manager approves them).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf

from hub_controller.signer.addon_status import Outcome
from hub_controller.signer.csr_events import (
    CSR_RESOURCE,
    HUB_CREDENTIAL_CSRS,
    handle_with_retries,
)
from hub_controller.signer.hub_identity import (
    ANNOTATION,
    Forged,
    HubIdentity,
    addon_csr_cluster,
    classify,
    ledger_of,
    merge_ledger,
    render_ledger,
)
from ocmfl import constants, pki
from ocmfl.kube import Kube, path_of

log = logging.getLogger(__name__)

FORGED_REASON: Final = "ForgedAddonIdentity"
# (the CSR, reason, message) -> a Warning Event on the CSR
Warn = Callable[[Mapping[str, Any], str, str], None]


def addon_path(cluster: str) -> str:
    """The REST path of `cluster`'s ManagedClusterAddOn of this addon."""
    return path_of(
        f"{constants.ADDON_GROUP}/v1alpha1",
        "ManagedClusterAddOn",
        cluster,
        constants.ADDON_NAME,
    )


@dataclass
class Ledger:
    """Records trusted hub credentials, warns about forged ones (`memo.ledger`)."""

    kube: Kube
    warn: Warn
    clock: Callable[[], dt.datetime] = pki.utcnow
    # (CSR uid, issued) already warned about; (cluster, fingerprint) already recorded.
    warned: set[tuple[str, bool]] = field(default_factory=set)
    recorded: set[tuple[str, str]] = field(default_factory=set)
    # Told what became of a cluster's own addon credential (its ManagedClusterAddOn's
    # condition): issued, or denied by whoever denied it.
    report: Callable[[str, Outcome], None] | None = None

    def observe(self, csr: Mapping[str, Any]) -> HubIdentity | Forged | None:
        """One event of an addon hub-credential CSR: record or warn; what it was."""
        found = classify(csr)
        if isinstance(found, Forged):
            meta = csr.get("metadata") or {}
            key = (str(meta.get("uid") or meta.get("name") or ""), found.issued)
            if key not in self.warned:
                self.warned.add(key)
                log.warning("%s: %s", FORGED_REASON, found.message())
                self.warn(csr, FORGED_REASON, found.message())
        elif (
            isinstance(found, HubIdentity)
            and (found.cluster, found.fingerprint) not in self.recorded
        ):
            if self.record(found) and self.report is not None:
                self.report(found.cluster, Outcome("HubCredentialIssued", "issued", ok=True))
        elif found is None and self.report is not None:
            denied = next(
                (
                    c
                    for c in (csr.get("status") or {}).get("conditions") or []
                    if c.get("type") == "Denied"
                ),
                None,
            )
            cluster = addon_csr_cluster(csr)
            if denied is not None and cluster is not None:
                name = (csr.get("metadata") or {}).get("name")
                self.report(
                    cluster,
                    Outcome(
                        "HubCredentialDenied",
                        f"OCM's KubeClient CSR {name} for the addon's hub kubeconfig was denied "
                        f"({denied.get('reason')}: {denied.get('message')})",
                    ),
                )
        return found

    def record(self, identity: HubIdentity) -> bool:
        """Add `identity` to its cluster's ledger annotation; True when written. The patch
        carries the resourceVersion read, so a concurrent change is a 409 (retried)."""
        path = addon_path(identity.cluster)
        addon = self.kube.get(path)
        meta = (addon or {}).get("metadata") or {}
        if addon is None or meta.get("deletionTimestamp"):
            log.info(
                "hub credential %s of cluster %s not recorded: its ManagedClusterAddOn is gone",
                identity.fingerprint,
                identity.cluster,
            )
            return False
        entries, problem = ledger_of(identity.cluster, meta.get("annotations"))
        if problem:
            log.warning("%s; rewriting it", problem)
        merged = merge_ledger(entries, identity, self.clock())
        if identity not in merged:  # expired already
            return False
        if merged == entries and problem is None:
            self.recorded.add((identity.cluster, identity.fingerprint))
            return False
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {ANNOTATION: render_ledger(merged)},
            }
        }
        self.kube.patch(path, patch)
        self.recorded.add((identity.cluster, identity.fingerprint))
        log.info(
            "cluster %s: hub credential X509SHA256=%s (CSR %s, until %s) recorded",
            identity.cluster,
            identity.fingerprint,
            identity.csr,
            identity.not_after,
        )
        return True


def _post_warning(csr: Mapping[str, Any], reason: str, message: str) -> None:
    kopf.warn(dict(csr), reason=reason, message=message)  # type: ignore[arg-type]


@kopf.on.startup()
def start_ledger(memo: kopf.Memo, **_: Any) -> None:
    def report(cluster: str, outcome: Outcome) -> None:
        status = memo.get("addon_status")  # hub_controller.signer.addon_status, when loaded
        if status is not None:
            status.credential(cluster, outcome)

    memo.ledger = Ledger(Kube(field_manager="ocm-fl-ledger"), _post_warning, report=report)


@kopf.on.event(*CSR_RESOURCE, **HUB_CREDENTIAL_CSRS)
def hub_credential_csr(
    type: str | None, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Every event of an addon hub-credential CSR (kopf runs sync handlers in a thread)."""
    if type == "DELETED":
        return
    ledger: Ledger = memo.ledger

    def handle(csr: dict[str, Any]) -> str | None:
        ledger.observe(csr)
        return None

    handle_with_retries(ledger.kube, dict(body), handle, logger, "hub credential CSR")
