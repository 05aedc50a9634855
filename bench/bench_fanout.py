"""One federation over N clusters: what the hub controller pays for the fan-out at N.

    OCMFL_CP_DIR=... .venv/bin/python bench/bench_fanout.py            # N = 100, 1000, 3500
    OCMFL_CP_DIR=... .venv/bin/python bench/bench_fanout.py --n 300

On a private local control plane (``$OCMFL_CP_DIR-bench``: the real kube-apiserver and OCM
placement controller) each phase makes N simulated ManagedClusters (accepted, in the `global`
set, the phase's data ClusterClaim in their status, a namespace each; no agent, so no work is
ever applied by an agent), starts the real hub process (hack/localfed.py: controller,
aggregator and signers) and applies one FederatedLearning selecting them (minAvailableClients
N). The SuperNode public keys the Fleet signer would store from the CSRs of all clusters but
one are written to the enrolled-keys shards as the signer does
(credentials_layout.enrolled_keys_secret_name). Once all N works exist, the bench marks them Applied
(what the work agents report): the gate opens and the controller writes the node-keys shards
at full size, then waits for the last key, so no server (no Flower process) starts.

One JSON line per N:

* ``raw_s``: the same N ManifestWorks (the controller's bodies with a client token, under
  another name) POSTed by a raw aiohttp client with as many requests in flight as the
  controller allows (WRITE_CONCURRENCY), before the controller runs; ``create_s``: the
  controller's. Both are measured the same way, by a metadata-only list+watch of the works in
  this process: from the first work seen to the Nth (``raw_call_s``: the raw client's own
  clock, first request to last answer, for comparison);
  ``ratio`` = controller create rate / raw rate (raw_s / create_s);
  ``create_after_decided_s``: the part of ``create_s`` after the placement controller had
  decided all N (the Placement's numberOfSelectedClusters, polled every 0.1 s);
  ``apply_to_n_s``: from the
  FederatedLearning's creation to N works (includes the placement controller's decisions,
  ``decided_s``);
* ``leave_s``: one cluster's claim removed -> its work deleted; ``join_s``: a new cluster with
  the claim -> its work created (``join_after_decision_s``: from the PlacementDecision naming
  it, i.e. the controller's own part); the joiner sorts into the first PlacementDecision, so
  OCM rewrites every slice after it, and ``join_deleted_others`` counts the other clusters'
  works deleted meanwhile (each a restarted client; 0 expected);
* ``cpu_s``, ``peak_rss_mb``: the hub process over the phase (sampled every 0.2 s);
  ``create_cpu_s``: its CPU seconds from apply to N works;
* ``objects``: the size in bytes of every object the controller writes (the resource with its
  status, each Secret, the Placement, the Service, the largest ManifestWork);
  ``max_object_bytes`` the largest of them;
* ``requests_per_cluster``: apiserver requests (apiserver_request_total, all verbs but WATCH,
  on the kinds the controller writes, minus the bench's own) from apply until N works, / N.

``--profile DIR`` (py-spy on PATH or in $PY_SPY) samples the hub's GIL holder from apply to N
works into ``DIR/hub-n<N>.txt`` (py-spy's raw format: one line per stack, with its count).

Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hack import controlplane as cp
from hack.controlplane import processes
from hack.localfed import FL_PATH, LocalFederation, create_fl
from hack.testing import WaitTimeout, wait_for
from hub_controller import credentials_layout
from hub_controller.api import FLRef, parse_spec
from hub_controller.membership import ClusterResolution
from hub_controller.operator import reconcile as reconciler
from hub_controller.operator.desired import client_token
from hub_controller.operator.desired import server as server_mod
from hub_controller.operator.desired import works as works_mod
from ocmfl import constants, nodekeys
from ocmfl.kube import LIST, Kube, list_watch, object_key, path_of

PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")
CLUSTERS = f"/apis/{constants.CLUSTER_GROUP}/v1/managedclusters"
WORKS_ALL = f"/apis/{constants.WORK_GROUP}/v1/manifestworks"
DECISIONS = f"/apis/{constants.CLUSTER_GROUP}/v1beta1/namespaces/{{ns}}/placementdecisions"
SETUP_CONCURRENCY = 32
# The kinds the controller writes (resource, subresource) as apiserver_request_total names them.
CONTROLLER_KINDS = {
    ("manifestworks", ""),
    ("secrets", ""),
    ("federatedlearnings", ""),
    ("federatedlearnings", "status"),
    ("placements", ""),
    ("services", ""),
    ("persistentvolumeclaims", ""),
    ("jobs", ""),
}


# --- a raw async client (the baseline, and fast set-up) ------------------------------------
class Raw:
    """aiohttp against the apiserver of `kube`, at most `limit` requests in flight."""

    def __init__(self, kube: Kube, limit: int) -> None:
        cfg = kube.api.configuration
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        self.ssl = ctx
        self.host = kube.host
        self.headers = {k: v for k, v in kube._headers().items() if k != "Accept"}
        self.limit = limit

    async def _all(self, requests: list[tuple[str, str, Any, str]]) -> list[int]:
        sem = asyncio.Semaphore(self.limit)
        conn = aiohttp.TCPConnector(ssl=self.ssl, limit=self.limit)
        async with aiohttp.ClientSession(connector=conn, headers=self.headers) as session:

            async def one(method: str, path: str, body: Any, ctype: str) -> int:
                async with sem:
                    data = None if body is None else json.dumps(body)
                    headers = {"Content-Type": ctype}
                    async with session.request(
                        method, self.host + path, data=data, headers=headers
                    ) as resp:
                        await resp.read()
                        return resp.status

            return list(await asyncio.gather(*(one(*r) for r in requests)))

    def run(self, requests: list[tuple[str, str, Any, str]]) -> list[int]:
        """Send all; the statuses in order."""
        return asyncio.run(self._all(requests))

    def check(self, requests: list[tuple[str, str, Any, str]], ok: Iterable[int]) -> None:
        allowed = set(ok)
        bad = [(r[0], r[1], s) for r, s in zip(requests, self.run(requests), strict=True)]
        bad = [b for b in bad if b[2] not in allowed]
        if bad:
            raise RuntimeError(f"{len(bad)} requests failed, e.g. {bad[:3]}")


JSON = "application/json"
MERGE = "application/merge-patch+json"
APPLIED = {
    "status": {
        "conditions": [
            {
                "type": "Applied",
                "status": "True",
                "reason": "AppliedManifestWorkComplete",
                "message": "simulated work agent",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
    }
}


def cluster_requests(names: list[str], claim: str) -> list[list[tuple[str, str, Any, str]]]:
    """Rounds of requests making the simulated clusters: namespaces, then ManagedClusters,
    then their status (claims, conditions; what the registration agent reports). The
    namespaces go first, in a round of their own: OCM's registration controller makes a new
    ManagedCluster's namespace itself, and would win a race with our create (409, seen in CI)."""
    namespaces: list[tuple[str, str, Any, str]] = []
    first: list[tuple[str, str, Any, str]] = []
    second: list[tuple[str, str, Any, str]] = []
    for name in names:
        namespaces.append(("POST", "/api/v1/namespaces", {"metadata": {"name": name}}, JSON))
        mc = {
            "apiVersion": f"{constants.CLUSTER_GROUP}/v1",
            "kind": "ManagedCluster",
            "metadata": {"name": name, "labels": {"name": name}},
            "spec": {"hubAcceptsClient": True, "leaseDurationSeconds": 60},
        }
        first.append(("POST", CLUSTERS, mc, JSON))
        second.append(("PATCH", f"{CLUSTERS}/{name}/status", cluster_status(name, claim), MERGE))
    return [namespaces, first, second]


