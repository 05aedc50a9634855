"""The FederatedLearning custom resource as pydantic models.

The models ARE the API: the controller validates a resource with `FederatedLearningSpec`,
writes status with `FederatedLearningStatus`, and `hack.codegen.crdgen` turns them into the
CRD's structural schema. JSON names are camelCase (aliases); Python names are snake_case.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from ocmfl import constants, privacy
from ocmfl.reports import MAX_CLIENT_LOG

# A Kubernetes resource.Quantity ("500m", "2Gi", "1e3").
_QUANTITY = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+|[numkKMGTPE]i?)?$")
# host:port, where host is a DNS name, IPv4 address or bracketed IPv6 address.
_HOST_PORT = r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?):[0-9]{1,5}$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# Env a tenant may not set on the client: the platform's own variables (the launchers, the SDK
# and Flower read them), the dynamic loader's and interpreters' hooks (code injection), the TLS
# trust settings of Python and gRPC, and what the pod spec itself relies on (scratch HOME/TMPDIR).
# Also package installers' settings (an index of the tenant's choosing), OpenSSL's and glibc's
# tunables, proxies (a way out for the data), resolver overrides and shells' start-up files.
RESERVED_ENV_PREFIXES: Final = (
    "OCMFL_",
    "FLWR_",
    "LD_",
    "PYTHON",
    "GRPC_",
    "SSL_",
    "PIP_",
    "UV_",
    "OPENSSL_",
    "GLIBC_",
    "GCONV_",
    "MALLOC_",
)
RESERVED_ENV_SUFFIXES: Final = ("_PROXY",)
RESERVED_ENV_NAMES: Final = frozenset(
    {
        "HOME",
        "TMPDIR",
        "PATH",
        "POD_IP",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "HOSTALIASES",
        "RES_OPTIONS",
        "LOCALDOMAIN",
        "BASH_ENV",
        "ENV",
    }
)

# Bounds the CRD puts on every spec string, list and map that names no tighter one (hack.
# codegen.crdgen adds them), so one resource cannot multiply hub etcd usage through its works;
# past a bound the apiserver refuses the resource naming the field.
SPEC_MAX_STRING: Final = 1024
SPEC_MAX_ITEMS: Final = 64
SPEC_MAX_PROPERTIES: Final = 64

CONDITION_VALIDATED: Final = "Validated"
CONDITION_PLACEMENT_SATISFIED: Final = "PlacementSatisfied"
CONDITION_CLIENTS_READY: Final = "ClientsReady"
CONDITION_SERVER_READY: Final = "ServerReady"
CONDITION_TRAINING_COMPLETE: Final = "TrainingComplete"
CONDITION_TYPES: Final = (
    CONDITION_VALIDATED,
    CONDITION_PLACEMENT_SATISFIED,
    CONDITION_CLIENTS_READY,
    CONDITION_SERVER_READY,
    CONDITION_TRAINING_COMPLETE,
)


class _Model(BaseModel):
    """Closed object: unknown fields are errors (the CRD prunes them anyway)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", use_enum_values=False
    )


