"""Per-FederatedLearning credentials: issued once, reused, renewed, scoped to members."""

from __future__ import annotations

import datetime as dt

from cryptography import x509

from hub_controller.operator.desired import credentials as cr
from ocmfl import pki

GW = cr.GatewayNames(dns=("fl-server.team.svc",), ips=("127.0.1.5",))


def test_first_reconcile_issues_everything_each_cluster_needs() -> None:
    ca = pki.create_ca()
    data = cr.reconcile_credentials({}, clusters=["cluster1", "cluster2"], gateway=GW, ca=ca)
    for cluster in ("cluster1", "cluster2"):
        bundle = cr.client_bundle(data, cluster)
        cert = pki.load_cert_pem(bundle[pki.CERT_FILE])
        assert pki.cluster_from_certificate(cert) == cluster
        assert pki.verify_issued_by(cert, ca.cert)
        assert bundle["node.key"].startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    assert set(cr.server_node_keys(data)) == {"cluster1.pub", "cluster2.pub"}


def test_second_reconcile_reuses_material_so_nothing_restarts() -> None:
    ca = pki.create_ca()
    first = cr.reconcile_credentials({}, clusters=["cluster1"], gateway=GW, ca=ca)
    second = cr.reconcile_credentials(first, clusters=["cluster1"], gateway=GW, ca=ca)
    assert second == first


def test_leaving_cluster_loses_its_material_and_joining_cluster_gets_new() -> None:
    ca = pki.create_ca()
    first = cr.reconcile_credentials({}, clusters=["cluster1", "cluster2"], gateway=GW, ca=ca)
    second = cr.reconcile_credentials(first, clusters=["cluster2", "cluster3"], gateway=GW, ca=ca)
    assert not any(k.startswith("cluster1.") for k in second)
    assert second["cluster2.node.key"] == first["cluster2.node.key"]
    assert "cluster3.tls.crt" in second


def test_gateway_certificate_follows_the_advertised_address() -> None:
    ca = pki.create_ca()
    first = cr.reconcile_credentials({}, clusters=[], gateway=GW, ca=ca)
    moved = cr.GatewayNames(dns=("fl.example.com",), ips=())
    second = cr.reconcile_credentials(first, clusters=[], gateway=moved, ca=ca)
    cert = pki.load_cert_pem(second[cr.GATEWAY_CERT])
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["fl.example.com"]
    assert second[cr.SUPERLINK_CERT] == first[cr.SUPERLINK_CERT]


def test_certificates_near_expiry_or_from_another_ca_are_reissued() -> None:
    ca = pki.create_ca()
    data = cr.reconcile_credentials({}, clusters=["cluster1"], gateway=GW, ca=ca)
    later = pki.utcnow() + dt.timedelta(hours=20)  # 24 h client certs: under 30 % left
    renewed = cr.reconcile_credentials(data, clusters=["cluster1"], gateway=GW, ca=ca, now=later)
    assert renewed["cluster1.tls.crt"] != data["cluster1.tls.crt"]
    assert renewed["cluster1.node.key"] == data["cluster1.node.key"]

    new_ca = pki.create_ca("rotated")
    rotated = cr.reconcile_credentials(data, clusters=["cluster1"], gateway=GW, ca=new_ca)
    for key in ("cluster1.tls.crt", cr.SUPERLINK_CERT, cr.GATEWAY_CERT):
        assert pki.verify_issued_by(pki.load_cert_pem(rotated[key]), new_ca.cert)