def cluster_status(name: str, claim: str | None) -> dict[str, Any]:
    claims = [{"name": claim, "value": f"/data/{name}"}] if claim else []
    cond = {
        "type": "ManagedClusterConditionAvailable",
        "status": "True",
        "reason": "ManagedClusterAvailable",
        "message": "simulated",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    return {"status": {"clusterClaims": claims, "conditions": [cond]}}


def fl_body(name: str, claim: str, n: int) -> dict[str, Any]:
    image = constants.WORKLOAD_IMAGE
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name},
        "spec": {
            "framework": "flower",
            "server": {
                "image": image,
                "app": {"path": "/opt/ocm-fl/apps/digits"},
                "rounds": 1,
                "minAvailableClients": n,
                "advertiseAddress": "127.0.0.1:19092",
                "storage": {"type": "HostPath"},
            },
            "client": {
                "image": image,
                "dataClaim": claim,
                "placement": {
                    "clusterSets": ["global"],
                    "predicates": [
                        {
                            "requiredClusterSelector": {
                                "claimSelector": {
                                    "matchExpressions": [{"key": claim, "operator": "Exists"}]
                                }
                            }
                        }
                    ],
                },
            },
        },
    }


# --- measuring -----------------------------------------------------------------------------
@dataclass(eq=False)
class ProcSampler(threading.Thread):
    """CPU seconds and peak RSS of one process, every 0.2 s."""

    pid: int
    cpu0: float = 0.0
    cpu: float = 0.0
    peak_rss: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)
        self.cpu0 = self._read()[0]

    def _read(self) -> tuple[float, int]:
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return self.cpu + self.cpu0, 0
        return (int(fields[11]) + int(fields[12])) / TICKS, int(fields[21]) * PAGE

    def now(self) -> float:
        """The process's CPU seconds so far."""
        return self._read()[0]

    def run(self) -> None:
        while not self.stop.is_set():
            cpu, rss = self._read()
            self.cpu, self.peak_rss = cpu - self.cpu0, max(self.peak_rss, rss)
            self.stop.wait(0.2)


