"""Many federations at once: two tenants train side by side on the same hub and clusters.

Three FederatedLearning resources in two tenant namespaces run at the same time over the same
three clusters, on the real local control plane with real Flower servers and clients (pods in
their own network namespaces, hack/controlplane/podnet.py):

* ``tenant-a/digits`` and ``tenant-b/digits`` (same name, two tenants) both use the shared
  claim ``digits.data.federated-learning.io`` (cluster1 and cluster2);
* ``tenant-b/private`` uses its own claim (cluster2 and cluster3).

cluster2 runs a client of every federation, beside the other two. Each must reach Completed on
its own data, with a status that holds only its own clusters' reports; deleting one must
leave the others' works, client Jobs and training untouched.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from examples.demo import demo_resource
from hack import controlplane as cp
from hack.localfed import (
    FL_PATH,
    LocalFederation,
    create_fl,
    get_fl,
    prepare_data,
    set_cluster_claim,
)
from hack.testing import WaitTimeout, wait_for
from hub_controller.api import FLRef
from hub_controller.operator.desired import security
from hub_controller.operator.desired.works import CLIENT_TOKEN_FILE, client_namespace, work_name
from ocmfl import constants
from ocmfl.kube import Kube

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

SHARED_CLAIM = "digits.data.federated-learning.io"
OWN_CLAIM = "private.data.federated-learning.io"
LONG_ROUNDS = 3  # the federations that keep training while another is deleted
SHORT_ROUNDS = 1


@dataclass
class Run:
    """One federation of the test: where it lives, its data and what it was created as."""

    namespace: str
    name: str
    claim: str
    rounds: int
    paths: dict[str, Path]  # cluster -> the data directory its claim names
    uid: str = ""

    @property
    def ref(self) -> FLRef:
        return FLRef(namespace=self.namespace, name=self.name, uid=self.uid)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _body(run: Run) -> dict[str, Any]:
    body = demo_resource(rounds=run.rounds, min_clients=2)
    body["metadata"]["name"] = run.name
    # Fit only: each client message is a fresh ClientApp process importing torch; three
    # federations on two cores need no evaluate round trips to show they keep apart.
    body["spec"]["server"]["app"]["runConfig"]["fraction-evaluate"] = 0.0
    client = body["spec"]["client"]
    client["dataClaim"] = run.claim
    [predicate] = client["placement"]["predicates"]
    predicate["requiredClusterSelector"]["claimSelector"]["matchExpressions"][0]["key"] = run.claim
    return body


def _status(hub: Kube, run: Run) -> dict[str, Any]:
    return dict((get_fl(hub, run.namespace, run.name) or {}).get("status") or {})


def _wait_phase(
    fed: LocalFederation, hub: Kube, run: Run, timeout: float, *phases: str
) -> dict[str, Any]:
    """`run`'s status once its phase is one of `phases`; Failed raises at once, and a timeout
    says where the run stood (phase, rounds, message, each cluster's row)."""
    seen: dict[str, Any] = {}

    def probe() -> dict[str, Any] | None:
        fed.check_alive()
        st = _status(hub, run)
        seen.clear()
        seen.update(st)
        if st.get("phase") == "Failed":
            raise AssertionError(f"{run.key} failed: {st.get('message')}")
        return st if st.get("phase") in phases else None

    try:
        return wait_for(probe, timeout, f"{run.key} {'/'.join(phases)}")
    except WaitTimeout:
        rows = [
            f"{r.get('name')}={r.get('phase')} round {r.get('round')} ({r.get('reason')})"
            for r in seen.get("clusters") or []
        ]
        raise AssertionError(
            f"{run.key} not {'/'.join(phases)} after {timeout:.0f}s: phase {seen.get('phase')}, "
            f"round {seen.get('round')}/{seen.get('totalRounds')}, {seen.get('message')!r}; "
            f"clusters: {'; '.join(rows) or 'none'}"
        ) from None


def _works(hub: Kube, cluster: str, run: Run) -> list[dict[str, Any]]:
    path = f"/apis/{constants.WORK_GROUP}/v1/namespaces/{cluster}/manifestworks"
    selector = f"{constants.LABEL_OWNER_UID}={run.uid}"
    return list((hub.get(path, {"labelSelector": selector}) or {}).get("items") or [])


def _client_pods(spoke: Kube, run: Run) -> dict[str, tuple[str, int]]:
    """Client pods of `run` on one cluster: name -> (uid, restarts)."""
    items = (spoke.get(f"/api/v1/namespaces/{client_namespace(run.ref)}/pods") or {}).get(
        "items"
    ) or []
    return {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses") or []),
        )
        for p in items
        if "test" not in (p["metadata"].get("labels") or {})
    }


