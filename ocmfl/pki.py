"""Small PKI for per-cluster identities: CA, CSRs, signing, PEM I/O, identity from a cert.

Everything here is pure except the `save_*`/`load_*_file` helpers. Agent (client)
certificates carry exactly CN = ``CERT_CN_PREFIX + cluster`` and O = ``CERT_ORGANIZATION``
(the project's signer sets that subject itself); `cluster_from_certificate` maps such a
certificate to exactly one cluster name, or raises `IdentityError`. Fleet client
certificates (`fleet_subject`, `fleet_uri`) have a distinct subject and a URI SAN, and are
signed by a federation's own Fleet CA, so they never pass as an agent.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import re
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ocmfl import constants

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
KeyKind = Literal["ec", "rsa"]

# File names of a kubernetes.io/tls Secret as mounted (OCM adds no ca.crt; we do).
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"

DEFAULT_CLIENT_LIFETIME = dt.timedelta(hours=24)
MAX_CLIENT_LIFETIME = dt.timedelta(hours=24)
DEFAULT_SERVER_LIFETIME = dt.timedelta(days=30)
DEFAULT_CA_LIFETIME = dt.timedelta(days=365)
# Backdate notBefore a little so small clock skew between hub and clusters does not matter.
CLOCK_SKEW = dt.timedelta(minutes=5)

# A ManagedCluster name becomes a namespace name: an RFC 1123 label.
_CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class IdentityError(ValueError):
    """A certificate or CSR subject does not name exactly one cluster."""


class CSRError(ValueError):
    """A certificate signing request is malformed or its signature does not verify."""


@dataclass(frozen=True)
class CertAndKey:
    """A certificate with its private key."""

    cert: x509.Certificate
    key: PrivateKey

    @property
    def cert_pem(self) -> bytes:
        return cert_to_pem(self.cert)

    @property
    def key_pem(self) -> bytes:
        return key_to_pem(self.key)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def is_valid_cluster_name(name: str) -> bool:
    """True when `name` can be a ManagedCluster name (an RFC 1123 label)."""
    return bool(_CLUSTER_NAME.match(name))


# --- keys ------------------------------------------------------------------------------------
def generate_key(kind: KeyKind = "ec") -> PrivateKey:
    """A fresh private key: EC P-256 (fast, default) or RSA 2048 (OCM's signingCA needs RSA)."""
    if kind == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


# --- subjects ----------------------------------------------------------------------------------
def cluster_common_name(cluster: str) -> str:
    """The CN that binds a client certificate to `cluster`."""
    if not is_valid_cluster_name(cluster):
        raise IdentityError(f"invalid cluster name {cluster!r}")
    return constants.CERT_CN_PREFIX + cluster


def name_attribute(oid: x509.ObjectIdentifier, value: str) -> x509.NameAttribute[str]:
    """A name attribute that may exceed X.509's 64-character bound (as OCM's CNs do)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Attribute's length", category=UserWarning)
        return x509.NameAttribute(oid, value, _validate=False)


def cluster_subject(cluster: str) -> x509.Name:
    """Subject of an agent certificate: CN=cluster:<name>, O=CERT_ORGANIZATION."""
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, constants.CERT_ORGANIZATION),
            # "cluster:" + a 63-character name exceeds X.509's 64-character CN bound, which
            # Go, OpenSSL and BoringSSL do not enforce (OCM's own CNs are longer still).
            name_attribute(NameOID.COMMON_NAME, cluster_common_name(cluster)),
        ]
    )


def subject_of(obj: x509.Certificate | x509.CertificateSigningRequest) -> x509.Name:
    """The subject, without cryptography's warning about CNs over 64 characters."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Attribute's length", category=UserWarning)
        return obj.subject


def _single(name: x509.Name, oid: x509.ObjectIdentifier, what: str) -> str:
    attrs = name.get_attributes_for_oid(oid)
    if len(attrs) != 1:
        raise IdentityError(f"subject must have exactly one {what}, has {len(attrs)}")
    value = attrs[0].value
    if not isinstance(value, str):
        raise IdentityError(f"{what} is not a string")
    return value


def cluster_from_subject(name: x509.Name) -> str:
    """The cluster a subject names, or IdentityError.

    Only the project signer's form is accepted: exactly one CN = ``cluster:<name>`` and
    exactly one O = CERT_ORGANIZATION. (OCM's default addon subject is no agent identity: no
    signer the aggregator trusts issues it.)
    """
    cn = _single(name, NameOID.COMMON_NAME, "CN")
    orgs = [a.value for a in name.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    if not cn.startswith(constants.CERT_CN_PREFIX):
        raise IdentityError(f"CN {cn!r} does not name a cluster")
    cluster = cn[len(constants.CERT_CN_PREFIX) :]
    if orgs != [constants.CERT_ORGANIZATION]:
        raise IdentityError(
            f"subject must have exactly one O={constants.CERT_ORGANIZATION!r}, has {orgs}"
        )
    if not is_valid_cluster_name(cluster):
        raise IdentityError(f"invalid cluster name {cluster!r} in CN")
    return cluster


def cluster_from_certificate(cert: x509.Certificate | bytes | str) -> str:
    """The cluster an agent certificate (object or PEM) identifies, or IdentityError.

    Beyond the subject, a certificate that is not for client authentication or that carries
    a Fleet URI SAN is refused: Fleet certificates must never pass as an agent.
    """
    if not isinstance(cert, x509.Certificate):
        try:
            cert = load_cert_pem(cert)
        except ValueError as e:
            raise IdentityError(f"unreadable certificate: {e}") from e
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        if ExtendedKeyUsageOID.CLIENT_AUTH not in eku:
            raise IdentityError("certificate is not for client authentication (EKU)")
    except x509.ExtensionNotFound:
        pass  # no EKU means any usage (RFC 5280); the subject check below still applies
    if any(u.startswith(constants.FLEET_URI_PREFIX) for u in uris_of(cert)):
        raise IdentityError("a Fleet certificate is not an agent identity")
    return cluster_from_subject(subject_of(cert))


def certificate_fingerprint(cert: x509.Certificate) -> str:
    """Lowercase hex SHA-256 of the certificate's DER: what kube-apiserver names an x509
    requester's credential by (user extra authentication.kubernetes.io/credential-id,
    "X509SHA256=<this>")."""
    return cert.fingerprint(hashes.SHA256()).hex()


def requested_sans(csr: x509.CertificateSigningRequest) -> list[str]:
    """Every subject alternative name a CSR asks for, as text (DNS:..., IP:..., URI:...,
    email:..., or the name's repr for other kinds); [] without a SAN extension."""
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    out: list[str] = []
    for name in san:
        if isinstance(name, x509.DNSName):
            out.append(f"DNS:{name.value}")
        elif isinstance(name, x509.IPAddress):
            out.append(f"IP:{name.value}")
        elif isinstance(name, x509.UniformResourceIdentifier):
            out.append(f"URI:{name.value}")
        elif isinstance(name, x509.RFC822Name):
            out.append(f"email:{name.value}")
        else:
            out.append(repr(name))
    return out


def uris_of(obj: x509.Certificate | x509.CertificateSigningRequest) -> list[str]:
    """The URI SANs of a certificate or (requested in) a CSR."""
    try:
        san = obj.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


# --- Fleet identities (one federation's Flower traffic) ---------------------------------------
def fleet_subject(cluster: str) -> x509.Name:
    """Subject of a Fleet client certificate: CN=fleet:<name>, O=FLEET_ORGANIZATION."""
    if not is_valid_cluster_name(cluster):
        raise IdentityError(f"invalid cluster name {cluster!r}")
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, constants.FLEET_ORGANIZATION),
            name_attribute(NameOID.COMMON_NAME, constants.FLEET_CN_PREFIX + cluster),
        ]
    )


