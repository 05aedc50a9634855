"""Desired ManifestWorks: one per cluster that has data, in the hub namespace `<cluster>`.

Each work carries a Namespace (Pod Security level `restricted` enforced), its LimitRange and
ResourceQuota from the namespace policy's per-pod caps (desired.limits), a ServiceAccount, a
ConfigMap with the client's run config, the federation's local-API token
Secret (`constants.CLIENT_TOKEN_SECRET`: the agent takes metrics posts for this federation only
with it), the client Job, and the data volume: a PersistentVolume for the cluster's claimed data
path, pre-bound to a claim in the client namespace (a pod in a `restricted` namespace may not
name a hostPath itself), mounted read-only unless spec.client.dataMount.readOnly is false.
No key or certificate travels in a work: the cluster's agent makes the client's Fleet and
SuperNode keys there and gets the certificate from the hub's Fleet signer.
Per-cluster overrides (by cluster name or ManagedCluster labels; later entries win) change env,
resources and run config. Status feedback rules bring the Job's counters back to the hub.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from hub_controller.api import (
    ClientSpec,
    FederatedLearningSpec,
    FLRef,
    LabelSelector,
    Quantity,
    Resources,
    RunConfigValue,
    SelectorOperator,
)
from hub_controller.membership import ClusterResolution
from hub_controller.operator.desired import limits, security
from ocmfl import constants
from ocmfl.kube import Encoded
from ocmfl.names import cluster_side_name
from ocmfl.privacy import ClusterRequirement, DpSettings, client_privacy

WORK_API_VERSION: Final = f"{constants.WORK_GROUP}/v1"
COMPONENT: Final = "client"
CLIENT_JOB_PREFIX: Final = "fl-client"
CONFIG_MAP_NAME: Final = "fl-client-config"
CONFIG_DIR: Final = "/etc/ocm-fl"
RUN_CONFIG_FILE: Final = "run-config.json"
SERVICE_ACCOUNT: Final = "fl-client"
CLIENT_COMMAND: Final = "ocm-fl-client"
# The client's Fleet identity: a Secret the cluster's agent writes in the client namespace
# (agent_addon.fleet_identity: tls.crt/key, ca.crt, node.key, keys made on the cluster). The
# pod starts once it exists; the work itself carries no key.
# The most one ManifestWork may weigh (JSON): a resource gets one per selected cluster in hub
# etcd, so its spec must not multiply into gigabytes. A work is ~10 KiB with the CA bundle.
MAX_WORK_BYTES: Final = 256 * 1024
TLS_DIR: Final = "/var/run/ocm-fl/tls"
STATE_DIR: Final = "/var/lib/ocm-fl-client"
CLIENT_TOKEN_FILE: Final = f"{constants.CLIENT_TOKEN_DIR}/{constants.CLIENT_TOKEN_KEY}"
# Where the client posts local metrics: the addon agent's Service in its namespace.
DEFAULT_AGENT_ENDPOINT: Final = (
    f"http://{constants.ADDON_NAME}-agent.{constants.AGENT_NAMESPACE}.svc:"
    f"{constants.AGENT_LOCAL_PORT}"
)
# Feedback values read back from the client Job (names used by status.py).
FEEDBACK_ACTIVE: Final = "active"
FEEDBACK_SUCCEEDED: Final = "succeeded"
FEEDBACK_FAILED: Final = "failed"
# The data volume's nominal size: a pre-bound hostPath volume is not provisioned, but a PV and
# its claim must state a capacity.
DATA_CAPACITY: Final = "1Gi"
# Hash of the work's spec, so an unchanged work is not re-applied on every reconcile.
SPEC_HASH_ANNOTATION: Final = f"{constants.LABEL_PREFIX}/spec-hash"


def _cluster_side_name(ref: FLRef) -> str:
    return cluster_side_name(ref.namespace, ref.name)


def work_name(ref: FLRef) -> str:
    """Name of the resource's ManifestWork in every cluster namespace."""
    return _cluster_side_name(ref)


def client_namespace(ref: FLRef) -> str:
    """Namespace on the managed cluster where the client runs."""
    return _cluster_side_name(ref)