class _OpenModel(BaseModel):
    """Open object: fields we do not model are kept (x-kubernetes-preserve-unknown-fields)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


def defaulted(factory: Callable[[], Any], description: str) -> Any:
    """An object field made by `factory` when unset; the CRD default `{}` keeps it present in
    stored objects too (its fields' defaults apply there, and CEL rules can read it)."""
    return Field(
        default_factory=factory, json_schema_extra={"default": {}}, description=description
    )


# --- enums ---------------------------------------------------------------------------------
class Framework(StrEnum):
    """FL framework of the app, run by the platform's Flower adapter (launchers + SDK)."""

    FLOWER = "flower"


class StorageType(StrEnum):
    """Where models go. `PersistentVolumeClaim` and `S3Bucket` are the incumbent controller's
    spellings of `PVC` and `S3`."""

    HOST_PATH = "HostPath"
    PVC = "PVC"
    PERSISTENT_VOLUME_CLAIM = "PersistentVolumeClaim"
    S3 = "S3"
    S3_BUCKET = "S3Bucket"


class Phase(StrEnum):
    """Where the whole training stands."""

    PENDING = "Pending"
    WAITING = "Waiting"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"


TERMINAL_PHASES: Final = frozenset({Phase.COMPLETED, Phase.FAILED})


def run_finished(
    phase: str | None, observed_generation: int | None, generation: int | None
) -> bool:
    """The one rule for "the run ended": the phase is Completed or Failed, decided for the
    resource's current generation (not compared when either generation is unknown)."""
    if phase not in TERMINAL_PHASES:
        return False
    return generation is None or observed_generation is None or observed_generation == generation


class ClusterPhase(StrEnum):
    """Where one selected cluster stands."""

    PENDING = "Pending"  # work written, not yet applied by the cluster's work agent
    NO_DATA = "NoData"  # selected by the placement, but its data claim is missing or unusable
    APPLIED = "Applied"  # work applied on the cluster; client not (yet) running
    # The cluster refused to apply its work (e.g. its apiserver or admission rejected the
    # client Job): the reason holds the apply error; it stays so until the spec changes.
    BLOCKED = "Blocked"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    # It took part in this run and is no longer selected (its claim or label went, the
    # placement dropped it): its work is deleted; its last values stay on the row. Selected
    # again, it stays Left (with a work again) until it trains a round after it came back.
    LEFT = "Left"


class SelectorOperator(StrEnum):
    """Label/claim selector operator."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class ConditionStatus(StrEnum):
    """Condition status."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


# --- shared pieces -------------------------------------------------------------------------
Quantity = int | str


class Resources(_Model):
    """Container resource requests and limits (Kubernetes quantities)."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Minimum resources, e.g. {cpu: 500m, memory: 1Gi}."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="Maximum resources, e.g. {memory: 4Gi}."
    )

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, value: dict[str, Quantity]) -> dict[str, Quantity]:
        for key, qty in value.items():
            if isinstance(qty, str) and not _QUANTITY.match(qty):
                raise ValueError(f"{key}: {qty!r} is not a Kubernetes quantity (e.g. 500m, 2Gi)")
        return value

    def to_k8s(self) -> dict[str, dict[str, str]]:
        """Kubernetes `resources` object (quantities as strings, empty parts left out)."""
        out: dict[str, dict[str, str]] = {}
        if self.requests:
            out["requests"] = {k: str(v) for k, v in self.requests.items()}
        if self.limits:
            out["limits"] = {k: str(v) for k, v in self.limits.items()}
        return out


class SelectorRequirement(_Model):
    """One selector expression."""

    key: str = Field(min_length=1, description="Label or claim name.")
    operator: SelectorOperator = Field(description="How the key's value is matched.")
    values: list[str] = Field(
        default_factory=list, description="Values for In/NotIn; empty for Exists/DoesNotExist."
    )


class LabelSelector(_Model):
    """Kubernetes label selector (matchLabels AND matchExpressions)."""

    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels that must have exactly these values."
    )
    match_expressions: list[SelectorRequirement] = Field(
        default_factory=list, description="Expressions that must all hold."
    )


class ClaimSelector(_Model):
    """OCM ClusterClaim selector."""

    match_expressions: list[SelectorRequirement] = Field(
        default_factory=list, description="Expressions over ClusterClaim names and values."
    )


class ClusterSelector(_OpenModel):
    """OCM requiredClusterSelector: label, claim (and CEL, kept as-is) selectors, ANDed."""

    label_selector: LabelSelector | None = Field(
        default=None, description="Select clusters by ManagedCluster labels."
    )
    claim_selector: ClaimSelector | None = Field(
        default=None, description="Select clusters by their ClusterClaims."
    )


class Predicate(_OpenModel):
    """One OCM placement predicate."""

    required_cluster_selector: ClusterSelector | None = Field(
        default=None, description="Clusters must match this selector."
    )


class Toleration(_OpenModel):
    """A toleration (of OCM cluster taints in a placement, of node taints on a pod)."""

    key: str | None = Field(default=None, description="Taint key; empty with Exists: all.")
    operator: str | None = Field(
        default=None, pattern="^(Exists|Equal)$", description="Exists or Equal (default)."
    )
    value: str | None = Field(default=None, description="Taint value for Equal.")
    effect: str | None = Field(
        default=None, description="Taint effect to tolerate; empty: all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute (or NoSelect) taint is tolerated."
    )


class PlacementSpec(_OpenModel):
    """An embedded OCM PlacementSpec (cluster.open-cluster-management.io/v1beta1).

    The modelled fields are validated; other PlacementSpec fields (prioritizerPolicy,
    decisionStrategy, spreadPolicy, ...) are passed through to the Placement unchanged.
    """

    cluster_sets: list[str] = Field(
        default_factory=list,
        description="ManagedClusterSets to choose from (each bound to this namespace).",
    )
    number_of_clusters: int | None = Field(
        default=None, ge=1, description="How many clusters to choose; unset: all that match."
    )
    predicates: list[Predicate] = Field(
        default_factory=list, description="Cluster selectors; a cluster matching any is chosen."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Cluster taints the placement tolerates."
    )


class EnvVar(_Model):
    """An environment variable."""

    name: str = Field(pattern=_ENV_NAME, description="Variable name.")
    value: str = Field(default="", description="Variable value.")


class PodSettings(_Model):
    """What a platform team sets on the pods: queue labels (e.g. Kueue), gang schedulers
    (e.g. Volcano), priorities, where the pods may run. The controller's own labels win."""

    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra pod labels, e.g. kueue.x-k8s.io/queue-name: team-a.",
    )
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")
    scheduler_name: str | None = Field(
        default=None, min_length=1, description="Pod scheduler, e.g. volcano; unset: default."
    )
    priority_class_name: str | None = Field(
        default=None, pattern=_DNS_SUBDOMAIN, description="PriorityClass of the pods."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pods must run on."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Node taints the pods tolerate."
    )

    def apply(self, pod_spec: dict[str, Any], meta: dict[str, Any]) -> None:
        """Add the settings to a pod template's spec and metadata (our labels win)."""
        if self.labels:
            meta["labels"] = {**self.labels, **meta.get("labels", {})}
        if self.annotations:
            meta["annotations"] = {**self.annotations, **meta.get("annotations", {})}
        if self.scheduler_name:
            pod_spec["schedulerName"] = self.scheduler_name
        if self.priority_class_name:
            pod_spec["priorityClassName"] = self.priority_class_name
        if self.node_selector:
            pod_spec["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            pod_spec["tolerations"] = [
                t.model_dump(by_alias=True, exclude_none=True) for t in self.tolerations
            ]


