"""The hub-identity ledger: which hub credentials OCM issued to each cluster's addon agent
through the cluster's own registration agent (classification, the annotation, the kopf edge
that records and warns, the indexes the signers read). Certificates are made by ocmfl.pki."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from hub_creds import issue_hub_credential, registration_agent

from hub_controller import membership_indexes as indexes
from hub_controller.bootstrap.addon_template import default_agent_subject
from hub_controller.membership import AddonInfo, AddonMembers, ClusterInfo, addon_info
from hub_controller.signer import hub_identity as hi
from hub_controller.signer.hub_identity import Forged, HubIdentity
from hub_controller.signer.ledger import FORGED_REASON, Ledger, addon_path
from ocmfl import constants, pki
from ocmfl.kube import KubeError

NOW = pki.utcnow()

# kopf.index types a decorated handler as kopf's IndexingFn (every kwarg required); kopf calls
# these with all of them, the tests with the few each handler reads.
_Index = Callable[..., Awaitable[Any]]
addon_idx = cast(_Index, indexes.addon_idx)
hub_csr_idx = cast(_Index, indexes.hub_csr_idx)


def identity(fingerprint: str, hours: float, cluster: str = "cluster1") -> HubIdentity:
    when = (NOW + dt.timedelta(hours=hours)).replace(microsecond=0)
    return HubIdentity(cluster, fingerprint, when, f"csr-{fingerprint[:4]}")


# --- classify -----------------------------------------------------------------------------------


def test_a_credential_issued_through_the_clusters_own_registration_agent_is_trusted() -> None:
    cred = issue_hub_credential("cluster1")
    found = hi.classify(cred.csr)
    assert isinstance(found, HubIdentity)
    assert found.cluster == "cluster1"
    assert found.fingerprint == pki.certificate_fingerprint(cred.pair.cert)
    assert len(found.fingerprint) == 64 and found.fingerprint == found.fingerprint.lower()
    assert found.not_after == cred.pair.cert.not_valid_after_utc
    assert found.csr == cred.csr["metadata"]["name"]


@pytest.mark.parametrize(
    ("requester", "why"),
    [
        (registration_agent("cluster10"), "prefix: OCM's HasPrefix check passes it"),
        (("system:open-cluster-management:cluster1", []), "no agent id"),
        (
            (
                "system:open-cluster-management:cluster1:x:y",
                ["system:open-cluster-management:cluster1"],
            ),
            "five parts",
        ),
        (
            ("system:open-cluster-management:cluster1:abc", ["system:authenticated"]),
            "without the cluster's group",
        ),
        (("system:serviceaccount:open-cluster-management:cluster-bootstrap", []), "bootstrap"),
        (("system:bootstrap:abcdef", ["system:bootstrappers"]), "bootstrap token"),
        (
            (
                default_agent_subject("cluster2")["user"],
                default_agent_subject("cluster2")["groups"],
            ),
            "another cluster's addon agent",
        ),
    ],
)
def test_anyone_else_asking_for_a_clusters_addon_credential_is_forged(
    requester: tuple[str, list[str]], why: str
) -> None:
    cred = issue_hub_credential("cluster1", requester)
    found = hi.classify(cred.csr)
    assert isinstance(found, Forged), why
    assert (found.cluster, found.requester, found.issued) == ("cluster1", requester[0], True)
    assert requester[0] in found.message() and "cluster1" in found.message()
    assert found.csr in found.message()


def test_what_is_not_an_issued_addon_credential_is_nothing() -> None:
    pending = issue_hub_credential("cluster1", issued=False)
    assert hi.classify(pending.csr) is None  # legit, but not issued yet
    forged_pending = issue_hub_credential("cluster1", registration_agent("cluster10"), issued=False)
    found = hi.classify(forged_pending.csr)
    assert isinstance(found, Forged) and not found.issued  # warned at once, before OCM acts
    other = issue_hub_credential("cluster1")
    other.csr["spec"]["signerName"] = constants.SIGNER_NAME
    assert hi.classify(other.csr) is None
    other = issue_hub_credential("cluster1")
    other.csr["metadata"]["labels"][constants.LABEL_OCM_ADDON_NAME] = "another-addon"
    assert hi.classify(other.csr) is None
    other = issue_hub_credential("cluster1")
    other.csr["status"]["certificate"] = "not base64!"
    assert hi.classify(other.csr) is None


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({hi.CREDENTIAL_ID: ["X509SHA256=" + "ab" * 32]}, "ab" * 32),
        ({hi.CREDENTIAL_ID: ["X509SHA256=" + "AB" * 32]}, "ab" * 32),
        ({}, None),
        (None, None),
        ({hi.CREDENTIAL_ID: []}, None),
        ({hi.CREDENTIAL_ID: "X509SHA256=" + "ab" * 32}, None),  # not a list
        ({hi.CREDENTIAL_ID: ["JTI=abc"]}, None),  # a token's credential
        ({hi.CREDENTIAL_ID: ["X509SHA256=" + "ab" * 32, "X509SHA256=" + "cd" * 32]}, None),
        ({hi.CREDENTIAL_ID: ["X509SHA256=abc"]}, None),
        ("junk", None),
    ],
)
def test_the_requesters_credential_fingerprint(extra: Any, expected: str | None) -> None:
    assert hi.credential_fingerprint({"spec": {"extra": extra}}) == expected


# --- the annotation -----------------------------------------------------------------------------


def test_the_ledger_round_trips_and_keeps_the_four_latest_unexpired_entries() -> None:
    entries = [identity(f"{i:064x}", hours=i) for i in range(1, 6)]
    expired = identity("f" * 64, hours=-1)
    merged = hi.merge_ledger([*entries[:4], expired], entries[4], NOW)
    assert [e.fingerprint for e in merged] == [f"{i:064x}" for i in (5, 4, 3, 2)]
    text = hi.render_ledger(merged)
    assert hi.parse_ledger("cluster1", text) == merged
    assert json.loads(text)[0] == {
        "sha256": f"{5:064x}",
        "notAfter": entries[4].not_after.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "csr": entries[4].csr,
    }
    again = hi.merge_ledger(merged, entries[4], NOW)  # the same credential: no duplicate
    assert again == merged
    assert hi.merge_ledger([], expired, NOW) == []


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        '{"sha256": "x"}',
        '["x"]',
        '[{"sha256": "zz", "notAfter": "2030-01-01T00:00:00Z", "csr": "a"}]',
        f'[{{"sha256": "{"a" * 64}", "notAfter": "tomorrow", "csr": "a"}}]',
        f'[{{"sha256": "{"a" * 64}", "notAfter": "2030-01-01T00:00:00Z"}}]',
    ],
)
def test_a_malformed_ledger_trusts_nothing_and_says_why(text: str) -> None:
    entries, problem = hi.ledger_of("cluster1", {hi.ANNOTATION: text})
    assert entries == [] and problem is not None
    assert "cluster1" in problem and hi.ANNOTATION in problem
    info = addon_info(
        {"metadata": {"name": "x", "namespace": "cluster1", "annotations": {hi.ANNOTATION: text}}}
    )
    assert info is not None and info.ledger == () and info.ledger_problem == problem


async def test_the_indexes_give_the_signers_ledger_and_live_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    legit = issue_hub_credential("cluster1")
    forged = issue_hub_credential("cluster1", registration_agent("cluster10"))
    recorded = identity("1" * 64, hours=2)
    mca: dict[str, Any] = {
        "metadata": {
            "name": constants.ADDON_NAME,
            "namespace": "cluster1",
            "annotations": {hi.ANNOTATION: hi.render_ledger([recorded])},
        }
    }
    addon = await addon_idx(namespace="cluster1", body=mca)
    assert addon == {"cluster1": AddonInfo(constants.ADDON_NAME, (recorded,))}
    assert await hub_csr_idx(body=legit.csr) == {"cluster1": legit.identity}
    assert await hub_csr_idx(body=forged.csr) is None  # never indexed
    members = AddonMembers(
        {"cluster1": [ClusterInfo("cluster1", accepted=True)]},
        {"cluster1": [addon["cluster1"]]},
        {"cluster1": [legit.identity]},
    )
    assert members.hub_identities("cluster1") == [recorded, legit.identity]
    assert members.hub_identities("cluster10") == []
    # A malformed annotation is logged, trusts nothing, and the addon is still a member.
    mca["metadata"]["annotations"] = {hi.ANNOTATION: "[{]"}
    with caplog.at_level(logging.WARNING):
        broken = await addon_idx(namespace="cluster1", body=mca)
    assert "malformed" in caplog.text
    members = AddonMembers(
        {"cluster1": [ClusterInfo("cluster1", accepted=True)]}, {"cluster1": [broken["cluster1"]]}
    )
    assert members.is_registered("cluster1") and members.hub_identities("cluster1") == []


# --- the kopf edge: record, warn ----------------------------------------------------------------


class FakeHub:
    """ManagedClusterAddOns by path, with resourceVersion preconditions like the apiserver."""

    def __init__(self, *clusters: str, annotations: dict[str, str] | None = None) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        for c in clusters:
            meta: dict[str, Any] = {
                "name": constants.ADDON_NAME,
                "namespace": c,
                "resourceVersion": "1",
            }
            if annotations:
                meta["annotations"] = dict(annotations)
            self.objects[addon_path(c)] = {"metadata": meta}

    def get(self, path: str) -> dict[str, Any] | None:
        obj = self.objects.get(path)
        return json.loads(json.dumps(obj)) if obj else None

    def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = self.objects[path]
        meta = obj["metadata"]
        if body["metadata"]["resourceVersion"] != meta["resourceVersion"]:
            raise KubeError(409, "Conflict", "the object has been modified")
        meta.setdefault("annotations", {}).update(body["metadata"]["annotations"])
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        self.patches.append((path, body))
        return obj


class Warnings:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def __call__(self, csr: Any, reason: str, message: str) -> None:
        self.posted.append((csr["metadata"]["name"], reason, message))


def ledger_entries(hub: FakeHub, cluster: str) -> list[HubIdentity]:
    meta = hub.objects[addon_path(cluster)]["metadata"]
    entries, problem = hi.ledger_of(cluster, meta.get("annotations"))
    assert problem is None
    return entries


def test_an_issued_credential_is_recorded_once_on_its_clusters_addon() -> None:
    hub, warn = FakeHub("cluster1"), Warnings()
    ledger = Ledger(hub, warn)  # type: ignore[arg-type]
    cred = issue_hub_credential("cluster1")
    assert ledger.observe(cred.csr) == cred.identity
    assert ledger_entries(hub, "cluster1") == [cred.identity]
    [(path, patch)] = hub.patches
    assert path == addon_path("cluster1")
    assert patch["metadata"]["resourceVersion"] == "1"  # a concurrent change is a 409
    ledger.observe(cred.csr)  # the same CSR again (approved, issued, relisted): no write
    assert len(hub.patches) == 1
    renewed = issue_hub_credential("cluster1")
    ledger.observe(renewed.csr)
    assert {e.fingerprint for e in ledger_entries(hub, "cluster1")} == {
        cred.fingerprint,
        renewed.fingerprint,
    }
    assert not warn.posted


def test_a_restarted_hub_rewrites_nothing_it_finds_recorded() -> None:
    cred = issue_hub_credential("cluster1")
    hub = FakeHub("cluster1", annotations={hi.ANNOTATION: hi.render_ledger([cred.identity])})
    assert not Ledger(hub, Warnings()).record(cred.identity)  # type: ignore[arg-type]
    assert not hub.patches


def test_a_malformed_ledger_is_rewritten_with_the_new_entry() -> None:
    hub = FakeHub("cluster1", annotations={hi.ANNOTATION: "garbage"})
    cred = issue_hub_credential("cluster1")
    assert Ledger(hub, Warnings()).record(cred.identity)  # type: ignore[arg-type]
    assert ledger_entries(hub, "cluster1") == [cred.identity]


def test_nothing_is_recorded_without_the_clusters_addon_or_once_expired() -> None:
    hub = FakeHub()
    ledger = Ledger(hub, Warnings())  # type: ignore[arg-type]
    assert not ledger.record(issue_hub_credential("cluster1").identity)
    hub = FakeHub("cluster1")
    ledger = Ledger(hub, Warnings())  # type: ignore[arg-type]
    assert not ledger.record(identity("a" * 64, hours=-1))
    assert not hub.patches


def test_a_forged_credential_is_warned_about_and_never_recorded() -> None:
    hub, warn = FakeHub("cluster1", "cluster10"), Warnings()
    ledger = Ledger(hub, warn)  # type: ignore[arg-type]
    asked = issue_hub_credential("cluster1", registration_agent("cluster10"), issued=False)
    ledger.observe(asked.csr)
    ledger.observe(asked.csr)  # the same event again: one warning
    issued = dict(asked.csr, status=issue_hub_credential("cluster1").csr["status"])
    ledger.observe(issued)  # issued by OCM after all: warned again
    assert [(n, r) for n, r, _ in warn.posted] == [
        (asked.csr["metadata"]["name"], FORGED_REASON)
    ] * 2
    _, _, message = warn.posted[-1]
    assert "system:open-cluster-management:cluster10:" in message and "'cluster1'" in message
    assert "OCM issued it" in message
    assert not hub.patches
