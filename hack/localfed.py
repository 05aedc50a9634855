"""A whole federation on the local control plane (DEMO AND TEST INFRASTRUCTURE).

On a real hub the controller, aggregator and CSR signer run in the Helm chart's Deployment and
each cluster's agent is deployed by OCM's addon manager; here they run as local processes
against the real local apiservers (hack.controlplane), with what the chart and OCM would do
done by this module instead:

* the hub CA (what `hub_controller.bootstrap.ca_init` creates on a real hub) is written to a
  directory;
* "clusteradm addon enable": a ManagedClusterAddOn per cluster;
* OCM's KubeClient registration: each agent gets a hub kubeconfig with the addon agent's
  default identity (user/groups of `default_agent_subject`), allowed to create CSRs;
* each agent then obtains its mTLS client certificate through the project's own CSR signer
  (`ocm-fl-agent --csr-hub-kubeconfig`): no certificate is made by hand for it.

Every process listens on its own host address of the plane (`ControlPlane.host_address`: the
hub on the first, cluster i's agent on the i-th), which pods in their own network namespaces
reach and which no other plane on the machine uses.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from hack.controlplane.plane import ControlPlane
from hack.testing import WaitTimeout, wait_for
from hub_controller import policy
from hub_controller.api import FLRef, PlacementSpec, exists_claim_keys, run_finished
from hub_controller.bootstrap.addon_template import default_agent_subject
from hub_controller.operator.desired.server import hostpath_store_dir
from ocmfl import constants, pki
from ocmfl.kube import Kube, KubeError

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
CRD_DIR = REPO / "crds"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
ADMISSION_PATHS = {
    "ValidatingAdmissionPolicy": f"{ADMISSION}/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": f"{ADMISSION}/validatingadmissionpolicybindings",
}
# Names the admission policy's objects like a chart release "ocm-fl-local" would.
ADMISSION_PREFIX = "ocm-fl-local"
POLICY_PATH = f"/apis/{constants.API_VERSION}/namespaces/{{ns}}/{policy.PLURAL}"
MCA_PATH = f"/apis/{constants.ADDON_GROUP}/v1alpha1/namespaces/{{ns}}/managedclusteraddons"
CLAIMS_PATH = f"/apis/{constants.CLUSTER_GROUP}/v1alpha1/clusterclaims"
BINDINGS_PATH = (
    f"/apis/{constants.CLUSTER_GROUP}/v1beta2/namespaces/{{ns}}/managedclustersetbindings"
)
FL_PATH = f"/apis/{constants.API_VERSION}/namespaces/{{ns}}/{constants.PLURAL}"
CSR_RBAC_NAME = "ocm-fl-local-addon-agents"
ADDON_AVAILABLE_LABEL = f"feature.open-cluster-management.io/addon-{constants.ADDON_NAME}"
T = TypeVar("T")


class FederationError(RuntimeError):
    """A component of the local federation failed to start."""


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


# --- what the Helm chart and OCM registration would do -------------------------------------
def install_crd(hub: Kube) -> None:
    """Apply the project's CRDs (crds/: FederatedLearning, FederationPolicy; server-side
    apply), wait until they are served, then the chart's admission policy, so the apiserver
    checks every FederatedLearning against its namespace's FederationPolicy as on a real hub."""
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        name = crd["metadata"]["name"]
        hub.apply(crd, f"{CRDS}/{name}")

        def established(name: str = name) -> bool:
            got = hub.get(f"{CRDS}/{name}") or {}
            conds = (got.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

        wait_for(established, 30, f"the CRD {name} to be established", error=FederationError)
    install_admission_policy(hub)


def install_admission_policy(hub: Kube) -> None:
    """The ValidatingAdmissionPolicy and bindings the chart ships (hub_controller.policy)."""
    for obj in policy.admission_objects(ADMISSION_PREFIX):
        hub.apply(obj, f"{ADMISSION_PATHS[obj['kind']]}/{obj['metadata']['name']}")


def grant_namespace(
    hub: Kube,
    namespace: str,
    *,
    image_prefixes: Sequence[str] = (constants.IMAGE_REGISTRY + "/",),
    data_claims: Sequence[str] = (),
    advertise_domains: Sequence[str] = (),
    writable_data_mount: bool = False,
    host_path_store: bool = False,
) -> dict[str, Any]:
    """What the hub admin does for a tenant namespace: create it (if needed) and its
    FederationPolicy `default` saying what FederatedLearning resources there may use."""
    spec = policy.FederationPolicySpec(
        allowed_image_prefixes=list(image_prefixes),
        allowed_data_claims=list(data_claims),
        allowed_advertise_domains=list(advertise_domains),
        allow_writable_data_mount=writable_data_mount,
        allow_host_path_store=host_path_store,
    )
    return apply_policy(hub, namespace, spec.model_dump(by_alias=True))


def apply_policy(hub: Kube, namespace: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Create the namespace (if needed) and apply its FederationPolicy `default` with `spec`;
    return once the apiserver's admission policy sees it."""
    hub.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    body = {
        "apiVersion": constants.API_VERSION,
        "kind": policy.KIND,
        "metadata": {"name": policy.POLICY_NAME, "namespace": namespace},
        "spec": dict(spec),
    }
    applied = hub.apply(body, f"{POLICY_PATH.format(ns=namespace)}/{policy.POLICY_NAME}")
    wait_policy_admitted(hub, namespace)
    return applied


def wait_policy_admitted(hub: Kube, namespace: str, timeout: float = 30.0) -> None:
    """Wait until the apiserver's admission policy sees the namespace's FederationPolicy (its
    parameter cache lags the API a moment): a dry-run create no longer fails for want of it."""
    probe = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "policy-probe", "namespace": namespace},
        "spec": {"client": {"dataClaim": "probe"}},
    }

    def seen() -> bool:
        try:
            hub.request("POST", FL_PATH.format(ns=namespace), probe, query={"dryRun": "All"})
        except KubeError as exc:
            return "no params found" not in str(exc)
        return True

    wait_for(seen, timeout, f"admission to see {namespace}'s FederationPolicy", interval=0.3)


