"""Fleet identities born on the cluster: agent CSR -> Fleet signer policy -> identity Secret,
and the hub key scan."""

from __future__ import annotations

import asyncio
import base64
import copy
from collections.abc import Mapping
from typing import Any

import pytest
from hub_creds import HubCredential, issue_hub_credential, registration_agent, requested_with

from agent_addon import fleet_identity as fi
from hack import keyscan
from hub_controller import credentials_layout
from hub_controller.membership import StaticMembers
from hub_controller.signer import fleet_server
from hub_controller.signer.fleet import ApproveFleet, WorkLookup, decide_fleet_csr, node_key_entry
from hub_controller.signer.policy import Deny
from ocmfl import constants, csroutcome, nodekeys, pki
from ocmfl.names import cluster_side_name

UID = "fl-uid-1"
WORK_LABELS = {
    constants.LABEL_OWNER_UID: UID,
    constants.LABEL_OWNER_NAMESPACE: "team",
    constants.LABEL_OWNER_NAME: "digits",
}


CREDS: dict[str, HubCredential] = {c: issue_hub_credential(c) for c in ("c1", "c2")}


def as_submitted(
    body: dict[str, Any], requester: str, credential: HubCredential | None = None
) -> dict[str, Any]:
    """The CSR as the apiserver stores it: with the identity and credential of the requester
    (cluster `requester`'s agent with its own hub kubeconfig, unless `credential` is given)."""
    csr = copy.deepcopy(body)
    csr["metadata"]["name"] = "csr-1"
    stored: dict[str, Any] = requested_with(csr, credential or CREDS[requester])
    return stored


def members(*clusters: str) -> StaticMembers:
    """`clusters` registered, each with its own hub credential in the ledger."""
    out = StaticMembers(clusters)
    for c in clusters:
        out.trust(CREDS[c].identity)
    return out


def works(present: Mapping[tuple[str, str], Mapping[str, str]]) -> WorkLookup:
    return lambda cluster, uid: present.get((cluster, uid))


def request(cluster: str = "c1", uid: str = UID) -> tuple[dict[str, Any], pki.PrivateKey, bytes]:
    key = pki.generate_key()
    node_private, node_public = nodekeys.generate_keypair()
    return fi.fleet_csr_object(cluster, uid, key, node_public), key, node_private


def test_agent_request_is_approved_for_its_own_cluster_and_federation() -> None:
    body, _, node_private = request()
    csr = as_submitted(body, "c1")
    assert keyscan.private_keys(csr) == []  # only public material leaves the cluster
    decision = decide_fleet_csr(csr, members("c1"), works({("c1", UID): WORK_LABELS}))
    assert isinstance(decision, ApproveFleet)
    assert (decision.cluster, decision.ref.namespace, decision.ref.name) == ("c1", "team", "digits")
    # The SuperNode public key reaches the hub from the CSR: it matches the cluster's key.
    name, line = node_key_entry(decision)
    assert name == "c1.node.pub"
    assert line.split()[:2] == nodekeys.public_key_of(node_private).split()[:2]


@pytest.mark.parametrize(
    ("requester", "cluster", "known", "present", "reason"),
    [
        ("c2", "c1", {"c1", "c2"}, {("c1", UID)}, "RequesterMismatch"),  # another cluster's agent
        ("c1", "c1", {"c1"}, set(), "NoWork"),  # the federation has no work on c1
        ("c1", "c1", {"c1"}, {("c2", UID)}, "NoWork"),
        ("c1", "c1", set(), {("c1", UID)}, "UnknownCluster"),
    ],
)
def test_fleet_requests_outside_the_grant_are_denied(
    requester: str, cluster: str, known: set[str], present: set[tuple[str, str]], reason: str
) -> None:
    body, _, _ = request(cluster)
    decision = decide_fleet_csr(
        as_submitted(body, requester), members(*known), works({p: WORK_LABELS for p in present})
    )
    assert isinstance(decision, Deny)
    assert decision.reason == reason


def test_the_fleet_signer_shares_the_agent_signers_requester_check() -> None:
    """A hub credential with c1's addon identity that c10's registration agent obtained
    (OCM's prefix check) gets no Fleet certificate, nor does a requester without one."""
    body, _, _ = request()
    forged = issue_hub_credential("c1", registration_agent("c10"))
    work = works({("c1", UID): WORK_LABELS})
    decision = decide_fleet_csr(as_submitted(body, "c1", forged), members("c1"), work)
    assert isinstance(decision, Deny) and decision.reason == "UnverifiedRequester"
    assert forged.fingerprint in decision.message
    tokenless = as_submitted(body, "c1")
    del tokenless["spec"]["extra"]
    decision = decide_fleet_csr(tokenless, members("c1"), work)
    assert isinstance(decision, Deny) and decision.reason == "UnverifiedRequester"