def request_counts(hub: Kube) -> dict[tuple[str, str, str], float]:
    """apiserver_request_total summed by (resource, subresource, verb), WATCH left out."""
    resp = hub._send("GET", hub._url("/metrics", None), hub._headers())
    out: dict[tuple[str, str, str], float] = defaultdict(float)
    for line in resp.data.decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, value = line[len("apiserver_request_total{") :].rsplit("} ", 1)
        labels = dict(
            part.split("=", 1) for part in labels_text.replace('"', "").split(",") if "=" in part
        )
        if labels.get("verb") in ("WATCH", "CONNECT"):
            continue
        key = (labels.get("resource", ""), labels.get("subresource", ""), labels.get("verb", ""))
        out[key] += float(value)
    return out


def controller_requests(
    before: dict[tuple[str, str, str], float],
    after: dict[tuple[str, str, str], float],
    own: dict[tuple[str, str], int],
) -> dict[str, int]:
    """Requests on the controller's kinds between two scrapes, less the bench's `own`
    ((resource, subresource) -> count), by "resource[/sub] VERB"."""
    out: dict[str, int] = {}
    for key, value in after.items():
        resource, sub, verb = key
        if (resource, sub) not in CONTROLLER_KINDS:
            continue
        delta = int(value - before.get(key, 0.0))
        if delta > 0:
            out[f"{resource}{'/' + sub if sub else ''} {verb}"] = delta
    for (resource, sub), count in own.items():
        for name in list(out):
            if name.startswith(f"{resource}{'/' + sub if sub else ''} "):
                take = min(count, out[name])
                out[name] -= take
                count -= take
    return {k: v for k, v in sorted(out.items()) if v > 0}


# Metadata only: the counter needs names, not 9 KB bodies (the apiserver encodes less per
# event and this process decodes less, for the raw client's works and the controller's alike).
# (A list must ask for PartialObjectMetadataList, a watch for PartialObjectMetadata: the
# apiserver answers 406 to the other, with no fallback to plain JSON.)
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_EVENTS = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class MetadataKube(Kube):
    """A `Kube` whose lists and watch events are metadata only (one thread per instance)."""

    _accept = METADATA_LIST

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        return {**super()._headers(content_type), "Accept": self._accept}

    def request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._accept = METADATA_LIST
        return super().request(*args, **kwargs)

    def watch(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        self._accept = METADATA_EVENTS
        yield from super().watch(*args, **kwargs)


@dataclass(eq=False)
class WorkWatch(threading.Thread):
    """Follows the works matching `selector` (list + watch, metadata only): how many exist,
    when the first appeared and when there were `n` (a LIST with a label selector cannot
    count cheaply). The raw client's works and the controller's are timed by the same watch,
    from the first work seen to the Nth."""

    kubeconfig: str
    selector: str
    n: int
    names: set[str] = field(default_factory=set)
    deleted: list[str] = field(default_factory=list)  # each work deleted, in order
    first: float | None = None
    full: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)

    def run(self) -> None:
        kube = MetadataKube(self.kubeconfig)
        query = {"labelSelector": self.selector}
        for etype, obj in list_watch(kube, WORKS_ALL, stop=self.stop, query=query):
            now = time.monotonic()
            if etype == LIST:
                self.names = {object_key(o) for o in obj.get("items") or []}
            elif etype == "DELETED":
                self.names.discard(object_key(obj))
                self.deleted.append(object_key(obj))
            else:
                self.names.add(object_key(obj))
            if self.names and self.first is None:
                self.first = now
            if len(self.names) >= self.n and self.full is None:
                self.full = now
        kube.close()