def matches_selector(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels AND every matchExpression)."""
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    for expr in selector.match_expressions:
        present = expr.key in labels
        if expr.operator == SelectorOperator.IN:
            ok = present and labels[expr.key] in expr.values
        elif expr.operator == SelectorOperator.NOT_IN:
            ok = not present or labels[expr.key] not in expr.values
        elif expr.operator == SelectorOperator.EXISTS:
            ok = present
        else:
            ok = not present
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class EffectiveClient:
    """Client settings for one cluster after overrides."""

    env: dict[str, str] = field(default_factory=dict)
    resources: Resources | None = None
    run_config: dict[str, RunConfigValue] = field(default_factory=dict)


def effective_client(
    client: ClientSpec, cluster: str, labels: Mapping[str, str]
) -> EffectiveClient:
    """Apply matching overrides in order: env and run config merge by key, resources replace."""
    env: dict[str, str] = {}
    resources = client.resources
    run_config = dict(client.run_config)
    for override in client.overrides:
        if override.cluster_name is not None:
            matched = override.cluster_name == cluster
        else:
            matched = override.cluster_selector is not None and matches_selector(
                override.cluster_selector, labels
            )
        if not matched:
            continue
        env.update({e.name: e.value for e in override.env})
        if override.resources is not None:
            resources = override.resources
        run_config.update(override.run_config)
    return EffectiveClient(env=env, resources=resources, run_config=run_config)


def client_args(
    spec: FederatedLearningSpec,
    cluster: str,
    server_address: str,
    server_name: str,
    requirement: ClusterRequirement | None = None,
) -> list[str]:
    """Arguments for `ocm-fl-client` (workloads.client_launcher).

    Expected flags:
      --server HOST:PORT     the hub server's Fleet gateway (mTLS)
      --server-name NAME     the DNS name on the gateway's certificate
      --root-certificates, --client-certfile, --client-keyfile, --auth-key
                             the Fleet CA, this cluster's Fleet identity and SuperNode key
                             (TLS_DIR: the identity Secret the cluster's agent writes)
      --cluster NAME         this managed cluster's name (also in OCMFL_CLUSTER_NAME)
      --data-dir PATH        the mounted data directory (also in OCMFL_DATA_DIR)
      --run-config FILE      JSON object of this cluster's values, given to the ClientApp as
                             node config (spec.client.runConfig + matching overrides)
      (no --port: the SuperNode's local API keeps its default 9094 on the pod's own loopback)
      --install-dependencies Flower installs the app's dependencies (spec.server.app)
      --privacy JSON         what this cluster's ClientApp worker enforces (ocmfl.privacy:
                             spec.privacy merged with the cluster's privacy ClusterClaim)
    The agent endpoint, FL name/namespace/uid come as env vars (ocmfl.constants.ENV_*).
    """
    app = spec.server.app
    extra = ["--install-dependencies"] if app is not None and app.install_dependencies else []
    dp = spec.privacy.differential_privacy if spec.privacy is not None else None
    if dp is not None or requirement is not None:
        settings = None if dp is None else DpSettings.from_spec(dp.model_dump(by_alias=True))
        extra += ["--privacy", client_privacy(cluster, settings, requirement).to_json()]
    return [
        *extra,
        "--server",
        server_address,
        "--server-name",
        server_name,
        "--root-certificates",
        f"{TLS_DIR}/ca.crt",
        "--client-certfile",
        f"{TLS_DIR}/tls.crt",
        "--client-keyfile",
        f"{TLS_DIR}/tls.key",
        "--auth-key",
        f"{TLS_DIR}/node.key",
        "--state-dir",
        STATE_DIR,
        # The SuperNode keeps its default ClientAppIo port: it is the pod's own loopback.
        "--cluster",
        cluster,
        "--data-dir",
        spec.client.data_mount.mount_path,
        "--run-config",
        f"{CONFIG_DIR}/{RUN_CONFIG_FILE}",
    ]


def client_env(
    ref: FLRef,
    spec: FederatedLearningSpec,
    cluster: str,
    agent_endpoint: str,
    extra: Mapping[str, str],
    with_token: bool = False,
) -> list[dict[str, str]]:
    """Env of the client container: our variables, then override env (which wins)."""
    env = {
        constants.ENV_CLUSTER_NAME: cluster,
        constants.ENV_DATA_DIR: spec.client.data_mount.mount_path,
        constants.ENV_AGENT_ENDPOINT: agent_endpoint,
        constants.ENV_FL_NAME: ref.name,
        constants.ENV_FL_NAMESPACE: ref.namespace,
        constants.ENV_FL_UID: ref.uid,
    }
    if with_token:
        env[constants.ENV_CLIENT_TOKEN_FILE] = CLIENT_TOKEN_FILE
    env.update(extra)
    return [{"name": k, "value": v} for k, v in env.items()]


def data_volume_names(ref: FLRef, data_path: str) -> tuple[str, str]:
    """(PersistentVolume, PersistentVolumeClaim) names for a cluster's data path. The PV is
    cluster-scoped, so it carries the client namespace (unique per resource); both carry a
    digest of the path because a PV's source and a claim's volumeName cannot change."""
    digest = hashlib.sha256(data_path.encode()).hexdigest()[:8]
    return f"{client_namespace(ref)}-data-{digest}", f"data-{digest}"


def _data_volume(
    ref: FLRef, spec: FederatedLearningSpec, data_path: str, labels: dict[str, str]
) -> list[dict[str, Any]]:
    """The PV (hostPath = the claimed data directory, reserved for our claim) and the claim
    bound to it by name: no provisioner or storage class is involved."""
    pv_name, pvc_name = data_volume_names(ref, data_path)
    namespace = client_namespace(ref)
    modes = ["ReadOnlyMany"] if spec.client.data_mount.read_only else ["ReadWriteOnce"]
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "labels": labels},
        "spec": {
            "capacity": {"storage": DATA_CAPACITY},
            "accessModes": modes,
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "volumeMode": "Filesystem",
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": namespace, "name": pvc_name},
            "hostPath": {"path": data_path, "type": "Directory"},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": pvc_name, "namespace": namespace, "labels": labels},
        "spec": {
            "accessModes": modes,
            "storageClassName": "",
            "volumeMode": "Filesystem",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": DATA_CAPACITY}},
        },
    }
    return [pv, pvc]


def _client_job(
    ref: FLRef,
    spec: FederatedLearningSpec,
    resolution: ClusterResolution,
    server_address: str,
    server_name: str,
    agent_endpoint: str,
    effective: EffectiveClient,
    labels: dict[str, str],
    with_token: bool = False,
) -> dict[str, Any]:
    assert resolution.data_path is not None
    mount = spec.client.data_mount
    container: dict[str, Any] = {
        "name": "client",
        "image": spec.client.image,
        "command": [CLIENT_COMMAND],
        "args": client_args(spec, resolution.name, server_address, server_name, resolution.privacy),
        "env": client_env(
            ref, spec, resolution.name, agent_endpoint, effective.env, with_token=with_token
        ),
        "volumeMounts": [
            {"name": "data", "mountPath": mount.mount_path, "readOnly": mount.read_only},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
            {"name": "state", "mountPath": STATE_DIR},
        ],
    }
    if effective.resources is not None and effective.resources.to_k8s():
        container["resources"] = effective.resources.to_k8s()
    template_meta: dict[str, Any] = {"labels": labels}
    pod_spec: dict[str, Any] = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [
            {
                "name": "data",
                "persistentVolumeClaim": {
                    "claimName": data_volume_names(ref, resolution.data_path)[1],
                    "readOnly": mount.read_only,
                },
            },
            {"name": "config", "configMap": {"name": CONFIG_MAP_NAME}},
            {
                "name": "tls",
                "secret": {
                    "secretName": constants.CLIENT_IDENTITY_SECRET,
                    "defaultMode": 0o400,
                },
            },
            {"name": "state", "emptyDir": {}},
        ],
    }
    if with_token:
        container["volumeMounts"].append(
            {"name": "client-token", "mountPath": constants.CLIENT_TOKEN_DIR, "readOnly": True}
        )
        pod_spec["volumes"].append(
            {
                "name": "client-token",
                "secret": {"secretName": constants.CLIENT_TOKEN_SECRET, "defaultMode": 0o440},
            }
        )
    spec.client.pod.apply(pod_spec, template_meta)
    security.harden(pod_spec)
    # Job pod templates are immutable: a changed template gets a new Job name, and the work
    # agent deletes the old Job when it leaves the manifest list.
    template = {"metadata": template_meta, "spec": pod_spec}
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:8]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{CLIENT_JOB_PREFIX}-{digest}",
            "namespace": client_namespace(ref),
            "labels": labels,
        },
        "spec": {
            "backoffLimit": 3,
            "template": template,
        },
    }


def desired_work(
    ref: FLRef,
    spec: FederatedLearningSpec,
    resolution: ClusterResolution,
    server_address: str,
    agent_endpoint: str = DEFAULT_AGENT_ENDPOINT,
    *,
    server_name: str,
    client_token: str | None = None,
    caps: Mapping[str, Quantity] | None = None,
) -> dict[str, Any]:
    """The ManifestWork for one cluster that has data.

    `server_name` is the DNS name on the gateway certificate; `client_token` the federation's
    token for the agent's local API (none: the agent refuses this client's metrics posts);
    `caps` the namespace policy's maxPodResources, which the client namespace's LimitRange
    and ResourceQuota hold it to on the cluster (desired.limits). The work carries no key:
    the client's Fleet identity comes from the cluster's agent (TLS_DIR).
    """
    if resolution.data_path is None:
        raise ValueError(f"cluster {resolution.name} has no data path: it gets no work")
    labels = {**ref.labels(COMPONENT), constants.LABEL_CLUSTER: resolution.name}
    effective = effective_client(spec.client, resolution.name, resolution.labels)
    namespace = client_namespace(ref)
    job = _client_job(
        ref,
        spec,
        resolution,
        server_address,
        server_name,
        agent_endpoint,
        effective,
        labels,
        with_token=client_token is not None,
    )
    client_limits = limits.client_limits(caps or {}, namespace, labels)
    manifests = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {**labels, **security.PSA_LABELS}},
        },
        *client_limits,
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": namespace, "labels": labels},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP_NAME, "namespace": namespace, "labels": labels},
            "data": {RUN_CONFIG_FILE: json.dumps(effective.run_config, sort_keys=True)},
        },
        *_data_volume(ref, spec, resolution.data_path, labels),
        job,
    ]
    if client_token is not None:
        manifests.insert(
            -1,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {
                    "name": constants.CLIENT_TOKEN_SECRET,
                    "namespace": namespace,
                    "labels": labels,
                },
                "data": {
                    constants.CLIENT_TOKEN_KEY: base64.b64encode(client_token.encode()).decode()
                },
            },
        )
    work: dict[str, Any] = {
        "apiVersion": WORK_API_VERSION,
        "kind": "ManifestWork",
        "metadata": {"name": work_name(ref), "namespace": resolution.name, "labels": labels},
        "spec": {
            "workload": {"manifests": manifests},
            "deleteOption": {"propagationPolicy": "Foreground"},
            "manifestConfigs": [
                {
                    "resourceIdentifier": {
                        "group": "batch",
                        "resource": "jobs",
                        "namespace": namespace,
                        "name": job["metadata"]["name"],
                    },
                    # A Job's selector is defaulted by the API and its template is immutable:
                    # the work agent's default Update would resend the manifest without the
                    # selector and be refused on every resync. Server-side apply only sends
                    # the fields we own (a changed template gets a new Job name anyway).
                    "updateStrategy": {"type": "ServerSideApply"},
                    "feedbackRules": [
                        {"type": "WellKnownStatus"},
                        {
                            "type": "JSONPaths",
                            "jsonPaths": [
                                {"name": FEEDBACK_ACTIVE, "path": ".status.active"},
                                {"name": FEEDBACK_SUCCEEDED, "path": ".status.succeeded"},
                                {"name": FEEDBACK_FAILED, "path": ".status.failed"},
                            ],
                        },
                    ],
                },
                # The apiserver stores quantities in canonical form ("0.5" as "500m"): the
                # work agent's default Update would see a change on every resync. A
                # server-side apply of the same values is a no-op.
                *(
                    {
                        "resourceIdentifier": {
                            "group": "",
                            "resource": limits.RESOURCES[obj["kind"]],
                            "namespace": namespace,
                            "name": obj["metadata"]["name"],
                        },
                        "updateStrategy": {"type": "ServerSideApply"},
                    }
                    for obj in client_limits
                ),
            ],
        },
    }
    # One sorted dump of the spec serves both the hash and the request body (before: the
    # hash's dump, then the whole work again for every request).
    spec_text = json.dumps(work["spec"], sort_keys=True)
    work["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: _digest(labels, spec_text)}
    head = json.dumps({k: work[k] for k in ("apiVersion", "kind", "metadata")})
    return Encoded(work, f'{head[:-1]}, "spec": {spec_text}}}')


def spec_hash(work: Mapping[str, Any]) -> str:
    """Digest of a work's spec and labels (what the annotation SPEC_HASH_ANNOTATION holds)."""
    labels = (work.get("metadata") or {}).get("labels")
    return _digest(labels, json.dumps(work.get("spec"), sort_keys=True))