RunConfigValue = int | float | bool | str


# --- spec ----------------------------------------------------------------------------------
class AppSpec(_Model):
    """The app to train: an ordinary Flower app (pyproject.toml with [tool.flwr.app]) in the
    server image. The server submits it with Flower's own run mechanism, which ships it to
    the clusters; client images must carry its dependencies."""

    path: str = Field(
        pattern="^/",
        description="The app directory inside spec.server.image; the project's example apps "
        f"are under {constants.APPS_DIR} (digits, digits-cnn, tabular).",
    )
    run_config: dict[str, RunConfigValue] = Field(
        default_factory=dict,
        description="Run config for the whole run (Flower's --run-config); keys must be "
        "declared in the app's [tool.flwr.app.config]. num-server-rounds is set from rounds.",
    )
    install_dependencies: bool = Field(
        default=False,
        description="Let Flower install the app's dependencies at run time (needs a package "
        "index); off: the images must carry them.",
    )


class S3Storage(_Model):
    """An S3-compatible bucket for checkpoints and the final model."""

    bucket_name: str = Field(min_length=1, description="Bucket name.")
    prefix: str = Field(default="", description="Key prefix (folder) inside the bucket.")
    region: str | None = Field(default=None, description="Region (AWS_REGION).")
    endpoint: str | None = Field(
        default=None,
        pattern="^https?://",
        description="URL of an S3-compatible server (MinIO, Ceph, ...); unset: AWS.",
    )
    credentials_secret: str | None = Field(
        default=None,
        pattern=_DNS_SUBDOMAIN,
        description="Secret in the resource's namespace with AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (optional AWS_SESSION_TOKEN), given to the server as env; "
        "unset: the pod's own identity.",
    )

    def uri(self) -> str:
        """s3://bucket/prefix."""
        return f"s3://{self.bucket_name}/{self.prefix.strip('/')}".rstrip("/")


DEFAULT_MODEL_CLAIM_SIZE: Final = "1Gi"


class Storage(_Model):
    """Where the server keeps checkpoints, the manifest and the final model."""

    type: StorageType = Field(
        default=StorageType.PVC,
        description="The kind of storage. Default PVC: a claim the controller creates on the "
        "hub's default StorageClass (or claimName's); HostPath needs the namespace's "
        "FederationPolicy allowHostPathStore.",
    )
    path: str | None = Field(
        default=None,
        description="Refused when set: tenants cannot choose host paths. A HostPath store is "
        "always <root>/<namespace>/<name>-<uid> on the hub node, under the root the hub admin "
        f"configures (Helm value storage.hostPathRoot, env {constants.ENV_HOSTPATH_ROOT}).",
    )
    claim_name: str | None = Field(
        default=None,
        pattern=_DNS_SUBDOMAIN,
        description="PVC: an existing claim. Omit it to let the controller create one of `size`.",
    )
    name: str | None = Field(
        default=None,
        pattern=_DNS_SUBDOMAIN,
        description="The incumbent controller's spelling of claimName.",
    )
    size: str | None = Field(
        default=None,
        description=f"Size of the PVC the controller creates (default {DEFAULT_MODEL_CLAIM_SIZE}).",
    )
    s3: S3Storage | None = Field(default=None, description="S3: the bucket.")

    @property
    def is_pvc(self) -> bool:
        """PVC storage (either spelling)."""
        return self.type in (StorageType.PVC, StorageType.PERSISTENT_VOLUME_CLAIM)

    @property
    def is_s3(self) -> bool:
        """S3 storage (either spelling)."""
        return self.type in (StorageType.S3, StorageType.S3_BUCKET)

    @property
    def claim(self) -> str | None:
        """The existing claim named (claimName, or the incumbent's name)."""
        return self.claim_name or self.name


class Timeouts(_Model):
    """How long the server waits."""

    clients_ready_seconds: int = Field(
        default=600,
        ge=1,
        description="For minAvailableClients clusters to connect, for lost clusters to "
        "come back, and for a server pod that cannot run (ErrImagePull, Unschedulable, ...) to "
        "start, before the run fails.",
    )
    round_seconds: int = Field(
        default=600, ge=1, description="For client replies in each round (apps on workloads.sdk)."
    )