def fleet_uri(federation_uid: str, cluster: str) -> str:
    """The URI SAN binding a Fleet certificate to one federation (by uid) and cluster."""
    return f"{constants.FLEET_URI_PREFIX}{federation_uid}:cluster:{cluster}"


def parse_fleet_uri(uri: str) -> tuple[str, str]:
    """(federation uid, cluster) of a `fleet_uri`, or IdentityError."""
    if not uri.startswith(constants.FLEET_URI_PREFIX):
        raise IdentityError(f"{uri!r} is not a Fleet URI")
    uid, sep, cluster = uri[len(constants.FLEET_URI_PREFIX) :].partition(":cluster:")
    if not sep or not uid or not is_valid_cluster_name(cluster):
        raise IdentityError(f"{uri!r} does not name a federation uid and a cluster")
    return uid, cluster


def supernode_key_uri(public_openssh: bytes) -> str:
    """A URI SAN carrying a SuperNode public key (OpenSSH line, comment dropped)."""
    fields = public_openssh.split()
    if len(fields) < 2:
        raise ValueError("not an OpenSSH public key line")
    blob = base64.urlsafe_b64encode(b" ".join(fields[:2])).decode().rstrip("=")
    return constants.SUPERNODE_KEY_URI_PREFIX + blob


def supernode_key_from_uri(uri: str) -> bytes:
    """The OpenSSH public key line (no comment, no newline) of a `supernode_key_uri`.

    ValueError unless it is an ECDSA key (what Flower's node authentication takes)."""
    if not uri.startswith(constants.SUPERNODE_KEY_URI_PREFIX):
        raise ValueError(f"{uri!r} is not a SuperNode key URI")
    blob = uri[len(constants.SUPERNODE_KEY_URI_PREFIX) :]
    line = base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4))
    key = serialization.load_ssh_public_key(line)
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError("a SuperNode key must be ECDSA")
    return line


