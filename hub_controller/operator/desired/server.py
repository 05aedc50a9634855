"""Desired hub-side server objects: the server Job, its LoadBalancer Service, its model PVC.

All live in the resource's namespace, carry the owner labels and an ownerReference. The Service
exists from the start (clusters need its address); the Job is started only once enough
clusters are ready (gang admission, decided by the status fold, operator/fold.py).
"""

from __future__ import annotations

import json
from typing import Any, Final

from hub_controller import credentials_layout
from hub_controller.api import DEFAULT_MODEL_CLAIM_SIZE, FederatedLearningSpec, FLRef
from hub_controller.credentials_layout import SERVER_COMPONENT, server_name
from hub_controller.operator.desired import security
from ocmfl import constants
from ocmfl.names import hub_side_name

COMPONENT: Final = SERVER_COMPONENT
SERVER_COMMAND: Final = "ocm-fl-server"
MODEL_DIR: Final = "/var/lib/ocm-fl/models"
STATE_DIR: Final = "/var/lib/ocm-fl/state"  # FLWR_HOME, logs, nginx run dir (emptyDir)
# SuperLink database and node map, on the model store's volume so that they outlive the pod:
# a replacement pod keeps the SuperNodes' node ids (they reconnect on their own) and stops
# the killed pod's run before it submits the resumed one.
PERSIST_DIR: Final = f"{MODEL_DIR}/.ocm-fl-server"
TLS_DIR: Final = "/var/run/ocm-fl/tls"  # credentials_layout.SERVER_TLS
NODE_KEYS_DIR: Final = "/var/run/ocm-fl/node-keys"  # <cluster>.pub
FLEET_PORT_NAME: Final = "fleet"
# A server pod that dies (SIGKILL, OOM, node loss) is replaced this many times; each new pod
# resumes from the model store's last checkpoint. The launcher's own verdict (exit 1: training
# failed, bad settings) fails the Job at once (SERVER_FAILURE_POLICY), so only crashes retry.
SERVER_BACKOFF_LIMIT: Final = 3


def hostpath_store_dir(root: str, ref: FLRef) -> str:
    """A HostPath store on the hub node: `<root>/<namespace>/<name>-<uid>`, one directory per
    resource under the admin's root (a re-created resource gets a new one; names and uids
    are DNS labels and UUIDs, so no part can climb out of the root)."""
    return f"{root.rstrip('/')}/{ref.namespace}/{ref.name}-{ref.uid}"


def _store_owner_init(image: str) -> dict[str, Any]:
    """Init container that hands the HostPath store directory to the workload uid: the kubelet
    creates it root-owned, and hostPath volumes ignore fsGroup. It runs the platform's image
    (never the tenant's) as root with CAP_CHOWN only, and does nothing else."""
    uid = constants.WORKLOAD_UID
    return {
        "name": "store-owner",
        "image": image,
        "command": ["chown", f"{uid}:{uid}", MODEL_DIR],
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
            "readOnlyRootFilesystem": True,
        },
        "volumeMounts": [{"name": "models", "mountPath": MODEL_DIR}],
    }


def model_claim_name(ref: FLRef, spec: FederatedLearningSpec) -> str | None:
    """PVC the server writes the model to (None for HostPath and S3 storage)."""
    storage = spec.server.storage
    if not storage.is_pvc:
        return None
    return storage.claim or hub_side_name(ref.name, "model")


def storage_location(spec: FederatedLearningSpec) -> str:
    """What the server launcher gets as --storage: the mounted directory or s3://bucket/prefix."""
    s3 = spec.server.storage.s3
    return s3.uri() if spec.server.storage.is_s3 and s3 is not None else MODEL_DIR


