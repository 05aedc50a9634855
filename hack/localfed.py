"""A whole federation on the local control plane (DEMO AND TEST INFRASTRUCTURE).

On a real hub the controller and aggregator run in the Helm chart's hub Deployment and the CSR
signers in its signer Deployment; here they run as the same two parts, two local processes
(`ocm-fl-hub --role controller` as "hub", `--role signer` as "signer"; only the signer has
the CA keys), against the real local apiservers (hack.controlplane), on the plane's first host
address, which pods reach. Everything on the
clusters' side is what a hub admin's install does, for real:

* the chart's addon objects (ClusterManagementAddOn, AddOnTemplate, AddOnDeploymentConfig, the
  addon agents' hub RBAC), rendered by helm from deploy/helm and applied as they are;
* `clusteradm addon enable` per cluster (hack.controlplane.clusteradm);
* then OCM's addon manager deploys the agent (a pod of the addon image) on every cluster, OCM's
  registration agent gives it its hub kubeconfig (KubeClient registration), and the agent gets
  its aggregator identity from the hub's own CSR signer; the addon turns Available by OCM's
  health check.

The two CAs the chart's hook would make (the hub CA for the aggregator's server certificate,
the agent CA for agent identities) live in the plane's state directory, so that successive
federations on one plane agree with the agents' CA bundle.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from hack.controlplane import clusteradm
from hack.controlplane.plane import ControlPlane
from hack.helm import helm_binary
from hack.testing import WaitTimeout, wait_for
from hub_controller import policy
from hub_controller.api import (
    FLRef,
    PlacementSpec,
    SpecError,
    claim_placement,
    exists_claim_keys,
    parse_spec,
    run_finished,
)
from hub_controller.operator.desired.server import hostpath_store_dir
from hub_controller.operator.desired.works import DEFAULT_AGENT_ENDPOINT
from ocmfl import constants, csroutcome, pki
from ocmfl.kube import Kube, KubeError, Obj

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
# The signer process's kopf liveness port, on the hub's address (the controller has 8080).
SIGNER_HEALTH_PORT = constants.HUB_HEALTH_PORT + 1
POLICY_PATH = f"/apis/{constants.API_VERSION}/namespaces/{{ns}}/{policy.PLURAL}"
MCA_PATH = f"/apis/{constants.ADDON_GROUP}/v1alpha1/namespaces/{{ns}}/managedclusteraddons"
PODS_PATH = f"/api/v1/namespaces/{constants.AGENT_NAMESPACE}/pods"
CLAIMS_PATH = f"/apis/{constants.CLUSTER_GROUP}/v1alpha1/clusterclaims"
BINDINGS_PATH = (
    f"/apis/{constants.CLUSTER_GROUP}/v1beta2/namespaces/{{ns}}/managedclustersetbindings"
)
FL_PATH = f"/apis/{constants.API_VERSION}/namespaces/{{ns}}/{constants.PLURAL}"
CHART = REPO / "deploy" / "helm" / "ocm-federated-learning"
ADDON_AGENTS_GROUP = f"system:open-cluster-management:addon:{constants.ADDON_NAME}"
ADDON_AVAILABLE_LABEL = f"feature.open-cluster-management.io/addon-{constants.ADDON_NAME}"
# kind -> (plural, namespaced) of what install_addon applies.
ADDON_PATHS = {
    "ClusterManagementAddOn": ("clustermanagementaddons", False),
    "AddOnTemplate": ("addontemplates", False),
    "AddOnDeploymentConfig": ("addondeploymentconfigs", True),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
}
AGENT_APP_LABEL = f"app.kubernetes.io/name={constants.ADDON_NAME}-agent"
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
    app_path_prefixes: Sequence[str] = (constants.APPS_DIR + "/",),
    **more: Any,
) -> dict[str, Any]:
    """What the hub admin does for a tenant namespace: create it (if needed) and its
    FederationPolicy `default` saying what FederatedLearning resources there may use (`more`:
    further FederationPolicySpec fields by their Python names)."""
    spec = policy.FederationPolicySpec(
        allowed_image_prefixes=list(image_prefixes),
        allowed_data_claims=list(data_claims),
        allowed_advertise_domains=list(advertise_domains),
        allow_writable_data_mount=writable_data_mount,
        allow_host_path_store=host_path_store,
        allowed_app_path_prefixes=list(app_path_prefixes),
        **more,
    )
    return apply_policy(hub, namespace, spec.model_dump(by_alias=True, exclude_none=True))


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
    """Wait until the apiserver's admission policy enforces the namespace's FederationPolicy:
    both the policy (compiled a moment after it is applied) and its parameter cache lag the
    API. A dry-run create with a data claim no policy grants must be refused by the admission
    policy itself, not admitted and not refused for want of the parameter."""
    probe = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "policy-probe", "namespace": namespace},
        "spec": {"client": {"dataClaim": "policy-probe.invalid"}},
    }

    def seen() -> bool:
        try:
            hub.request("POST", FL_PATH.format(ns=namespace), probe, query={"dryRun": "All"})
        except KubeError as exc:
            text = str(exc)
            return "no params found" not in text and "ValidatingAdmissionPolicy" in text
        return False  # admitted: the admission policy is not enforcing yet

    wait_for(seen, timeout, f"admission to see {namespace}'s FederationPolicy", interval=0.3)


def metrics_headers(hub: Kube) -> dict[str, str]:
    """The Authorization header the hub's /metrics asks for, from the token Secret it made in
    its namespace ({} while there is none)."""
    path = f"/api/v1/namespaces/{constants.HUB_NAMESPACE}/secrets/{constants.METRICS_TOKEN_SECRET}"
    data = ((hub.get(path) or {}).get("data") or {}).get(constants.METRICS_TOKEN_KEY)
    return {"Authorization": f"Bearer {base64.b64decode(data).decode()}"} if data else {}


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
        "host_path_store": (server.get("storage") or {}).get("type") == "HostPath",
        **_pod_grant(spec),
    }


def _pod_grant(spec: Mapping[str, Any]) -> dict[str, Any]:
    """FederationPolicySpec fields that allow the pod settings, resources, app path, env and
    S3 store `spec` uses (nothing for a spec the API refuses: the controller reports that
    itself)."""
    try:
        parsed = parse_spec(dict(spec))
    except SpecError:
        return {}
    pods = (parsed.server.pod, parsed.client.pod)
    tolerations = [t for p in pods for t in p.tolerations]
    placement = parsed.client.placement.tolerations
    resources = [parsed.server.resources, parsed.client.resources]
    resources += [o.resources for o in parsed.client.overrides]
    caps: dict[str, Any] = {}
    for r in resources:
        for name, qty in [*(r.requests.items() if r else ()), *(r.limits.items() if r else ())]:
            if name in caps and policy.parse_quantity(caps[name]) >= policy.parse_quantity(qty):
                continue
            caps[name] = qty
    app = parsed.server.app
    app_dir = "" if app is None else app.path.rsplit("/", 1)[0] + "/"
    s3, init = parsed.server.storage.s3, parsed.server.init_model or ""
    buckets = {s3.bucket_name} if s3 else set()
    if init.startswith("s3://"):
        buckets.add(init[len("s3://") :].split("/", 1)[0])
    return {
        "allowed_s3_buckets": sorted(buckets),
        "allowed_s3_endpoints": [s3.endpoint] if s3 and s3.endpoint else [],
        "app_path_prefixes": [constants.APPS_DIR + "/", *([app_dir] if app_dir else [])],
        "allowed_priority_classes": sorted({p.priority_class_name for p in pods} - {None}),
        "allowed_scheduler_names": sorted({p.scheduler_name for p in pods} - {None}),
        "allowed_toleration_keys": sorted({t.key for t in tolerations if t.key}),
        "allowed_placement_toleration_keys": sorted({t.key for t in placement if t.key}),
        "allow_keyless_tolerations": any(not t.key for t in [*tolerations, *placement]),
        "allowed_node_selector_keys": sorted({k for p in pods for k in p.node_selector}),
        "allowed_label_prefixes": sorted({k for p in pods for k in p.labels}),
        "allowed_annotation_prefixes": sorted({k for p in pods for k in p.annotations}),
        "max_pod_resources": caps,
        "allow_install_dependencies": bool(app and app.install_dependencies),
        "allowed_env": sorted({e.name for o in parsed.client.overrides for e in o.env}),
    }


def _widened(have: policy.FederationPolicySpec, want: Mapping[str, Any]) -> dict[str, Any]:
    """`have` extended so it also allows what `want` (grant_namespace's arguments) does:
    lists joined, switches on when either is, resource caps the larger of the two."""
    names = {
        "image_prefixes": "allowed_image_prefixes",
        "data_claims": "allowed_data_claims",
        "advertise_domains": "allowed_advertise_domains",
        "writable_data_mount": "allow_writable_data_mount",
        "host_path_store": "allow_host_path_store",
        "app_path_prefixes": "allowed_app_path_prefixes",
    }
    extra = policy.FederationPolicySpec(**{names.get(k, k): v for k, v in want.items()})
    out: dict[str, Any] = {}
    for name in policy.FederationPolicySpec.model_fields:
        old, new = getattr(have, name), getattr(extra, name)
        if isinstance(old, list):
            out[name] = sorted({*old, *new})
        elif isinstance(old, bool):
            out[name] = old or new
        elif isinstance(old, dict):
            caps = dict(old)
            for k, v in new.items():
                if k not in caps or policy.parse_quantity(v) > policy.parse_quantity(caps[k]):
                    caps[k] = v
            out[name] = caps
        else:
            out[name] = old  # the caps on clusters and rounds stay the admin's
    return out


def render_chart(values: Mapping[str, str], files: Mapping[str, str] | None = None) -> list[Obj]:
    """The chart's objects as `helm template` renders them with `values` (`--set-string`) and
    `files` (`--set-file`, for multi-line values)."""
    helm = helm_binary()
    if helm is None:
        raise FederationError("helm is needed to render the chart: run `make setup`")
    cmd = [helm, "template", "ocm-fl", str(CHART), "--namespace", constants.HUB_NAMESPACE]
    for key, value in values.items():
        cmd += ["--set-string", f"{key}={value}"]
    for key, path in (files or {}).items():
        cmd += ["--set-file", f"{key}={path}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise FederationError(f"helm template failed: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def addon_objects(docs: Sequence[Obj]) -> list[Obj]:
    """What OCM needs of the chart to run the addon on the clusters: the
    ClusterManagementAddOn, AddOnTemplate and AddOnDeploymentConfig, and the hub RBAC of the
    addon agents (the ClusterRoleBindings naming their group, the ClusterRoles they bind, and
    the one the signer binds in each cluster namespace)."""
    bindings = [
        d
        for d in docs
        if d["kind"] == "ClusterRoleBinding"
        and any(s.get("name") == ADDON_AGENTS_GROUP for s in d.get("subjects") or [])
    ]
    # ... and the CSR-outcome reader the signer binds per cluster namespace.
    roles = {b["roleRef"]["name"] for b in bindings} | {csroutcome.READER_ROLE}
    return [
        d
        for d in docs
        if (d["kind"] in ADDON_PATHS and d["kind"] not in ("ClusterRole", "ClusterRoleBinding"))
        or (d["kind"] == "ClusterRole" and d["metadata"]["name"] in roles)
    ] + bindings


def install_addon(hub: Kube, aggregator_address: str, hub_ca_pem: bytes, workdir: Path) -> None:
    """Apply the chart's addon objects (addon_objects) for agents that dial the aggregator at
    `aggregator_address` and trust `hub_ca_pem` for it, as `helm install` would."""
    bundle = workdir / "hub-ca-bundle.pem"
    bundle.write_bytes(hub_ca_pem)
    docs = render_chart(
        {"aggregator.externalAddress": aggregator_address}, {"ca.bundle": str(bundle)}
    )
    for obj in addon_objects(docs):
        plural, namespaced = ADDON_PATHS[obj["kind"]]
        meta = obj["metadata"]
        base = f"/apis/{obj['apiVersion']}"
        if namespaced:
            base += f"/namespaces/{meta['namespace']}"
        hub.apply(obj, f"{base}/{plural}/{meta['name']}")


def addon_hub_kubeconfig(plane: ControlPlane, cluster: str, dest: Path, timeout: float = 90) -> str:
    """The addon agent's hub kubeconfig on `cluster` as OCM's registration agent wrote it
    (Secret `constants.HUB_KUBECONFIG_SECRET` in the agent namespace there: what root on that
    cluster holds), copied into `dest` as the agent pod's Secret volume holds it; waits for
    it. Returns the kubeconfig's path."""
    spoke = Kube(plane.cluster_kubeconfigs[cluster])
    path = (
        f"/api/v1/namespaces/{constants.AGENT_NAMESPACE}/secrets/{constants.HUB_KUBECONFIG_SECRET}"
    )
    try:
        secret = wait_for(
            lambda: (spoke.get(path) or {}).get("data", {}).get("tls.crt") and spoke.get(path),
            timeout,
            f"OCM's registration agent to write {path} on {cluster}",
            error=FederationError,
        )
    finally:
        spoke.close()
    dest.mkdir(parents=True, exist_ok=True)
    for key, value in secret["data"].items():
        (dest / key).write_bytes(base64.b64decode(value))
        (dest / key).chmod(0o600)
    return str(dest / "kubeconfig")


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
    """`clusteradm clusterset bind global --namespace <namespace>`, so Placements there see
    every cluster."""
    clusteradm.clusterset_bind(hub, "global", namespace)


# --- processes -----------------------------------------------------------------------------
@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class LocalFederation:
    """The hub controller (+ aggregator + CSR signers) as a local process, and on every
    cluster the addon agent OCM deploys from the chart (see the module docstring)."""

    plane: ControlPlane
    workdir: Path
    clusters: list[str] = field(default_factory=list)
    procs: list[_Proc] = field(default_factory=list)
    # Clusters whose ManagedClusterAddOn `start` created: `stop` deletes them again (OCM then
    # removes their agents), so a shared plane does not keep the addon enabled where the next
    # test expects it absent.
    enabled: list[str] = field(default_factory=list)
    # The admin's root for HostPath model stores (the hub's $OCMFL_HOSTPATH_ROOT); default:
    # <workdir>/models.
    hostpath_root: Path | None = None
    # How long to wait for each agent: deployed by OCM, registered (its hub kubeconfig), its
    # certificate from the hub's signer, which runs once the hub has listed everything it
    # watches (longer on a hub with thousands of clusters: bench_fanout).
    agent_wait_s: float = 90.0
    # Extra env of the hub process from its next start (e.g. OCMFL_CERT_LIFETIME_SECONDS).
    hub_env: dict[str, str] = field(default_factory=dict)
    # Agent containers `kill` stopped, by cluster: `start_agent` waits for another one.
    _killed: dict[str, str] = field(default_factory=dict)
    # The hub's /metrics Authorization header, once read (metrics_headers).
    _metrics_headers: dict[str, str] = field(default_factory=dict)

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
        """The hub CA (the aggregator's server certificate): one per plane, like the chart's
        Secret, so agents deployed for an earlier federation on this plane still trust it."""
        return Path(self.plane.state_dir) / "ocm-fl" / "hub-ca"

    @property
    def agent_ca_dir(self) -> Path:
        """The agent CA (the hub's CSR signer issues agent identities from it), per plane."""
        return Path(self.plane.state_dir) / "ocm-fl" / "agent-ca"

    @property
    def hub_host(self) -> str:
        """Where the hub controller, aggregator and metrics listen."""
        return self.plane.host_address(0)

    @property
    def aggregator_address(self) -> str:
        return f"{self.hub_host}:{constants.AGGREGATOR_PORT}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.hub_host}:{constants.HUB_METRICS_PORT}/metrics"

    def metrics_headers(self) -> dict[str, str]:
        """What a scrape of `metrics_url` sends: the hub's bearer token, read once (the hub
        keeps it) so scrapes work while a drill stops the apiserver; {} before the hub made
        it, or while the apiserver does not answer."""
        if not self._metrics_headers:
            with (
                contextlib.closing(Kube(self.plane.hub_kubeconfig)) as hub,
                contextlib.suppress(KubeError),
            ):
                self._metrics_headers = metrics_headers(hub)
        return dict(self._metrics_headers)

    def agent_endpoints(self) -> dict[str, str]:
        """Where each cluster's FL client posts its metrics: the agent's Service (the
        controller's default endpoint)."""
        return dict.fromkeys(self.clusters, DEFAULT_AGENT_ENDPOINT)

    def agent_pod(self, cluster: str) -> Obj | None:
        """The cluster's current agent pod (not being deleted), or None."""
        spoke = Kube(self.plane.cluster_kubeconfigs[cluster])
        try:
            pods = spoke.list_objects(PODS_PATH, AGENT_APP_LABEL)
        finally:
            spoke.close()
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        live.sort(key=lambda p: p["metadata"]["creationTimestamp"])
        return live[-1] if live else None

    def agent_host(self, cluster: str) -> str:
        """The address of `cluster`'s agent pod (its local API and /healthz listen there)."""
        pod = self.agent_pod(cluster)
        ip = ((pod or {}).get("status") or {}).get("podIP")
        if not ip:
            raise FederationError(f"cluster {cluster} has no running agent pod")
        return str(ip)

    def agent_pid(self, cluster: str) -> int | None:
        """The process (group) of the agent container now running on `cluster`, or None."""
        for c in ((self.agent_pod(cluster) or {}).get("status") or {}).get(
            "containerStatuses"
        ) or []:
            if "running" in (c.get("state") or {}) and c.get("containerID", "").startswith(
                "local://"
            ):
                return int(c["containerID"].removeprefix("local://"))
        return None

    def agent_cert_dir(self, cluster: str) -> Path:
        """The agent's own key and certificate: its pod's memory volume on the local node
        (what root on that cluster reads)."""
        pod = self.agent_pod(cluster)
        if pod is None:
            raise FederationError(f"cluster {cluster} has no agent pod")
        (container,) = pod["spec"]["containers"]
        volume = next(
            m["name"]
            for m in container["volumeMounts"]
            if m["mountPath"] == constants.AGENT_CERT_DIR
        )
        meta = pod["metadata"]
        pod_dir = f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        return Path(self.plane.state_dir, "pods", cluster, pod_dir, "volumes", str(volume))

    def log_file(self, name: str) -> Path:
        """A component's log: `hub`, or `agent-<cluster>` (the current agent pod's container
        log on the local node)."""
        if name.startswith("agent-"):
            cluster = name.removeprefix("agent-")
            pod = self.agent_pod(cluster)
            if pod is None:
                raise FederationError(f"cluster {cluster} has no agent pod")
            meta = pod["metadata"]
            pod_dir = f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
            return Path(self.plane.state_dir) / "pods" / cluster / pod_dir / "logs" / "agent.log"
        return self.workdir / "logs" / f"{name}.log"

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Bring up the hub side, install and enable the addon; return once every cluster's
        agent, deployed and registered by OCM, holds its certificate from the hub's signer."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._ensure_cas()
        hub = Kube(self.plane.hub_kubeconfig)
        try:
            install_crd(hub)
            install_addon(
                hub,
                self.aggregator_address,
                (self.ca_dir / pki.CERT_FILE).read_bytes(),
                self.workdir,
            )
            for cluster in self.clusters:
                if clusteradm.addon_enable(
                    hub, constants.ADDON_NAME, cluster, constants.AGENT_NAMESPACE
                ):
                    self.enabled.append(cluster)
        finally:
            hub.close()
        try:
            # The hub's start (imports, informers) overlaps OCM deploying the agents.
            self._start_hub()
            for cluster in self.clusters:
                self._wait_agent(cluster)
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> LocalFederation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _ensure_cas(self) -> None:
        """What the chart's ca-init hook does: both CAs, made once and never overwritten."""
        for directory, name in (
            (self.ca_dir, "ocm-fl-local-hub-ca"),
            (self.agent_ca_dir, "ocm-fl-local-agent-ca"),
        ):
            if not (directory / pki.KEY_FILE).exists():
                pki.save_tls_dir(directory, pki.create_ca(name), None)

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

    def _hub_env(self) -> dict[str, str]:
        return {
            "KUBECONFIG": self.plane.hub_kubeconfig,
            constants.ENV_HOSTPATH_ROOT: str(self.hostpath_root),
            **self.hub_env,
        }

    def _start_signer(self) -> None:
        """The signer part (`ocm-fl-hub --role signer`, the chart's signer Deployment): the
        only process with the CA keys; it issues the aggregator's certificate into its Secret
        before the controller's aggregator looks for it."""
        env = {
            **self._hub_env(),
            constants.ENV_CA_DIR: str(self.ca_dir),
            constants.ENV_AGENT_CA_DIR: str(self.agent_ca_dir),
            constants.ENV_HUB_AGGREGATOR_ADDRESS: self.aggregator_address,
            constants.ENV_RUN_CSR_SIGNER: "true",
        }
        self._spawn_hub_part("signer", "signer", env, SIGNER_HEALTH_PORT, SIGNER_HEALTH_PORT, 90)

    def _spawn_hub_part(
        self, name: str, role: str, env: Mapping[str, str], health: int, ready: int, wait_s: float
    ) -> None:
        """`ocm-fl-hub --role ROLE` as process `name`, kopf's liveness on `health`; returns
        once it listens on `ready`."""
        argv = [
            str(VENV_BIN / "ocm-fl-hub"),
            f"--role={role}",
            "--liveness",
            f"http://{self.hub_host}:{health}/healthz",
        ]
        proc = self._spawn(name, argv, env)
        self._wait_port(proc, self.hub_host, ready, wait_s)

    def _start_hub(self) -> None:
        """The signer part, then the controller part (`ocm-fl-hub --role controller`, the
        chart's hub Deployment: operator and aggregator, with the agent CA's certificate and
        no CA key, as the chart mounts them), each unless it is running."""
        if not any(p.name == "signer" for p in self.procs):
            self._start_signer()
        if any(p.name == "hub" for p in self.procs):
            return
        agent_ca_public = self.agent_ca_dir.parent / "agent-ca-public"
        pki.write_atomic(
            agent_ca_public / pki.CERT_FILE, (self.agent_ca_dir / pki.CERT_FILE).read_bytes()
        )
        env = {
            **self._hub_env(),
            constants.ENV_AGENT_CA_DIR: str(agent_ca_public),
            constants.ENV_AGGREGATOR_LISTEN: self.aggregator_address,
            constants.ENV_METRICS_LISTEN: f"{self.hub_host}:{constants.HUB_METRICS_PORT}",
        }
        ports = (constants.HUB_HEALTH_PORT, constants.AGGREGATOR_PORT)
        self._spawn_hub_part("hub", "controller", env, *ports, 150)

    def agent_health(self, cluster: str) -> dict[str, Any] | None:
        """The agent's /healthz answer (hubConnected, pending, ...), None when it does not
        answer."""
        try:
            host = self.agent_host(cluster)
            got = httpx.get(f"http://{host}:{constants.AGENT_HEALTH_PORT}/healthz", timeout=2)
            answer: dict[str, Any] = got.json()
        except (FederationError, httpx.HTTPError, ValueError):
            return None
        return answer

    def _wait_agent(self, cluster: str, identity: bool = True) -> None:
        """Until `cluster`'s agent (another container than one `kill` stopped) answers, and
        with `identity` also holds its certificate from the hub's signer; FederationError
        naming what is missing."""

        def ready() -> bool:
            killed = self._killed.get(cluster)
            if killed is not None and str(self.agent_pid(cluster)) == killed:
                return False
            health = self.agent_health(cluster)
            return health is not None and (bool(health.get("certificateNotAfter")) or not identity)

        try:
            wait_for(ready, self.agent_wait_s, f"the agent on {cluster}", interval=0.3)
        except WaitTimeout:
            raise FederationError(self._agent_problem(cluster)) from None
        self._killed.pop(cluster, None)

    def _agent_problem(self, cluster: str) -> str:
        """Why `cluster`'s agent is not ready: its addon's conditions, its pod, its health."""
        hub = Kube(self.plane.hub_kubeconfig)
        try:
            mca = hub.get(f"{MCA_PATH.format(ns=cluster)}/{constants.ADDON_NAME}") or {}
        finally:
            hub.close()
        conds = [
            f"{c.get('type')}={c.get('status')} ({c.get('reason')}: {c.get('message')})"
            for c in (mca.get("status") or {}).get("conditions") or []
        ]
        pod = self.agent_pod(cluster)
        phase = ((pod or {}).get("status") or {}).get("phase", "no pod")
        log = ""
        with contextlib.suppress(FederationError, OSError):
            log = self.log_file(f"agent-{cluster}").read_text(errors="replace")[-2000:]
        return (
            f"the agent on {cluster} got no identity from the hub in {self.agent_wait_s:.0f} s: "
            f"addon conditions {conds or 'none'}; agent pod {phase}; health "
            f"{self.agent_health(cluster)}; log tail:\n{log}"
        )

    def stop(self) -> None:
        """Stop the hub process (SIGTERM, then SIGKILL) and disable the addon where `start`
        enabled it (OCM removes those agents)."""
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
        self._keep_agent_logs()
        if self.enabled:
            hub = Kube(self.plane.hub_kubeconfig)
            try:
                for cluster in self.enabled:
                    with contextlib.suppress(KubeError, OSError):
                        hub.delete(f"{MCA_PATH.format(ns=cluster)}/{constants.ADDON_NAME}")
            finally:
                hub.close()
            self.enabled.clear()

    def _keep_agent_logs(self) -> None:
        """Copy every agent pod's log of this plane to workdir/logs/agent-<cluster>.log (the
        plane's pod directories go with it)."""
        for cluster in self.clusters:
            pods = Path(self.plane.state_dir, "pods", cluster)
            logs = sorted(pods.glob(f"{constants.AGENT_NAMESPACE}_*/logs/agent.log"))
            if logs:
                out = self.workdir / "logs" / f"agent-{cluster}.log"
                out.parent.mkdir(parents=True, exist_ok=True)
                with out.open("ab") as fh:
                    for log in logs:
                        with contextlib.suppress(OSError):
                            fh.write(f"--- {log.parent.parent.name}\n".encode() + log.read_bytes())

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to a component ("hub": its process group, forgotten once it has exited;
        "agent-<cluster>": the agent container's, which the node restarts as kubelet would):
        fault drills, a crash rather than a shutdown."""
        if name.startswith("agent-"):
            cluster = name.removeprefix("agent-")
            pid = self.agent_pid(cluster)
            if pid is None:
                raise FederationError(f"cluster {cluster} has no running agent container")
            self._killed[cluster] = str(pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            return
        [proc] = [p for p in self.procs if p.name == name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, sig)
        proc.popen.wait(30)
        self.procs.remove(proc)

    def replace_agent(self, cluster: str) -> None:
        """Delete `cluster`'s agent pod and wait for the one its Deployment makes instead
        (fresh volumes: a new key and a new certificate)."""
        pod = self.agent_pod(cluster)
        if pod is not None:
            self._killed[cluster] = str(self.agent_pid(cluster))
            spoke = Kube(self.plane.cluster_kubeconfigs[cluster])
            try:
                spoke.delete(f"{PODS_PATH}/{pod['metadata']['name']}")
            finally:
                spoke.close()
            wait_for(
                lambda: (
                    (self.agent_pod(cluster) or {}).get("metadata", {}).get("uid")
                    != pod["metadata"]["uid"]
                ),
                60,
                f"a new agent pod on {cluster}",
                error=FederationError,
            )
        self._wait_agent(cluster)

    def start_hub(self) -> None:
        """Start whichever of the hub's two processes is not running, e.g. after `kill("hub")`
        (the controller) or `kill("signer")`; returns once the aggregator listens."""
        self._start_hub()

    def start_agent(self, cluster: str) -> None:
        """Wait for `cluster`'s agent to be back (its container restarted by the node after a
        `kill`, with the pod's volumes: its key, certificate and unsent reports) and
        answering; it reconnects to the hub by itself once the hub is there."""
        self._wait_agent(cluster, identity=False)

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


def inert_fl_body(namespace: str, claim: str, name: str = "digits") -> dict[str, Any]:
    """A FederatedLearning on the clusters that carry the data claim `claim`, whose clients
    never run (an image no node has) and whose server never starts (minAvailableClients out
    of reach): for tests about what the hub does with it (works, reports, identities)."""
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "server": {
                "rounds": 1,
                "minAvailableClients": 9,
                "app": {"path": f"{constants.APPS_DIR}/digits"},
            },
            "client": {
                "image": "example.invalid/not-run:0",
                "dataClaim": claim,
                "placement": claim_placement(claim),
            },
        },
    }


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
        widened = policy.FederationPolicySpec(**_widened(have, grant_for(body)))
        apply_policy(hub, namespace, widened.model_dump(by_alias=True, exclude_none=True))
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