# Run as a pod beside tenant-b/private's client on cluster3: posts naming tenant-a/digits
# until the agent attributes the pod by its address. Round 0 is invalid, so a post the agent
# did not attribute (400) changes nothing; an attributed one is refused with 403.
SPOOF = """
import json, sys, time, urllib.error, urllib.request
body = {"phase": "fit", "round": 1, "samples": 1, "fl_namespace": "tenant-a", "fl_name": "digits",
        "fl_uid": "spoofed"}
token = open(sys.argv[2]).read().strip()  # its own federation's token, there in its namespace
for _ in range(120):
    req = urllib.request.Request(
        sys.argv[1] + "/v1/metrics", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + token},
    )
    try:
        urllib.request.urlopen(req, timeout=5)
        code = 202
    except urllib.error.HTTPError as e:
        code = e.code
        if code == 403:
            print(403, json.load(e)["error"])
            sys.exit(0)
        print(code, e.read()[:300])
    except OSError:
        code = 0
    time.sleep(1)
print(code)
sys.exit(1)
"""


def _spoof_pod(run: Run, agent: str) -> dict[str, Any]:
    labels = {**run.ref.labels("client"), "test": "spoof"}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "c",
                "image": constants.WORKLOAD_IMAGE,
                "command": ["python", "-c", SPOOF, agent, CLIENT_TOKEN_FILE],
                "volumeMounts": [
                    {"name": "token", "mountPath": constants.CLIENT_TOKEN_DIR, "readOnly": True}
                ],
            }
        ],
        "volumes": [{"name": "token", "secret": {"secretName": constants.CLIENT_TOKEN_SECRET}}],
    }
    # Client namespaces enforce the restricted Pod Security level: a pod there runs as one.
    security.harden(spec)
    return {
        "metadata": {"name": "spoof", "namespace": client_namespace(run.ref), "labels": labels},
        "spec": spec,
    }


def _keep_server_logs(plane: cp.ControlPlane) -> None:
    """Copy each server pod's SuperLink and gateway logs next to its container log."""
    for pod in Path(plane.state_dir, "pods", "hub").glob("tenant-*"):
        for log in ("superlink.log", "gateway/nginx.log"):
            src = pod / "volumes" / "state" / log
            if src.is_file():
                shutil.copyfile(src, pod / "logs" / log.replace("/", "-"))


def _print_diagnosis(plane: cp.ControlPlane, hub: Kube, runs: list[Run]) -> None:
    """On a failure: each run's status and the tail of every pod log of its namespaces."""
    for run in runs:
        st = _status(hub, run)
        print(f"--- {run.key}: {st.get('phase')} round {st.get('round')}: {st.get('message')}")
        for row in st.get("clusters") or []:
            print(f"    {row}")
    namespaces = {r.namespace for r in runs} | {client_namespace(r.ref) for r in runs if r.uid}
    for log in sorted(Path(plane.state_dir, "pods").glob("*/*/logs/*.log")):
        if log.parent.parent.name.split("_")[0] not in namespaces:
            continue
        print(f"--- {log.relative_to(plane.state_dir)}")
        print("\n".join(log.read_text(errors="replace").splitlines()[-15:]))