def server_args(ref: FLRef, spec: FederatedLearningSpec) -> list[str]:
    """Arguments for `ocm-fl-server` (workloads.server_launcher, the Flower adapter).

    Expected flags:
      --app-dir PATH                the Flower app directory in the server image
      --run-config JSON             the run config (keys the app declares)
      --rounds N                    rounds to run
      --min-clients N               wait for this many connected clients, then start; also
                                    the successful results a round needs
      --storage DIR|s3://B/P        model store (checkpoints, manifest, final model)
      --init-model REF              optional starting model (inside the store, absolute, s3://)
      --install-dependencies        Flower installs the app's dependencies at run time
      --clients-ready-timeout SECS  give up (exit 1) when min clients do not connect in time
      --round-timeout SECS          per-round timeout
      --run-id NAMESPACE/NAME       label for logs
      --persist-dir DIR             SuperLink database + node map (on the store's volume;
                                    absent for S3 storage, whose volume is an emptyDir)
      --privacy JSON                spec.privacy.differentialPrivacy (run_strategy applies it)
      --secure-aggregation JSON     spec.privacy.secureAggregation (run_strategy runs SecAgg+)
    The launcher exits 0 when training completed, non-zero otherwise, and writes a JSON
    {"ok", "reason", "round", "path", "sha256", "metrics"} outcome to /dev/termination-log
    (read by `outcome_from_termination_message`).
    """
    server = spec.server
    if server.app is None:
        raise ValueError("spec.server.app is required")
    args = [
        "--app-dir",
        server.app.path,
        "--run-config",
        json.dumps(server.app.run_config, sort_keys=True),
        "--rounds",
        str(server.rounds),
        "--min-clients",
        str(server.min_available_clients),
        "--storage",
        storage_location(spec),
        "--clients-ready-timeout",
        str(server.timeouts.clients_ready_seconds),
        "--round-timeout",
        str(server.timeouts.round_seconds),
        "--run-id",
        f"{ref.namespace}/{ref.name}",
        # SuperLink on the pod's loopback; clusters reach it only through the mTLS gateway.
        "--state-dir",
        STATE_DIR,
        "--ssl-ca-certfile",
        f"{TLS_DIR}/{credentials_layout.CA}",
        "--ssl-certfile",
        f"{TLS_DIR}/{credentials_layout.SUPERLINK_CERT}",
        "--ssl-keyfile",
        f"{TLS_DIR}/{credentials_layout.SUPERLINK_KEY}",
        "--supernode-keys",
        NODE_KEYS_DIR,
        "--gateway-listen",
        f"$(POD_IP):{constants.FLEET_PROXY_PORT}",
        "--gateway-certfile",
        f"{TLS_DIR}/{credentials_layout.GATEWAY_CERT}",
        "--gateway-keyfile",
        f"{TLS_DIR}/{credentials_layout.GATEWAY_KEY}",
    ]
    if not server.storage.is_s3:
        args += ["--persist-dir", f"{PERSIST_DIR}/{ref.uid}"]
    if server.init_model:
        args += ["--init-model", server.init_model]
    if server.app.install_dependencies:
        args.append("--install-dependencies")
    if spec.privacy is not None and spec.privacy.differential_privacy is not None:
        dp = spec.privacy.differential_privacy.model_dump(mode="json", by_alias=True)
        args += ["--privacy", json.dumps(dp, sort_keys=True)]
    if spec.privacy is not None and spec.privacy.secure_aggregation is not None:
        secagg = spec.privacy.secure_aggregation.model_dump(mode="json", by_alias=True)
        args += ["--secure-aggregation", json.dumps(secagg, sort_keys=True)]
    return args


# Keys of spec.server.storage.s3.credentialsSecret the server gets, and whether each must exist.
S3_CREDENTIAL_KEYS: Final = (
    ("AWS_ACCESS_KEY_ID", False),
    ("AWS_SECRET_ACCESS_KEY", False),
    ("AWS_SESSION_TOKEN", True),
)


