"""Per-FederatedLearning credentials on the controller's side: the request it makes of the
signer, what the server gets, when it may start, and the Secrets' bounds."""

from __future__ import annotations

import base64
import datetime as dt

import pytest

from hub_controller import credentials_layout
from hub_controller.operator.desired import credentials as cr
from hub_controller.signer import fleet_server
from ocmfl import nodekeys, pki

GW = credentials_layout.GatewayNames(dns=("fl-server.team.svc",), ips=("127.0.1.5",))
NOW = pki.utcnow()


def signer_tls(gateway: credentials_layout.GatewayNames = GW) -> dict[str, bytes]:
    """The server entries as the signer part writes them into the credentials Secret."""
    ca, _ = fleet_server.fleet_ca({}, "fleet", NOW)
    return fleet_server.server_tls({}, ca, gateway, NOW)


def enrolled(*clusters: str) -> dict[str, bytes]:
    """SuperNode public keys as the Fleet signer stores them (from each cluster's CSR)."""
    return {f"{c}.node.pub": nodekeys.generate_keypair(c)[1] for c in clusters}


def test_the_server_gets_the_signers_certificates_and_only_members_public_keys() -> None:
    keys = enrolled("cluster1", "cluster2", "cluster9")
    tls = signer_tls()
    data = cr.credentials(tls, clusters=["cluster1", "cluster2"], enrolled=keys)
    # Members' SuperNode public keys reach the server; a non-member's does not.
    assert cr.server_node_keys(data) == {
        "cluster1.pub": keys["cluster1.node.pub"],
        "cluster2.pub": keys["cluster2.node.pub"],
    }
    assert cr.server_tls_bundle(data) == tls
    # No private key of a cluster or of the Fleet CA, and no Fleet client certificate.
    assert not [k for k in data if k.endswith((".tls.key", ".node.key", ".tls.crt", "ca.key"))]


def test_leaving_cluster_loses_its_key_and_joining_cluster_gets_its_enrolled_one() -> None:
    keys = enrolled("cluster1", "cluster2", "cluster3")
    data = cr.credentials(signer_tls(), clusters=["cluster2", "cluster3"], enrolled=keys)
    assert set(cr.server_node_keys(data)) == {"cluster2.pub", "cluster3.pub"}


def test_the_controllers_request_holds_no_key_material_and_names_the_gateway() -> None:
    meta = {"namespace": "team", "labels": {"a": "b"}, "ownerReferences": []}
    request = cr.credentials_request(meta, "fl-server", GW)
    assert "data" not in request  # the signer owns every entry
    assert request["metadata"]["labels"][credentials_layout.LABEL_KEYS] == "tls"
    annotation = request["metadata"]["annotations"][credentials_layout.GATEWAY_NAMES_ANNOTATION]
    assert credentials_layout.GatewayNames.from_annotation(annotation) == GW


def test_the_server_waits_until_the_signer_issued_for_the_current_gateway() -> None:
    assert "has not issued ca.crt" in str(cr.tls_ready({}, GW, NOW))
    tls = signer_tls()
    assert cr.tls_ready(tls, GW, NOW) is None
    moved = credentials_layout.GatewayNames(dns=("fl.example.com",))
    assert "does not name the gateway's current names" in str(cr.tls_ready(tls, moved, NOW))
    # A certificate of another CA than the one in ca.crt does not count.
    assert "not a current certificate" in str(
        cr.tls_ready({**tls, credentials_layout.CA: signer_tls()[credentials_layout.CA]}, GW, NOW)
    )
    later = NOW + dt.timedelta(days=300)
    assert "not a current certificate" in str(cr.tls_ready(tls, GW, later))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[]", "expected"),
        ('{"names": ["x"]}', "expected"),
        ('{"dns": "x"}', "lists of at most 64"),
        ('{"dns": [1]}', "1 to 253 characters"),
        ('{"dns": [], "ips": []}', "no name"),
        ("{", "Expecting"),  # not JSON
    ],
)
def test_a_malformed_gateway_annotation_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        credentials_layout.GatewayNames.from_annotation(text)


def test_hub_secrets_stay_bounded_at_3500_clusters() -> None:
    # 3,500 members' public keys (the size a real SuperNode key has) over the shards: the
    # credentials Secret holds none of them and no shard comes near the apiserver's 1 MiB.
    key = nodekeys.generate_keypair("x")[1]
    names = [f"cluster-{i:04d}" for i in range(3500)]
    keys = {f"{c}.node.pub": key for c in names}
    data = cr.credentials(signer_tls(), clusters=names, enrolled=keys)
    meta = {"namespace": "team", "labels": {}, "ownerReferences": []}
    secrets = cr.hub_secrets(meta, "fl-server", GW, data)
    [creds, *shards] = secrets
    assert len(shards) == credentials_layout.NODE_KEY_SHARDS
    assert "data" not in creds
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