def size(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def object_sizes(hub: Kube, ns: str, name: str, selector: str) -> dict[str, int]:
    """Bytes of each object the controller wrote for the resource (works: the largest)."""
    sizes: dict[str, int] = {}
    fl = hub.get(f"{FL_PATH.format(ns=ns)}/{name}") or {}
    sizes["FederatedLearning (whole, with status)"] = size(fl)
    sizes["status"] = size(fl.get("status") or {})
    for api_version, kind in (
        ("v1", "Secret"),
        ("cluster.open-cluster-management.io/v1beta1", "Placement"),
        ("v1", "Service"),
    ):
        for obj in hub.list_objects(path_of(api_version, kind, ns), selector):
            sizes[f"{kind} {obj['metadata']['name']}"] = size(obj)
    biggest, cont = 0, None
    while True:
        query = {"labelSelector": selector, "limit": 500, "continue": cont}
        page = hub.request("GET", WORKS_ALL, query=query)
        biggest = max([biggest, *(size(w) for w in page.get("items") or [])])
        cont = (page.get("metadata") or {}).get("continue")
        if not cont:
            break
    sizes["ManifestWork (largest)"] = biggest
    return sizes


def decided(hub: Kube, ns: str, cluster: str) -> bool:
    for d in (hub.get(DECISIONS.format(ns=ns)) or {}).get("items") or []:
        if any(x.get("clusterName") == cluster for x in (d.get("status") or {}).get("decisions")
               or []):  # fmt: skip
            return True
    return False


# --- one phase -----------------------------------------------------------------------------
def enrolled_shards(
    ref: FLRef, names: list[str], keys: dict[str, bytes]
) -> list[tuple[str, str, Any, str]]:
    """POSTs of the enrolled-keys shards with every cluster's public key, as the Fleet signer
    writes them (one shard per credentials_layout.key_shard, its labels and owner)."""
    server_name = credentials_layout.server_name(ref)
    shards: dict[str, dict[str, str]] = defaultdict(dict)
    for c in names:
        secret = credentials_layout.enrolled_keys_secret_name(server_name, c)
        shards[secret][f"{c}{credentials_layout.NODE_PUB_SUFFIX}"] = base64.b64encode(
            keys[c]
        ).decode()
    labels = {**ref.labels(server_mod.COMPONENT), credentials_layout.LABEL_KEYS: "enrolled"}
    return [
        (
            "POST",
            path_of("v1", "Secret", ref.namespace),
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": secret,
                    "labels": labels,
                    "ownerReferences": [ref.owner_reference()],
                },
                "data": data,
            },
            JSON,
        )
        for secret, data in shards.items()
    ]