def storage_env(spec: FederatedLearningSpec) -> list[dict[str, Any]]:
    """Env giving the server its S3 endpoint, region and credentials. Only the AWS keys are
    taken from the credentials Secret, one by one: the Secret's other keys (LD_PRELOAD,
    OCMFL_STORAGE, ...) never become env."""
    s3 = spec.server.storage.s3
    if not spec.server.storage.is_s3 or s3 is None:
        return []
    env: list[dict[str, Any]] = []
    if s3.endpoint:
        env.append({"name": "AWS_ENDPOINT_URL_S3", "value": s3.endpoint})
    if s3.region:
        env.append({"name": "AWS_REGION", "value": s3.region})
    if s3.credentials_secret:
        env += [
            {
                "name": key,
                "valueFrom": {
                    "secretKeyRef": {
                        "name": s3.credentials_secret,
                        "key": key,
                        **({"optional": True} if optional else {}),
                    }
                },
            }
            for key, optional in S3_CREDENTIAL_KEYS
        ]
    return env


def _meta(ref: FLRef, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": ref.namespace,
        "labels": ref.labels(COMPONENT),
        "ownerReferences": [ref.owner_reference()],
    }


def _selector(ref: FLRef) -> dict[str, str]:
    return {constants.LABEL_OWNER_UID: ref.uid, constants.LABEL_COMPONENT: COMPONENT}


