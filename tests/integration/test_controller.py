"""The hub controller against the real local control plane (apiservers, OCM placement
controller, work agents), with kopf running in-process (kopf.testing.KopfRunner).

Each test uses its own namespace and its own ClusterClaim name, so tests do not see each
other's claims. minAvailableClients is above the number of clusters, so the server Job never
starts: these tests are about placement, cluster resolution, works and cleanup.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

from hack.controlplane.plane import ControlPlane
from hack.localfed import grant_namespace, install_crd
from hack.testing import kopf_registry, wait_for
from hub_controller import credentials_layout
from hub_controller.api import FLRef, claim_placement
from hub_controller.operator.desired import server as server_mod
from hub_controller.operator.desired.works import work_name
from hub_controller.operator.reconcile import KEYS_WAIT_S
from ocmfl import constants, nodekeys, pki
from ocmfl.kube import Kube, KubeError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CLUSTER = constants.CLUSTER_GROUP
CLAIMS = f"/apis/{CLUSTER}/v1alpha1/clusterclaims"
WORKS_ALL = f"/apis/{constants.WORK_GROUP}/v1/manifestworks"
FL_NAME = "digits"


def fl_path(namespace: str, name: str = "") -> str:
    base = f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{constants.PLURAL}"
    return f"{base}/{name}" if name else base


@pytest.fixture
def hub(control_plane: ControlPlane) -> Iterator[Kube]:
    k = Kube(control_plane.hub_kubeconfig)
    install_crd(k)
    yield k
    k.close()


@pytest.fixture
def spokes(control_plane: ControlPlane) -> Iterator[dict[str, Kube]]:
    ks = {c: Kube(p) for c, p in control_plane.cluster_kubeconfigs.items()}
    yield ks
    for k in ks.values():
        k.close()


@pytest.fixture
def bound(hub: Kube, namespace: str, claim: str) -> str:
    """The test namespace with the `global` cluster set bound and a FederationPolicy allowing
    the test's claim, the workload image, HostPath storage and 127.0.0.1 (the admin's steps)."""
    grant_namespace(
        hub, namespace, data_claims=[claim], advertise_domains=["127.0.0.1"], host_path_store=True
    )
    hub.create(
        f"/apis/{CLUSTER}/v1beta2/namespaces/{namespace}/managedclustersetbindings",
        {
            "apiVersion": f"{CLUSTER}/v1beta2",
            "kind": "ManagedClusterSetBinding",
            "metadata": {"name": "global", "namespace": namespace},
            "spec": {"clusterSet": "global"},
        },
    )
    return namespace


@pytest.fixture
def claim(spokes: dict[str, Kube], namespace: str) -> Iterator[str]:
    """A ClusterClaim name unique to this test; whatever the test creates is removed."""
    name = f"{namespace}.data.ocmfl.io"
    yield name
    for k in spokes.values():
        k.delete(f"{CLAIMS}/{name}")


def set_claim(spoke: Kube, name: str, value: str) -> None:
    spoke.create(
        CLAIMS,
        {
            "apiVersion": f"{CLUSTER}/v1alpha1",
            "kind": "ClusterClaim",
            "metadata": {"name": name},
            "spec": {"value": value},
        },
    )


# The module's tests make their namespaces with this prefix: its one operator watches them all.
NS_PREFIX = "tc-"


@pytest.fixture(scope="module")
def test_namespaces(control_plane: ControlPlane) -> Iterator[list[str]]:
    """The namespaces this module's tests made, deleted at its end (after the operator has
    finished deleting every resource in them)."""
    made: list[str] = []
    yield made
    hub = Kube(control_plane.hub_kubeconfig)
    for name in made:
        hub.delete(f"/api/v1/namespaces/{name}")
    hub.close()


@pytest.fixture
def namespace(hub: Kube, test_namespaces: list[str]) -> Iterator[str]:
    """A fresh namespace for the test; its resources are deleted after it, and the module's
    operator (still running) finishes their deletion while the next test runs."""
    name = f"{NS_PREFIX}{uuid.uuid4().hex[:8]}"
    hub.create("/api/v1/namespaces", {"metadata": {"name": name}}, exist_ok=False)
    test_namespaces.append(name)
    yield name
    for item in (hub.get(fl_path(name)) or {}).get("items", []):
        hub.delete(fl_path(name, item["metadata"]["name"]))


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane,
    test_namespaces: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KopfRunner]:
    """The operator, and the signer part's Fleet server certificates (which the server waits
    for), kopf in-process against the hub, once for the module (kopf holds handlers back until
    its indexes are filled). At the end every test's resources must be gone while it still
    runs: its finalizer does that."""
    hub = Kube(control_plane.hub_kubeconfig)
    # The hub CA (ca_init on a real hub): agents trust it; tenant credentials never come from it.
    ca_dir = tmp_path_factory.mktemp("hub-ca")
    pki.save_tls_dir(ca_dir, pki.create_ca("test-hub-ca"), None)
    # Only this module's namespaces and the cluster namespaces (where the works live), so other
    # tests' resources on a shared plane are left to their own operators.
    watched = [f"--namespace={NS_PREFIX}*", *(f"--namespace={c}" for c in control_plane.clusters)]
    registry = kopf_registry(
        "hub_controller.operator.handlers", "hub_controller.signer.fleet_server"
    )
    # The signer keeps each federation's Fleet CA in its own namespace (deleted at the end).
    signer_ns = f"{NS_PREFIX}signer-{uuid.uuid4().hex[:8]}"
    hub.create("/api/v1/namespaces", {"metadata": {"name": signer_ns}}, exist_ok=False)
    test_namespaces.append(signer_ns)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KUBECONFIG", control_plane.hub_kubeconfig)
        env.setenv(constants.ENV_CA_DIR, str(ca_dir))
        env.setenv(constants.ENV_POD_NAMESPACE, signer_ns)
        with KopfRunner(["run", "--standalone", *watched], registry=registry, timeout=60) as run:
            yield run

            def left() -> list[str]:
                return [n for n in test_namespaces if (hub.get(fl_path(n)) or {}).get("items")]

            wait_for(lambda: not left(), 120, "every test's FederatedLearning deleted")
    hub.close()
    assert run.exception is None, run.exception


def fl_body(namespace: str, claim: str, **server: Any) -> dict[str, Any]:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": FL_NAME, "namespace": namespace},
        "spec": {
            "server": {
                "rounds": 1,
                "minAvailableClients": 9,
                "advertiseAddress": "127.0.0.1:9443",
                "app": {"path": f"{constants.APPS_DIR}/digits"},
                **server,
            },
            "client": {
                "dataClaim": claim,
                "placement": claim_placement(claim),
            },
        },
    }


def enrol_supernode_key(hub: Kube, ref: FLRef, cluster: str) -> None:
    """Write `cluster`'s SuperNode public key where the Fleet signer puts it."""
    name = credentials_layout.enrolled_keys_secret_name(
        credentials_layout.server_name(ref), cluster
    )
    _, public = nodekeys.generate_keypair(cluster)
    labels = {**ref.labels(server_mod.COMPONENT), credentials_layout.LABEL_KEYS: "enrolled"}
    hub.create(
        f"/api/v1/namespaces/{ref.namespace}/secrets",
        {
            "metadata": {"name": name, "namespace": ref.namespace, "labels": labels},
            "data": {f"{cluster}.node.pub": base64.b64encode(public).decode()},
        },
    )


