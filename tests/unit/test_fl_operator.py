"""One reconcile pass and the cleanup handler, driven with in-memory indexes and a recording
fake of the Kubernetes layer."""

from __future__ import annotations

import base64
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import kopf
import pytest
from fl_fixtures import REF, spec_dict

from hub_controller import credentials_layout
from hub_controller.membership import ClusterInfo
from hub_controller.operator import handlers
from hub_controller.operator import reconcile as reconciler
from hub_controller.operator.desired.works import work_name
from hub_controller.operator.indexes import Indexes, Owned
from hub_controller.operator.observed import (
    DecisionState,
    JobState,
    PlacementState,
    WorkState,
    signed_fleet_csr,
)
from hub_controller.reports import ClusterReport, NoReports
from hub_controller.signer import fleet_server
from ocmfl import constants, nodekeys, pki
from ocmfl.kube import object_path

LOG = logging.getLogger("test")
# kopf's decorators type the handlers as its callback protocols; tests call them directly.
CLEANUP: Any = handlers.cleanup


FLEET_CA = fleet_server.fleet_ca({}, "fleet", pki.utcnow())[0]


class FakeKube:
    """Records writes; `objects` answers list_objects() by kind. With `signer` on, a
    credentials Secret's request comes back with the server certificates the signer part
    issues for the names it asks for (hub_controller.signer.fleet_server)."""

    def __init__(self) -> None:
        self.signer = True
        self.applied: list[dict[str, Any]] = []
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.patched: list[tuple[str, Any]] = []
        self.objects: dict[str, list[dict[str, Any]]] = {}

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(obj)
        meta = obj["metadata"]
        names = (meta.get("annotations") or {}).get(credentials_layout.GATEWAY_NAMES_ANNOTATION)
        if self.signer and names is not None:
            gateway = credentials_layout.GatewayNames.from_annotation(names)
            data = fleet_server.server_tls({}, FLEET_CA, gateway, pki.utcnow())
            encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
            self.applied[-1] = {**obj, "data": encoded}
        return obj

    def create(self, path: str, body: dict[str, Any], exist_ok: bool = True) -> dict[str, Any]:
        self.created.append(body)
        return body

    def get(self, path: str) -> dict[str, Any] | None:
        obj: dict[str, Any]  # reversed() of a list of dict[str, Any] reads as Any
        for obj in reversed(self.applied):
            if object_path(obj) == path:
                return obj
        return None

    def delete(self, path: str, query: Any = None, body: Any = None) -> None:
        self.deleted.append(path)

    def list_objects(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        return [o for kind, objs in self.objects.items() if f"/{kind}" in path for o in objs]

    def patch(self, path: str, body: Any, content_type: str = "") -> dict[str, Any]:
        self.patched.append((path, body))
        return {}

    def kinds(self, objs: Sequence[dict[str, Any]]) -> Sequence[str]:
        return [o["kind"] for o in objs]

    def status(self) -> dict[str, Any]:
        """The last status patch."""
        [(path, body)] = [p for p in self.patched if p[0].endswith("/status")][-1:]
        assert path.endswith(f"/{REF.name}/status")
        patch: dict[str, Any] = body["status"]
        return patch


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> FakeKube:
    fake = FakeKube()
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(
        kopf, "warn", lambda body, reason, message: events.append((reason, message))
    )
    monkeypatch.setattr(kopf, "info", lambda body, reason, message: None)
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    fake.events = events  # type: ignore[attr-defined]
    return fake


@pytest.fixture
def op(kube: FakeKube, tmp_path: Any) -> reconciler.Operator:
    pki.save_tls_dir(tmp_path / "hub-ca", pki.create_ca("test-hub-ca"), None)
    return reconciler.Operator(kube=kube)  # type: ignore[arg-type]


KEY = (REF.namespace, REF.name)
PLACEMENT_UID = "placement-uid"
POLICY = {
    "allowedImagePrefixes": ["quay.io/ocm-fl/"],
    "allowedDataClaims": ["fl.data-path"],
    "allowedAdvertiseDomains": ["127.0.0.1"],
    "allowHostPathStore": True,
    "allowedAppPathPrefixes": ["/opt/ocm-fl/apps/"],
}
META = {"namespace": REF.namespace, "name": REF.name, "uid": REF.uid, "generation": 1}


def indexes(
    decided: tuple[str, ...] = ("c1", "c2", "c3"),
    claims: dict[str, str] | None = None,
    works: list[WorkState] | None = None,
    job: JobState | None = None,
    selected: int | None = None,
    clusters: dict[str, ClusterInfo] | None = None,
) -> Indexes:
    """Indexes as the hub has them for REF: its Placement (uid PLACEMENT_UID) controls the
    decision (`selected`: its selected count, default all decided); `works` without an owner
    uid are REF's; `clusters`: ManagedClusters besides (or instead of) the decided ones'."""
    claims = {"c1": "/srv/a", "c2": "/srv/b"} if claims is None else claims
    works = [dataclasses.replace(w, uid=w.uid or REF.uid) for w in works or []]
    return Indexes.of(
        {
            "placement_idx": {
                KEY: [
                    Owned(
                        REF.uid,
                        PlacementState(
                            uid=PLACEMENT_UID,
                            selected=len(decided) if selected is None else selected,
                        ),
                    )
                ]
            },
            "decision_idx": {KEY: [DecisionState(PLACEMENT_UID, decided)]},
            "cluster_idx": {
                **{
                    c: [ClusterInfo(c, {"fl.data-path": claims[c]} if c in claims else {})]
                    for c in decided
                },
                **{c: [info] for c, info in (clusters or {}).items()},
            },
            "addon_idx": {},
            "work_idx": {KEY: works},
            "server_job_idx": {KEY: [Owned(REF.uid, job)]} if job else {},
            "server_service_idx": {},
            "server_pod_idx": {},
            # The admin's policy allowing what spec_dict() uses (hub_controller/policy.py).
            "policy_idx": {REF.namespace: [POLICY]},
        }
    )


def body(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": META,
        "spec": spec,
        "status": status or {},
    }


class Reports(NoReports):
    def __init__(self, reports: dict[str, ClusterReport]) -> None:
        self.reports = reports

    def snapshot(self, uid: str) -> dict[str, ClusterReport]:
        return self.reports if uid == REF.uid else {}


def run(
    op: reconciler.Operator,
    spec: dict[str, Any],
    idx: Indexes,
    state: reconciler.Run | None = None,
    reports: NoReports | None = None,
) -> reconciler.Run:
    state = state or reconciler.Run(REF, status={})
    reconciler.reconcile(op, reports or NoReports(), body(spec, state.status), idx, state, LOG)
    return state


def test_invalid_spec_fails_with_condition_and_event_and_applies_nothing(
    op: reconciler.Operator, kube: FakeKube
) -> None:
    raw = spec_dict(minAvailableClients=5)
    raw["client"]["placement"]["numberOfClusters"] = 2
    run(op, raw, indexes())
    status = kube.status()
    assert status["phase"] == "Failed"
    [cond] = status["conditions"]
    assert (cond["type"], cond["status"]) == ("Validated", "False")
    assert "lower minAvailableClients" in status["message"]
    assert kube.events[0][0] == "InvalidSpec"  # type: ignore[attr-defined]
    assert not kube.applied and not kube.created and not kube.deleted
    # ...and /metrics says so (the chart's OcmFlFederationFailed alert reads it).
    labels = {"namespace": REF.namespace, "name": REF.name, "phase": "Failed"}
    assert op.metrics.registry.get_sample_value("ocmfl_federation_phase", labels) == 1.0


def test_a_resource_outside_the_charts_fl_namespaces_fails_and_applies_nothing(
    op: reconciler.Operator, kube: FakeKube
) -> None:
    op.fl_namespaces = frozenset({"fl", "team-b"})  # REF lives in another namespace
    run(op, spec_dict(advertiseAddress="127.0.0.1:9443"), indexes())
    status = kube.status()
    assert status["phase"] == "Failed"
    [cond] = status["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "Validated",
        "False",
        "NamespaceNotServed",
    )
    assert status["message"] == (
        f"namespace {REF.namespace}: the hub may run FL servers only in fl, team-b (Helm value "
        f"rbac.flNamespaces); create the resource there, or ask the hub admin to add "
        f"{REF.namespace} to rbac.flNamespaces"
    )
    assert kube.events == [("NamespaceNotServed", status["message"])]  # type: ignore[attr-defined]
    assert not kube.applied and not kube.created and not kube.deleted
    # Served (listed, or no list: the chart's cluster-wide grant), it runs as before.
    for served in (frozenset({REF.namespace}), frozenset()):
        op.fl_namespaces = served
        assert reconciler.namespace_not_served(REF.namespace, served) is None


def test_valid_spec_applies_placement_service_and_works_for_clusters_with_data(
    op: reconciler.Operator, kube: FakeKube
) -> None:
    stale = WorkState(cluster="c9", name=work_name(REF), applied=True)
    run(op, spec_dict(advertiseAddress="127.0.0.1:9443"), indexes(works=[stale]))
    kinds = kube.kinds(kube.applied)
    # the credentials Secret and the client-token Secret (node keys: once the server starts)
    assert kinds == ["Placement", "Service", "Secret", "Secret"]
    # New works are created (one request each; a taken name would answer 409).
    works = [o for o in kube.created if o["kind"] == "ManifestWork"]
    assert sorted(w["metadata"]["namespace"] for w in works) == ["c1", "c2"]
    # The credentials are issued once on the hub, owned by the resource.
    secrets = [o for o in kube.applied if o["kind"] == "Secret"]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == REF.uid for o in secrets)
    assert kube.deleted == [
        f"/apis/{constants.WORK_GROUP}/v1/namespaces/c9/manifestworks/{work_name(REF)}"
    ]
    assert "Job" not in kube.kinds(kube.created)  # no server before clusters are ready
    status = kube.status()
    assert status["phase"] == "Waiting"
    rows = {r["name"]: r for r in status["clusters"]}
    assert rows["c3"]["phase"] == "NoData"
    assert rows["c1"]["dataPath"] == "/srv/a"


