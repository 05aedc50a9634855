"""kopf handlers, driven directly with in-memory indexes and a recording fake API."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import kopf
import pytest
from fl_fixtures import REF, spec_dict

from hub_controller.api import parse_spec
from hub_controller.membership import ClusterInfo
from hub_controller.operator import handlers as operator
from hub_controller.operator import indexes as idx_mod
from hub_controller.operator.desired.works import work_name
from hub_controller.operator.observed import JobState, WorkState
from ocmfl import constants, pki

LOG = logging.getLogger("test")
# kopf's decorators type the handlers as its callback protocols; tests call them directly.
RECONCILE: Any = operator.reconcile
CLEANUP: Any = operator.cleanup


class FakeKube:
    """Records writes; `objects` answers list()."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.created: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str | None, str]] = []
        self.patched: list[tuple[str, str | None, str, Any]] = []
        self.objects: dict[str, list[dict[str, Any]]] = {}

    def apply(self, obj: dict[str, Any]) -> None:
        self.applied.append(obj)

    def create(self, obj: dict[str, Any]) -> bool:
        self.created.append(obj)
        return True

    def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        for obj in reversed(self.applied):
            meta = obj["metadata"]
            if (obj["kind"], meta.get("namespace"), meta["name"]) == (kind, namespace, name):
                return obj
        return None

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        self.deleted.append((kind, namespace, name))
        return True

    def list(
        self, api_version: str, kind: str, namespace: str | None, selector: str
    ) -> list[dict[str, Any]]:
        return self.objects.get(kind, [])

    def merge_patch(
        self, api_version: str, kind: str, namespace: str | None, name: str, patch: Any
    ) -> None:
        self.patched.append((kind, namespace, name, patch))

    def kinds(self, objs: Sequence[dict[str, Any]]) -> Sequence[str]:
        return [o["kind"] for o in objs]


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[FakeKube]:
    pki.save_tls_dir(tmp_path / "hub-ca", pki.create_ca("test-hub-ca"), None)
    monkeypatch.setenv(constants.ENV_CA_DIR, str(tmp_path / "hub-ca"))
    fake = FakeKube()
    monkeypatch.setattr(operator.STATE, "kube", fake)
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(
        kopf, "warn", lambda body, reason, message: events.append((reason, message))
    )
    monkeypatch.setattr(kopf, "info", lambda body, reason, message: None)
    fake.events = events  # type: ignore[attr-defined]
    yield fake


KEY = (REF.namespace, REF.name)
META = {"namespace": REF.namespace, "name": REF.name, "uid": REF.uid, "generation": 1}


def indexes(
    decided: tuple[str, ...] = ("c1", "c2", "c3"),
    claims: dict[str, str] | None = None,
    works: list[WorkState] | None = None,
    job: JobState | None = None,
    inputs: str = "",
) -> dict[str, Any]:
    claims = {"c1": "/srv/a", "c2": "/srv/b"} if claims is None else claims
    spec = parse_spec(spec_dict(advertiseAddress="127.0.0.1:9443"))
    return {
        "fl_idx": {KEY: [idx_mod.FLEntry(uid=REF.uid, spec=spec, inputs=inputs)]},
        "placement_idx": {},
        "decision_idx": {KEY: [decided]},
        "cluster_idx": {
            c: [ClusterInfo(c, {"fl.data-path": claims[c]} if c in claims else {})] for c in decided
        },
        "work_idx": {KEY: works or []},
        "server_job_idx": {KEY: [idx_mod.Owned(REF.uid, job)]} if job else {},
        "server_service_idx": {},
        "server_pod_idx": {},
    }


def run(spec: dict[str, Any], idx: dict[str, Any], status: dict[str, Any] | None = None) -> Any:
    patch = kopf.Patch()
    RECONCILE(
        body={"metadata": META},
        meta=META,
        spec=spec,
        status=status or {},
        patch=patch,
        logger=LOG,
        **idx,
    )
    return patch


def test_invalid_spec_fails_with_condition_and_event_and_applies_nothing(kube: FakeKube) -> None:
    raw = spec_dict(minAvailableClients=5)
    raw["client"]["placement"]["numberOfClusters"] = 2
    patch = run(raw, indexes())
    assert patch["status"]["phase"] == "Failed"
    [cond] = patch["status"]["conditions"]
    assert (cond["type"], cond["status"]) == ("Validated", "False")
    assert "lower minAvailableClients" in patch["status"]["message"]
    assert kube.events[0][0] == "InvalidSpec"  # type: ignore[attr-defined]
    assert not kube.applied and not kube.created and not kube.deleted