def test_a_fleet_request_asking_for_names_besides_its_uris_is_denied() -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = pki.generate_key()
    _, node_public = nodekeys.generate_keypair()
    req = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(pki.fleet_subject("c1"))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.UniformResourceIdentifier(pki.fleet_uri(UID, "c1")),
                    x509.UniformResourceIdentifier(pki.supernode_key_uri(node_public)),
                    x509.DNSName("fl-gateway.example.com"),
                ]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    body, _, _ = request()
    body["spec"]["request"] = base64.b64encode(pki.csr_to_pem(req)).decode()
    decision = decide_fleet_csr(
        as_submitted(body, "c1"), members("c1"), works({("c1", UID): WORK_LABELS})
    )
    assert isinstance(decision, Deny) and decision.reason == "UnexpectedSANs"
    assert "DNS:fl-gateway.example.com" in decision.message


def test_a_request_naming_no_supernode_key_or_a_foreign_subject_is_denied() -> None:
    key = pki.generate_key()
    plain = pki.create_csr("c1", key)  # an agent-identity CSR sent to the Fleet signer
    body, _, _ = request()
    body["spec"]["request"] = base64.b64encode(pki.csr_to_pem(plain)).decode()
    decision = decide_fleet_csr(as_submitted(body, "c1"), members("c1"), works({}))
    assert isinstance(decision, Deny) and decision.reason == "BadSubject"


def test_signed_fleet_certificate_is_for_the_requested_key_and_never_an_agent() -> None:
    body, key, _ = request()
    fleet_ca = pki.create_ca("fleet", key_kind="ec")
    csr = pki.load_csr_pem(base64.b64decode(body["spec"]["request"]))
    cert = pki.sign_fleet_csr(csr, fleet_ca, UID, "c1")
    pair = pki.load_cert_and_key(pki.cert_to_pem(cert), pki.key_to_pem(key))
    assert pki.uris_of(pair.cert) == [pki.fleet_uri(UID, "c1")]  # the key URI is not copied
    with pytest.raises(pki.IdentityError):
        pki.cluster_from_certificate(cert)


class FakeHub:
    """Signs Fleet CSRs the way the hub signer does, on the next read."""

    def __init__(self, fleet_ca: pki.CertAndKey) -> None:
        self.ca = fleet_ca
        self.csrs: dict[str, dict[str, Any]] = {}

    def create(self, path: str, body: dict[str, Any], exist_ok: bool = True) -> dict[str, Any]:
        csr = as_submitted(body, "c1")
        csr["metadata"]["name"] = f"csr-{len(self.csrs)}"
        self.csrs[csr["metadata"]["name"]] = csr
        return csr

    def get(self, path: str) -> dict[str, Any] | None:
        """Only the outcome the signer mirrors into the agent's own cluster namespace."""
        assert path.startswith("/api/v1/namespaces/c1/configmaps/"), path
        csr = self.csrs[path.rsplit("/", 1)[1]]
        decision = decide_fleet_csr(csr, members("c1"), works({("c1", UID): WORK_LABELS}))
        assert isinstance(decision, ApproveFleet)
        req = pki.load_csr_pem(base64.b64decode(csr["spec"]["request"]))
        cert = pki.sign_fleet_csr(req, self.ca, UID, "c1")
        chain = pki.cert_to_pem(cert) + pki.cert_to_pem(self.ca.cert)
        csr["status"] = {"certificate": base64.b64encode(chain).decode()}
        return {"data": csroutcome.outcome_data(csr)}


class FakeCluster:
    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, Any]] = {}

    def get(self, path: str, query: Any = None) -> dict[str, Any] | None:
        return self.secrets.get(path)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        self.secrets[f"/api/v1/namespaces/{meta['namespace']}/secrets/{meta['name']}"] = obj
        return obj


def test_agent_writes_the_identity_secret_and_keeps_the_supernode_key_on_renewal() -> None:
    fleet_ca = pki.create_ca("fleet", key_kind="ec")
    local, hub = FakeCluster(), FakeHub(fleet_ca)
    ids = fi.FleetIdentities("c1", local, hub)  # type: ignore[arg-type]
    target = fi.ClientNamespace("fl-team-digits", UID)
    assert asyncio.run(ids.ensure(target)) is True
    [secret] = local.secrets.values()
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert set(data) == {"tls.crt", "tls.key", "ca.crt", "node.key"}
    pair = pki.load_cert_and_key(data["tls.crt"], data["tls.key"])
    assert pki.verify_issued_by(pair.cert, fleet_ca.cert)
    assert data["ca.crt"] == pki.cert_to_pem(fleet_ca.cert)
    assert asyncio.run(ids.ensure(target)) is False  # fresh: nothing to do
    # Expired certificate: a new Fleet key, but the same SuperNode key (already registered).
    stale = pki.issue_fleet_client_cert(
        fleet_ca, UID, "c1", now=pki.utcnow() - pki.MAX_CLIENT_LIFETIME
    )
    secret["data"]["tls.crt"] = base64.b64encode(stale.cert_pem).decode()
    secret["data"]["tls.key"] = base64.b64encode(stale.key_pem).decode()
    assert asyncio.run(ids.ensure(target)) is True
    [renewed] = local.secrets.values()
    assert renewed["data"]["node.key"] == base64.b64encode(data["node.key"]).decode()
    assert pki.load_cert_pem(base64.b64decode(renewed["data"]["tls.crt"])) != stale.cert