def test_unchanged_inputs_apply_nothing_and_an_unchanged_status_is_not_written(
    op: reconciler.Operator, kube: FakeKube
) -> None:
    spec = spec_dict(advertiseAddress="127.0.0.1:9443")
    state = run(op, spec, indexes())
    writes, patches = len(kube.applied), len(kube.patched)
    run(op, spec, indexes(), state)
    assert len(kube.applied) == writes and len(kube.patched) == patches


def test_changed_inputs_apply_only_changed_works_and_start_the_server_at_the_gate(
    op: reconciler.Operator, kube: FakeKube
) -> None:
    spec = spec_dict(advertiseAddress="127.0.0.1:9443")
    state = run(op, spec, indexes())
    hashes = {
        w["metadata"]["namespace"]: w["metadata"]["annotations"]
        for w in kube.created
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
    run(op, spec, indexes(works=works), state)
    # Credentials still good and works unchanged: nothing but the idempotent Placement/Service,
    # and, the gate being open, the node-keys shards the server pod will mount (all of them).
    assert kube.kinds(kube.applied[before:]) == ["Placement", "Service"] + ["Secret"] * (
        credentials_layout.NODE_KEY_SHARDS
    )
    # Both applied, but no cluster's agent has sent its SuperNode key yet: no server.
    assert "Job" not in kube.kinds(kube.created)
    # The Fleet signer enrols both clusters' keys (from their CSRs): the gate opens.
    kube.objects["secrets"] = enrolled_keys_secrets("c1", "c2")
    third = len(kube.applied)
    run(op, spec, indexes(works=works), state)
    assert kube.kinds(kube.created).count("Job") == 1
    # Only the shards the two keys fall in were written again, and hold them.
    again = kube.applied[third + 2 :]
    assert 1 <= len(again) <= 2 and all(o["kind"] == "Secret" for o in again)
    node_keys: dict[str, Any] = {}
    for shard in range(credentials_layout.NODE_KEY_SHARDS):
        path = f"/api/v1/namespaces/{REF.namespace}/secrets/"
        secret = kube.get(
            path
            + credentials_layout.node_keys_secret_name(credentials_layout.server_name(REF), shard)
        )
        assert secret is not None
        node_keys.update(secret["data"])
    assert set(node_keys) == {"c1.pub", "c2.pub"}
    # The credentials Secret holds no per-cluster key: its size does not grow with N.
    creds = kube.get(
        f"/api/v1/namespaces/{REF.namespace}/secrets/"
        + credentials_layout.credentials_secret_name(credentials_layout.server_name(REF))
    )
    assert creds is not None and not any(k.endswith(".node.pub") for k in creds["data"])


def test_the_server_waits_for_the_signers_certificates_and_asks_for_them_without_keys(
    op: reconciler.Operator, kube: FakeKube
) -> None:
    spec = spec_dict(advertiseAddress="127.0.0.1:9443", minAvailableClients=1)
    kube.signer = False  # the signer part has not answered yet
    kube.objects["secrets"] = enrolled_keys_secrets("c1", "c2")
    state = run(op, spec, indexes())
    works = [
        WorkState(cluster=w["metadata"]["namespace"], name=work_name(REF), applied=True,
                  spec_hash=next(iter(w["metadata"]["annotations"].values())))
        for w in kube.created
        if w["kind"] == "ManifestWork"
    ]  # fmt: skip
    state.applied = None  # a later pass (KEYS_WAIT_S on), both works applied on the clusters
    run(op, spec, indexes(works=works), state)
    assert "Job" not in kube.kinds(kube.created)
    # What the controller asked for: the gateway's names, and no key material of its own.
    path = f"/api/v1/namespaces/{REF.namespace}/secrets/" + (
        credentials_layout.credentials_secret_name(credentials_layout.server_name(REF))
    )
    request = kube.get(path)
    assert request is not None and "data" not in request
    names = request["metadata"]["annotations"][credentials_layout.GATEWAY_NAMES_ANNOTATION]
    assert credentials_layout.GatewayNames.from_annotation(names).ips == ("127.0.0.1",)
    # The signer issues: the next pass starts the server.
    kube.signer = True
    kube.apply(request)
    state.applied = None
    run(op, spec, indexes(works=works), state)
    assert kube.kinds(kube.created).count("Job") == 1


def enrolled_keys_secrets(*clusters: str) -> list[dict[str, Any]]:
    """What the Fleet signer writes: each cluster's SuperNode public key from its CSR, in the
    shard of its name."""
    server_name = credentials_layout.server_name(REF)
    out: dict[str, dict[str, Any]] = {}
    for c in clusters:
        name = credentials_layout.enrolled_keys_secret_name(server_name, c)
        secret = out.setdefault(
            name,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": REF.namespace},
                "data": {},
            },
        )
        public = nodekeys.generate_keypair(c)[1]
        secret["data"][f"{c}.node.pub"] = base64.b64encode(public).decode()
    return list(out.values())