def create_fleet_csr(
    federation_uid: str, cluster: str, key: PrivateKey, supernode_public: bytes
) -> x509.CertificateSigningRequest:
    """The CSR an agent sends for its cluster's Fleet identity in one federation."""
    sans = [
        x509.UniformResourceIdentifier(fleet_uri(federation_uid, cluster)),
        x509.UniformResourceIdentifier(supernode_key_uri(supernode_public)),
    ]
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(fleet_subject(cluster))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )


def sign_fleet_csr(
    csr: x509.CertificateSigningRequest,
    fleet_ca: CertAndKey,
    federation_uid: str,
    cluster: str,
    *,
    lifetime: dt.timedelta = DEFAULT_CLIENT_LIFETIME,
    now: dt.datetime | None = None,
) -> x509.Certificate:
    """A Fleet client certificate for the CSR's key; subject and SAN are set here, never
    copied from the request."""
    verify_csr(csr)
    lifetime = min(lifetime, MAX_CLIENT_LIFETIME)
    builder = _leaf_builder(
        fleet_subject(cluster),
        csr.public_key(),
        fleet_ca,
        lifetime=lifetime,
        now=now,
        client=True,
        server=False,
    ).add_extension(
        x509.SubjectAlternativeName(
            [x509.UniformResourceIdentifier(fleet_uri(federation_uid, cluster))]
        ),
        critical=False,
    )
    return builder.sign(fleet_ca.key, hashes.SHA256())


def issue_fleet_client_cert(
    fleet_ca: CertAndKey,
    federation_uid: str,
    cluster: str,
    *,
    lifetime: dt.timedelta = DEFAULT_CLIENT_LIFETIME,
    now: dt.datetime | None = None,
) -> CertAndKey:
    """A fresh key and Fleet client certificate for `cluster` in one federation."""
    return issue_cert(
        fleet_ca,
        fleet_subject(cluster),
        client=True,
        uris=[fleet_uri(federation_uid, cluster)],
        lifetime=lifetime,
        now=now,
    )


# --- building certificates ---------------------------------------------------------------------
def _key_id(key: PrivateKey) -> x509.SubjectKeyIdentifier:
    return x509.SubjectKeyIdentifier.from_public_key(key.public_key())


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """A CA signs certificates and CRLs; a leaf signs and (RSA) enciphers keys."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not ca,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def create_ca(
    common_name: str = "ocm-fl-ca",
    *,
    lifetime: dt.timedelta = DEFAULT_CA_LIFETIME,
    key_kind: KeyKind = "rsa",
    now: dt.datetime | None = None,
) -> CertAndKey:
    """A self-signed CA (RSA by default)."""
    now = now or utcnow()
    key = generate_key(key_kind)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(_key_id(key), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertAndKey(cert, key)


def create_csr(cluster: str, key: PrivateKey) -> x509.CertificateSigningRequest:
    """A CSR for `cluster`'s agent client certificate."""
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(cluster_subject(cluster))
        .sign(key, hashes.SHA256())
    )


