"""The project's CSR signer for agent identities: applies `policy.decide_csr` to the hub's
CertificateSigningRequests (approve and sign, or deny; foreign CSRs untouched).

`CSRSigner` lists and watches CSRs and writes outcomes through the certificates API.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import threading
from collections.abc import Callable, Collection
from typing import Any

from hub_controller.membership import is_accepted
from hub_controller.signer.policy import (
    Approve,
    Decision,
    Deny,
    Ignore,
    approval_condition,
    decide_csr,
    sign_request,
)
from ocmfl import constants, pki

log = logging.getLogger(__name__)


# --- I/O edge ------------------------------------------------------------------------------
def load_ca_from_secret(core_api: Any, namespace: str, name: str) -> pki.CertAndKey:
    """The signing CA from a kubernetes.io/tls Secret on the hub."""
    secret = core_api.read_namespaced_secret(name, namespace)
    data = secret.data or {}
    return pki.load_cert_and_key(
        base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"])
    )


def registered_clusters(custom_api: Any) -> set[str]:
    """Accepted ManagedClusters that have ManagedClusterAddOn constants.ADDON_NAME."""
    mcs = custom_api.list_cluster_custom_object(constants.CLUSTER_GROUP, "v1", "managedclusters")
    accepted = {m["metadata"]["name"] for m in mcs.get("items", []) if is_accepted(m)}
    mcas = custom_api.list_cluster_custom_object(
        constants.ADDON_GROUP,
        "v1alpha1",
        "managedclusteraddons",
        field_selector=f"metadata.name={constants.ADDON_NAME}",
    )
    enabled = {m["metadata"]["namespace"] for m in mcas.get("items", [])}
    return accepted & enabled


class CSRSigner:
    """Applies `decide_csr` to CSRs: approve + sign, or deny; foreign CSRs untouched."""

    def __init__(
        self,
        api_client: Any,
        ca: Callable[[], pki.CertAndKey],
        known_clusters: Callable[[], Collection[str]],
        *,
        clock: Callable[[], dt.datetime] = pki.utcnow,
    ) -> None:
        from kubernetes import client

        self._api_client = api_client
        self.certs: Any = client.CertificatesV1Api(api_client)
        self.ca = ca
        self.known_clusters = known_clusters
        self.clock = clock
        self._stop = threading.Event()
        # UIDs signed by this process: the watch still shows them approved-but-unsigned for
        # one more event, and a certificate can be set only once.
        self._signed: set[str] = set()

    def handle(self, csr: dict[str, Any]) -> Decision:
        """Decide on one CSR (camelCase dict) and write the outcome."""
        if (csr.get("spec") or {}).get("signerName") != constants.SIGNER_NAME:
            return Ignore("not our signer")  # without listing clusters
        decision = decide_csr(csr, self.known_clusters())
        name, uid = csr["metadata"]["name"], csr["metadata"].get("uid", "")
        if isinstance(decision, Ignore):
            return decision
        if isinstance(decision, Approve) and uid in self._signed:
            return Ignore("signed by this signer already")
        if isinstance(decision, Deny) or not decision.already_approved:
            body = dict(csr)
            status = dict(body.get("status") or {})
            status["conditions"] = [
                *(status.get("conditions") or []),
                approval_condition(decision, self.clock()),
            ]
            body["status"] = status
            updated = self.certs.replace_certificate_signing_request_approval(name, body)
            csr = self._api_client.sanitize_for_serialization(updated)
            log.info("CSR %s: %s", name, decision)
        if isinstance(decision, Approve):
            cert = sign_request(csr, decision, self.ca())
            self._signed.add(uid)
            self.certs.patch_certificate_signing_request_status(
                name, {"status": {"certificate": cert}}
            )
            log.info("CSR %s signed for cluster %s (%s)", name, decision.cluster, decision.lifetime)
        return decision

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """List + watch CSRs until stop(); errors relist after a pause."""
        from kubernetes import watch

        serialize = self._api_client.sanitize_for_serialization
        while not self._stop.is_set():
            try:
                listing = self.certs.list_certificate_signing_request()
                for item in listing.items:
                    self._safe_handle(serialize(item))
                w = watch.Watch()  # type: ignore[no-untyped-call]
                for event in w.stream(  # type: ignore[no-untyped-call]
                    self.certs.list_certificate_signing_request,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=60,
                ):
                    if self._stop.is_set():
                        w.stop()  # type: ignore[no-untyped-call]
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._safe_handle(serialize(event["object"]))
            except Exception as e:
                log.warning("CSR watch failed (%s); relisting", e)
                self._stop.wait(2.0)

    def _safe_handle(self, csr: dict[str, Any]) -> None:
        try:
            self.handle(csr)
        except Exception:
            log.exception("CSR %s: handling failed", (csr.get("metadata") or {}).get("name"))