def grant_for(body: Mapping[str, Any]) -> dict[str, Any]:
    """grant_namespace's arguments that allow exactly what a FederatedLearning body uses
    (its images, data claim, storage and advertised host): for tests and demos whose subject
    is not the policy."""
    spec = body["spec"]
    server, client = spec.get("server") or {}, spec["client"]
    default = constants.WORKLOAD_IMAGE
    address = server.get("advertiseAddress")
    return {
        "image_prefixes": sorted({server.get("image", default), client.get("image", default)}),
        "data_claims": [client["dataClaim"]]
        if client.get("dataClaim")
        else exists_claim_keys(PlacementSpec.model_validate(client.get("placement") or {})),
        "advertise_domains": [policy.advertised_host(address)] if address else [],
        "writable_data_mount": (client.get("dataMount") or {}).get("readOnly") is False,
        "host_path_store": (server.get("storage") or {}).get("type", "HostPath") == "HostPath",
    }


def enable_addon(hub: Kube, cluster: str) -> bool:
    """What `clusteradm addon enable --names federated-learning --clusters C` creates; True
    when this call created it (False: it was there already)."""
    created = hub.create(
        MCA_PATH.format(ns=cluster),
        {
            "apiVersion": f"{constants.ADDON_GROUP}/v1alpha1",
            "kind": "ManagedClusterAddOn",
            "metadata": {"name": constants.ADDON_NAME, "namespace": cluster},
            "spec": {},
        },
    )
    return created is not None


def ensure_agent_csr_rbac(hub: Kube) -> None:
    """Addon agents may create and read CSRs (the agent's hub permissions on a real hub)."""
    hub.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "metadata": {"name": CSR_RBAC_NAME},
            "rules": [
                {
                    "apiGroups": ["certificates.k8s.io"],
                    "resources": ["certificatesigningrequests"],
                    "verbs": ["create", "get", "list", "watch"],
                }
            ],
        },
    )
    hub.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": CSR_RBAC_NAME},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": CSR_RBAC_NAME,
            },
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Group",
                    "name": f"system:open-cluster-management:addon:{constants.ADDON_NAME}",
                }
            ],
        },
    )


