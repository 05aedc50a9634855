"""The hub controller at hub scale (docs/scale.md): bounded status and messages, decisions
over many PlacementDecision objects, works written concurrently and only when changed, and
an object the apiserver refuses named as such."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from fl_fixtures import REF, spec, spec_dict

from hub_controller import credentials_layout
from hub_controller.api import ClusterPhase
from hub_controller.membership import ClusterInfo, ClusterResolution
from hub_controller.operator import reconcile as reconciler
from hub_controller.operator.desired import works as works_mod
from hub_controller.operator.fold import (
    MAX_CLUSTER_ROWS,
    MAX_NAMES,
    bounded_rows,
    fold,
    some_names,
    status_body,
)
from hub_controller.operator.indexes import Indexes, Owned, gather
from hub_controller.operator.observed import (
    DecisionState,
    JobState,
    Observations,
    PlacementState,
    WorkState,
)
from hub_controller.reports import NoReports
from ocmfl import constants, pki
from ocmfl.kube import KubeError, object_path

LOG = logging.getLogger("test")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEY = (REF.namespace, REF.name)
PLACEMENT_UID = "placement-uid"
ADDR = "127.0.0.1:9443"
POLICY = {
    "allowedImagePrefixes": ["quay.io/ocm-fl/"],
    "allowedDataClaims": ["fl.data-path"],
    "allowedAdvertiseDomains": ["127.0.0.1"],
    "allowHostPathStore": True,
    "allowedAppPathPrefixes": ["/opt/ocm-fl/apps/"],
}


def names(n: int) -> list[str]:
    return [f"cluster-{i:04d}" for i in range(n)]


def indexes(decisions: list[tuple[str, ...]], works: list[WorkState] | None = None) -> Indexes:
    """Indexes holding REF's Placement (all of its decisions made), its PlacementDecision
    objects (one tuple each, numbered from 1 as OCM does) and a data claim on every decided
    cluster."""
    clusters = {c for d in decisions for c in d}
    placement = PlacementState(uid=PLACEMENT_UID, selected=len(clusters))
    return Indexes.of(
        {
            "placement_idx": {KEY: [Owned(REF.uid, placement)]},
            "decision_idx": {
                KEY: [DecisionState(PLACEMENT_UID, d, i) for i, d in enumerate(decisions, 1)]
            },
            "cluster_idx": {c: [ClusterInfo(c, {"fl.data-path": f"/d/{c}"})] for c in clusters},
            "addon_idx": {},
            "work_idx": {KEY: works or []},
            "server_job_idx": {},
            "server_service_idx": {},
            "server_pod_idx": {},
            "policy_idx": {REF.namespace: [POLICY]},
        }
    )


def decision_objects(clusters: list[str], per_object: int = 100) -> list[tuple[str, ...]]:
    """The clusters split as OCM's placement controller does: at most 100 per object."""
    return [tuple(clusters[i : i + per_object]) for i in range(0, len(clusters), per_object)]


# --- status and messages -------------------------------------------------------------------
def test_status_at_3500_clusters_keeps_the_worst_rows_counts_all_and_stays_small() -> None:
    all_names = names(3500)
    resolutions = tuple(ClusterResolution(c, f"/d/{c}", "selected") for c in all_names)
    failed = JobState(exists=True, failed=1)
    works = {c: WorkState(cluster=c, name="w", applied=True) for c in all_names[:3000]}
    works.update({c: WorkState(c, "w", applied=True, job=failed) for c in all_names[100:110]})
    obs = Observations(
        placement=PlacementState(exists=True, satisfied="True"),
        resolutions=resolutions,
        works=works,
        server_address=ADDR,
    )
    st = fold(spec(minAvailableClients=3600), 1, obs, None, T0)
    assert len(st.clusters) == MAX_CLUSTER_ROWS
    assert st.clusters_omitted == 3500 - MAX_CLUSTER_ROWS
    assert st.cluster_counts == {"Applied": 2990, "Failed": 10, "Pending": 500}
    # The worst first: every failed cluster has its row, then the pending ones.
    phases = [r.phase for r in st.clusters]
    assert phases.count(ClusterPhase.FAILED) == 10
    assert phases.count(ClusterPhase.PENDING) == MAX_CLUSTER_ROWS - 10
    assert st.clients == "3000/3500"  # ready: work applied (a failed client included)
    size = len(json.dumps(status_body(st)))
    assert size < 256 * 1024
    for cond in st.conditions:
        assert len(cond.message) < 1000, cond.type
    assert "and 495 more" in st.message  # 500 pending: five named, the rest counted