def _digest(labels: Any, spec_text: str) -> str:
    """sha256 of json.dumps({"labels": labels, "spec": spec}, sort_keys=True), given the
    spec's own sorted dump (the text is that dump's: keys in order, default separators)."""
    text = f'{{"labels": {json.dumps(labels, sort_keys=True)}, "spec": {spec_text}}}'
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stamped_hash(work: Mapping[str, Any]) -> str:
    """The hash `desired_work` put on the work (SPEC_HASH_ANNOTATION), else computed."""
    stamped = ((work.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
    return str(stamped) if stamped else spec_hash(work)


def desired_works(
    ref: FLRef,
    spec: FederatedLearningSpec,
    resolutions: Iterable[ClusterResolution],
    server_address: str,
    agent_endpoints: Mapping[str, str] | None = None,
    *,
    server_name: str,
    client_token: str | None = None,
    caps: Mapping[str, Quantity] | None = None,
) -> dict[str, dict[str, Any]]:
    """Works keyed by cluster name, for the clusters that have data.

    `agent_endpoints` overrides where
    a cluster's client finds its agent (default: the agent Service, DEFAULT_AGENT_ENDPOINT).
    """
    return dict(
        WorkCache().each(
            None,
            ref,
            spec,
            resolutions,
            server_address,
            agent_endpoints,
            server_name=server_name,
            client_token=client_token,
            caps=caps,
        )
    )


class WorkCache:
    """The desired work of each cluster, built again only when its inputs change (the spec
    generation, the cluster's data path and labels, the server address and name, its agent
    endpoint, the token): one cluster joining at N = 3,500 builds one work, not 3,500."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def each(
        self,
        generation: int | None,
        ref: FLRef,
        spec: FederatedLearningSpec,
        resolutions: Iterable[ClusterResolution],
        server_address: str,
        agent_endpoints: Mapping[str, str] | None = None,
        *,
        server_name: str,
        client_token: str | None = None,
        caps: Mapping[str, Quantity] | None = None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """What `desired_works` returns for the same arguments, one (cluster, work) at a time,
        each as soon as it is built (a caller can send the first while the rest are built);
        the cache is updated once all are. Works are not to be mutated."""
        endpoints = agent_endpoints or {}
        capped = limits.caps_key(caps or {})
        fresh: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        for r in resolutions:
            if not r.has_data:
                continue
            endpoint = endpoints.get(r.name, DEFAULT_AGENT_ENDPOINT)
            key = (
                ref.uid,
                generation,
                r.data_path,
                tuple(sorted(r.labels.items())),
                server_address,
                endpoint,
                server_name,
                client_token,
                capped,
            )
            hit = self._items.get(r.name)
            if hit is not None and hit[0] == key:
                fresh[r.name] = hit
                yield r.name, hit[1]
                continue
            work = desired_work(
                ref,
                spec,
                r,
                server_address,
                endpoint,
                server_name=server_name,
                client_token=client_token,
                caps=caps,
            )
            fresh[r.name] = (key, work)
            yield r.name, work
        self._items = fresh


def works_to_delete(
    existing: Iterable[tuple[str, str]], desired: Mapping[str, Mapping[str, Any]]
) -> list[tuple[str, str]]:
    """(namespace, name) of existing works that are not desired: clusters that left."""
    wanted = {(w["metadata"]["namespace"], w["metadata"]["name"]) for w in desired.values()}
    return sorted(set(existing) - wanted)
