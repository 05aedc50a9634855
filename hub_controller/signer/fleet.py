"""The Fleet signer: certificates for keys each cluster's agent made on that cluster.

An agent asks, per federation that has a work on its cluster, for a Fleet client certificate
(`constants.FLEET_SIGNER_NAME`). `decide_fleet_csr` (pure) approves only when the requester is
that cluster's addon agent with a hub credential OCM issued to it through the cluster's own
registration agent (`policy.check_requester`, the agent signer's own check), the cluster is
registered, and the federation named by uid in the CSR has a ManifestWork on that cluster.
The certificate is signed with that federation's own Fleet CA (kept in the signer's namespace,
hub_controller.signer.fleet_server),
and the SuperNode public key the CSR carries is stored beside it for the server to register.
No private key of the cluster ever reaches the hub.
Always runs in `ocm-fl-hub`, next to the agent signer.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf

from hub_controller import credentials_layout
from hub_controller.api import FLRef
from hub_controller.membership import Registry
from hub_controller.membership_indexes import members_of
from hub_controller.signer.csr_events import (
    CSR_RESOURCE,
    decide_with_retries,
    of_signer,
    write_decision,
)
from hub_controller.signer.fleet_server import FleetCAs
from hub_controller.signer.policy import (
    WAITING_FOR_LEDGER,
    Deny,
    Ignore,
    Members,
    check_requester,
    conditions_of,
    csr_condition,
    defer_unverified,
    open_request,
    requested_lifetime,
)
from ocmfl import certlife, constants, pki
from ocmfl.kube import MERGE_PATCH, Kube, KubeError, path_of

log = logging.getLogger(__name__)

ALLOWED_USAGES: Final = frozenset({"client auth", "digital signature", "key encipherment"})
NO_CA_YET: Final = "the federation's Fleet CA is not there yet"
WORKS: Final = f"/apis/{constants.WORK_GROUP}/v1/namespaces/{{cluster}}/manifestworks"


@dataclass(frozen=True)
class ApproveFleet:
    cluster: str
    ref: FLRef  # the federation, from its work on the cluster
    supernode_key: bytes  # OpenSSH public key line
    lifetime: dt.timedelta
    already_approved: bool = False


FleetDecision = ApproveFleet | Deny | Ignore
# (cluster, federation uid) -> labels of that federation's work on the cluster, or None.
WorkLookup = Callable[[str, str], Mapping[str, str] | None]


def decide_fleet_csr(
    csr: Mapping[str, Any],
    members: Members,
    work_of: WorkLookup,
    cap: dt.timedelta | None = None,
    now: dt.datetime | None = None,
) -> FleetDecision:
    """What to do with one CertificateSigningRequest for the Fleet signer (`members`: who is
    registered and the hub credentials issued to each; `cap`: the hub's lifetime cap,
    ocmfl.certlife)."""
    spec = csr.get("spec") or {}
    request = open_request(csr, constants.FLEET_SIGNER_NAME)
    if isinstance(request, Ignore | Deny):
        return request
    uris = pki.uris_of(request)
    fleet = [u for u in uris if u.startswith(constants.FLEET_URI_PREFIX)]
    keys = [u for u in uris if u.startswith(constants.SUPERNODE_KEY_URI_PREFIX)]
    if len(fleet) != 1 or len(keys) != 1 or len(uris) != 2:
        return Deny(
            "BadSubject",
            "the CSR must carry exactly one Fleet URI SAN and one SuperNode key URI SAN",
        )
    others = [n for n in pki.requested_sans(request) if not n.startswith("URI:")]
    if others:
        return Deny(
            "UnexpectedSANs",
            f"a Fleet certificate carries only its Fleet URI; the request also asks for "
            f"{', '.join(others)}",
        )
    try:
        uid, cluster = pki.parse_fleet_uri(fleet[0])
        supernode_key = pki.supernode_key_from_uri(keys[0])
    except ValueError as e:
        return Deny("BadSubject", str(e))
    if pki.subject_of(request) != pki.fleet_subject(cluster):
        return Deny("BadSubject", f"subject must be CN=fleet:{cluster}, O=federated-learning:fleet")
    if cluster not in members.registered():
        return Deny(
            "UnknownCluster",
            f"cluster {cluster!r} is not an accepted ManagedCluster with the addon enabled",
        )
    requester = check_requester(csr, cluster, members.hub_identities(cluster), now or pki.utcnow())
    if requester is not None:
        return requester
    usages = set(spec.get("usages") or [])
    if "client auth" not in usages or not usages <= ALLOWED_USAGES:
        return Deny("BadUsages", f"usages must be client auth, got {sorted(usages)}")
    labels = work_of(cluster, uid)
    if labels is None:
        return Deny(
            "NoWork",
            f"federation {uid} has no ManifestWork on cluster {cluster!r}",
        )
    ns, name = labels.get(constants.LABEL_OWNER_NAMESPACE), labels.get(constants.LABEL_OWNER_NAME)
    if not ns or not name:
        return Deny("NoWork", f"the work of federation {uid} on {cluster!r} names no owner")
    lifetime = requested_lifetime(spec, cap)
    if isinstance(lifetime, Deny):
        return lifetime
    return ApproveFleet(
        cluster,
        FLRef(namespace=ns, name=name, uid=uid),
        supernode_key,
        lifetime,
        already_approved="Approved" in conditions_of(csr),
    )


def node_key_entry(decision: ApproveFleet) -> tuple[str, bytes]:
    """The credentials Secret entry holding the cluster's SuperNode public key."""
    _, _, _, node_pub = credentials_layout.cluster_keys(decision.cluster)
    return node_pub, decision.supernode_key + b" " + decision.cluster.encode() + b"\n"