def desired_service(ref: FLRef) -> dict[str, Any]:
    """LoadBalancer Service exposing the server's Fleet port to the clusters."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(ref, server_name(ref)),
        "spec": {
            "type": "LoadBalancer",
            "selector": _selector(ref),
            "ports": [
                {
                    "name": FLEET_PORT_NAME,
                    "port": constants.FLEET_PROXY_PORT,
                    "targetPort": FLEET_PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def desired_model_claim(ref: FLRef, spec: FederatedLearningSpec) -> dict[str, Any] | None:
    """The PVC the controller creates (PVC storage without claimName), else None."""
    storage = spec.server.storage
    if not storage.is_pvc or storage.claim:
        return None
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(ref, hub_side_name(ref.name, "model")),
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": storage.size or DEFAULT_MODEL_CLAIM_SIZE}},
        },
    }


def server_failure_policy() -> dict[str, Any]:
    """The Job's podFailurePolicy: a disrupted pod (eviction, preemption, node drain: the
    DisruptionTarget condition) is replaced without counting; the launcher's failure verdict
    (exit SERVER_FAILED_EXIT, its reason in the termination message) fails the Job at once;
    any other exit (a kill, OOM, a crash) counts against SERVER_BACKOFF_LIMIT."""
    return {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": "server",
                    "operator": "In",
                    "values": [constants.SERVER_FAILED_EXIT],
                },
            },
        ]
    }


def desired_job(
    ref: FLRef,
    spec: FederatedLearningSpec,
    hostpath_root: str = constants.DEFAULT_HOSTPATH_ROOT,
) -> dict[str, Any]:
    """The server Job: runs the rounds and exits with the training outcome. A pod that dies
    without a verdict is replaced (up to SERVER_BACKOFF_LIMIT times) and resumes from the
    last checkpoint in the model store; the launcher's failure verdict is not retried.

    A HostPath store is `hostpath_store_dir(hostpath_root, ref)`; the pod runs under the
    restricted profile's settings (security.harden), apart from that hostPath volume."""
    server = spec.server
    labels = {**ref.labels(COMPONENT)}
    claim = model_claim_name(ref, spec)
    volume: dict[str, Any]
    if claim:
        volume = {"name": "models", "persistentVolumeClaim": {"claimName": claim}}
    elif server.storage.is_s3:
        volume = {"name": "models", "emptyDir": {}}  # models go to the bucket
    else:
        volume = {
            "name": "models",
            "hostPath": {
                "path": hostpath_store_dir(hostpath_root, ref),
                "type": "DirectoryOrCreate",
            },
        }
    extra_env = storage_env(spec)
    container: dict[str, Any] = {
        "name": "server",
        "image": server.image,
        "command": [SERVER_COMMAND],
        "args": server_args(ref, spec),
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": constants.ENV_FL_NAME, "value": ref.name},
            {"name": constants.ENV_FL_NAMESPACE, "value": ref.namespace},
            {"name": constants.ENV_FL_UID, "value": ref.uid},
            *extra_env,
        ],
        "ports": [{"name": FLEET_PORT_NAME, "containerPort": constants.FLEET_PROXY_PORT}],
        "volumeMounts": [
            {"name": "models", "mountPath": MODEL_DIR},
            {"name": "state", "mountPath": STATE_DIR},
            {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
            {"name": "node-keys", "mountPath": NODE_KEYS_DIR, "readOnly": True},
        ],
        "terminationMessagePolicy": "File",
    }
    if server.resources is not None and server.resources.to_k8s():
        container["resources"] = server.resources.to_k8s()
    template_meta: dict[str, Any] = {"labels": labels}
    pod_spec: dict[str, Any] = {"restartPolicy": "Never"}
    server.pod.apply(pod_spec, template_meta)
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = [
        volume,
        {"name": "state", "emptyDir": {}},
        {
            "name": "tls",
            "secret": {
                "secretName": credentials_layout.credentials_secret_name(server_name(ref)),
                "defaultMode": 0o400,
                "items": [{"key": k, "path": k} for k in credentials_layout.SERVER_TLS],
            },
        },
        {
            # Every shard of members' public keys, merged into one directory of
            # <cluster>.pub files (none optional: the pod waits until all exist).
            "name": "node-keys",
            "projected": {
                "sources": [
                    {
                        "secret": {
                            "name": credentials_layout.node_keys_secret_name(server_name(ref), i)
                        }
                    }
                    for i in range(credentials_layout.NODE_KEY_SHARDS)
                ]
            },
        },
    ]
    security.harden(pod_spec)
    if "hostPath" in volume:
        pod_spec["initContainers"] = [_store_owner_init(constants.WORKLOAD_IMAGE)]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(ref, server_name(ref)),
        "spec": {
            "backoffLimit": SERVER_BACKOFF_LIMIT,
            "podFailurePolicy": server_failure_policy(),
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def _advertised_host(address: str) -> tuple[str, bool]:
    """The host of a host:port address (brackets stripped) and whether it is an IP address."""
    host = address.rsplit(":", 1)[0].strip("[]")
    return host, host.replace(".", "").isdigit() or ":" in host


def gateway_names(ref: FLRef, address: str | None) -> credentials_layout.GatewayNames:
    """SANs of the Fleet gateway certificate: the Service's DNS names and the advertised host."""
    svc = server_name(ref)
    dns = [f"{svc}.{ref.namespace}.svc", f"{svc}.{ref.namespace}.svc.cluster.local"]
    ips: list[str] = []
    if address:
        host, is_ip = _advertised_host(address)
        if is_ip:
            ips.append(host)
        elif host not in dns:
            dns.append(host)
    return credentials_layout.GatewayNames(dns=tuple(dns), ips=tuple(ips))


def gateway_server_name(ref: FLRef, address: str) -> str:
    """The DNS name clients check on the gateway certificate (nginx matches DNS SANs only)."""
    host, is_ip = _advertised_host(address)
    return f"{server_name(ref)}.{ref.namespace}.svc" if is_ip else host


def model_location(
    ref: FLRef,
    spec: FederatedLearningSpec,
    path: str,
    hostpath_root: str = constants.DEFAULT_HOSTPATH_ROOT,
) -> str:
    """Where a model the server wrote at `path` (inside its container) lives for the admin:
    the host directory for HostPath storage, ``pvc://<claim>/<file>`` for a PVC."""
    if not path.startswith(MODEL_DIR):
        return path
    rel = path[len(MODEL_DIR) :].lstrip("/")
    claim = model_claim_name(ref, spec)
    if claim:
        return f"pvc://{claim}/{rel}"
    return f"{hostpath_store_dir(hostpath_root, ref)}/{rel}"