def test_no_address_means_no_works_and_no_deletions(
    op: reconciler.Operator, kube: FakeKube
) -> None:
    stale = WorkState(cluster="c1", name=work_name(REF), applied=True)
    run(op, spec_dict(), indexes(works=[stale]))
    assert kube.kinds(kube.applied) == ["Placement", "Service"]
    assert not kube.deleted
    conds = {c["type"]: c for c in kube.status()["conditions"]}
    assert conds["ServerReady"]["reason"] == "NoAddress"


def test_a_report_refolds_status_without_applying_anything(
    op: reconciler.Operator, kube: FakeKube
) -> None:
    spec = spec_dict(advertiseAddress="127.0.0.1:9443")
    works = [WorkState(cluster=c, name=work_name(REF), applied=True) for c in ("c1", "c2")]
    idx = indexes(works=works, job=JobState(exists=True, active=1))
    state = run(op, spec, idx)
    assert kube.status()["phase"] == "Running"
    writes = len(kube.applied) + len(kube.created) + len(kube.deleted)
    report = ClusterReport("c1", REF.uid, reconciler._now(), phase="Running", round=2)
    run(op, spec, idx, state, Reports({"c1": report}))
    assert len(kube.applied) + len(kube.created) + len(kube.deleted) == writes
    assert kube.status()["clusters"][0]["round"] == 2