def _condition(decision: ApproveFleet | Deny, now: dt.datetime) -> dict[str, Any]:
    if isinstance(decision, ApproveFleet):
        message = f"agent of {decision.cluster} for {decision.ref.namespace}/{decision.ref.name}"
        return csr_condition("Approved", "FleetIdentity", message, now)
    return csr_condition("Denied", decision.reason, decision.message, now)


@dataclass
class FleetSigner:
    """Applies `decide_fleet_csr`; kept in kopf's memo as `memo.fleet_signer`."""

    kube: Kube
    cas: FleetCAs | None = None
    clock: Callable[[], dt.datetime] = pki.utcnow
    signed: set[str] = field(default_factory=set)

    def work_of(self, cluster: str, uid: str) -> Mapping[str, str] | None:
        selector = f"{constants.LABEL_OWNER_UID}={uid}"
        found = self.kube.get(WORKS.format(cluster=cluster), {"labelSelector": selector})
        for item in (found or {}).get("items") or []:
            return dict(item["metadata"].get("labels") or {})
        return None

    def handle(self, csr: dict[str, Any], members: Registry) -> FleetDecision:
        now = self.clock()
        decision = decide_fleet_csr(csr, members, self.work_of, certlife.lifetime_override(), now)
        if isinstance(decision, Ignore):
            return decision
        waiting = defer_unverified(csr, decision, now)
        if waiting is not None:
            return waiting
        name, uid = csr["metadata"]["name"], csr["metadata"].get("uid", "")
        if isinstance(decision, ApproveFleet) and uid in self.signed:
            return Ignore("signed by this signer already")
        path = path_of(constants.CSR_API_VERSION, "CertificateSigningRequest", None, name)
        if isinstance(decision, ApproveFleet):
            ca = self._fleet_ca(decision.ref)
            if ca is None:
                return Ignore(NO_CA_YET)
        if isinstance(decision, Deny) or not decision.already_approved:
            csr = write_decision(self.kube, path, csr, _condition(decision, self.clock()))
            log.info("Fleet CSR %s: %s", name, decision)
        if isinstance(decision, ApproveFleet):
            assert ca is not None
            self._store_node_key(decision)
            request = pki.load_csr_pem(base64.b64decode(csr["spec"]["request"]))
            cert = pki.sign_fleet_csr(
                request, ca, decision.ref.uid, decision.cluster, lifetime=decision.lifetime
            )
            chain = pki.cert_to_pem(cert) + pki.cert_to_pem(ca.cert)
            self.signed.add(uid)
            self.kube.patch(
                f"{path}/status", {"status": {"certificate": base64.b64encode(chain).decode()}}
            )
            log.info("Fleet CSR %s signed for %s in %s", name, decision.cluster, decision.ref)
        return decision

    def _fleet_ca(self, ref: FLRef) -> pki.CertAndKey | None:
        """The federation's Fleet CA (made now if it has none yet), None while the signer
        cannot store one."""
        if self.cas is None:
            return None
        try:
            return self.cas.get(ref)
        except KubeError as exc:
            log.warning("no Fleet CA for %s: %s", ref, exc)
            return None

    def _store_node_key(self, decision: ApproveFleet) -> None:
        """The SuperNode public key into the resource's enrolled-keys shard for this cluster
        (credentials_layout.key_shard); the operator copies members' keys to the node-keys
        shards."""
        ref = decision.ref
        name = credentials_layout.enrolled_keys_secret_name(
            credentials_layout.server_name(ref), decision.cluster
        )
        key, value = node_key_entry(decision)
        data = {key: base64.b64encode(value).decode()}
        path = path_of("v1", "Secret", ref.namespace, name)
        if self.kube.get(path) is None:
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {
                    "name": name,
                    "namespace": ref.namespace,
                    "labels": {
                        **ref.labels(credentials_layout.SERVER_COMPONENT),
                        credentials_layout.LABEL_KEYS: "enrolled",
                    },
                    "ownerReferences": [ref.owner_reference()],
                },
                "data": data,
            }
            if self.kube.create(path_of("v1", "Secret", ref.namespace), body) is not None:
                return
        # Merge, not apply: one manager, many clusters' keys side by side.
        self.kube.patch(path, {"data": data}, MERGE_PATCH)


@kopf.on.startup()
def start_fleet_signer(memo: kopf.Memo, **_: Any) -> None:
    kube = Kube(field_manager="ocm-fl-fleet-signer")
    namespace = os.environ.get(constants.ENV_POD_NAMESPACE) or constants.HUB_NAMESPACE
    memo.fleet_signer = FleetSigner(kube, FleetCAs(kube, namespace))


@kopf.on.event(*CSR_RESOURCE, **of_signer(constants.FLEET_SIGNER_NAME))
def fleet_csr_changed(
    type: str | None, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **kwargs: Any
) -> None:
    """Every event of a Fleet CSR (kopf runs sync handlers in its thread pool)."""
    if type == "DELETED":
        return
    # An approved key reaches the running server through the controller, which watches the
    # signed CSR (operator/handlers.py fleet_csr_signed): same process or not. A Fleet CSR can
    # come before its federation's CA Secret, or a moment after the requester's hub
    # credential was issued: wait for them a little.
    waits = (NO_CA_YET, WAITING_FOR_LEDGER)
    signer: FleetSigner = memo.fleet_signer
    decide_with_retries(signer, dict(body), members_of(kwargs), logger, "Fleet CSR", waits)