def test_rows_below_the_bound_are_all_kept_and_beyond_it_the_worst() -> None:
    resolutions = (ClusterResolution("a", None, "no claim"), ClusterResolution("b", "/d", "ok"))
    obs = Observations(resolutions=resolutions, server_address=ADDR)
    st = fold(spec(), 1, obs, None, T0)
    assert [r.name for r in st.clusters] == ["a", "b"] and st.clusters_omitted == 0
    assert st.cluster_counts == {"NoData": 1, "Pending": 1}
    rows, counts = bounded_rows(st.clusters, limit=1)
    assert [r.name for r in rows] == ["b"]  # Pending (work not applied) before NoData
    assert counts == {"NoData": 1, "Pending": 1}


def test_some_names_names_a_few_and_counts_the_rest() -> None:
    assert some_names(["a", "b"]) == "a, b"
    many = names(40)
    text = some_names(many)
    assert text.count("cluster-") == MAX_NAMES and text.endswith(f"and {40 - MAX_NAMES} more")


# --- decisions -----------------------------------------------------------------------------
def test_decisions_spanning_many_placementdecision_objects_are_all_read() -> None:
    clusters = names(250)
    objects = decision_objects(clusters)
    assert [len(d) for d in objects] == [100, 100, 50]
    obs = gather(REF, spec(), indexes(objects), NoReports())
    assert [r.name for r in obs.resolutions] == clusters
    assert all(r.has_data for r in obs.resolutions)


# --- works ---------------------------------------------------------------------------------
class CountingKube:
    """Counts requests; tracks the most in flight at once (each takes `delay` seconds)."""

    def __init__(self, delay: float = 0.0, refuse_secret: str = "") -> None:
        self.delay = delay
        self.refuse_secret = refuse_secret
        self.requests: list[tuple[str, str]] = []
        self.objects: dict[str, dict[str, Any]] = {}
        self.created: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most = 0

    def _call(self, verb: str, path: str) -> None:
        with self.lock:
            self.requests.append((verb, path))
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        time.sleep(self.delay)
        with self.lock:
            self.in_flight -= 1

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        path = object_path(obj)
        self._call("apply", path)
        if self.refuse_secret and obj["metadata"]["name"] == self.refuse_secret:
            body = json.dumps({"message": "Secret is invalid: data: Too long: must have at most "
                               "1048576 bytes"})  # fmt: skip
            raise KubeError(422, "Unprocessable Entity", body)
        self.objects[path] = obj
        return obj

    def create(self, path: str, body: dict[str, Any], exist_ok: bool = True) -> dict[str, Any]:
        self._call("create", path)
        with self.lock:
            self.created.append(body)
        return body

    def get(self, path: str, query: Any = None) -> dict[str, Any] | None:
        self._call("get", path)
        return self.objects.get(path)

    def list_objects(self, path: str, label_selector: str | None = None) -> list[Any]:
        self._call("list", path)
        return []

    def delete(self, path: str, query: Any = None, body: Any = None) -> None:
        self._call("delete", path)

    def patch(self, path: str, body: Any, content_type: str = "") -> dict[str, Any]:
        self._call("patch", path)
        return {}

    def writes(self, kind: str) -> int:
        return sum(1 for verb, path in self.requests if verb != "get" and f"/{kind}" in path)


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(
        kopf, "warn", lambda body, reason, message: events.append((reason, message))
    )
    monkeypatch.setattr(kopf, "info", lambda body, reason, message: None)
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    return events


