"""Desired hub-side server objects: the server Job, its LoadBalancer Service, its model PVC.

All live in the resource's namespace, carry the owner labels and an ownerReference. The Service
exists from the start (clusters need its address); the Job is started only once enough
clusters are ready (gang admission, decided in status.py / operator.py).
"""

from __future__ import annotations

import json
from typing import Any, Final

from hub_controller.api import FederatedLearningSpec, FLRef, StorageType
from hub_controller.operator.desired import credentials
from hub_controller.operator.desired.works import safe_name
from ocmfl import constants

COMPONENT: Final = "server"
SERVER_COMMAND: Final = "ocm-fl-server"
MODEL_DIR: Final = "/var/lib/ocm-fl/models"
STATE_DIR: Final = "/var/lib/ocm-fl/state"  # SuperLink database, FLWR_HOME, nginx run dir
TLS_DIR: Final = "/var/run/ocm-fl/tls"  # credentials.server_tls_bundle
NODE_KEYS_DIR: Final = "/var/run/ocm-fl/node-keys"  # <cluster>.pub
FLEET_PORT_NAME: Final = "fleet"


def server_name(ref: FLRef) -> str:
    """Name of the server Job and Service."""
    return safe_name(ref.name, "server")


def model_claim_name(ref: FLRef, spec: FederatedLearningSpec) -> str | None:
    """PVC the server writes the model to (None for HostPath storage)."""
    storage = spec.server.storage
    if storage.type != StorageType.PVC:
        return None
    return storage.claim_name or safe_name(ref.name, "model")


def server_args(ref: FLRef, spec: FederatedLearningSpec) -> list[str]:
    """Arguments for `ocm-fl-server` (workloads.server_launcher).

    Expected flags:
      --rounds N                    rounds to run
      --min-clients N               wait for this many connected clients, then start
      --strategy NAME               fedavg | fedprox
      --strategy-params JSON        strategy parameters (proximalMu, fractionTrain, ...)
      --task NAME                   workload task, e.g. digits
      --model-dir PATH              checkpoints and the final model go here
      --init-model PATH|URI         optional pretrained start
      --clients-ready-timeout SECS  give up (exit 1) when min clients do not connect in time
      --round-timeout SECS          per-round timeout
      --run-id NAMESPACE/NAME       label for logs and the model store
    The launcher exits 0 when training completed, non-zero otherwise, and writes a JSON
    {"path", "round", "sha256", "metrics"} describing the final model to
    /dev/termination-log (read by `model_from_termination_message`).
    """
    server = spec.server
    params = server.strategy.params.model_dump(by_alias=True, exclude_none=True, mode="json")
    args = [
        "--rounds",
        str(server.rounds),
        "--min-clients",
        str(server.min_available_clients),
        "--strategy",
        server.strategy.name.value,
        "--strategy-params",
        json.dumps(params, sort_keys=True),
        "--task",
        server.task.value,
        "--model-dir",
        MODEL_DIR,
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
        f"{TLS_DIR}/{credentials.CA}",
        "--ssl-certfile",
        f"{TLS_DIR}/{credentials.SUPERLINK_CERT}",
        "--ssl-keyfile",
        f"{TLS_DIR}/{credentials.SUPERLINK_KEY}",
        "--supernode-keys",
        NODE_KEYS_DIR,
        "--gateway-listen",
        f"$(POD_IP):{constants.FLEET_PROXY_PORT}",
        "--gateway-certfile",
        f"{TLS_DIR}/{credentials.GATEWAY_CERT}",
        "--gateway-keyfile",
        f"{TLS_DIR}/{credentials.GATEWAY_KEY}",
    ]
    if server.init_model:
        args += ["--init-model", server.init_model]
    return args


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
    if storage.type != StorageType.PVC or storage.claim_name:
        return None
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(ref, safe_name(ref.name, "model")),
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": storage.size or "1Gi"}},
        },
    }


def desired_job(ref: FLRef, spec: FederatedLearningSpec) -> dict[str, Any]:
    """The server Job: runs the rounds and exits with the training outcome (no retries)."""
    server = spec.server
    labels = {**ref.labels(COMPONENT)}
    claim = model_claim_name(ref, spec)
    volume: dict[str, Any] = (
        {"name": "models", "persistentVolumeClaim": {"claimName": claim}}
        if claim
        else {
            "name": "models",
            "hostPath": {"path": server.storage.path, "type": "DirectoryOrCreate"},
        }
    )
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
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(ref, server_name(ref)),
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": [
                        volume,
                        {"name": "state", "emptyDir": {}},
                        {
                            "name": "tls",
                            "secret": {
                                "secretName": credentials.credentials_secret_name(server_name(ref)),
                                "defaultMode": 0o400,
                                "items": [
                                    {"key": k, "path": k}
                                    for k in (
                                        credentials.CA,
                                        credentials.SUPERLINK_CERT,
                                        credentials.SUPERLINK_KEY,
                                        credentials.GATEWAY_CERT,
                                        credentials.GATEWAY_KEY,
                                    )
                                ],
                            },
                        },
                        {
                            "name": "node-keys",
                            "secret": {
                                "secretName": credentials.node_keys_secret_name(server_name(ref))
                            },
                        },
                    ],
                },
            },
        },
    }


def _advertised_host(address: str) -> tuple[str, bool]:
    """The host of a host:port address (brackets stripped) and whether it is an IP address."""
    host = address.rsplit(":", 1)[0].strip("[]")
    return host, host.replace(".", "").isdigit() or ":" in host


def gateway_names(ref: FLRef, address: str | None) -> credentials.GatewayNames:
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
    return credentials.GatewayNames(dns=tuple(dns), ips=tuple(ips))


def gateway_server_name(ref: FLRef, address: str) -> str:
    """The DNS name clients check on the gateway certificate (nginx matches DNS SANs only)."""
    host, is_ip = _advertised_host(address)
    return f"{server_name(ref)}.{ref.namespace}.svc" if is_ip else host


def model_location(ref: FLRef, spec: FederatedLearningSpec, path: str) -> str:
    """Where a model the server wrote at `path` (inside its container) lives for the admin:
    the host directory for HostPath storage, ``pvc://<claim>/<file>`` for a PVC."""
    if not path.startswith(MODEL_DIR):
        return path
    rel = path[len(MODEL_DIR) :].lstrip("/")
    claim = model_claim_name(ref, spec)
    if claim:
        return f"pvc://{claim}/{rel}"
    return f"{spec.server.storage.path.rstrip('/')}/{rel}"