def test_two_tenants_three_federations_at_once_each_on_its_own_data(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube
) -> None:
    started = time.monotonic()
    c1, c2, c3 = plane.clusters[:3]
    root = fed.workdir.parent / "tenants"
    # Partitions of different sizes, so a client reading the wrong directory shows in samples.
    shared = prepare_data(plane, root / "shared", [c1, c2], SHARED_CLAIM, sizes="2,1")
    own = prepare_data(plane, root / "own", [c2, c3], OWN_CLAIM, sizes="3,1")
    runs = [
        Run("tenant-a", "digits", SHARED_CLAIM, LONG_ROUNDS, shared),
        Run("tenant-b", "digits", SHARED_CLAIM, SHORT_ROUNDS, shared),
        Run("tenant-b", "private", OWN_CLAIM, LONG_ROUNDS, own),
    ]
    keep_a, gone, keep_c = runs
    kept = [keep_a, keep_c]
    spokes = {c: Kube(plane.cluster_kubeconfigs[c]) for c in (c1, c2, c3)}
    try:
        # The short one first, the others once it trains; all three then train side by side.
        # Started together, a long one on quick clusters finished all its rounds before the
        # short one's server came up.
        gone.uid = create_fl(hub, gone.namespace, _body(gone))["metadata"]["uid"]
        _wait_phase(fed, hub, gone, 600, "Running", "Completed")
        for run in kept:
            run.uid = create_fl(hub, run.namespace, _body(run))["metadata"]["uid"]

        # One tenant's client pod cannot post metrics for another tenant's federation.
        spoof_ns = f"/api/v1/namespaces/{client_namespace(keep_c.ref)}"
        wait_for(lambda: spokes[c3].get(spoof_ns), 300, f"client namespace of {keep_c.key}")
        spokes[c3].create(f"{spoof_ns}/pods", _spoof_pod(keep_c, fed.agent_endpoints()[c3]))

        # The short one completes while the others train.
        _wait_phase(fed, hub, gone, 900, "Completed")
        for run in kept:
            _wait_phase(fed, hub, run, 600, "Running", "Completed")
            st = _status(hub, run)
            assert int(st.get("round") or 0) < run.rounds, (run.key, "finished too early")

        def spoof_done() -> str | None:
            pod = spokes[c3].get(f"{spoof_ns}/pods/spoof") or {}
            phase = (pod.get("status") or {}).get("phase")
            return phase if phase in ("Succeeded", "Failed") else None

        spoof_logs = Path(plane.state_dir, "pods", c3).glob(
            f"{client_namespace(keep_c.ref)}_spoof_*/logs/c.log"
        )
        outcome = wait_for(spoof_done, 180, "the spoofing pod")
        assert outcome == "Succeeded", [log.read_text()[-2000:] for log in spoof_logs]
        [log] = Path(plane.state_dir, "pods", c3).glob(
            f"{client_namespace(keep_c.ref)}_spoof_*/logs/c.log"
        )
        # Refused 403 for tenant-a's federation, with tenant-b's token from the pod's own
        # namespace: by the pod's address when the agent sees it, else by the token (through a
        # Service the local node proxies, the agent sees the node's address).
        refusal = log.read_text()
        assert refusal.startswith("403 fl_namespace, fl_name: "), refusal
        assert (
            "this client pod belongs to tenant-b/private" in refusal
            or "tenant-a/digits has no client here" in refusal
        ), refusal
        spokes[c3].delete(f"{spoof_ns}/pods/spoof")

        # Three distinct servers behind three distinct LoadBalancer addresses.
        addresses = set()
        for run in runs:
            svcs = (
                hub.get(
                    f"/api/v1/namespaces/{run.namespace}/services",
                    {"labelSelector": f"{constants.LABEL_OWNER_UID}={run.uid}"},
                )
                or {}
            )
            [svc] = svcs["items"]
            addresses.add(svc["status"]["loadBalancer"]["ingress"][0]["ip"])
        assert len(addresses) == 3

        # Deleting one leaves the others untouched and still training.
        before = {
            (run.key, c): (
                [(w["metadata"]["uid"], w["metadata"]["generation"]) for w in _works(hub, c, run)],
                _client_pods(spokes[c], run),
            )
            for run in kept
            for c in run.paths
        }
        rounds_before = {run.key: int(_status(hub, run).get("round") or 0) for run in kept}
        hub.delete(f"{FL_PATH.format(ns=gone.namespace)}/{gone.name}")
        wait_for(lambda: get_fl(hub, gone.namespace, gone.name) is None, 180, f"{gone.key} gone")
        for c in gone.paths:
            ns = f"/api/v1/namespaces/{client_namespace(gone.ref)}"

            def works_gone(c: str = c) -> bool:
                return not _works(hub, c, gone)

            def ns_gone(c: str = c, n: str = ns) -> bool:
                return spokes[c].get(n) is None

            wait_for(works_gone, 120, f"{gone.key} work on {c} gone")
            wait_for(ns_gone, 180, f"{gone.key} ns on {c}")
        for run in kept:
            st = _status(hub, run)
            assert st.get("phase") in ("Running", "Completed"), (run.key, st.get("message"))

        finals = {}
        for run in kept:

            def finished(run: Run = run) -> dict[str, Any] | None:
                fed.check_alive()
                st = _status(hub, run)
                return st if st.get("phase") in ("Completed", "Failed") else None

            finals[run.key] = wait_for(finished, 900, f"{run.key} finished")
        after = {
            (run.key, c): (
                [(w["metadata"]["uid"], w["metadata"]["generation"]) for w in _works(hub, c, run)],
                _client_pods(spokes[c], run),
            )
            for run in kept
            for c in run.paths
        }
        assert after == before  # same works (uid, generation), same client pods, no restarts
        for run in kept:
            st = finals[run.key]
            assert st["phase"] == "Completed", (run.key, st.get("message"))
            assert st["round"] == st["totalRounds"] == run.rounds
            assert st["round"] > rounds_before[run.key]  # it went on training after the delete

            # A client posts a round's metrics after its reply, so the last round's reports can
            # reach the status just after the server ended: the rows catch up.
            def caught_up(run: Run = run) -> dict[str, Any] | None:
                now = _status(hub, run)
                rounds = {r["name"]: r.get("round") for r in now.get("clusters") or []}
                return now if all(rounds.get(c) == run.rounds for c in run.paths) else None

            st = wait_for(caught_up, 60, f"{run.key}'s rows at round {run.rounds}")

            # Only its own clusters, each on the directory its own claim names.
            rows = {r["name"]: r for r in st["clusters"]}
            assert set(rows) == set(run.paths), (run.key, sorted(rows))
            history = {h["cluster"] for h in st.get("history") or []}
            assert history and history <= {*run.paths, "global"}, (run.key, history)
            for cluster, path in run.paths.items():
                [work] = _works(hub, cluster, run)
                assert work["metadata"]["name"] == work_name(run.ref)
                manifests = work["spec"]["workload"]["manifests"]
                pv = next(m for m in manifests if m["kind"] == "PersistentVolume")
                assert pv["spec"]["hostPath"]["path"] == str(path)
                manifest = json.loads((path / "manifest.json").read_text())
                assert rows[cluster]["samples"] == manifest["samples"], (run.key, rows[cluster])
                assert rows[cluster]["round"] == run.rounds, (run.key, rows[cluster])
            outside = set(plane.clusters) - set(run.paths)
            assert not [c for c in outside if _works(hub, c, run)], run.key
            model = Path(st["model"]["path"])
            # Each resource's store is its own directory under the hub's HostPath root.
            assert model.is_file() and str(model).startswith(str(fed.store_dir(run.ref)) + "/")
        print(f"three federations, two tenants: {time.monotonic() - started:.0f}s")
    except BaseException:
        _print_diagnosis(plane, hub, runs)
        raise
    finally:
        _keep_server_logs(plane)  # the pods' volumes go with them; their logs/ dirs stay
        for run in runs:  # also after a failure: nothing keeps training into later tests
            hub.delete(f"{FL_PATH.format(ns=run.namespace)}/{run.name}")
        for run in runs:

            def fl_gone(r: Run = run) -> bool:
                return get_fl(hub, r.namespace, r.name) is None

            wait_for(fl_gone, 180, f"{run.key}")
        for spoke in spokes.values():
            spoke.close()
        for c in (c1, c2):
            set_cluster_claim(plane, c, SHARED_CLAIM, None)
        for c in (c2, c3):
            set_cluster_claim(plane, c, OWN_CLAIM, None)