def verify_csr(csr: x509.CertificateSigningRequest) -> None:
    """Raise CSRError unless the CSR is signed by the key it carries."""
    if not csr.is_signature_valid:
        raise CSRError("CSR signature does not verify")


def _leaf_builder(
    subject: x509.Name,
    public_key: object,
    ca: CertAndKey,
    *,
    lifetime: dt.timedelta,
    now: dt.datetime | None,
    client: bool,
    server: bool,
) -> x509.CertificateBuilder:
    now = now or utcnow()
    not_after = min(now + lifetime, ca.cert.not_valid_after_utc)
    usages = []
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        # Backdated for clock skew, but by a small share of a short lifetime: renewal is
        # due at a share of (not_after - not_before) left, so 5 min on a 1 min certificate
        # would make it due at once.
        .not_valid_before(now - min(CLOCK_SKEW, lifetime / 10))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder


def sign_csr(
    csr: x509.CertificateSigningRequest,
    ca: CertAndKey,
    *,
    lifetime: dt.timedelta = DEFAULT_CLIENT_LIFETIME,
    max_lifetime: dt.timedelta = MAX_CLIENT_LIFETIME,
    now: dt.datetime | None = None,
) -> x509.Certificate:
    """Sign an agent CSR as a client certificate.

    The CSR signature and subject are checked (the subject must name one cluster). The
    certificate's subject is made here from that cluster name (`cluster_subject`); nothing
    else of the request is copied: no SANs, no extensions. Lifetime is capped at
    `max_lifetime` and at the CA's expiry.
    """
    verify_csr(csr)
    subject = cluster_subject(cluster_from_subject(subject_of(csr)))
    lifetime = min(lifetime, max_lifetime)
    builder = _leaf_builder(
        subject, csr.public_key(), ca, lifetime=lifetime, now=now, client=True, server=False
    )
    return builder.sign(ca.key, hashes.SHA256())


def issue_cert(
    ca: CertAndKey,
    subject: x509.Name,
    *,
    client: bool = False,
    server: bool = False,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    uris: Sequence[str] = (),
    lifetime: dt.timedelta = DEFAULT_CLIENT_LIFETIME,
    now: dt.datetime | None = None,
    key_kind: KeyKind = "ec",
) -> CertAndKey:
    """A fresh key and a certificate for it, signed by `ca`, with SANs when given."""
    key = generate_key(key_kind)
    builder = _leaf_builder(
        subject, key.public_key(), ca, lifetime=lifetime, now=now, client=client, server=server
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ip_addresses]
    sans += [x509.UniformResourceIdentifier(u) for u in uris]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return CertAndKey(builder.sign(ca.key, hashes.SHA256()), key)


def issue_client_cert(
    cluster: str,
    ca: CertAndKey,
    *,
    lifetime: dt.timedelta = DEFAULT_CLIENT_LIFETIME,
    now: dt.datetime | None = None,
    key_kind: KeyKind = "ec",
) -> CertAndKey:
    """A fresh key and client certificate for `cluster` (test and bootstrap helper)."""
    return issue_cert_for_subject(
        cluster_subject(cluster), ca, lifetime=lifetime, now=now, key_kind=key_kind
    )


def issue_cert_for_subject(
    subject: x509.Name,
    ca: CertAndKey,
    *,
    lifetime: dt.timedelta = DEFAULT_CLIENT_LIFETIME,
    now: dt.datetime | None = None,
    key_kind: KeyKind = "ec",
) -> CertAndKey:
    """A client certificate with an arbitrary subject (e.g. an OCM addon identity)."""
    return issue_cert(ca, subject, client=True, lifetime=lifetime, now=now, key_kind=key_kind)


def issue_server_cert(
    ca: CertAndKey,
    *,
    dns_names: Sequence[str] = ("localhost",),
    ip_addresses: Sequence[str] = ("127.0.0.1",),
    common_name: str | None = None,
    lifetime: dt.timedelta = DEFAULT_SERVER_LIFETIME,
    now: dt.datetime | None = None,
    key_kind: KeyKind = "ec",
    client_auth: bool = False,
) -> CertAndKey:
    """A server certificate with DNS and IP SANs (for the aggregator, proxies, Flower)."""
    if not dns_names and not ip_addresses:
        raise ValueError("a server certificate needs at least one SAN")
    cn = common_name or (dns_names[0] if dns_names else ip_addresses[0])
    return issue_cert(
        ca,
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]),
        client=client_auth,
        server=True,
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        lifetime=lifetime,
        now=now,
        key_kind=key_kind,
    )