def test_reports_are_acknowledged_only_after_a_status_write_that_holds_them(
    op: reconciler.Operator, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reconcile tells the store the version it read before its snapshot once the status
    is written, never when the write failed."""
    from hub_controller.aggregator.store import ReportStore
    from ocmfl.kube import KubeError
    from tests.unit.test_report_store import report as make_report

    spec = spec_dict(advertiseAddress="127.0.0.1:9443")
    works = [WorkState(cluster=c, name=work_name(REF), applied=True) for c in ("c1", "c2")]
    idx = indexes(works=works, job=JobState(exists=True, active=1))
    store = ReportStore(wait_for_status=True)
    acked: list[int] = []
    applied = store.apply("c1", make_report("c1", 2, uid=REF.uid))
    store.when_durable(REF.uid, applied.version, lambda: acked.append(applied.version))

    def refused(*_: object, **__: object) -> dict[str, Any]:
        raise KubeError(503, "ServiceUnavailable", "apiserver unavailable")

    state = reconciler.Run(REF, status={})
    with monkeypatch.context() as m:
        m.setattr(kube, "patch", refused)
        with pytest.raises(KubeError):
            reconciler.reconcile(op, store, body(spec, state.status), idx, state, LOG)
    assert acked == []
    reconciler.reconcile(op, store, body(spec, state.status), idx, state, LOG)
    assert kube.status()["clusters"][0]["round"] == 2 and acked == [1]
    again = store.apply("c1", make_report("c1", 2, uid=REF.uid))
    store.when_durable(REF.uid, again.version, lambda: acked.append(again.version))
    store.persisted(REF.uid, 1)  # an older write's news does not ack the newer report
    reconciler.reconcile(op, store, body(spec, state.status), idx, state, LOG)
    assert acked == [1, 2]


def test_delete_removes_owned_objects_forgets_reports_and_waits_for_works(
    op: reconciler.Operator, kube: FakeKube
) -> None:
    forgotten: list[str] = []

    class Forgetful(NoReports):
        def forget(self, uid: str) -> None:
            forgotten.append(uid)

    memo = kopf.Memo(operator=op, reports=Forgetful())
    kube.objects = {
        "manifestworks": [{"metadata": {"namespace": "c1", "name": work_name(REF)}}],
        "placements": [{"metadata": {"name": REF.name}}],
        "jobs": [{"metadata": {"name": "digits-server"}}],
        "services": [{"metadata": {"name": "digits-server"}}],
    }
    with pytest.raises(kopf.TemporaryError):
        CLEANUP(meta=META, memo=memo, retry=0, logger=LOG)
    assert any(p.endswith(f"/c1/manifestworks/{work_name(REF)}") for p in kube.deleted)
    assert any(p.endswith(f"/placements/{REF.name}") for p in kube.deleted)
    assert any(p.endswith("/jobs/digits-server") for p in kube.deleted)
    assert forgotten == [REF.uid]
    kube.objects["manifestworks"] = []
    CLEANUP(meta=META, memo=memo, retry=1, logger=LOG)


def _node_keys(kube: FakeKube) -> dict[str, str]:
    """The server's key directory as the node-keys shards last written hold it."""
    out: dict[str, str] = {}
    for shard in range(credentials_layout.NODE_KEY_SHARDS):
        name = credentials_layout.node_keys_secret_name(credentials_layout.server_name(REF), shard)
        secret = kube.get(f"/api/v1/namespaces/{REF.namespace}/secrets/{name}")
        out.update((secret or {}).get("data") or {})
    return out


def _fleet_csr(federation_uid: str, cluster: str) -> dict[str, Any]:
    _, node_public = nodekeys.generate_keypair()
    request = pki.create_fleet_csr(federation_uid, cluster, pki.generate_key(), node_public)
    return {
        "metadata": {"name": f"fleet-{cluster}", "uid": f"csr-uid-{cluster}"},
        "spec": {
            "signerName": constants.FLEET_SIGNER_NAME,
            "request": base64.b64encode(pki.csr_to_pem(request)).decode(),
        },
    }


def test_a_key_enrolled_while_nothing_else_changes_reaches_the_server_at_once(
    op: reconciler.Operator, kube: FakeKube
) -> None:
    """Drill 4: a cluster that comes back gets a new SuperNode key; its work and client Job
    can be observed before the Fleet signer enrols the key, so no observed input changes
    afterwards. The signed Fleet CSR, which the controller watches whether the signer runs
    in its process or not (Operator.key_enrolled), makes the next pass copy the key to the
    node-keys shards; the run was otherwise refused that cluster until the resync."""
    spec = spec_dict(advertiseAddress="127.0.0.1:9443")
    works = [
        WorkState(cluster=c, name=work_name(REF), applied=True, job=JobState(True, active=1))
        for c in ("c1", "c2")
    ]
    idx = indexes(works=works, job=JobState(exists=True, active=1))
    kube.objects["secrets"] = enrolled_keys_secrets("c1", "c2")
    state = run(op, spec, idx)
    old = _node_keys(kube)["c2.pub"]
    # c2 comes back with a new key, enrolled by the signer; everything observed is as before.
    kube.objects["secrets"] = enrolled_keys_secrets("c1", "c2")
    woken: list[bool] = []
    op.wakers[KEY] = lambda: woken.append(True)
    op.keys_by_uid[REF.uid] = KEY
    # What the controller sees of the signer (its own Deployment): c2's Fleet CSR, signed.
    csr = _fleet_csr(REF.uid, "c2")
    assert signed_fleet_csr(csr) is None  # not signed yet: no key stored yet
    csr["status"] = {"certificate": "c2ln bmVk"}
    signed = signed_fleet_csr(csr)
    assert signed == ("csr-uid-c2", REF.uid)
    op.key_enrolled(*signed)
    op.key_enrolled(*signed)  # the same CSR again (a later event): counted once
    op.key_enrolled("csr-uid-x", "another-federation")  # not one of ours: nothing
    assert woken == [True]
    run(op, spec, idx, state)
    new = _node_keys(kube)["c2.pub"]
    enrolled = [
        s["data"]["c2.node.pub"] for s in kube.objects["secrets"] if "c2.node.pub" in s["data"]
    ]
    assert new != old and [new] == enrolled


def test_credentials_of_another_resource_are_never_reused_or_overwritten(
    op: reconciler.Operator, kube: FakeKube
) -> None:
    """A Secret of the credentials' name that another uid owns (a deleted resource's, or one
    the tenant made with a CA key of its choosing): the run fails naming it; nothing of it is
    read into the server's credentials or written over."""

    name = credentials_layout.credentials_secret_name(credentials_layout.server_name(REF))
    planted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": REF.namespace,
                     "labels": {constants.LABEL_OWNER_UID: "someone-else"}},
        "data": {},
    }  # fmt: skip
    kube.applied.append(planted)
    run(op, spec_dict(advertiseAddress="127.0.0.1:9443"), indexes())
    status = kube.status()
    assert status["phase"] == "Failed"
    [cond] = status["conditions"]
    assert cond["reason"] == reconciler.REASON_NAME_TAKEN
    assert f"Secret {REF.namespace}/{name}" in status["message"]
    assert "belongs to someone-else" in status["message"] and "delete it" in status["message"]
    assert [o for o in kube.applied if o["kind"] == "Secret"] == [planted]