_REFUSED = "Not part of this API: the controller refuses it with the field to use instead."


class ServerSpec(_Model):
    """The server on the hub: runs the app's ServerApp (Flower SuperLink) as a Job."""

    image: str = Field(
        default=constants.WORKLOAD_IMAGE,
        min_length=1,
        description="Server image: the workload image, or one built FROM it with the app.",
    )
    app: AppSpec | None = Field(default=None, description="The Flower app to run (required).")
    rounds: int = Field(default=3, ge=1, description="Federated rounds to run.")
    min_available_clients: int = Field(
        default=1,
        ge=1,
        description="Clusters that must be ready before training starts, and successful "
        "results every round needs.",
    )
    init_model: str | None = Field(
        default=None,
        min_length=1,
        description="Starting model: a path inside the storage (e.g. base.pth), an absolute "
        "path in the server image, or s3://bucket/key; .npz, .arrayrecord, .pt/.pth "
        "(state_dict) or .safetensors. A restarted server resumes from its checkpoints.",
    )
    storage: Storage = defaulted(Storage, "Where checkpoints and the final model go.")
    resources: Resources | None = Field(default=None, description="Server container resources.")
    timeouts: Timeouts = defaulted(Timeouts, "Waits.")
    advertise_address: str | None = Field(
        default=None,
        pattern=_HOST_PORT,
        description="host:port clusters use to reach the server; default: the server "
        "Service's LoadBalancer ingress.",
    )
    pod: PodSettings = defaulted(
        PodSettings, "Labels, annotations and scheduling of the server pod."
    )
    task: str | None = Field(default=None, description=_REFUSED + " Use app.path.")
    strategy: dict[str, Any] | None = Field(
        default=None, description=_REFUSED + " The app picks its strategy (app.runConfig)."
    )
    listeners: list[dict[str, Any]] | None = Field(
        default=None, description=_REFUSED + " Use advertiseAddress."
    )
    superlink: str | None = Field(
        default=None, description=_REFUSED + " The server runs its own SuperLink."
    )


class DataMount(_Model):
    """Where the cluster's data directory appears in the client pod."""

    mount_path: str = Field(default="/data", pattern="^/", description="Path in the pod.")
    read_only: bool = Field(default=True, description="Mount it read-only.")


class ClusterOverride(_Model):
    """Per-cluster settings, matched by cluster name or ManagedCluster labels; later wins."""

    cluster_name: str | None = Field(
        default=None, min_length=1, description="The cluster this override is for."
    )
    cluster_selector: LabelSelector | None = Field(
        default=None, description="Or: the clusters whose labels match."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        description="Extra client env, names the namespace's FederationPolicy allowedEnv "
        "lists. Names the platform sets or that hook code into its processes are always "
        "refused: OCMFL_*, FLWR_*, LD_*, PYTHON*, GRPC_*, SSL_*, PIP_*, UV_*, OPENSSL_*, "
        "GLIBC_*, GCONV_*, MALLOC_*, *_PROXY, HOME, TMPDIR, PATH, POD_IP, REQUESTS_CA_BUNDLE, "
        "CURL_CA_BUNDLE, HOSTALIASES, RES_OPTIONS, LOCALDOMAIN, BASH_ENV, ENV.",
    )
    resources: Resources | None = Field(
        default=None, description="Client container resources for these clusters."
    )
    run_config: dict[str, RunConfigValue] = Field(
        default_factory=dict,
        description="Values for these clusters' ClientApps (node config; merged by key).",
    )


class ClientSpec(_Model):
    """The clients: one Flower SuperNode per chosen cluster, next to its data."""

    image: str = Field(
        default=constants.WORKLOAD_IMAGE,
        min_length=1,
        description="Client image: must carry the app's dependencies.",
    )
    placement: PlacementSpec = defaulted(PlacementSpec, "Which clusters train (an OCM Placement).")
    data_claim: str | None = Field(
        default=None,
        max_length=253,
        pattern=_DNS_SUBDOMAIN,
        description="ClusterClaim whose value is the data path on each cluster. Unset: the "
        "one ClusterClaim key the placement selects with Exists (said in a condition).",
    )
    data_mount: DataMount = defaulted(DataMount, "Where the data appears in the client pod.")
    resources: Resources | None = Field(default=None, description="Client container resources.")
    run_config: dict[str, RunConfigValue] = Field(
        default_factory=dict,
        description="Values every cluster's ClientApp gets as node config (context.node_config).",
    )
    overrides: list[ClusterOverride] = Field(
        default_factory=list, description="Per-cluster env, resources and node config."
    )
    pod: PodSettings = defaulted(
        PodSettings, "Labels, annotations and scheduling of the client pods."
    )
    supernode: str | None = Field(
        default=None, description=_REFUSED + " Each client runs its own SuperNode."
    )