def verify_issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """True when `ca` signed `cert` (signature check only; no validity-period check)."""
    if cert.issuer != ca.subject:
        return False
    pub = ca.public_key()
    sig_hash = cert.signature_hash_algorithm
    try:
        if isinstance(pub, rsa.RSAPublicKey) and sig_hash is not None:
            pub.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(), sig_hash)
        elif isinstance(pub, ec.EllipticCurvePublicKey) and sig_hash is not None:
            pub.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(sig_hash))
        elif isinstance(pub, ed25519.Ed25519PublicKey):
            pub.verify(cert.signature, cert.tbs_certificate_bytes)
        else:
            return False
    except InvalidSignature:
        return False
    return True


def remaining_fraction(cert: x509.Certificate, now: dt.datetime | None = None) -> float:
    """Share of the certificate's lifetime still left (0.0 once expired)."""
    now = now or utcnow()
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    total = (end - start).total_seconds()
    if total <= 0:
        return 0.0
    return max(0.0, min(1.0, (end - now).total_seconds() / total))


# --- PEM -------------------------------------------------------------------------------------
def cert_to_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def certs_to_pem(certs: Iterable[x509.Certificate]) -> bytes:
    return b"".join(cert_to_pem(c) for c in certs)


def key_to_pem(key: PrivateKey) -> bytes:
    """Unencrypted PKCS#8 PEM (what kubernetes.io/tls Secrets hold)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def csr_to_pem(csr: x509.CertificateSigningRequest) -> bytes:
    return csr.public_bytes(serialization.Encoding.PEM)


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


def load_cert_pem(data: bytes | str) -> x509.Certificate:
    """The first certificate in a PEM blob."""
    return x509.load_pem_x509_certificate(_as_bytes(data))


def load_certs_pem(data: bytes | str) -> list[x509.Certificate]:
    """All certificates in a PEM bundle."""
    return x509.load_pem_x509_certificates(_as_bytes(data))


def load_key_pem(data: bytes | str) -> PrivateKey:
    """An unencrypted RSA or EC private key (PKCS#1, SEC1 or PKCS#8 PEM)."""
    key = serialization.load_pem_private_key(_as_bytes(data), password=None)
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ValueError(f"unsupported key type {type(key).__name__}")
    return key


def load_csr_pem(data: bytes | str) -> x509.CertificateSigningRequest:
    try:
        return x509.load_pem_x509_csr(_as_bytes(data))
    except ValueError as e:
        raise CSRError(f"unreadable CSR: {e}") from e


def load_cert_and_key(cert_pem: bytes | str, key_pem: bytes | str) -> CertAndKey:
    """Parse a certificate and its key; ValueError if they do not belong together."""
    cert, key = load_cert_pem(cert_pem), load_key_pem(key_pem)
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    enc = serialization.Encoding.DER
    if cert.public_key().public_bytes(enc, pub) != key.public_key().public_bytes(enc, pub):
        raise ValueError("certificate and private key do not match")
    return CertAndKey(cert, key)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` via a temp file + rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_tls_dir(directory: str | Path, pair: CertAndKey, ca: x509.Certificate | None) -> Path:
    """Write tls.key, tls.crt (and ca.crt) into `directory` like a mounted TLS Secret.

    The key is written before the certificate so a watcher keyed on tls.crt sees a
    matching pair.
    """
    d = Path(directory)
    write_atomic(d / KEY_FILE, pair.key_pem, 0o600)
    write_atomic(d / CERT_FILE, pair.cert_pem)
    if ca is not None:
        write_atomic(d / CA_FILE, cert_to_pem(ca))
    return d


def load_tls_dir(directory: str | Path) -> tuple[CertAndKey, list[x509.Certificate]]:
    """Read tls.crt/tls.key (and ca.crt when present) from a mounted TLS Secret."""
    d = Path(directory)
    pair = load_cert_and_key((d / CERT_FILE).read_bytes(), (d / KEY_FILE).read_bytes())
    ca_path = d / CA_FILE
    cas = load_certs_pem(ca_path.read_bytes()) if ca_path.exists() else []
    return pair, cas