def test_a_cluster_whose_agent_is_briefly_down_keeps_its_work_until_the_grace_ends(
    op: reconciler.Operator, kube: FakeKube
) -> None:
    """An agent restart makes OCM mark the addon unhealthy and a Placement that selects on
    the addon's label drops the cluster for seconds: its work (its client, mid-round) stays,
    for at most AGENT_GRACE_S. A cluster whose data claim is gone leaves at once. (CI19: a
    drill's agent restart deleted the cluster's work and failed the run.)"""
    from hub_controller.membership import ADDON_AVAILABILITY_LABEL, AGENT_GRACE_S

    spec = spec_dict(advertiseAddress="127.0.0.1:9443")
    works = [WorkState(cluster=c, name=work_name(REF), applied=True) for c in ("c1", "c2")]
    now = [1000.0]
    state = reconciler.Run(REF, status={})

    def pass_(idx: Indexes) -> list[str]:
        before = len(kube.deleted)
        reconciler.reconcile(
            op, NoReports(), body(spec, state.status), idx, state, LOG, clock=lambda: now[0]
        )
        return [path.rsplit("/", 3)[-3] for path in kube.deleted[before:]]

    assert pass_(indexes(decided=("c1", "c2"), works=works)) == []
    unhealthy = {ADDON_AVAILABILITY_LABEL: "unhealthy"}
    down = ClusterInfo("c1", {"fl.data-path": "/srv/a"}, unhealthy, accepted=True)
    dropped = indexes(decided=("c2",), works=works, clusters={"c1": down})
    assert pass_(dropped) == []
    now[0] += AGENT_GRACE_S - 1
    assert pass_(dropped) == []
    now[0] += 2
    assert pass_(dropped) == ["c1"]  # still down after the grace: it has left

    # A controller that starts while the decisions are incomplete takes nothing away.
    state = reconciler.Run(REF, status={})
    c1 = {"c1": ClusterInfo("c1", {"fl.data-path": "/srv/a"})}
    assert pass_(indexes(decided=("c2",), works=works, selected=2, clusters=c1)) == []
    # Its data claim removed, or the hub no longer accepting it: it leaves at once.
    for gone in (
        ClusterInfo("c1", {}, unhealthy, accepted=True),
        dataclasses.replace(down, accepted=False),
    ):
        state = reconciler.Run(REF, status={})
        assert pass_(indexes(decided=("c2",), works=works, clusters={"c1": gone})) == ["c1"]