class DpMode(StrEnum):
    """Where the noise is added."""

    CENTRAL = privacy.CENTRAL  # clients clip, the server adds noise to the average
    LOCAL = privacy.LOCAL  # clients clip and add noise before their update leaves the cluster


class Clipping(StrEnum):
    """How the clipping norm is chosen."""

    FIXED = privacy.FIXED
    ADAPTIVE = privacy.ADAPTIVE


class DifferentialPrivacy(_Model):
    """Differential privacy of the model updates (workloads/sdk/privacy.py, docs/privacy.md)."""

    mode: DpMode = Field(description="central: server noise on the average; local: each "
                         "client adds noise before its update leaves its cluster.")  # fmt: skip
    clipping: Clipping = Field(
        default=Clipping.FIXED,
        description="fixed: clippingNorm every round; adaptive (mode central): the server "
        "moves the norm each round towards the targetUnclippedQuantile of the clients' update "
        "norms, from a noised count (Andrew et al. 2021), within the same privacy budget.",
    )
    clipping_norm: float = Field(
        gt=0, description="Each client's update (reply minus the model it got) is scaled down "
        "to this L2 norm at most (with adaptive clipping: in the first round).",
    )  # fmt: skip
    target_unclipped_quantile: float = Field(
        default=privacy.DEFAULT_TARGET_UNCLIPPED,
        gt=0,
        lt=1,
        description="adaptive: the share of updates the norm should leave unclipped.",
    )
    clipping_norm_learning_rate: float = Field(
        default=privacy.DEFAULT_CLIP_LEARNING_RATE,
        gt=0,
        description="adaptive: how fast the norm moves (geometric step per round).",
    )
    clipped_count_stddev: float | None = Field(
        default=None,
        gt=0,
        description="adaptive (required): std of the noise on the count of unclipped updates; "
        "above noiseMultiplier / 2 (about clients / 20 is usual). The updates' noise grows to "
        "keep the round's privacy at noiseMultiplier.",
    )
    noise_multiplier: float | None = Field(
        default=None,
        gt=0,
        description="central: noise std / clipping norm of the sum (required for central).",
    )
    epsilon: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="local: epsilon of each round's update, 0 < epsilon < 1 (required for "
        "local); the total over the rounds is accounted and reported.",
    )
    delta: float = Field(
        default=privacy.DEFAULT_DELTA, gt=0, lt=1, description="The delta epsilon is stated at."
    )


class SecureAggregation(_Model):
    """SecAgg+ (workloads/sdk/secagg.py, docs/privacy.md): the server, the hub and the tenant's
    ServerApp see only the sum of each round's updates, never one cluster's."""

    reconstruction_threshold: int = Field(
        ge=2,
        description="How many of a client's shares rebuild its secrets. A round completes as "
        "long as every client keeps this many of its share holders (shares minus this many "
        "may drop out); no fewer than this many clients can unmask anything together. At most "
        "minAvailableClients.",
    )
    shares: int | None = Field(
        default=None,
        ge=3,
        description="How many clients (itself included) each client's secrets are split among; "
        "default all of the round's clients (fewer are made odd).",
    )
    clipping_range: float = Field(
        default=privacy.SECAGG_CLIPPING_RANGE,
        gt=0,
        description="Each value of a client's update (reply minus the model it got, times "
        "its weight / maxWeight) is clipped to [-clippingRange, clippingRange] before it is "
        "quantized.",
    )
    quantization_range: int = Field(
        default=privacy.SECAGG_QUANTIZATION_RANGE,
        gt=0,
        le=privacy.SECAGG_QUANTIZATION_RANGE,
        description="Quantization levels over the clipping range (at most 2**22).",
    )
    max_weight: float = Field(
        default=privacy.SECAGG_MAX_WEIGHT,
        gt=0,
        description="A client's weight (its sample count) counts up to this; set it to the "
        "largest sample count of a cluster.",
    )


class Privacy(_Model):
    """What the clusters' updates are protected by. A cluster's own requirement (its
    ClusterClaim privacy.federated-learning.open-cluster-management.io) is enforced on that
    cluster in addition."""

    differential_privacy: DifferentialPrivacy | None = Field(
        default=None, description="Differential privacy of the model updates."
    )
    secure_aggregation: SecureAggregation | None = Field(
        default=None,
        description="Secure aggregation (SecAgg+) of each round's updates.",
    )


class FederatedLearningSpec(_Model):
    """What to train, where, and how."""

    framework: Framework = Field(default=Framework.FLOWER, description="FL framework.")
    server: ServerSpec = defaulted(ServerSpec, "The server on the hub.")
    client: ClientSpec = Field(description="The clients on the chosen clusters.")
    privacy: Privacy | None = Field(
        default=None, description="Differential privacy of the model updates (docs/privacy.md)."
    )