def addon_agent_kubeconfig(plane: ControlPlane, cluster: str, path: Path) -> str:
    """A hub kubeconfig for `cluster`'s addon agent identity (as OCM's KubeClient gives it)."""
    state = Path(plane.state_dir) / "pki"
    ca = pki.load_cert_and_key((state / "ca.crt").read_bytes(), (state / "ca.key").read_bytes())
    subject = default_agent_subject(cluster)
    name = x509.Name(
        [pki.name_attribute(NameOID.ORGANIZATION_NAME, g) for g in subject["groups"][:2]]
        + [pki.name_attribute(NameOID.COMMON_NAME, subject["user"])]
    )
    pair = pki.issue_cert_for_subject(name, ca)
    hub_cfg = yaml.safe_load(Path(plane.hub_kubeconfig).read_text())
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "agent",
        "clusters": [{"name": "hub", "cluster": hub_cfg["clusters"][0]["cluster"]}],
        "users": [
            {
                "name": "agent",
                "user": {
                    "client-certificate-data": base64.b64encode(pair.cert_pem).decode(),
                    "client-key-data": base64.b64encode(pair.key_pem).decode(),
                },
            }
        ],
        "contexts": [{"name": "agent", "context": {"cluster": "hub", "user": "agent"}}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return str(path)


def mark_addon_available(hub: Kube, cluster: str) -> None:
    """The label OCM's registration hub sets once the addon's agent is healthy (Placements
    select on it); set here when the local agent is up."""
    hub.patch(
        f"/apis/{constants.CLUSTER_GROUP}/v1/managedclusters/{cluster}",
        {"metadata": {"labels": {ADDON_AVAILABLE_LABEL: "available"}}},
    )


# --- what the admin does -------------------------------------------------------------------
def set_cluster_claim(plane: ControlPlane, cluster: str, name: str, value: str | None) -> None:
    """Create/update (value) or delete (None) a ClusterClaim on the managed cluster itself."""
    spoke = Kube(plane.cluster_kubeconfigs[cluster])
    try:
        if value is None:
            spoke.delete(f"{CLAIMS_PATH}/{name}")
            return
        body = {
            "apiVersion": f"{constants.CLUSTER_GROUP}/v1alpha1",
            "kind": "ClusterClaim",
            "metadata": {"name": name},
            "spec": {"value": value},
        }
        spoke.apply(body, f"{CLAIMS_PATH}/{name}")
    finally:
        spoke.close()


def bind_global_cluster_set(hub: Kube, namespace: str) -> None:
    """The ManagedClusterSetBinding an admin creates so Placements in `namespace` see clusters."""
    hub.create(
        BINDINGS_PATH.format(ns=namespace),
        {
            "apiVersion": f"{constants.CLUSTER_GROUP}/v1beta2",
            "kind": "ManagedClusterSetBinding",
            "metadata": {"name": "global", "namespace": namespace},
            "spec": {"clusterSet": "global"},
        },
    )


# --- processes -----------------------------------------------------------------------------
@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class LocalFederation:
    """The hub controller (+ aggregator + CSR signer) and one agent per cluster, as processes."""

    plane: ControlPlane
    workdir: Path
    clusters: list[str] = field(default_factory=list)
    procs: list[_Proc] = field(default_factory=list)
    # Clusters whose ManagedClusterAddOn `start` created: `stop` deletes them again, so a
    # shared plane does not keep the addon enabled where the next test expects it absent.
    enabled: list[str] = field(default_factory=list)
    # The admin's root for HostPath model stores (the hub's $OCMFL_HOSTPATH_ROOT); default:
    # <workdir>/models.
    hostpath_root: Path | None = None
    # How long to wait for each agent's port and its certificate from the hub's CSR signer:
    # the signer runs once the hub has listed everything it watches (ManagedClusters included),
    # which takes longer on a hub with thousands of clusters (bench_fanout).
    agent_wait_s: float = 60.0
    # Extra env of the hub process from its next start (e.g. OCMFL_CERT_LIFETIME_SECONDS).
    hub_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        if not self.clusters:
            self.clusters = list(self.plane.clusters)
        self.hostpath_root = Path(self.hostpath_root or self.workdir / "models").resolve()

    def store_dir(self, fl: FLRef | Mapping[str, Any]) -> Path:
        """A resource's (its FLRef or the object) HostPath model store on the local hub node."""
        if not isinstance(fl, FLRef):
            meta = fl["metadata"]
            fl = FLRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
        return Path(hostpath_store_dir(str(self.hostpath_root), fl))

    @property
    def ca_dir(self) -> Path:
        return self.workdir / "hub-ca"

    @property
    def hub_host(self) -> str:
        """Where the hub controller, aggregator and metrics listen."""
        return self.plane.host_address(0)

    def agent_host(self, cluster: str) -> str:
        """Where `cluster`'s agent listens (reached by that cluster's FL client pods)."""
        return self.plane.host_address(self.plane.clusters.index(cluster) + 1)

    @property
    def aggregator_address(self) -> str:
        return f"{self.hub_host}:{constants.AGGREGATOR_PORT}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.hub_host}:{constants.HUB_METRICS_PORT}/metrics"

    def agent_endpoints(self) -> dict[str, str]:
        """Where each cluster's FL client posts its metrics (the cluster's agent)."""
        return {
            c: f"http://{self.agent_host(c)}:{constants.AGENT_LOCAL_PORT}" for c in self.clusters
        }

    def log_file(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Bring up the hub side, enable the addon and start an agent on every cluster."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        hub = Kube(self.plane.hub_kubeconfig)
        try:
            install_crd(hub)
            ensure_agent_csr_rbac(hub)
            self._ensure_ca()
            for cluster in self.clusters:
                if enable_addon(hub, cluster):
                    self.enabled.append(cluster)
        finally:
            hub.close()
        try:
            # All at once: each agent's CSR waits for the hub's signer, and the hub's start
            # (imports, informers) overlaps the agents' own.
            hub_proc = self._spawn_hub()
            agents = {cluster: self._spawn_agent(cluster) for cluster in self.clusters}
            self._wait_port(hub_proc, self.hub_host, constants.AGGREGATOR_PORT, 90)
            for cluster, proc in agents.items():
                self._wait_agent(cluster, proc)
            hub = Kube(self.plane.hub_kubeconfig)
            try:
                for cluster in self.clusters:
                    mark_addon_available(hub, cluster)
            finally:
                hub.close()
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> LocalFederation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _ensure_ca(self) -> None:
        if (self.ca_dir / pki.KEY_FILE).exists():
            return
        pki.save_tls_dir(self.ca_dir, pki.create_ca("ocm-fl-local-hub-ca"), None)

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> _Proc:
        log = self.log_file(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        full_env = {
            **os.environ,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        with log.open("ab") as fh:
            popen = subprocess.Popen(
                # Dies with this process even when it is killed before `stop` (a test run's
                # timeout): an orphan would keep this plane's host addresses and ports.
                ["setpriv", "--pdeathsig", "TERM", "--", *argv],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=str(REPO),
                start_new_session=True,
            )
        proc = _Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def _wait_port(self, proc: _Proc, host: str, port: int, timeout: float) -> None:
        def up() -> bool:
            if proc.popen.poll() is not None:
                tail = proc.log.read_text(errors="replace")[-3000:]
                raise FederationError(
                    f"{proc.name} exited with {proc.popen.returncode} at start; "
                    f"log {proc.log}:\n{tail}"
                )
            return _port_open(host, port)

        what = f"{proc.name} to listen on {host}:{port} (log {proc.log})"
        wait_for(up, timeout, what, error=FederationError)

    def _start_hub(self) -> None:
        proc = self._spawn_hub()
        self._wait_port(proc, self.hub_host, constants.AGGREGATOR_PORT, 90)

    def _spawn_hub(self) -> _Proc:
        env = {
            "KUBECONFIG": self.plane.hub_kubeconfig,
            constants.ENV_CA_DIR: str(self.ca_dir),
            constants.ENV_HUB_AGGREGATOR_ADDRESS: self.aggregator_address,
            constants.ENV_AGGREGATOR_LISTEN: self.aggregator_address,
            constants.ENV_METRICS_LISTEN: f"{self.hub_host}:{constants.HUB_METRICS_PORT}",
            constants.ENV_RUN_CSR_SIGNER: "true",
            constants.ENV_AGENT_ENDPOINTS: json.dumps(self.agent_endpoints()),
            constants.ENV_HOSTPATH_ROOT: str(self.hostpath_root),
            **self.hub_env,
        }
        argv = [
            str(VENV_BIN / "ocm-fl-hub"),
            "--liveness",
            f"http://{self.hub_host}:{constants.HUB_HEALTH_PORT}/healthz",
        ]
        return self._spawn("hub", argv, env)

    def _start_agent(self, cluster: str) -> None:
        self._wait_agent(cluster, self._spawn_agent(cluster))

    def _spawn_agent(self, cluster: str) -> _Proc:
        host = self.agent_host(cluster)
        cdir = self.workdir / "agents" / cluster
        bootstrap = addon_agent_kubeconfig(self.plane, cluster, cdir / "hub-bootstrap.kubeconfig")
        (cdir / "state").mkdir(parents=True, exist_ok=True)
        argv = [
            str(VENV_BIN / "ocm-fl-agent"),
            "--cluster", cluster,
            "--hub-address", self.aggregator_address,
            "--cert-dir", str(cdir / "tls"),
            "--ca-file", str(self.ca_dir / pki.CERT_FILE),
            "--kubeconfig", self.plane.cluster_kubeconfigs[cluster],
            "--csr-hub-kubeconfig", bootstrap,
            "--listen-host", host,
            "--state-dir", str(cdir / "state"),
        ]  # fmt: skip
        return self._spawn(f"agent-{cluster}", argv, {})

    def _wait_agent(self, cluster: str, proc: _Proc) -> None:
        cdir = self.workdir / "agents" / cluster
        self._wait_port(
            proc, self.agent_host(cluster), constants.AGENT_LOCAL_PORT, self.agent_wait_s
        )
        # The agent's identity comes from the hub CSR signer: wait until it holds it.
        wait_for(
            lambda: (cdir / "tls" / pki.CERT_FILE).exists(),
            self.agent_wait_s,
            f"agent {cluster}'s certificate from the hub CSR signer (log {proc.log})",
            error=FederationError,
        )

    def stop(self) -> None:
        """Stop every process this federation started (SIGTERM, then SIGKILL)."""
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in reversed(self.procs):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                proc.popen.wait(remaining)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(5)
        self.procs.clear()
        if self.enabled:
            hub = Kube(self.plane.hub_kubeconfig)
            try:
                for cluster in self.enabled:
                    with contextlib.suppress(KubeError, OSError):
                        hub.delete(f"{MCA_PATH.format(ns=cluster)}/{constants.ADDON_NAME}")
            finally:
                hub.close()
            self.enabled.clear()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to a component's process group ("hub", "agent-<cluster>") and forget it
        once it has exited (fault drills: a crash, not a shutdown)."""
        [proc] = [p for p in self.procs if p.name == name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, sig)
        proc.popen.wait(30)
        self.procs.remove(proc)

    def start_hub(self) -> None:
        """(Re)start the hub process, e.g. after `kill("hub")`; returns once it listens."""
        self._start_hub()

    def start_agent(self, cluster: str) -> None:
        """(Re)start a cluster's agent with its state directory, e.g. after a kill."""
        self._start_agent(cluster)

    def check_alive(self) -> None:
        """FederationError naming the component (and its log) if a process has died."""
        for proc in self.procs:
            if proc.popen.poll() is not None:
                raise FederationError(
                    f"{proc.name} exited with {proc.popen.returncode}; log {proc.log}"
                )


@contextlib.contextmanager
def running(
    plane: ControlPlane, workdir: Path, clusters: list[str] | None = None
) -> Iterator[LocalFederation]:
    """A started LocalFederation, stopped on exit."""
    fed = LocalFederation(plane, workdir, clusters or [])
    fed.start()
    try:
        yield fed
    finally:
        fed.stop()


def get_fl(hub: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The FederatedLearning resource as the API returns it, or None."""
    return hub.get(f"{FL_PATH.format(ns=namespace)}/{name}")


def prepare_data(
    plane: ControlPlane, root: Path, clusters: list[str], claim: str, *, sizes: str = "2,1"
) -> dict[str, Path]:
    """Write a label-skewed digits partition per cluster under `root` (each cluster's disk)
    plus a held-out `root/test`, and point each cluster's ClusterClaim `claim` at its own."""
    paths = write_partitions(root, clusters, sizes=sizes)
    claim_data(plane, paths, claim)
    return paths


def write_partitions(root: Path, clusters: list[str], *, sizes: str = "2,1") -> dict[str, Path]:
    """prepare_data's files only (no plane needed, so it can run while one starts): the
    label-skewed digits partition of each cluster under `root`, plus `root/test`."""
    from workloads.data import partition

    partition(root, clusters, split="label-skew", sizes=sizes, seed=0)
    return {c: (root / c).resolve() for c in clusters}


def claim_data(plane: ControlPlane, paths: Mapping[str, Path], claim: str) -> None:
    """Point each cluster's ClusterClaim `claim` at its data directory in `paths`."""
    for cluster, path in paths.items():
        set_cluster_claim(plane, cluster, claim, str(path))


def create_fl(
    hub: Kube, namespace: str, body: Mapping[str, Any], *, grant: bool = True
) -> dict[str, Any]:
    """Create the namespace (if needed), its cluster-set binding and the FederatedLearning.

    `grant`: also extend the namespace's FederationPolicy (create it if absent) so it allows
    what `body` uses (`grant_for`), for tests and benchmarks whose subject is not the policy.
    """
    hub.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    if grant:
        current = hub.get(f"{POLICY_PATH.format(ns=namespace)}/{policy.POLICY_NAME}") or {}
        have = policy.parse_policy(current.get("spec"))
        want = grant_for(body)
        grant_namespace(
            hub,
            namespace,
            image_prefixes=sorted({*have.allowed_image_prefixes, *want["image_prefixes"]}),
            data_claims=sorted({*have.allowed_data_claims, *want["data_claims"]}),
            advertise_domains=sorted({*have.allowed_advertise_domains, *want["advertise_domains"]}),
            writable_data_mount=have.allow_writable_data_mount or want["writable_data_mount"],
            host_path_store=have.allow_host_path_store or want["host_path_store"],
        )
    bind_global_cluster_set(hub, namespace)
    obj = {**body, "metadata": {**body["metadata"], "namespace": namespace}}
    deadline = time.monotonic() + (10.0 if grant else 0.0)
    while True:
        try:
            created = hub.create(FL_PATH.format(ns=namespace), obj, exist_ok=False)
            assert created is not None
            return created
        except KubeError as exc:
            # A policy just extended reaches the admission policy's cache a moment later.
            if "ValidatingAdmissionPolicy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def wait_fl(
    hub: Kube,
    namespace: str,
    name: str,
    timeout: float,
    on_update: Callable[[dict[str, Any]], None] | None = None,
    fed: LocalFederation | None = None,
    interval: float = 2.0,
) -> dict[str, Any]:
    """Follow the resource until its run finished (returned) or FederationError on timeout;
    one GET per `interval` seconds."""
    last: dict[str, Any] = {}

    def finished() -> dict[str, Any] | None:
        if fed is not None:
            fed.check_alive()
        obj = get_fl(hub, namespace, name)
        if obj is None:
            return None
        last.update(obj)
        if on_update is not None:
            on_update(obj)
        status = obj.get("status") or {}
        generation = (obj.get("metadata") or {}).get("generation")
        done = run_finished(status.get("phase"), status.get("observedGeneration"), generation)
        return obj if done else None

    try:
        return wait_for(finished, timeout, f"{namespace}/{name} to finish", interval=interval)
    except WaitTimeout:
        status = last.get("status") or {}
        raise FederationError(
            f"{namespace}/{name} not finished after {timeout:.0f}s "
            f"(phase {status.get('phase')}: {status.get('message')})"
        ) from None
