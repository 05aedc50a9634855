"""The signer part's Fleet CAs and server certificates (hub_controller.signer.fleet_server):
the CA never leaves the signer's namespace, only a genuine credentials Secret gets
certificates, they are reused, follow the gateway, renew, and a gone federation's CA goes."""

from __future__ import annotations

import base64
import copy
import datetime as dt
from typing import Any

import pytest
from cryptography import x509

from hub_controller import credentials_layout as layout
from hub_controller.api import FLRef
from hub_controller.operator.desired import credentials as cr
from hub_controller.signer import fleet_server as fs
from ocmfl import constants, pki
from ocmfl.kube import path_of
from tests.unit.secrets_kube import SecretsKube

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
GW = layout.GatewayNames(dns=("fl-server.team.svc",), ips=("127.0.1.5",))
REF = FLRef(namespace="team", name="mnist", uid="uid-1")
SIGNER_NS = "ocm-fl-hub"


def _fl(ref: FLRef = REF) -> dict[str, Any]:
    return {"metadata": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid}}


def _request(ref: FLRef = REF, gateway: layout.GatewayNames = GW) -> dict[str, Any]:
    """The credentials Secret as the controller applies it."""
    meta = {
        "namespace": ref.namespace,
        "labels": ref.labels(layout.SERVER_COMPONENT),
        "ownerReferences": [ref.owner_reference()],
    }
    return cr.credentials_request(meta, layout.server_name(ref), gateway)