# --- status --------------------------------------------------------------------------------
class Condition(_Model):
    """A standard Kubernetes condition."""

    type: str = Field(description="One of the condition types listed above.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        pattern="^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", description="Machine-readable cause."
    )
    message: str = Field(default="", description="What happened, and the fix when one is needed.")
    last_transition_time: datetime = Field(description="When the status last changed.")
    observed_generation: int | None = Field(
        default=None, description="The spec generation this condition describes."
    )


class ClusterStatus(_Model):
    """One chosen cluster."""

    name: str = Field(description="ManagedCluster name.")
    phase: ClusterPhase = Field(description="Where this cluster stands.")
    data_path: str | None = Field(default=None, description="Its data directory (claim value).")
    reason: str = Field(default="", description="Why it is in this phase.")
    samples: int | None = Field(default=None, description="Samples its client reported.")
    round: int | None = Field(default=None, description="Last round it reported.")
    loss: float | None = Field(default=None, description="Its last reported loss.")
    accuracy: float | None = Field(default=None, description="Its last reported accuracy.")
    last_report_time: datetime | None = Field(
        default=None, description="When its agent last reported."
    )
    work_applied: bool = Field(
        default=False, description="Its ManifestWork is applied on the cluster."
    )
    client_log: str | None = Field(
        default=None,
        max_length=MAX_CLIENT_LOG,
        description="The last lines of its client's log (at most 4096 characters) when its "
        "ClientApp raised or its client failed, as its agent sent them; `ocm-fl logs` shows "
        "them. Never sent from a cluster whose admin switched client logs off.",
    )


class ModelArtifact(_Model):
    """The final model."""

    path: str = Field(
        description="Where it is: a hub directory, pvc://claim/file or s3://bucket/key."
    )
    round: int | None = Field(default=None, description="Rounds it was trained for.")
    sha256: str | None = Field(default=None, description="Digest of the model file.")
    metrics: dict[str, float] = Field(
        default_factory=dict, description="Its final metrics (the app's names)."
    )


class PrivacySpent(_Model):
    """The privacy the run spent, from the server's accountant (RDP, Flower's RdpAccountant)."""

    mode: DpMode = Field(description="central or local.")
    epsilon: float | None = Field(default=None, description="Total epsilon over the rounds run.")
    delta: float | None = Field(default=None, description="The delta epsilon is stated at.")
    round_epsilon: float | None = Field(default=None, description="Epsilon of one round.")
    rounds: int | None = Field(default=None, description="Rounds accounted.")


GLOBAL_HISTORY: Final = "global"  # HistoryEntry.cluster of the federation as a whole


class HistoryEntry(_Model):
    """Metrics of one round on one cluster; cluster "global" is the sample-weighted mean."""

    round: int = Field(ge=0, description="Round.")
    cluster: str = Field(description="Cluster name, or global.")
    loss: float | None = Field(default=None, description="Loss.")
    accuracy: float | None = Field(default=None, description="Accuracy.")
    samples: int | None = Field(default=None, description="Samples.")


class FederatedLearningStatus(_Model):
    """What the controller observed."""

    phase: Phase = Field(default=Phase.PENDING, description="Where the training stands.")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions.")
    observed_generation: int | None = Field(
        default=None, description="The spec generation this status describes."
    )
    round: int = Field(default=0, description="Rounds done.")
    total_rounds: int | None = Field(default=None, description="Rounds asked for.")
    clients: str | None = Field(default=None, description="Ready/selected clusters, e.g. 2/3.")
    accuracy: float | None = Field(
        default=None, description="Sample-weighted accuracy of the last round."
    )
    clusters: list[ClusterStatus] = Field(
        default_factory=list,
        description="One row per cluster, up to a bound (the worst first beyond it; "
        "clusterCounts counts them all).",
    )
    cluster_counts: dict[str, int] = Field(
        default_factory=dict, description="Selected clusters by phase (all of them)."
    )
    clusters_omitted: int = Field(
        default=0, ge=0, description="Clusters counted in clusterCounts but without a row."
    )
    model: ModelArtifact | None = Field(default=None, description="The final model.")
    privacy: PrivacySpent | None = Field(
        default=None, description="Privacy spent (spec.privacy.differentialPrivacy)."
    )
    history: list[HistoryEntry] = Field(
        default_factory=list, description="Per-round metrics per cluster (latest entries)."
    )
    message: str = Field(default="", description="The phase in words (the failure reason).")


class FederatedLearning(_Model):
    """The whole custom resource (used for the CRD schema)."""

    model_config = ConfigDict(extra="allow")

    api_version: str | None = None
    kind: str | None = None
    spec: FederatedLearningSpec
    status: FederatedLearningStatus | None = None