def operator(kube: CountingKube, tmp_path: Any) -> reconciler.Operator:
    pki.save_tls_dir(tmp_path / "hub-ca", pki.create_ca("test-hub-ca"), None)
    return reconciler.Operator(kube=kube)  # type: ignore[arg-type]


def body(status: dict[str, Any]) -> dict[str, Any]:
    meta = {"namespace": REF.namespace, "name": REF.name, "uid": REF.uid, "generation": 1}
    raw = spec_dict(advertiseAddress=ADDR, minAvailableClients=5000)
    return {"apiVersion": constants.API_VERSION, "kind": constants.KIND, "metadata": meta,
            "spec": raw, "status": status}  # fmt: skip


def test_works_are_written_concurrently_with_a_bound_and_unchanged_ones_cost_nothing(
    tmp_path: Any, quiet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube = CountingKube(delay=0.01)
    op = operator(kube, tmp_path)
    clusters = names(300)
    state = reconciler.Run(REF, status={})
    reconciler.reconcile(op, NoReports(), body({}), indexes(decision_objects(clusters)), state, LOG)
    assert kube.writes("manifestworks") == 300
    assert 1 < kube.most <= reconciler.WRITE_CONCURRENCY
    # The next pass comes before the index shows them (its watch lags): nothing written again.
    before = len(kube.requests)
    lagging = indexes(decision_objects([*clusters, "cluster-0x"]))
    reconciler.reconcile(op, NoReports(), body(state.status), lagging, state, LOG)
    assert [p for v, p in kube.requests[before:] if "/manifestworks" in p] == [
        f"/apis/{constants.WORK_GROUP}/v1/namespaces/cluster-0x/manifestworks"
    ]
    kube.created = [w for w in kube.created if w["metadata"]["namespace"] != "cluster-0x"]
    # The index now shows the 300 works with the hashes the controller wrote.
    works = [
        WorkState(
            w["metadata"]["namespace"],
            works_mod.work_name(REF),
            uid=REF.uid,
            spec_hash=w["metadata"]["annotations"][works_mod.SPEC_HASH_ANNOTATION],
        )
        for w in kube.created
        if w["kind"] == "ManifestWork"
    ]
    # One cluster joins: one work written, none of the 300 others touched.
    built: list[str] = []
    real = works_mod.desired_work

    def counting(*args: Any, **kwargs: Any) -> dict[str, Any]:
        built.append(args[2].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(works_mod, "desired_work", counting)
    before = len(kube.requests)
    joined = [*clusters, "cluster-new"]
    idx = indexes(decision_objects(joined), works)
    reconciler.reconcile(op, NoReports(), body(state.status), idx, state, LOG)
    new = kube.requests[before:]
    assert [p for v, p in new if "/manifestworks" in p] == [
        f"/apis/{constants.WORK_GROUP}/v1/namespaces/cluster-new/manifestworks"
    ]
    assert built == ["cluster-new"]  # the 300 others come from the cache
    # It leaves again: one delete, nothing else written for the works.
    before = len(kube.requests)
    works.append(WorkState("cluster-new", works_mod.work_name(REF), uid=REF.uid))
    idx = indexes(decision_objects(clusters), works)
    reconciler.reconcile(op, NoReports(), body(state.status), idx, state, LOG)
    assert [(v, p.rsplit("/", 3)[-3]) for v, p in kube.requests[before:]
            if "/manifestworks" in p] == [("delete", "cluster-new")]  # fmt: skip


def test_an_internal_object_the_apiserver_refuses_is_named_with_its_size_not_invalid_spec(
    tmp_path: Any, quiet: list[tuple[str, str]]
) -> None:

    refused = credentials_layout.credentials_secret_name(credentials_layout.server_name(REF))
    kube = CountingKube(refuse_secret=refused)
    op = operator(kube, tmp_path)
    state = reconciler.Run(REF, status={})
    idx = indexes(decision_objects(names(3)))
    reconciler.reconcile(op, NoReports(), body({}), idx, state, LOG)
    status = state.status
    assert status["phase"] == "Failed"
    [cond] = status["conditions"]
    assert cond["reason"] == reconciler.REASON_REFUSED
    assert "invalid spec" not in status["message"]
    assert f"Secret {REF.namespace}/{refused}" in status["message"]
    assert "bytes" in status["message"] and "Too long" in status["message"]
    assert quiet[0][0] == "Refused"


def test_a_spec_that_would_make_oversized_works_fails_naming_the_cap_and_writes_no_work(
    tmp_path: Any, quiet: list[tuple[str, str]]
) -> None:
    """Strings in runConfig are not bounded by the CRD (any JSON scalar): the cap on one
    ManifestWork is (each selected cluster gets one in hub etcd)."""
    kube = CountingKube()
    op = operator(kube, tmp_path)
    state = reconciler.Run(REF, status={})
    big = body({})
    big["spec"]["client"]["runConfig"] = {f"k{i}": "x" * 1000 for i in range(300)}
    reconciler.reconcile(op, NoReports(), big, indexes(decision_objects(names(3))), state, LOG)
    status = state.status
    assert status["phase"] == "Failed"
    [cond] = status["conditions"]
    assert cond["reason"] == "InvalidSpec"
    assert (
        "the controller refused an object built from the spec (ManifestWork " in status["message"]
    )
    assert f"over the cap of {works_mod.MAX_WORK_BYTES} bytes" in status["message"]
    assert "spec.client.runConfig" in status["message"]
    assert kube.writes("manifestworks") == 0


def test_the_fleet_signer_stores_a_key_in_its_clusters_shard_where_the_operator_reads_it() -> None:
    import datetime as dt

    from hub_controller.operator.desired import credentials
    from hub_controller.signer.fleet import ApproveFleet, FleetSigner
    from ocmfl import nodekeys

    made: list[dict[str, Any]] = []

    class Kube:
        def get(self, path: str) -> None:
            return None

        def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            made.append(body)
            return body

    public = nodekeys.generate_keypair("c7")[1].split(b" c7")[0]
    decision = ApproveFleet("c7", REF, public, dt.timedelta(days=1))
    FleetSigner(Kube())._store_node_key(decision)  # type: ignore[arg-type]
    [secret] = made
    server_name = credentials_layout.server_name(REF)
    assert secret["metadata"]["name"] == credentials_layout.enrolled_keys_secret_name(
        server_name, "c7"
    )
    labels = secret["metadata"]["labels"]
    selector = dict(
        part.split("=") for part in credentials_layout.enrolled_selector(REF.uid).split(",")
    )
    assert all(labels[k] == v for k, v in selector.items())
    assert set(credentials.enrolled_data([secret])) == {"c7.node.pub"}


def test_status_patch_removes_a_phase_no_cluster_is_in_any_more() -> None:
    from hub_controller.operator.fold import status_patch

    obs = Observations(resolutions=(ClusterResolution("a", "/d", "ok"),), server_address=ADDR)
    pending = fold(spec(), 1, obs, None, T0)
    applied_obs = Observations(
        resolutions=obs.resolutions,
        works={"a": WorkState("a", "w", applied=True)},
        server_address=ADDR,
    )
    applied = fold(spec(), 1, applied_obs, pending, T0)
    patch = status_patch(applied, status_body(pending))
    # A merge patch merges maps: the Pending count must be removed explicitly.
    assert patch["clusterCounts"] == {"Applied": 1, "Pending": None}
