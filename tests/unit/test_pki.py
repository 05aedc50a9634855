"""ocmfl.pki: CA, CSRs, signing, PEM round trips and strict cluster identities."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ocmfl import constants, pki


@pytest.fixture(scope="module")
def ca() -> pki.CertAndKey:
    return pki.create_ca(key_kind="ec")


def _name(*attrs: tuple[x509.ObjectIdentifier, str]) -> x509.Name:
    return x509.Name([pki.name_attribute(oid, v) for oid, v in attrs])


def test_csr_signed_into_a_client_cert_for_its_cluster(ca: pki.CertAndKey) -> None:
    key = pki.generate_key()
    cert = pki.sign_csr(pki.create_csr("edge-1", key), ca, lifetime=dt.timedelta(hours=2))
    assert pki.cluster_from_certificate(cert) == "edge-1"
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
        constants.CERT_CN_PREFIX + "edge-1"
    )
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert pki.verify_issued_by(cert, ca.cert)
    assert (
        cert.not_valid_after_utc - cert.not_valid_before_utc
        <= dt.timedelta(hours=2) + pki.CLOCK_SKEW
    )


def test_lifetime_is_capped_at_max_and_ca_expiry() -> None:
    short_ca = pki.create_ca(lifetime=dt.timedelta(hours=1), key_kind="ec")
    cert = pki.sign_csr(
        pki.create_csr("a", pki.generate_key()), short_ca, lifetime=dt.timedelta(days=30)
    )
    assert cert.not_valid_after_utc <= short_ca.cert.not_valid_after_utc


def test_server_cert_has_dns_and_ip_sans(ca: pki.CertAndKey) -> None:
    pair = pki.issue_server_cert(
        ca, dns_names=["hub.local", "localhost"], ip_addresses=["127.0.0.1"]
    )
    san = pair.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["hub.local", "localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]


def test_pem_round_trip_and_mismatched_pair(ca: pki.CertAndKey, tmp_path: Path) -> None:
    pair = pki.issue_client_cert("a", ca)
    pki.save_tls_dir(tmp_path, pair, ca.cert)
    loaded, cas = pki.load_tls_dir(tmp_path)
    assert loaded.cert == pair.cert and cas == [ca.cert]
    assert (tmp_path / pki.KEY_FILE).stat().st_mode & 0o777 == 0o600
    other = pki.issue_client_cert("a", ca)
    with pytest.raises(ValueError, match="do not match"):
        pki.load_cert_and_key(pair.cert_pem, other.key_pem)


def test_rsa_ca_by_default() -> None:
    ca = pki.create_ca()
    assert isinstance(ca.key, rsa.RSAPrivateKey) and ca.key.key_size == 2048
    assert pki.load_key_pem(ca.key_pem).private_numbers() == ca.key.private_numbers()


@pytest.mark.parametrize(
    "subject",
    [
        _name((NameOID.COMMON_NAME, "edge-1")),  # no prefix
        _name((NameOID.COMMON_NAME, "cluster:edge-1")),  # no O
        _name((NameOID.ORGANIZATION_NAME, "other"), (NameOID.COMMON_NAME, "cluster:edge-1")),
        _name(
            (NameOID.ORGANIZATION_NAME, constants.CERT_ORGANIZATION),
            (NameOID.ORGANIZATION_NAME, constants.CERT_ORGANIZATION),
            (NameOID.COMMON_NAME, "cluster:edge-1"),
        ),  # two O
        _name(
            (NameOID.ORGANIZATION_NAME, constants.CERT_ORGANIZATION),
            (NameOID.COMMON_NAME, "cluster:edge-1"),
            (NameOID.COMMON_NAME, "cluster:edge-2"),
        ),  # two CN
        _name(
            (NameOID.ORGANIZATION_NAME, constants.CERT_ORGANIZATION),
            (NameOID.COMMON_NAME, "cluster:Edge_1"),
        ),  # not a cluster name
        _name(
            (NameOID.ORGANIZATION_NAME, constants.CERT_ORGANIZATION),
            (NameOID.COMMON_NAME, "cluster:"),
        ),
        # OCM form whose groups name another cluster
        _name(
            (
                NameOID.ORGANIZATION_NAME,
                f"system:open-cluster-management:cluster:b:addon:{constants.ADDON_NAME}",
            ),
            (
                NameOID.COMMON_NAME,
                f"system:open-cluster-management:cluster:a:addon:{constants.ADDON_NAME}:agent:x",
            ),
        ),
        # OCM form of another addon
        _name(
            (NameOID.ORGANIZATION_NAME, "system:open-cluster-management:cluster:a:addon:z"),
            (NameOID.COMMON_NAME, "system:open-cluster-management:cluster:a:addon:z:agent:x"),
        ),
    ],
)
def test_ambiguous_or_foreign_subjects_are_rejected(subject: x509.Name) -> None:
    with pytest.raises(pki.IdentityError):
        pki.cluster_from_subject(subject)


def test_unreadable_certificate_is_an_identity_error() -> None:
    with pytest.raises(pki.IdentityError):
        pki.cluster_from_certificate(b"not a cert")


def test_csr_with_bad_signature_is_refused(ca: pki.CertAndKey) -> None:
    csr = pki.create_csr("a", pki.generate_key())
    der = bytearray(
        csr.public_bytes(
            __import__(
                "cryptography.hazmat.primitives.serialization", fromlist=["Encoding"]
            ).Encoding.DER
        )
    )
    der[-3] ^= 0xFF  # corrupt the signature
    bad = x509.load_der_x509_csr(bytes(der))
    with pytest.raises(pki.CSRError):
        pki.sign_csr(bad, ca)


def test_longest_cluster_name_fits_in_a_certificate(ca: pki.CertAndKey) -> None:
    name = "c" * 63
    cert = pki.sign_csr(pki.create_csr(name, pki.generate_key()), ca)
    assert pki.cluster_from_certificate(pki.cert_to_pem(cert)) == name


def test_fingerprint_is_what_kube_apiserver_names_an_x509_credential(ca: pki.CertAndKey) -> None:
    import hashlib

    from cryptography.hazmat.primitives.serialization import Encoding

    cert = pki.issue_client_cert("a", ca).cert
    # apiserver x509.go: "X509SHA256=" + hex.EncodeToString(sha256.Sum256(chain[0].Raw))
    assert (
        pki.certificate_fingerprint(cert)
        == hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()
    )


def test_requested_sans_names_every_kind() -> None:
    from cryptography.hazmat.primitives import hashes

    names: list[x509.GeneralName] = [
        x509.DNSName("a.example"),
        x509.IPAddress(ipaddress.ip_address("10.1.2.3")),
        x509.UniformResourceIdentifier("urn:x"),
        x509.RFC822Name("a@example.com"),
    ]
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(pki.cluster_subject("a"))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(pki.generate_key(), hashes.SHA256())
    )
    assert pki.requested_sans(csr) == [
        "DNS:a.example",
        "IP:10.1.2.3",
        "URI:urn:x",
        "email:a@example.com",
    ]
    assert pki.requested_sans(pki.create_csr("a", pki.generate_key())) == []


def test_a_csr_subject_with_extra_attributes_is_signed_as_the_bare_cluster_subject(
    ca: pki.CertAndKey,
) -> None:
    from cryptography.hazmat.primitives import hashes

    subject = _name(
        (NameOID.ORGANIZATIONAL_UNIT_NAME, "admins"),
        (NameOID.ORGANIZATION_NAME, constants.CERT_ORGANIZATION),
        (NameOID.COMMON_NAME, "cluster:edge-1"),
    )
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .sign(pki.generate_key(), hashes.SHA256())
    )
    cert = pki.sign_csr(csr, ca)
    assert pki.subject_of(cert) == pki.cluster_subject("edge-1")