# --- owner reference -----------------------------------------------------------------------
@dataclass(frozen=True)
class FLRef:
    """Identity of one FederatedLearning resource: what everything we create points back to."""

    namespace: str
    name: str
    uid: str

    def labels(self, component: str) -> dict[str, str]:
        return {
            constants.LABEL_OWNER_NAME: self.name,
            constants.LABEL_OWNER_NAMESPACE: self.namespace,
            constants.LABEL_OWNER_UID: self.uid,
            constants.LABEL_COMPONENT: component,
        }

    def owner_reference(self) -> dict[str, Any]:
        """ownerReference for objects in the resource's own namespace (garbage collection)."""
        return {
            "apiVersion": constants.API_VERSION,
            "kind": constants.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


# --- validation ----------------------------------------------------------------------------
class SpecError(ValueError):
    """A spec the controller refuses; each message names the field and the fix."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _loc(loc: tuple[int | str, ...]) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def parse_spec(spec: dict[str, Any] | Any, name: str = "") -> FederatedLearningSpec:
    """Validate a resource's spec (schema and cross-field rules) or raise SpecError."""
    try:
        model = FederatedLearningSpec.model_validate(spec)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(
                to_camel(p) if isinstance(p, str) and "_" in p else p
                for p in err["loc"]
                if not (isinstance(p, str) and p in {"str", "int", "float", "bool"})
            )
            problems.append(f"{_loc(loc)}: {err['msg']}")
        raise SpecError(problems) from None
    problems = semantic_problems(model, name)
    if problems:
        raise SpecError(problems)
    return model


def data_claim_of(spec: FederatedLearningSpec) -> tuple[str | None, bool]:
    """(the data claim, whether it was inferred): spec.client.dataClaim, else the one
    ClusterClaim key the placement selects with Exists (the incumbent controller's rule)."""
    if spec.client.data_claim:
        return spec.client.data_claim, False
    keys = exists_claim_keys(spec.client.placement)
    return (keys[0], True) if len(keys) == 1 else (None, False)


def claim_placement(
    claim: str,
    cluster_sets: Sequence[str] = ("global",),
    label_selector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """spec.client.placement choosing every cluster of `cluster_sets` that carries ClusterClaim
    `claim` (operator Exists: the form exists_claim_keys reads back), and with
    `label_selector` only the clusters it matches."""
    expr = {"key": claim, "operator": SelectorOperator.EXISTS.value}
    required: dict[str, Any] = {"claimSelector": {"matchExpressions": [expr]}}
    if label_selector is not None:
        required["labelSelector"] = label_selector
    return {
        "clusterSets": list(cluster_sets),
        "predicates": [{"requiredClusterSelector": required}],
    }


def exists_claim_keys(placement: PlacementSpec) -> list[str]:
    """ClusterClaim keys the placement selects with operator Exists, in order, once each."""
    keys: list[str] = []
    for predicate in placement.predicates:
        selector = predicate.required_cluster_selector
        claims = selector.claim_selector if selector is not None else None
        for expr in claims.match_expressions if claims is not None else []:
            if expr.operator == SelectorOperator.EXISTS and expr.key not in keys:
                keys.append(expr.key)
    return keys


def _refused(spec: FederatedLearningSpec) -> list[str]:
    """Fields other controllers (or older versions) use, each with its form here."""
    server, problems = spec.server, []
    if server.task is not None:
        problems.append(
            f"spec.server.task ({server.task}) was removed: name the app instead, "
            f"spec.server.app.path: {constants.APPS_DIR}/digits (or {constants.APPS_DIR}/tabular "
            "for breast-cancer)"
        )
    if server.strategy is not None:
        problems.append(
            "spec.server.strategy was removed: the app chooses its strategy; pass its settings "
            "in spec.server.app.runConfig (the example digits app reads strategy, proximal-mu, "
            "fraction-train, fraction-evaluate)"
        )
    if server.listeners is not None:
        problems.append(
            "spec.server.listeners is not supported: clusters reach the server through its "
            "LoadBalancer Service; set spec.server.advertiseAddress (host:port) when the hub "
            "has no load balancer"
        )
    if server.superlink is not None:
        problems.append(
            "spec.server.superlink is not used: the server runs its own SuperLink behind an "
            "mTLS gateway; remove it"
        )
    if spec.client.supernode is not None:
        problems.append(
            "spec.client.supernode is not used: each client runs its own SuperNode; remove it"
        )
    return problems


def reserved_env(name: str) -> bool:
    """True for names the platform sets or that hook code into its processes."""
    upper = name.upper()
    return (
        upper in RESERVED_ENV_NAMES
        or upper.startswith(RESERVED_ENV_PREFIXES)
        or upper.endswith(RESERVED_ENV_SUFFIXES)
    )


def _env_problems(client: ClientSpec) -> list[str]:
    problems = []
    for i, override in enumerate(client.overrides):
        for j, env in enumerate(override.env):
            if reserved_env(env.name):
                problems.append(
                    f"spec.client.overrides[{i}].env[{j}].name ({env.name}) is reserved: the "
                    "platform sets it, or it hooks code into the client's processes (reserved: "
                    f"{', '.join(p + '*' for p in RESERVED_ENV_PREFIXES)}, "
                    f"{', '.join('*' + x for x in RESERVED_ENV_SUFFIXES)}, "
                    f"{', '.join(sorted(RESERVED_ENV_NAMES))}); use another name"
                )
    return problems


def _storage_problems(storage: Storage) -> list[str]:
    problems = []
    if storage.path is not None:
        problems.append(
            f"spec.server.storage.path ({storage.path}) cannot be set: tenants cannot choose "
            "host paths. A HostPath store lives under the hub admin's root, in "
            "<root>/<namespace>/<name>-<uid>; remove path (or use type PVC or S3)"
        )
    if storage.claim_name and storage.name and storage.claim_name != storage.name:
        problems.append(
            f"spec.server.storage: claimName ({storage.claim_name}) and name ({storage.name}) "
            "differ: set one of them"
        )
    if storage.is_s3 and storage.s3 is None:
        problems.append(
            f"spec.server.storage: type {storage.type.value} needs s3.bucketName (and "
            "credentialsSecret unless the server pod has its own identity)"
        )
    if storage.s3 is not None and not storage.is_s3:
        problems.append(
            f"spec.server.storage.s3 is set but type is {storage.type.value}: set type S3"
        )
    if storage.size is not None and not _QUANTITY.match(storage.size):
        problems.append(
            f"spec.server.storage.size ({storage.size!r}) is not a Kubernetes quantity: "
            "write it like 1Gi"
        )
    return problems


def secagg_settings(secagg: SecureAggregation) -> privacy.SecAggSettings:
    """The resource's SecAgg+ settings as the server uses them."""
    return privacy.SecAggSettings(
        threshold=secagg.reconstruction_threshold,
        shares=secagg.shares,
        clipping_range=secagg.clipping_range,
        quantization_range=secagg.quantization_range,
        max_weight=secagg.max_weight,
    )


def _privacy_problems(spec_privacy: Privacy | None, min_clients: int) -> list[str]:
    if spec_privacy is None:
        return []
    problems = []
    where = "spec.privacy"
    secagg = spec_privacy.secure_aggregation
    if secagg is not None:
        problems += privacy.secagg_problems(
            secagg_settings(secagg), min_clients, f"{where}.secureAggregation"
        )
    dp = spec_privacy.differential_privacy
    if dp is None:
        return problems
    where += ".differentialPrivacy"
    problems += privacy.mode_problems(dp.mode.value, dp.noise_multiplier, dp.epsilon, where)
    problems += privacy.clipping_problems(
        dp.clipping.value,
        dp.mode.value,
        dp.noise_multiplier,
        dp.clipped_count_stddev,
        dp.target_unclipped_quantile,
        where,
    )
    return problems


def semantic_problems(spec: FederatedLearningSpec, name: str = "") -> list[str]:
    """Cross-field rules the CRD schema cannot express, each with the fix."""
    problems: list[str] = _refused(spec)
    server, client = spec.server, spec.client
    if len(name) > 63:
        problems.append(
            f"metadata.name is {len(name)} characters; labels on everything the resource "
            "creates carry it, so it must be at most 63: use a shorter name"
        )
    if server.app is None and server.task is None:
        problems.append(
            "spec.server.app.path is required: the Flower app directory inside "
            f"spec.server.image, e.g. {constants.APPS_DIR}/digits"
        )
    n = client.placement.number_of_clusters
    if n is not None and server.min_available_clients > n:
        problems.append(
            f"spec.server.minAvailableClients ({server.min_available_clients}) is larger than "
            f"spec.client.placement.numberOfClusters ({n}): lower minAvailableClients or raise "
            "numberOfClusters"
        )
    problems += _storage_problems(server.storage)
    if client.data_claim is None and data_claim_of(spec)[0] is None:
        keys = exists_claim_keys(client.placement)
        problems.append(
            "spec.client.dataClaim is required: the ClusterClaim whose value is each "
            "cluster's data directory (it can be left out only when the placement selects "
            f"exactly one ClusterClaim key with Exists; it selects {len(keys)}"
            + (f": {', '.join(keys)}" if keys else "")
            + ")"
        )
    for i, override in enumerate(client.overrides):
        if (override.cluster_name is None) == (override.cluster_selector is None):
            problems.append(
                f"spec.client.overrides[{i}]: set exactly one of clusterName or clusterSelector"
            )
    problems += _env_problems(client)
    problems += _privacy_problems(spec.privacy, server.min_available_clients)
    for side, pod in (("server", server.pod), ("client", client.pod)):
        ours = sorted(k for k in pod.labels if k.startswith(constants.LABEL_PREFIX))
        if ours:
            problems.append(
                f"spec.{side}.pod.labels {ours}: the {constants.LABEL_PREFIX}/ prefix belongs "
                "to the controller; use another prefix"
            )
    if client.data_mount.mount_path in {"/", "/etc", "/etc/ocm-fl"}:
        problems.append(
            f"spec.client.dataMount.mountPath ({client.data_mount.mount_path}) would hide "
            "system or config files: use a dedicated directory such as /data"
        )
    return problems