def start_profile(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy (on PATH, or $PY_SPY) sampling process `pid` into `out` (collapsed stacks, one
    line per stack and thread) until `stop_profile`; only samples of the thread holding the
    GIL (`--gil`): where the process's Python CPU goes, not where its threads wait."""
    exe = os.environ.get("PY_SPY") or shutil.which("py-spy") or "py-spy"
    argv = [exe, "record", "--pid", str(pid), "--rate", "25", "--threads", "--nonblocking",
            "--gil", "--format", "raw", "--output", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the phase's clock starts
    return proc


def stop_profile(proc: subprocess.Popen[bytes]) -> None:
    """Stop py-spy; it writes its file on SIGINT."""
    proc.send_signal(signal.SIGINT)
    proc.wait(60)


def phase(
    n: int, plane: cp.ControlPlane, workdir: Path, prefix: str = "fan", profile: Path | None = None
) -> dict[str, Any]:
    """One phase at N (see the module docstring); cleans up what it made. With `profile`,
    the hub is sampled by py-spy from the resource's creation to its Nth work, into that
    file."""
    hub = Kube(plane.hub_kubeconfig)
    setup = Raw(hub, SETUP_CONCURRENCY)
    raw = Raw(hub, reconciler.WRITE_CONCURRENCY)
    names = [f"{prefix}{n}-{i:04d}" for i in range(n)]
    # Sorts into the first PlacementDecision: OCM moves one cluster of every later slice
    # into the next one (the join that could restart other clusters' works mid-rewrite).
    joiner = f"{prefix}{n}-0000a"
    claim = f"{prefix}{n}.bench.federated-learning.io"
    ns, fl_name = f"{prefix}-{n}", "fanout"
    fed: LocalFederation | None = None
    try:
        for rnd in cluster_requests(names, claim):
            setup.check(rnd, (200, 201))
        body = fl_body(fl_name, claim, n)
        keys = {c: nodekeys.generate_keypair(c)[1] for c in [*names, joiner]}

        # Baseline: the controller's own work bodies for these clusters (with a client token,
        # as the controller's), under another name, timed by the same watch as the
        # controller's: first work seen -> Nth work seen.
        spec = parse_spec(body["spec"], fl_name)
        raw_ref = FLRef(namespace=ns, name=f"{fl_name}-raw", uid="00000000-raw")
        resolutions = [ClusterResolution(c, f"/data/{c}", "bench") for c in names]
        bodies = works_mod.desired_works(
            raw_ref,
            spec,
            resolutions,
            "127.0.0.1:19092",
            server_name="127.0.0.1",
            client_token=client_token.new_token(),
        )
        posts = [
            ("POST", path_of(works_mod.WORK_API_VERSION, "ManifestWork", c), w, JSON)
            for c, w in bodies.items()
        ]
        raw_selector = (
            f"{constants.LABEL_OWNER_NAMESPACE}={ns},{constants.LABEL_OWNER_NAME}={raw_ref.name}"
        )
        raw_watch = WorkWatch(plane.hub_kubeconfig, raw_selector, n)
        raw_watch.start()
        time.sleep(1.0)  # its LIST is done: it sees every work from the first
        started = time.monotonic()
        raw.check(posts, (201,))
        raw_call_s = time.monotonic() - started
        wait_for(lambda: raw_watch.full is not None, 60 + n * 0.05, f"{n} raw works seen")
        raw_watch.stop.set()
        assert raw_watch.full is not None and raw_watch.first is not None
        raw_s = raw_watch.full - raw_watch.first
        deletes = [(m[0].replace("POST", "DELETE"), m[1] + "/" + m[2]["metadata"]["name"], None,
                    JSON) for m in posts]  # fmt: skip
        setup.check(deletes, (200, 202))

        # The one agent's certificate waits for the hub's initial listing (N clusters).
        fed = LocalFederation(plane, workdir / f"n{n}", [], agent_wait_s=60 + n * 0.06)
        fed.start()
        hub_proc = next(p for p in fed.procs if p.name == "hub")
        sampler = ProcSampler(hub_proc.popen.pid)
        sampler.start()
        time.sleep(2.0)  # the hub's indexes list what exists
        selector = f"{constants.LABEL_OWNER_NAMESPACE}={ns},{constants.LABEL_OWNER_NAME}={fl_name}"
        watch = WorkWatch(plane.hub_kubeconfig, selector, n)
        watch.start()
        time.sleep(1.0)  # its LIST is done: it sees every work from the first
        spy = start_profile(hub_proc.popen.pid, profile) if profile is not None else None
        before = request_counts(hub)
        t0 = time.monotonic()
        cpu_t0 = sampler.now()
        created = create_fl(hub, ns, body)
        ref = FLRef(ns, fl_name, created["metadata"]["uid"])
        # Every cluster's agent but one has sent its key: once all works are applied the
        # gate opens and the controller writes the node-keys shards, but waits for the last
        # key, so no server starts (no Flower process disturbs the measurement).
        shard_posts = enrolled_shards(ref, names[1:], keys)
        setup.check(shard_posts, (201,))
        own: dict[tuple[str, str], int] = defaultdict(int)
        own[("federatedlearnings", "")] += 1
        own[("secrets", "")] += len(shard_posts)
        t_decided: float | None = None
        placement_path = path_of(
            "cluster.open-cluster-management.io/v1beta1", "Placement", ns, fl_name
        )

        def all_works() -> bool:
            nonlocal t_decided
            fed.check_alive()
            now = time.monotonic()
            if t_decided is None:
                placement = hub.get(placement_path) or {}
                own[("placements", "")] += 1
                if (placement.get("status") or {}).get("numberOfSelectedClusters") == n:
                    t_decided = now
            return watch.full is not None

        wait_for(all_works, 120 + n * 0.5, f"{n} works", interval=0.1)
        create_cpu_s = sampler.now() - cpu_t0
        if spy is not None:
            stop_profile(spy)
        assert watch.full is not None
        t_n, first, seen = watch.full, watch.first, len(watch.names)
        after = request_counts(hub)
        requests = controller_requests(before, after, own)
        work = works_mod.work_name(ref)

        def clients(want: str) -> bool:
            st = (hub.get(f"{FL_PATH.format(ns=ns)}/{fl_name}") or {}).get("status") or {}
            return st.get("clients") == want

        wait_for(lambda: clients(f"0/{n}"), 60 + n * 0.02, f"status 0/{n}", interval=0.5)
        # What the clusters' work agents would report: every work Applied.
        patches = [
            ("PATCH", path_of(works_mod.WORK_API_VERSION, "ManifestWork", c, work) + "/status",
             APPLIED, MERGE)
            for c in names
        ]  # fmt: skip
        setup.check(patches, (200,))
        node_keys = 0

        def keys_copied() -> bool:
            nonlocal node_keys
            shards = hub.list_objects(
                path_of("v1", "Secret", ns), f"{credentials_layout.LABEL_KEYS}=node"
            )
            node_keys = sum(len(s.get("data") or {}) for s in shards)
            return node_keys >= n - 1 and clients(f"{n}/{n}")

        # The gate is open: the controller copied every enrolled member's key to the shards.
        wait_for(keys_copied, 60 + n * 0.02, "node keys of all clusters", interval=0.5)
        fl = hub.get(f"{FL_PATH.format(ns=ns)}/{fl_name}") or {}
        status = fl.get("status") or {}
        sizes = object_sizes(hub, ns, fl_name, selector)
        decisions = len((hub.get(DECISIONS.format(ns=ns)) or {}).get("items") or [])

        # One cluster leaves (its claim goes), one joins (a new cluster with the claim).
        leaver = names[-1]
        work_path = path_of(works_mod.WORK_API_VERSION, "ManifestWork", leaver, work)
        t = time.monotonic()
        hub.patch(f"{CLUSTERS}/{leaver}/status", cluster_status(leaver, None))
        wait_for(lambda: hub.get(work_path) is None, 120, f"{leaver}'s work deleted", interval=0.05)
        leave_s = time.monotonic() - t
        namespace, make, claim_it = cluster_requests([joiner], claim)
        setup.check(namespace, (200, 201))
        setup.check(make, (200, 201))
        t = time.monotonic()
        setup.check(claim_it, (200, 201))
        join_path = path_of(works_mod.WORK_API_VERSION, "ManifestWork", joiner, work)
        t_seen: list[float] = []

        def joined() -> bool:
            if not t_seen and decided(hub, ns, joiner):
                t_seen.append(time.monotonic())
            return hub.get(join_path) is not None

        wait_for(joined, 120, f"{joiner}'s work created", interval=0.05)
        join_s = time.monotonic() - t
        join_after = time.monotonic() - t_seen[0] if t_seen else None
        # Once the placement controller has rewritten every slice (its count comes last), a
        # moment for the controller to act: no other cluster's work went meanwhile.
        wait_for(
            lambda: (
                ((hub.get(placement_path) or {}).get("status") or {}).get(
                    "numberOfSelectedClusters"
                )
                == n
            ),
            120,
            "the placement's count after the join",
            interval=0.1,
        )
        time.sleep(1.0)
        join_deleted = [k for k in watch.deleted if not k.startswith(f"{leaver}/")]
        sampler.stop.set()
        sampler.join()
        watch.stop.set()
        total = sum(requests.values())
        create_s = t_n - (first or t0)
        return {
            "n": n,
            "works_created": seen,
            "phase": status.get("phase"),
            "ratio": round(raw_s / create_s, 2) if create_s > 0 else None,
            "max_object_bytes": max(sizes.values()),
            "raw_s": round(raw_s, 2),
            "raw_call_s": round(raw_call_s, 2),
            "create_s": round(create_s, 2),
            "apply_to_n_s": round(t_n - t0, 2),
            # The part of create_s after the placement controller had decided all N (its
            # decisions, made 100 clusters per object, can still arrive after the first work).
            "create_after_decided_s": (
                round(t_n - max(first or t0, t_decided), 2) if t_decided is not None else None
            ),
            "decided_s": round(t_decided - t0, 2) if t_decided is not None else None,
            "leave_s": round(leave_s, 2),
            "join_s": round(join_s, 2),
            "join_after_decision_s": round(join_after, 2) if join_after is not None else None,
            # Works of other clusters deleted while the join's decisions were rewritten.
            "join_deleted_others": len(join_deleted),
            "cpu_s": round(sampler.cpu, 1),
            "create_cpu_s": round(create_cpu_s, 1),
            "peak_rss_mb": round(sampler.peak_rss / 2**20),
            "objects": sizes,
            "node_keys": node_keys,
            "placement_decisions": decisions,
            "status_rows": len(status.get("clusters") or []),
            "cluster_counts": status.get("clusterCounts"),
            "requests_per_cluster": round(total / n, 2),
            "requests": requests,
        }
    finally:
        if fed is not None:
            fed.stop()
        cleanup(hub, setup, ns, fl_name, [*names, joiner])
        hub.close()


def cleanup(hub: Kube, setup: Raw, ns: str, fl_name: str, names: list[str]) -> None:
    """Delete the phase's resource (its finalizer dropped: the controller is stopped, and the
    works go with their cluster namespaces), clusters and namespaces; nothing waits on them."""
    fl_path = f"{FL_PATH.format(ns=ns)}/{fl_name}"
    if hub.get(fl_path) is not None:
        hub.patch(fl_path, {"metadata": {"finalizers": None}})
    hub.delete(f"/api/v1/namespaces/{ns}")
    reqs = [("DELETE", f"{CLUSTERS}/{c}", None, JSON) for c in names]
    reqs += [("DELETE", f"/api/v1/namespaces/{c}", None, JSON) for c in names]
    setup.run(reqs)

    def gone() -> bool:
        left = hub.request("GET", "/api/v1/namespaces")
        wanted = set(names)
        return not any(i["metadata"]["name"] in wanted for i in left.get("items") or [])

    # The next phase measures on a quiet apiserver: the namespace controller is done here.
    with contextlib.suppress(WaitTimeout):
        wait_for(gone, 180, "the phase's namespaces deleted", interval=2.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", default="100,1000,3500", help="comma-separated cluster counts")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="a directory: py-spy samples the hub from apply to N works into hub-n<N>.txt",
    )
    a = ap.parse_args()
    ns = [int(x) for x in a.n.split(",")]
    root = Path(tempfile.mkdtemp(prefix="ocmfl-bench-fanout-"))
    state_dir = Path(f"{processes.state_dir()}-bench")
    results = []
    with cp.session(clusters=1, state_dir=state_dir) as state:
        plane = cp.ControlPlane.from_state(state)
        for n in ns:
            out = a.profile / f"hub-n{n}.txt" if a.profile else None
            r = phase(n, plane, root, profile=out)
            results.append(r)
            print(json.dumps(r), flush=True)
    if a.json:
        a.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
