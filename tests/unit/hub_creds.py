"""Hub credentials as OCM issues them, made with real PKI (ocmfl.pki), for the signer tests.

The hub's kube-controller-manager signs (kubernetes.io/kube-apiserver-client) the client
certificate of a cluster's addon agent, asked for by that cluster's registration agent, or by
someone else (a forgery OCM's prefix check lets through). A CSR the agent then sends with that
hub kubeconfig carries what kube-apiserver derives from the certificate: the user (CN), the
groups (O) and the credential id `X509SHA256=<sha256 of the DER>` in spec.extra.
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
from dataclasses import dataclass
from functools import cache
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID

from hub_controller.bootstrap.addon_template import default_agent_subject
from hub_controller.signer.hub_identity import CREDENTIAL_ID, HubIdentity, classify
from ocmfl import constants, pki

_names = itertools.count()


@cache
def kube_ca() -> pki.CertAndKey:
    """The hub's kube-controller-manager signing CA (one per test session)."""
    return pki.create_ca("hub-kube-ca", key_kind="ec")


def registration_agent(cluster: str, agent_id: str = "7c1f2b9e") -> tuple[str, list[str]]:
    """(username, groups) of `cluster`'s registration agent on the hub."""
    return f"system:open-cluster-management:{cluster}:{agent_id}", [
        f"system:open-cluster-management:{cluster}",
        "system:open-cluster-management:managed-clusters",
        "system:authenticated",
    ]


@dataclass(frozen=True)
class HubCredential:
    """One addon hub credential: the certificate and key, and OCM's CSR that issued it."""

    cluster: str  # whose addon identity the certificate carries
    pair: pki.CertAndKey
    csr: dict[str, Any]

    @property
    def fingerprint(self) -> str:
        return pki.certificate_fingerprint(self.pair.cert)

    @property
    def identity(self) -> HubIdentity:
        found = classify(self.csr)
        assert isinstance(found, HubIdentity), found
        return found


def issue_hub_credential(
    cluster: str,
    requester: tuple[str, list[str]] | None = None,
    *,
    lifetime: dt.timedelta = dt.timedelta(hours=24),
    now: dt.datetime | None = None,
    issued: bool = True,
) -> HubCredential:
    """The addon hub credential of `cluster`, asked for by `requester` (username, groups;
    default: the cluster's own registration agent), as OCM's CSR object after issuing."""
    subject = default_agent_subject(cluster)
    name = x509.Name(
        [pki.name_attribute(NameOID.ORGANIZATION_NAME, g) for g in subject["groups"][:2]]
        + [pki.name_attribute(NameOID.COMMON_NAME, subject["user"])]
    )
    pair = pki.issue_cert_for_subject(name, kube_ca(), lifetime=lifetime, now=now)
    request = (
        x509.CertificateSigningRequestBuilder().subject_name(name).sign(pair.key, hashes.SHA256())
    )
    username, groups = requester or registration_agent(cluster)
    csr_name = f"addon-{cluster}-{constants.ADDON_NAME}-{next(_names)}"
    csr: dict[str, Any] = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {
            "name": csr_name,
            "uid": f"uid-{csr_name}",
            "labels": {
                constants.LABEL_OCM_CLUSTER_NAME: cluster,
                constants.LABEL_OCM_ADDON_NAME: constants.ADDON_NAME,
            },
        },
        "spec": {
            "signerName": constants.KUBE_APISERVER_CLIENT_SIGNER,
            "request": base64.b64encode(pki.csr_to_pem(request)).decode(),
            "usages": ["digital signature", "key encipherment", "client auth"],
            "username": username,
            "groups": groups,
        },
        "status": {},
    }
    if issued:
        csr["status"]["certificate"] = base64.b64encode(pair.cert_pem).decode()
    return HubCredential(cluster, pair, csr)


def requested_with(body: dict[str, Any], credential: HubCredential | None) -> dict[str, Any]:
    """The CSR `body` as kube-apiserver stores it when the requester authenticates with
    `credential`'s certificate (None: a requester without one, e.g. a token)."""
    csr = {**body, "metadata": dict(body["metadata"]), "spec": dict(body["spec"])}
    csr["metadata"].setdefault("name", f"csr-{next(_names)}")
    csr["metadata"].setdefault("creationTimestamp", "2000-01-01T00:00:00Z")
    if credential is None:
        csr["spec"].update(username="system:serviceaccount:x:y", groups=["system:authenticated"])
        return csr
    cert = credential.pair.cert
    subject = pki.subject_of(cert)
    csr["spec"].update(
        username=subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value,
        groups=[
            *(a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)),
            "system:authenticated",
        ],
        extra={CREDENTIAL_ID: [f"X509SHA256={pki.certificate_fingerprint(cert)}"]},
    )
    return csr