def _ns(name: str, uid: str, fed_uid: str | None, cluster: str, fl: str = "digits") -> Any:
    labels = {
        constants.LABEL_CLUSTER: cluster,
        constants.LABEL_OWNER_NAMESPACE: "team-a",
        constants.LABEL_OWNER_NAME: fl,
    }
    if fed_uid:
        labels[constants.LABEL_OWNER_UID] = fed_uid
    return {"metadata": {"name": name, "uid": uid, "labels": labels}}  # fmt: skip


def _amw(work: str, *namespaces: tuple[str, str]) -> Any:
    applied = [{"group": "", "version": "v1", "resource": "namespaces", "name": n, "uid": u}
               for n, u in namespaces]  # fmt: skip
    return {"spec": {"manifestWorkName": work}, "status": {"appliedResources": applied}}


def test_client_namespaces_are_those_the_work_agent_applied_from_the_federations_work() -> None:
    own = cluster_side_name("team-a", "digits")
    items = [
        _ns(own, "ns-uid-1", "u1", "c1"),
        _ns("b", "ns-uid-2", "u2", "c2"),  # another cluster's
        _ns("c", "ns-uid-3", None, "c1"),  # no federation
    ]
    applied = [_amw(own, (own, "ns-uid-1"))]
    assert fi.client_namespaces(items, "c1", applied) == [fi.ClientNamespace(own, "u1")]


def test_labels_alone_get_no_identity() -> None:
    """Anyone who may create a namespace on the cluster can copy a federation's labels."""
    own = cluster_side_name("team-a", "digits")
    applied = [_amw(own, (own, "ns-uid-1"))]
    spoofs = [
        _ns("my-namespace", "x1", "u1", "c1"),  # any name, the federation's labels
        _ns(own, "x2", "u1", "c1"),  # its name, but not the namespace the work agent applied
        _ns(cluster_side_name("team-a", "other"), "x3", "u1", "c1", fl="other"),  # no work
    ]
    assert fi.client_namespaces(spoofs, "c1", applied) == []
    # A namespace applied by another federation's work does not count for this one.
    other = cluster_side_name("team-a", "other")
    assert (
        fi.client_namespaces([_ns(own, "x4", "u1", "c1")], "c1", [_amw(other, (own, "x4"))]) == []
    )


# --- keyscan -----------------------------------------------------------------------------------
def _secret(name: str, data: Mapping[str, bytes]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team"},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def test_keyscan_accepts_hub_keys_and_finds_cluster_keys_wherever_they_are() -> None:
    fleet_ca, _ = fleet_server.fleet_ca({}, "fleet", pki.utcnow())
    creds = fleet_server.server_tls(
        {}, fleet_ca, credentials_layout.GatewayNames(dns=("fl.example",)), pki.utcnow()
    )
    body, key, node_private = request()
    csr = as_submitted(body, "c1")
    clean = {
        "Secret": [_secret("digits-server-credentials", creds)],
        "CertificateSigningRequest": [csr],
    }
    assert keyscan.scan(clean) == []  # the gateway and SuperLink keys are hub keys

    leaked_tls = _secret("stash", {"x": pki.key_to_pem(key)})
    leaked_node = _secret("stash2", {"y": node_private})
    named = _secret("old-style", {"c1.tls.key": b"anything"})
    shipped = _secret("fl-client-tls", {"tls.key": pki.key_to_pem(pki.generate_key())})
    work = {
        "metadata": {"name": "w", "namespace": "c1"},
        "spec": {"workload": {"manifests": [shipped]}},
    }
    found = keyscan.scan(
        {
            "Secret": [leaked_tls, leaked_node, named],
            "CertificateSigningRequest": [csr],
            "ManifestWork": [work],
        }
    )
    assert sorted((f.kind, f.name) for f in found) == [
        ("ManifestWork", "w"),
        ("Secret", "old-style"),
        ("Secret", "stash"),
        ("Secret", "stash2"),
    ]
