"""The project's own CSR signer for agent identities (signerName = constants.SIGNER_NAME).

`decide_csr` is the whole policy, pure: a CSR for our signer is approved only when its
subject names exactly one cluster that is registered (accepted ManagedCluster with the
addon enabled), the requester is that cluster's addon agent, and it asks for client auth
only. Certificates last at most `MAX_LIFETIME` (spec.expirationSeconds honoured below that).
CSRs for other signers are never touched. The CA private key stays on the hub.
`CSRSigner` applies decisions through the certificates API (plain watch, one thread).
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ocmfl import constants, pki

log = logging.getLogger(__name__)

MAX_LIFETIME: Final = dt.timedelta(hours=24)
MIN_LIFETIME: Final = dt.timedelta(minutes=10)
LABEL_CLUSTER_NAME: Final = "open-cluster-management.io/cluster-name"
LABEL_ADDON_NAME: Final = "open-cluster-management.io/addon-name"
ALLOWED_USAGES: Final = frozenset({"client auth", "digital signature", "key encipherment"})


@dataclass(frozen=True)
class Approve:
    cluster: str
    lifetime: dt.timedelta
    already_approved: bool = False


@dataclass(frozen=True)
class Deny:
    reason: str  # CamelCase condition reason
    message: str


@dataclass(frozen=True)
class Ignore:
    why: str


Decision = Approve | Deny | Ignore


def agent_group(cluster: str, addon: str = constants.ADDON_NAME) -> str:
    """The group OCM gives the addon agent of `cluster` (its hub kubeconfig identity)."""
    return f"system:open-cluster-management:cluster:{cluster}:addon:{addon}"


def _conditions(csr: Mapping[str, Any]) -> set[str]:
    status = csr.get("status") or {}
    return {c.get("type", "") for c in status.get("conditions") or []}


def decide_csr(csr: Mapping[str, Any], known_clusters: Collection[str]) -> Decision:
    """What to do with one CertificateSigningRequest (a camelCase dict)."""
    spec = csr.get("spec") or {}
    if spec.get("signerName") != constants.SIGNER_NAME:
        return Ignore("not our signer")
    conditions = _conditions(csr)
    if (csr.get("status") or {}).get("certificate"):
        return Ignore("already signed")
    if conditions & {"Denied", "Failed"}:
        return Ignore("already denied or failed")
    try:
        request = pki.load_csr_pem(base64.b64decode(spec.get("request") or "", validate=True))
        pki.verify_csr(request)
    except (ValueError, pki.CSRError) as e:
        return Deny("InvalidRequest", f"spec.request is not a valid signed CSR: {e}")
    try:
        cluster = pki.cluster_from_subject(pki.subject_of(request))
    except pki.IdentityError as e:
        return Deny("BadSubject", str(e))
    if cluster not in known_clusters:
        return Deny(
            "UnknownCluster",
            f"cluster {cluster!r} is not an accepted ManagedCluster with the addon enabled",
        )
    labels = (csr.get("metadata") or {}).get("labels") or {}
    if labels.get(LABEL_CLUSTER_NAME) != cluster:
        return Deny("ClusterMismatch", f"label {LABEL_CLUSTER_NAME} must be {cluster!r}")
    if agent_group(cluster) not in (spec.get("groups") or []):
        return Deny(
            "RequesterMismatch",
            f"requester {spec.get('username')!r} is not the addon agent of cluster {cluster!r}",
        )
    usages = set(spec.get("usages") or [])
    if "client auth" not in usages or not usages <= ALLOWED_USAGES:
        return Deny(
            "BadUsages",
            f"usages must be client auth (+ digital signature, key "
            f"encipherment), got {sorted(usages)}",
        )
    lifetime = MAX_LIFETIME
    seconds = spec.get("expirationSeconds")
    if seconds is not None:
        if not isinstance(seconds, int) or seconds < MIN_LIFETIME.total_seconds():
            return Deny(
                "BadExpiration",
                f"expirationSeconds must be at least {int(MIN_LIFETIME.total_seconds())}",
            )
        lifetime = min(lifetime, dt.timedelta(seconds=seconds))
    return Approve(cluster, lifetime, already_approved="Approved" in conditions)


def sign_request(csr: Mapping[str, Any], decision: Approve, ca: pki.CertAndKey) -> str:
    """Base64 PEM certificate for an approved CSR (what status.certificate holds)."""
    request = pki.load_csr_pem(base64.b64decode(csr["spec"]["request"]))
    cert = pki.sign_csr(request, ca, lifetime=decision.lifetime, max_lifetime=MAX_LIFETIME)
    return base64.b64encode(pki.cert_to_pem(cert)).decode()


def approval_condition(decision: Approve | Deny, now: dt.datetime) -> dict[str, Any]:
    ts = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(decision, Approve):
        return {
            "type": "Approved",
            "status": "True",
            "reason": "AgentIdentity",
            "message": f"addon agent of cluster {decision.cluster}",
            "lastUpdateTime": ts,
            "lastTransitionTime": ts,
        }
    return {
        "type": "Denied",
        "status": "True",
        "reason": decision.reason,
        "message": decision.message,
        "lastUpdateTime": ts,
        "lastTransitionTime": ts,
    }


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
    from hub_controller.aggregator.registry import is_accepted

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
