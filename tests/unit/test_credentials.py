"""Per-FederatedLearning credentials: issued once, reused, renewed, scoped to members."""

from __future__ import annotations

import base64
import datetime as dt

from cryptography import x509

from hub_controller import credentials_layout
from hub_controller.operator.desired import credentials as cr
from ocmfl import nodekeys, pki

GW = cr.GatewayNames(dns=("fl-server.team.svc",), ips=("127.0.1.5",))
UID = "0b5e-uid"


def _reconcile(current: dict[str, bytes], clusters: list[str], **kw: object) -> dict[str, bytes]:
    args: dict[str, object] = {"gateway": GW, "federation_uid": UID, **kw}
    return cr.reconcile_credentials(current, clusters=clusters, **args)  # type: ignore[arg-type]


def enrolled(*clusters: str) -> dict[str, bytes]:
    """SuperNode public keys as the Fleet signer stores them (from each cluster's CSR)."""
    return {f"{c}.node.pub": nodekeys.generate_keypair(c)[1] for c in clusters}


def test_first_reconcile_issues_the_server_side_and_only_public_cluster_material() -> None:
    keys = enrolled("cluster1", "cluster2", "cluster9")
    data = _reconcile({}, ["cluster1", "cluster2"], enrolled=keys)
    # Members' SuperNode public keys reach the server; a non-member's does not.
    assert cr.server_node_keys(data) == {
        "cluster1.pub": keys["cluster1.node.pub"],
        "cluster2.pub": keys["cluster2.node.pub"],
    }
    # No cluster private key or Fleet client certificate is made on the hub.
    assert not [k for k in data if k.endswith((".tls.key", ".node.key", ".tls.crt"))]


def test_every_certificate_comes_from_the_resources_own_fleet_ca() -> None:
    # Each resource gets its own CA; none of it is signed by anything agents trust.
    first, other = _reconcile({}, ["cluster1"]), _reconcile({}, ["cluster1"])
    assert first[credentials_layout.CA] != other[credentials_layout.CA]
    ca = pki.load_cert_and_key(first[credentials_layout.CA], first[credentials_layout.FLEET_CA_KEY])
    for key in (credentials_layout.SUPERLINK_CERT, credentials_layout.GATEWAY_CERT):
        assert pki.verify_issued_by(pki.load_cert_pem(first[key]), ca.cert)


def test_second_reconcile_reuses_material_so_nothing_restarts() -> None:
    first = _reconcile({}, ["cluster1"])
    second = _reconcile(first, ["cluster1"])
    assert second == first


def test_leaving_cluster_loses_its_key_and_joining_cluster_gets_its_enrolled_one() -> None:
    keys = enrolled("cluster1", "cluster2", "cluster3")
    first = _reconcile({}, ["cluster1", "cluster2"], enrolled=keys)
    second = _reconcile(first, ["cluster2", "cluster3"], enrolled=keys)
    assert set(cr.server_node_keys(second)) == {"cluster2.pub", "cluster3.pub"}


def test_gateway_certificate_follows_the_advertised_address() -> None:
    first = _reconcile({}, [])
    moved = cr.GatewayNames(dns=("fl.example.com",), ips=())
    second = _reconcile(first, [], gateway=moved)
    cert = pki.load_cert_pem(second[credentials_layout.GATEWAY_CERT])
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["fl.example.com"]
    assert second[credentials_layout.SUPERLINK_CERT] == first[credentials_layout.SUPERLINK_CERT]


def test_a_fleet_ca_near_its_end_is_replaced_with_everything_it_signed() -> None:
    data = _reconcile({}, ["cluster1"])
    assert _reconcile(data, ["cluster1"], now=pki.utcnow() + dt.timedelta(days=5)) == data
    much_later = pki.utcnow() + dt.timedelta(days=300)
    rotated = _reconcile(data, ["cluster1"], now=much_later)
    new_ca = pki.load_cert_pem(rotated[credentials_layout.CA])
    assert rotated[credentials_layout.CA] != data[credentials_layout.CA]
    for key in (credentials_layout.SUPERLINK_CERT, credentials_layout.GATEWAY_CERT):
        assert pki.verify_issued_by(pki.load_cert_pem(rotated[key]), new_ca)


def test_hub_secrets_stay_bounded_at_3500_clusters() -> None:
    # 3,500 members' public keys (the size a real SuperNode key has) over the shards: the
    # credentials Secret holds none of them and no shard comes near the apiserver's 1 MiB.
    key = nodekeys.generate_keypair("x")[1]
    names = [f"cluster-{i:04d}" for i in range(3500)]
    keys = {f"{c}.node.pub": key for c in names}
    data = _reconcile({}, names, enrolled=keys)
    meta = {"namespace": "team", "labels": {}, "ownerReferences": []}
    secrets = cr.hub_secrets(meta, "fl-server", data)
    [creds, *shards] = secrets
    assert len(shards) == credentials_layout.NODE_KEY_SHARDS
    assert not [k for k in creds["data"] if k.endswith(".node.pub")]
    assert len(str(creds)) < 16 * 1024
    sizes = [sum(len(v) for v in s["data"].values()) for s in shards]
    assert max(sizes) < 64 * 1024
    # Every member's key is in exactly the shard its name hashes to, and nowhere else.
    found = {k: i for i, s in enumerate(shards) for k in s["data"]}
    assert len(found) == len(names)
    assert all(found[f"{c}.pub"] == credentials_layout.key_shard(c) for c in names)


def test_enrolled_data_takes_a_key_only_from_its_clusters_shard() -> None:
    key = enrolled("cluster1")["cluster1.node.pub"]
    right = credentials_layout.enrolled_keys_secret_name("fl-server", "cluster1")
    wrong = next(
        name
        for i in range(100)
        if (name := credentials_layout.enrolled_keys_secret_name("fl-server", f"c{i}")) != right
    )

    def secret(name: str) -> dict[str, object]:
        encoded = base64.b64encode(key).decode()
        return {"metadata": {"name": name}, "data": {"cluster1.node.pub": encoded}}

    assert cr.enrolled_data([secret(right)]) == {"cluster1.node.pub": key}
    # A key in another shard was not put there by the signer: it is not taken.
    assert cr.enrolled_data([secret(wrong)]) == {}