def test_valid_spec_applies_placement_service_and_works_for_clusters_with_data(
    kube: FakeKube,
) -> None:
    stale = WorkState(cluster="c9", name=work_name(REF), applied=True)
    patch = run(spec_dict(advertiseAddress="127.0.0.1:9443"), indexes(works=[stale]))
    kinds = kube.kinds(kube.applied)
    assert kinds == ["Placement", "Service", "Secret", "Secret", "ManifestWork", "ManifestWork"]
    works = [o for o in kube.applied if o["kind"] == "ManifestWork"]
    assert [w["metadata"]["namespace"] for w in works] == ["c1", "c2"]
    # The credentials are issued once on the hub, owned by the resource.
    secrets = [o for o in kube.applied if o["kind"] == "Secret"]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == REF.uid for o in secrets)
    assert kube.deleted == [("ManifestWork", "c9", work_name(REF))]
    assert not kube.created  # no server before clusters are ready
    assert patch["status"]["phase"] == "Waiting"
    rows = {r["name"]: r for r in patch["status"]["clusters"]}
    assert rows["c3"]["phase"] == "NoData"
    assert rows["c1"]["dataPath"] == "/srv/a"


def test_unchanged_works_are_not_reapplied(kube: FakeKube) -> None:
    run(spec_dict(advertiseAddress="127.0.0.1:9443"), indexes())
    hashes = {
        w["metadata"]["namespace"]: w["metadata"]["annotations"]
        for w in kube.applied
        if w["kind"] == "ManifestWork"
    }
    works = [
        WorkState(
            cluster=c,
            name=work_name(REF),
            applied=True,
            spec_hash=next(iter(hashes[c].values())),
        )
        for c in ("c1", "c2")
    ]
    before = len(kube.applied)
    run(spec_dict(advertiseAddress="127.0.0.1:9443"), indexes(works=works))
    # Credentials still good and works unchanged: nothing but the idempotent Placement/Service.
    assert kube.kinds(kube.applied[before:]) == ["Placement", "Service"]
    assert kube.kinds(kube.created) == ["Job"]  # both applied: the gate opens


def test_no_address_means_no_works_and_no_deletions(kube: FakeKube) -> None:
    stale = WorkState(cluster="c1", name=work_name(REF), applied=True)
    patch = run(spec_dict(), indexes(works=[stale]))
    assert kube.kinds(kube.applied) == ["Placement", "Service"]
    assert not kube.deleted
    conds = {c["type"]: c for c in patch["status"]["conditions"]}
    assert conds["ServerReady"]["reason"] == "NoAddress"


def test_touch_patches_the_inputs_annotation_only_when_inputs_changed(kube: FakeKube) -> None:
    idx = idx_mod.Indexes.of(indexes())
    operator.touch([KEY], idx, LOG)
    [(kind, ns, name, body)] = kube.patched
    assert (kind, ns, name) == (constants.KIND, REF.namespace, REF.name)
    digest = body["metadata"]["annotations"][idx_mod.INPUTS_ANNOTATION]
    kube.patched.clear()
    operator.touch([KEY], idx_mod.Indexes.of(indexes(inputs=digest)), LOG)
    assert kube.patched == []


def test_delete_removes_owned_objects_and_waits_for_works(kube: FakeKube) -> None:
    work = {"metadata": {"namespace": "c1", "name": work_name(REF)}}
    kube.objects = {
        "ManifestWork": [work],
        "Placement": [{"metadata": {"name": REF.name}}],
        "Job": [{"metadata": {"name": "digits-server"}}],
        "Service": [{"metadata": {"name": "digits-server"}}],
    }
    with pytest.raises(kopf.TemporaryError):
        CLEANUP(meta=META, retry=0, logger=LOG)
    assert ("ManifestWork", "c1", work_name(REF)) in kube.deleted
    assert ("Placement", REF.namespace, REF.name) in kube.deleted
    assert ("Job", REF.namespace, "digits-server") in kube.deleted
    kube.objects["ManifestWork"] = []
    CLEANUP(meta=META, retry=1, logger=LOG)


REFOLD: Any = operator.refold


def test_refold_timer_writes_status_from_indexes_without_api_calls(kube: FakeKube) -> None:
    works = [WorkState(cluster=c, name=work_name(REF), applied=True) for c in ("c1", "c2")]
    patch = kopf.Patch()
    REFOLD(
        meta=META,
        spec=spec_dict(advertiseAddress="127.0.0.1:9443"),
        status={},
        patch=patch,
        **indexes(works=works, job=JobState(exists=True, active=1)),
    )
    assert patch["status"]["phase"] == "Running"
    assert patch["status"]["clients"] == "2/3"
    assert not (kube.applied or kube.created or kube.deleted or kube.patched)


def test_refold_leaves_an_invalid_resource_alone(kube: FakeKube) -> None:
    patch = kopf.Patch()
    REFOLD(meta=META, spec={"client": {}}, status={}, patch=patch, **indexes())
    assert not patch