def works_of(hub: Kube, namespace: str) -> dict[str, dict[str, Any]]:
    """Our ManifestWorks for the test's resource, by cluster."""
    selector = (
        f"{constants.LABEL_OWNER_NAMESPACE}={namespace},{constants.LABEL_OWNER_NAME}={FL_NAME}"
    )
    items = (hub.get(WORKS_ALL, {"labelSelector": selector}) or {}).get("items", [])
    return {w["metadata"]["namespace"]: w for w in items}


def host_path(work: dict[str, Any]) -> str:
    """The cluster's data path: the hostPath of the PV the client's data claim is bound to."""
    [pv] = [m for m in work["spec"]["workload"]["manifests"] if m["kind"] == "PersistentVolume"]
    return str(pv["spec"]["hostPath"]["path"])


def test_works_follow_the_clusters_that_claim_data(
    hub: Kube,
    spokes: dict[str, Kube],
    bound: str,
    claim: str,
    operator: KopfRunner,
) -> None:
    namespace = bound
    clusters = sorted(spokes)
    with_data = clusters[:-1] if len(clusters) > 2 else clusters[:1]
    for c in with_data:
        set_claim(spokes[c], claim, f"/srv/data/{c}")
    hub.create(fl_path(namespace), fl_body(namespace, claim))

    def exact_works() -> dict[str, dict[str, Any]] | None:
        w = works_of(hub, namespace)
        return w if set(w) == set(with_data) else None

    works = wait_for(exact_works, 60, f"works on exactly {with_data}")
    for c in with_data:
        assert host_path(works[c]) == f"/srv/data/{c}"
        assert works[c]["metadata"]["name"] == work_name(FLRef(namespace, FL_NAME, "x"))

    def status() -> dict[str, Any]:
        got = hub.get(fl_path(namespace, FL_NAME)) or {}
        return dict(got.get("status") or {})

    st = wait_for(
        lambda: (s := status()).get("clients") == f"{len(with_data)}/{len(with_data)}" and s,
        60,
        "works applied in status",
    )
    assert st["phase"] == "Waiting"
    rows = {r["name"]: r for r in st["clusters"]}
    assert rows[with_data[0]]["dataPath"] == f"/srv/data/{with_data[0]}"
    assert rows[with_data[0]]["workApplied"] is True

    # the client's namespace and Job reached the managed cluster
    client_ns = work_name(FLRef(namespace, FL_NAME, "x"))
    spoke = spokes[with_data[0]]
    jobs = wait_for(
        lambda: (spoke.get(f"/apis/batch/v1/namespaces/{client_ns}/jobs") or {}).get("items"),
        60,
        "client Job on the cluster",
    )
    # Its data comes through a claim the PV controller binds to the work's hostPath PV, in a
    # namespace that enforces the restricted Pod Security level.
    [data] = [v for v in jobs[0]["spec"]["template"]["spec"]["volumes"] if v["name"] == "data"]
    claim_path = (
        f"/api/v1/namespaces/{client_ns}/persistentvolumeclaims/"
        f"{data['persistentVolumeClaim']['claimName']}"
    )

    def bound_claim() -> dict[str, Any] | None:
        pvc = spoke.get(claim_path) or {}
        return pvc if (pvc.get("status") or {}).get("phase") == "Bound" else None

    pvc = wait_for(bound_claim, 60, "the client's data claim Bound")
    pv = spoke.get(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}") or {}
    assert pv["spec"]["hostPath"]["path"].startswith("/srv/data/")
    labels = (spoke.get(f"/api/v1/namespaces/{client_ns}") or {})["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"

    # a cluster that loses its claim loses its work
    leaver = with_data[0]
    spokes[leaver].delete(f"{CLAIMS}/{claim}")
    wait_for(lambda: leaver not in works_of(hub, namespace), 60, f"work on {leaver} deleted")
    assert set(works_of(hub, namespace)) == set(with_data[1:])


def test_a_work_the_cluster_refuses_shows_the_cluster_blocked_with_its_error(
    hub: Kube,
    spokes: dict[str, Kube],
    bound: str,
    claim: str,
    operator: KopfRunner,
) -> None:
    """The policy allows the label prefix, the cluster's apiserver refuses the label's value:
    the cluster's work agent cannot apply the client Job (issue 29 item 7)."""
    namespace = bound
    first = sorted(spokes)[0]
    grant_namespace(
        hub,
        namespace,
        data_claims=[claim],
        advertise_domains=["127.0.0.1"],
        host_path_store=True,
        allowed_label_prefixes=["example.com/"],
    )
    set_claim(spokes[first], claim, f"/srv/data/{first}")
    body = fl_body(namespace, claim)
    body["spec"]["client"]["pod"] = {"labels": {"example.com/team": "x" * 64}}
    hub.create(fl_path(namespace), body)

    def blocked() -> dict[str, Any] | None:
        st = (hub.get(fl_path(namespace, FL_NAME)) or {}).get("status") or {}
        rows = {r["name"]: r for r in st.get("clusters") or []}
        return st if (rows.get(first) or {}).get("phase") == "Blocked" else None

    st = wait_for(blocked, 90, f"{first} Blocked")
    [row] = [r for r in st["clusters"] if r["name"] == first]
    assert "the cluster refused its work: Job " in row["reason"], row
    assert "must be no more than 63" in row["reason"], row
    assert st["phase"] == "Waiting"
    assert f"work refused by {first}: Job " in st["message"], st["message"]


def test_deleting_the_resource_removes_everything_it_created(
    hub: Kube, spokes: dict[str, Kube], bound: str, claim: str, operator: KopfRunner
) -> None:
    namespace = bound
    first = sorted(spokes)[0]
    set_claim(spokes[first], claim, "/srv/data/x")
    hub.create(fl_path(namespace), fl_body(namespace, claim))
    wait_for(lambda: first in works_of(hub, namespace), 60, "work created")
    placement = f"/apis/{CLUSTER}/v1beta1/namespaces/{namespace}/placements/{FL_NAME}"
    assert hub.get(placement) is not None
    services = f"/api/v1/namespaces/{namespace}/services"
    assert (hub.get(services) or {}).get("items")
    fl = hub.get(fl_path(namespace, FL_NAME)) or {}
    assert constants.FINALIZER in fl["metadata"].get("finalizers", [])

    hub.delete(fl_path(namespace, FL_NAME))
    wait_for(lambda: hub.get(fl_path(namespace, FL_NAME)) is None, 90, "resource gone")
    assert not works_of(hub, namespace)
    wait_for(
        lambda: (p := hub.get(placement)) is None or bool(p["metadata"].get("deletionTimestamp")),
        30,
        "Placement deleted",
    )
    client_ns = work_name(FLRef(namespace, FL_NAME, "x"))
    wait_for(
        lambda: (
            (ns := spokes[first].get(f"/api/v1/namespaces/{client_ns}")) is None
            or bool(ns["metadata"].get("deletionTimestamp"))
        ),
        60,
        "client namespace removed on the cluster",
    )
    # nothing else was touched: the binding is still there
    binding = f"/apis/{CLUSTER}/v1beta2/namespaces/{namespace}/managedclustersetbindings/global"
    assert hub.get(binding) is not None


def test_schema_refuses_what_it_can_say(hub: Kube, namespace: str) -> None:
    body = fl_body(namespace, "x.data", rounds=0)
    with pytest.raises(KubeError) as exc:
        hub.create(fl_path(namespace), body)
    assert exc.value.status == 422
    assert "spec.server.rounds" in str(exc.value)
    body = fl_body(namespace, "x.data")
    body["spec"]["server"]["storage"] = {"type": "Floppy"}
    with pytest.raises(KubeError):
        hub.create(fl_path(namespace), body)


def test_invalid_resource_fails_with_a_useful_message_and_applies_nothing(
    hub: Kube, bound: str, claim: str, operator: KopfRunner
) -> None:
    namespace = bound
    body = fl_body(namespace, claim, minAvailableClients=3)
    body["spec"]["client"]["placement"]["numberOfClusters"] = 2
    hub.create(fl_path(namespace), body)

    def status() -> dict[str, Any]:
        return dict((hub.get(fl_path(namespace, FL_NAME)) or {}).get("status") or {})

    st = wait_for(lambda: (s := status()).get("phase") == "Failed" and s, 60, "Failed")
    assert "lower minAvailableClients or raise numberOfClusters" in st["message"]
    [cond] = [c for c in st["conditions"] if c["type"] == "Validated"]
    assert cond["status"] == "False"
    placement = f"/apis/{CLUSTER}/v1beta1/namespaces/{namespace}/placements/{FL_NAME}"
    assert hub.get(placement) is None
    assert not works_of(hub, namespace)
    events = (hub.get(f"/api/v1/namespaces/{namespace}/events") or {}).get("items", [])
    assert any(e.get("reason") == "InvalidSpec" for e in events)


def test_selected_cluster_without_the_claim_is_reported_and_gets_no_work(
    hub: Kube,
    spokes: dict[str, Kube],
    bound: str,
    claim: str,
    operator: KopfRunner,
    request: pytest.FixtureRequest,
) -> None:
    namespace = bound
    first, second = sorted(spokes)[:2]
    set_claim(spokes[first], claim, "/srv/data/only-here")
    # The hub admin labels the two clusters (OCM sets no `name` label on ManagedClusters).
    label = f"{namespace}.test.ocmfl.io/selected"
    for c in (first, second):
        hub.patch(f"/apis/{CLUSTER}/v1/managedclusters/{c}", {"metadata": {"labels": {label: "y"}}})

    def unlabel() -> None:
        for c in (first, second):
            patch = {"metadata": {"labels": {label: None}}}
            hub.patch(f"/apis/{CLUSTER}/v1/managedclusters/{c}", patch)

    request.addfinalizer(unlabel)
    body = fl_body(namespace, claim)
    body["spec"]["client"]["placement"] = {
        "clusterSets": ["global"],
        "predicates": [
            {
                "requiredClusterSelector": {
                    "labelSelector": {"matchExpressions": [{"key": label, "operator": "Exists"}]}
                }
            }
        ],
    }
    hub.create(fl_path(namespace), body)

    def rows() -> dict[str, dict[str, Any]] | None:
        got = hub.get(fl_path(namespace, FL_NAME)) or {}
        found = {r["name"]: r for r in (got.get("status") or {}).get("clusters", [])}
        return found if {first, second} <= set(found) else None

    found = wait_for(rows, 60, "both clusters in status")
    assert found[second]["phase"] == "NoData"
    assert f"no ClusterClaim {claim}" in found[second]["reason"]
    assert found[first]["dataPath"] == "/srv/data/only-here"
    assert set(works_of(hub, namespace)) == {first}


def test_server_starts_once_enough_clusters_are_ready(
    hub: Kube, spokes: dict[str, Kube], bound: str, claim: str, operator: KopfRunner
) -> None:
    namespace = bound
    first = sorted(spokes)[0]
    set_claim(spokes[first], claim, "/srv/data/x")
    created = hub.create(fl_path(namespace), fl_body(namespace, claim, minAvailableClients=1))
    assert created is not None
    ref = FLRef(namespace=namespace, name=FL_NAME, uid=created["metadata"]["uid"])
    selector = f"{constants.LABEL_OWNER_NAME}={FL_NAME},{constants.LABEL_COMPONENT}=server"
    jobs_path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    # The work is there, but no cluster has sent its SuperNode key: no server yet.
    wait_for(lambda: works_of(hub, namespace).get(first), 60, "the work")
    # Something that must not happen has no event to wait for: give the controller two of its
    # key checks (reconcile.KEYS_WAIT_S apart) in which it could wrongly start the server.
    time.sleep(2 * KEYS_WAIT_S + 1)
    assert not (hub.get(jobs_path, {"labelSelector": selector}) or {}).get("items")
    # What the Fleet signer does for the cluster's agent CSR (no agent runs here).
    enrol_supernode_key(hub, ref, first)
    jobs = wait_for(
        lambda: (hub.get(jobs_path, {"labelSelector": selector}) or {}).get("items"),
        60,
        "server Job",
    )
    container = jobs[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["ocm-fl-server"]

    def phase() -> str | None:
        got = hub.get(fl_path(namespace, FL_NAME)) or {}
        p = (got.get("status") or {}).get("phase")
        return str(p) if p in ("Running", "Completed", "Failed") else None

    wait_for(phase, 60, "phase past Waiting")
    conds = {
        c["type"]: c
        for c in ((hub.get(fl_path(namespace, FL_NAME)) or {}).get("status") or {})["conditions"]
    }
    assert conds["ClientsReady"]["status"] == "True"


def test_cluster_that_gains_the_claim_later_gets_a_work_with_its_overrides(
    hub: Kube, spokes: dict[str, Kube], bound: str, claim: str, operator: KopfRunner
) -> None:
    namespace = bound
    first = sorted(spokes)[0]
    body = fl_body(namespace, claim)
    body["spec"]["client"]["runConfig"] = {"local-epochs": 1, "batch-size": 32}
    body["spec"]["client"]["overrides"] = [
        {"clusterName": first, "runConfig": {"local-epochs": 3}},
        {"clusterName": "elsewhere", "runConfig": {"local-epochs": 99}},
    ]
    hub.create(fl_path(namespace), body)

    def phase() -> str | None:
        got = hub.get(fl_path(namespace, FL_NAME)) or {}
        return (got.get("status") or {}).get("phase")

    wait_for(lambda: phase() in ("Pending", "Waiting"), 30, "status written")
    assert not works_of(hub, namespace)

    set_claim(spokes[first], claim, "/srv/data/late")
    work = wait_for(lambda: works_of(hub, namespace).get(first), 60, "work for the joiner")
    assert host_path(work) == "/srv/data/late"
    client_ns = work_name(FLRef(namespace, FL_NAME, "x"))
    cm = wait_for(
        lambda: spokes[first].get(f"/api/v1/namespaces/{client_ns}/configmaps/fl-client-config"),
        60,
        "run config on the cluster",
    )
    assert json.loads(cm["data"]["run-config.json"]) == {"batch-size": 32, "local-epochs": 3}