class SignerKube(SecretsKube):
    """Secrets and FederatedLearnings, with the patch, list and delete the signer uses."""

    def patch(self, path: str, body: dict[str, Any], content_type: str = "") -> dict[str, Any]:
        current = self.objects[path]
        current.setdefault("data", {}).update(body["data"])
        self.writes += 1
        return copy.deepcopy(current)

    def list_objects(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        key, value = (label_selector or "=").split("=")
        return [
            copy.deepcopy(o)
            for p, o in self.objects.items()
            if p.startswith(f"{path}/") and (o["metadata"].get("labels") or {}).get(key) == value
        ]

    def delete(self, path: str, query: Any = None, body: Any = None) -> None:
        self.objects.pop(path, None)

    def add(self, obj: dict[str, Any], kind: str = "Secret") -> str:
        meta = obj["metadata"]
        version = "v1" if kind == "Secret" else constants.API_VERSION
        path = path_of(version, kind, meta["namespace"], meta.get("name"))
        self.objects[path] = copy.deepcopy(obj)
        return path


def _signer(kube: SignerKube, now: dt.datetime = NOW) -> fs.FleetServerCerts:
    clock = lambda: now  # noqa: E731
    return fs.FleetServerCerts(kube, fs.FleetCAs(kube, SIGNER_NS, clock), clock)  # type: ignore[arg-type]


def _data(kube: SignerKube, path: str) -> dict[str, bytes]:
    return layout.secret_data(kube.objects[path])


def _stored_ca(kube: SignerKube, ref: FLRef = REF) -> pki.CertAndKey:
    """The federation's Fleet CA as its shard in the signer's namespace holds it."""
    shard = layout.fleet_ca_secret_name(layout.fleet_ca_shard(ref.uid))
    data = _data(kube, path_of("v1", "Secret", SIGNER_NS, shard))
    cert, key, owner = layout.fleet_ca_keys(ref.uid)
    assert data[owner] == f"{ref.namespace}/{ref.name}".encode()
    return pki.load_cert_and_key(data[cert], data[key])


def test_a_credentials_secret_gets_server_certificates_of_a_ca_kept_in_the_signers_namespace() -> (
    None
):
    kube = SignerKube()
    kube.add(_fl(), constants.KIND)
    path = kube.add(_request())
    due = _signer(kube).ensure_federation(_fl())
    data = _data(kube, path)
    assert set(data) == set(layout.SERVER_TLS)
    assert cr.tls_ready(data, GW, NOW) is None
    # The CA's key is only in the signer's namespace; the tenant's Secret has its certificate.
    ca = _stored_ca(kube)
    assert data[layout.CA] == pki.cert_to_pem(ca.cert)
    assert not [v for v in data.values() if b"PRIVATE KEY" in v and v == pki.key_to_pem(ca.key)]
    assert due is not None and due > 0
    # Nothing changed: nothing written again.
    writes = kube.writes
    _signer(kube).ensure_federation(_fl())
    assert kube.writes == writes


def test_the_gateway_certificate_follows_the_names_and_the_rest_is_kept() -> None:
    kube = SignerKube()
    kube.add(_fl(), constants.KIND)
    path = kube.add(_request())
    _signer(kube).ensure_federation(_fl())
    first = _data(kube, path)
    moved = layout.GatewayNames(dns=("fl.example.com",))
    kube.objects[path]["metadata"]["annotations"] = _request(gateway=moved)["metadata"][
        "annotations"
    ]
    _signer(kube).ensure_federation(_fl())
    second = _data(kube, path)
    san = pki.load_cert_pem(second[layout.GATEWAY_CERT]).extensions
    names = san.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["fl.example.com"]
    assert second[layout.SUPERLINK_CERT] == first[layout.SUPERLINK_CERT]
    assert second[layout.CA] == first[layout.CA]


def test_a_ca_near_its_end_is_replaced_with_everything_it_signed() -> None:
    kube = SignerKube()
    kube.add(_fl(), constants.KIND)
    path = kube.add(_request())
    _signer(kube).ensure_federation(_fl())
    first = _data(kube, path)
    _signer(kube, NOW + dt.timedelta(days=5)).ensure_federation(_fl())
    assert _data(kube, path) == first
    _signer(kube, NOW + dt.timedelta(days=300)).ensure_federation(_fl())
    rotated = _data(kube, path)
    assert rotated[layout.CA] != first[layout.CA]
    new_ca = pki.load_cert_pem(rotated[layout.CA])
    for key in (layout.SUPERLINK_CERT, layout.GATEWAY_CERT):
        assert pki.verify_issued_by(pki.load_cert_pem(rotated[key]), new_ca)


def test_each_federation_has_its_own_ca() -> None:
    kube = SignerKube()
    other = FLRef(namespace="team", name="other", uid="uid-2")
    paths = []
    for ref in (REF, other):
        kube.add(_fl(ref), constants.KIND)
        paths.append(kube.add(_request(ref)))
        _signer(kube).ensure_federation(_fl(ref))
    assert _data(kube, paths[0])[layout.CA] != _data(kube, paths[1])[layout.CA]


VICTIM = FLRef(namespace="team-b", name="victim", uid="uid-victim")


def _forged(change: str) -> dict[str, Any]:
    """A Secret in tenant `team`'s namespace that tries to get the certificates of `team-b`'s
    federation VICTIM, or of its own without asking properly."""
    secret = _request(REF)
    meta = secret["metadata"]
    if change == "other namespace's federation":  # everything names team-b's federation
        secret = _request(FLRef(namespace=REF.namespace, name=VICTIM.name, uid=VICTIM.uid))
    elif change == "wrong uid":
        meta["ownerReferences"] = [{**REF.owner_reference(), "uid": VICTIM.uid}]
    elif change == "uid label":
        meta["labels"][constants.LABEL_OWNER_UID] = VICTIM.uid
    elif change == "other name":
        meta["name"] = "my-own-secret"
    elif change == "no owner":
        meta["ownerReferences"] = []
    elif change == "bad names":
        meta["annotations"][layout.GATEWAY_NAMES_ANNOTATION] = '{"dns": "x"}'
    return secret


@pytest.mark.parametrize(
    "change",
    [
        "other namespace's federation",
        "wrong uid",
        "uid label",
        "other name",
        "no owner",
        "bad names",
    ],
)
def test_a_secret_that_is_not_a_federations_own_credentials_secret_gets_nothing(
    change: str,
) -> None:
    kube = SignerKube()
    secret = _forged(change)
    path = kube.add(secret)
    for fl in (_fl(REF), _fl(VICTIM)):
        kube.add(fl, constants.KIND)
        assert _signer(kube).ensure(kube.objects[path], fl) is None
    assert "data" not in kube.objects[path]
    assert not [p for p in kube.objects if p.startswith(f"/api/v1/namespaces/{SIGNER_NS}/")]


def test_a_federation_without_its_request_yet_is_looked_at_again_soon() -> None:
    kube = SignerKube()
    kube.add(_fl(), constants.KIND)
    signer = _signer(kube)
    assert signer.ensure_federation(_fl()) is None  # the controller has not asked yet
    assert signer.ensure_all() == fs.RETRY_S * 2  # second look, backing off
    path = kube.add(_request())
    assert signer.ensure_all() == fs.RECHECK_S  # issued: back at the latest in RECHECK_S
    assert set(_data(kube, path)) == set(layout.SERVER_TLS)


def test_a_gone_federations_ca_is_removed_and_a_living_ones_kept() -> None:
    kube = SignerKube()
    gone = FLRef(namespace="team", name="gone", uid="uid-gone")
    reused = FLRef(namespace="team", name="mnist-old", uid="uid-old")
    signer = _signer(kube)
    many = [FLRef(namespace="team", name=f"fl{i}", uid=f"many-{i}") for i in range(40)]
    for ref in (REF, gone, reused, *many):
        signer.cas.get(ref)
    for ref in (REF, *many):
        kube.add(_fl(ref), constants.KIND)
    kube.add(_fl(FLRef(namespace="team", name="mnist-old", uid="uid-new")), constants.KIND)
    # 43 CAs in at most FLEET_CA_SHARDS Secrets; the sweep keeps every living one as it was.
    shards = [p for p in kube.objects if p.startswith(f"/api/v1/namespaces/{SIGNER_NS}/")]
    assert len(shards) <= layout.FLEET_CA_SHARDS
    before = {ref.uid: pki.cert_to_pem(_stored_ca(kube, ref).cert) for ref in (REF, *many)}
    assert sorted(signer.cas.sweep()) == ["uid-gone", "uid-old"]  # uid-old: name reused
    after = {ref.uid: pki.cert_to_pem(_stored_ca(kube, ref).cert) for ref in (REF, *many)}
    assert after == before
    for uid in ("uid-gone", "uid-old"):
        shard = layout.fleet_ca_secret_name(layout.fleet_ca_shard(uid))
        data = _data(kube, path_of("v1", "Secret", SIGNER_NS, shard))
        assert not set(layout.fleet_ca_keys(uid)) & set(data)


def test_a_write_that_loses_a_race_is_read_again_and_keeps_the_other_writers_ca() -> None:
    kube = SignerKube()
    cas = _signer(kube).cas
    other = FLRef(namespace="team", name="other", uid=next(
        f"u{i}" for i in range(1000)
        if layout.fleet_ca_shard(f"u{i}") == layout.fleet_ca_shard(REF.uid) and f"u{i}" != REF.uid
    ))  # fmt: skip
    real_put = kube.put

    def racing_put(path: str, body: dict[str, Any]) -> dict[str, Any]:
        kube.put = real_put  # type: ignore[method-assign]
        cas.get(other)  # another writer gets there first: this put then conflicts
        return real_put(path, body)

    cas.get(REF)
    kube.put = racing_put  # type: ignore[method-assign]
    renewed = fs.FleetCAs(kube, SIGNER_NS, lambda: NOW + dt.timedelta(days=300))  # type: ignore[arg-type]
    ca = renewed.get(REF)  # due: a new CA is written, racing the other writer
    assert _stored_ca(kube).cert == ca.cert
    _stored_ca(kube, other)  # the other writer's CA survived


def test_the_ca_secret_holds_the_key_the_tenant_never_sees() -> None:
    kube = SignerKube()
    kube.add(_fl(), constants.KIND)
    kube.add(_request())
    _signer(kube).ensure_federation(_fl())
    tenant = [o for p, o in kube.objects.items() if p.startswith("/api/v1/namespaces/team/")]
    blobs = [base64.b64decode(v) for o in tenant for v in (o.get("data") or {}).values()]
    ca_key = pki.key_to_pem(_stored_ca(kube).key)
    assert ca_key not in blobs
    assert len([b for b in blobs if b"PRIVATE KEY" in b]) == 2  # the SuperLink's, the gateway's
