"""Per-FederatedLearning credentials: issued once, reused, renewed, scoped to members."""

from __future__ import annotations

import datetime as dt

from cryptography import x509

from hub_controller.operator.desired import credentials as cr
from ocmfl import pki

GW = cr.GatewayNames(dns=("fl-server.team.svc",), ips=("127.0.1.5",))
UID = "0b5e-uid"


def _reconcile(current: dict[str, bytes], clusters: list[str], **kw: object) -> dict[str, bytes]:
    args: dict[str, object] = {"gateway": GW, "federation_uid": UID, **kw}
    return cr.reconcile_credentials(current, clusters=clusters, **args)  # type: ignore[arg-type]


def test_first_reconcile_issues_everything_each_cluster_needs() -> None:
    data = _reconcile({}, ["cluster1", "cluster2"])
    fleet_ca = pki.load_cert_pem(data[cr.CA])
    for cluster in ("cluster1", "cluster2"):
        bundle = cr.client_bundle(data, cluster)
        cert = pki.load_cert_pem(bundle[pki.CERT_FILE])
        assert pki.verify_issued_by(cert, fleet_ca)
        assert pki.uris_of(cert) == [pki.fleet_uri(UID, cluster)]
        assert bundle["node.key"].startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    assert set(cr.server_node_keys(data)) == {"cluster1.pub", "cluster2.pub"}


def test_every_certificate_comes_from_the_resources_own_fleet_ca() -> None:
    # Each resource gets its own CA; none of it is signed by anything agents trust.
    first, other = _reconcile({}, ["cluster1"]), _reconcile({}, ["cluster1"])
    assert first[cr.CA] != other[cr.CA]
    ca = pki.load_cert_and_key(first[cr.CA], first[cr.FLEET_CA_KEY])
    for key in ("cluster1.tls.crt", cr.SUPERLINK_CERT, cr.GATEWAY_CERT):
        assert pki.verify_issued_by(pki.load_cert_pem(first[key]), ca.cert)


def test_second_reconcile_reuses_material_so_nothing_restarts() -> None:
    first = _reconcile({}, ["cluster1"])
    second = _reconcile(first, ["cluster1"])
    assert second == first


def test_leaving_cluster_loses_its_material_and_joining_cluster_gets_new() -> None:
    first = _reconcile({}, ["cluster1", "cluster2"])
    second = _reconcile(first, ["cluster2", "cluster3"])
    assert not any(k.startswith("cluster1.") for k in second)
    assert second["cluster2.node.key"] == first["cluster2.node.key"]
    assert "cluster3.tls.crt" in second


def test_gateway_certificate_follows_the_advertised_address() -> None:
    first = _reconcile({}, [])
    moved = cr.GatewayNames(dns=("fl.example.com",), ips=())
    second = _reconcile(first, [], gateway=moved)
    cert = pki.load_cert_pem(second[cr.GATEWAY_CERT])
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["fl.example.com"]
    assert second[cr.SUPERLINK_CERT] == first[cr.SUPERLINK_CERT]


def test_certificates_near_expiry_or_from_another_ca_are_reissued() -> None:
    data = _reconcile({}, ["cluster1"])
    later = pki.utcnow() + dt.timedelta(hours=20)  # 24 h client certs: under 30 % left
    renewed = _reconcile(data, ["cluster1"], now=later)
    assert renewed["cluster1.tls.crt"] != data["cluster1.tls.crt"]
    assert renewed["cluster1.node.key"] == data["cluster1.node.key"]
    assert renewed[cr.CA] == data[cr.CA]

    # A Fleet CA near its end is replaced, and everything it signed with it.
    much_later = pki.utcnow() + dt.timedelta(days=300)
    rotated = _reconcile(data, ["cluster1"], now=much_later)
    new_ca = pki.load_cert_pem(rotated[cr.CA])
    assert rotated[cr.CA] != data[cr.CA]
    for key in ("cluster1.tls.crt", cr.SUPERLINK_CERT, cr.GATEWAY_CERT):
        assert pki.verify_issued_by(pki.load_cert_pem(rotated[key]), new_ca)
