"""The FederatedLearning custom resource as pydantic models.

The models ARE the API: the controller validates a resource with `FederatedLearningSpec`,
writes status with `FederatedLearningStatus`, and `hack.codegen.crdgen` turns them into the
CRD's structural schema. JSON names are camelCase (aliases); Python names are snake_case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from ocmfl import constants

# A Kubernetes resource.Quantity ("500m", "2Gi", "1e3").
_QUANTITY = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+|[numkKMGTPE]i?)?$")
# host:port, where host is a DNS name, IPv4 address or bracketed IPv6 address.
_HOST_PORT = r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?):[0-9]{1,5}$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

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


# --- enums ---------------------------------------------------------------------------------
class Framework(StrEnum):
    FLOWER = "flower"


class StrategyName(StrEnum):
    FEDAVG = "fedavg"
    FEDPROX = "fedprox"


class Task(StrEnum):
    """Training task built into the workload image (model + data loader)."""

    DIGITS = "digits"
    BREAST_CANCER = "breast-cancer"


class StorageType(StrEnum):
    HOST_PATH = "HostPath"
    PVC = "PVC"


class Phase(StrEnum):
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
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


# --- shared pieces -------------------------------------------------------------------------
Quantity = int | str


class Resources(_Model):
    """Container resource requests and limits (Kubernetes quantities)."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)

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
    key: str = Field(min_length=1)
    operator: SelectorOperator
    values: list[str] = Field(default_factory=list)


class LabelSelector(_Model):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[SelectorRequirement] = Field(default_factory=list)


class ClaimSelector(_Model):
    match_expressions: list[SelectorRequirement] = Field(default_factory=list)


class ClusterSelector(_OpenModel):
    """OCM requiredClusterSelector: label, claim (and CEL, kept as-is) selectors, ANDed."""

    label_selector: LabelSelector | None = None
    claim_selector: ClaimSelector | None = None


class Predicate(_OpenModel):
    required_cluster_selector: ClusterSelector | None = None


class Toleration(_OpenModel):
    key: str | None = None
    operator: str | None = Field(default=None, pattern="^(Exists|Equal)$")
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


class PlacementSpec(_OpenModel):
    """An embedded OCM PlacementSpec (cluster.open-cluster-management.io/v1beta1).

    The modelled fields are validated; other PlacementSpec fields (prioritizerPolicy,
    decisionStrategy, spreadPolicy, ...) are passed through to the Placement unchanged.
    """

    cluster_sets: list[str] = Field(default_factory=list)
    number_of_clusters: int | None = Field(default=None, ge=1)
    predicates: list[Predicate] = Field(default_factory=list)
    tolerations: list[Toleration] = Field(default_factory=list)


class EnvVar(_Model):
    name: str = Field(pattern=_ENV_NAME)
    value: str = ""


RunConfigValue = int | float | bool | str


# --- spec ----------------------------------------------------------------------------------
class StrategyParams(_Model):
    """Strategy parameters (the server launcher refuses keys it does not know)."""

    proximal_mu: float | None = Field(default=None, ge=0, description="FedProx proximal term.")
    fraction_train: float = Field(default=1.0, gt=0, le=1)
    fraction_evaluate: float = Field(default=1.0, ge=0, le=1)


class Strategy(_Model):
    name: StrategyName = StrategyName.FEDAVG
    params: StrategyParams = Field(
        default_factory=StrategyParams, json_schema_extra={"default": {}}
    )


class Storage(_Model):
    """Where the server keeps checkpoints and the final model."""

    type: StorageType = StorageType.HOST_PATH
    path: str = Field(default="/var/lib/ocm-fl/models", pattern="^/")
    claim_name: str | None = Field(
        default=None,
        pattern=_DNS_SUBDOMAIN,
        description="Existing PVC (type PVC). Omit it to let the controller create one of `size`.",
    )
    size: str | None = Field(default=None, description="Size of the PVC the controller creates.")


class Timeouts(_Model):
    clients_ready_seconds: int = Field(default=600, ge=1)
    round_seconds: int = Field(default=600, ge=1)


class ServerSpec(_Model):
    image: str = Field(default=constants.WORKLOAD_IMAGE, min_length=1)
    rounds: int = Field(default=3, ge=1)
    min_available_clients: int = Field(default=1, ge=1)
    strategy: Strategy = Field(default_factory=Strategy, json_schema_extra={"default": {}})
    task: Task = Task.DIGITS
    init_model: str | None = Field(
        default=None, min_length=1, description="Path or URI of a pretrained starting model."
    )
    storage: Storage = Field(default_factory=Storage, json_schema_extra={"default": {}})
    resources: Resources | None = None
    timeouts: Timeouts = Field(default_factory=Timeouts, json_schema_extra={"default": {}})
    advertise_address: str | None = Field(
        default=None,
        pattern=_HOST_PORT,
        description="host:port clusters use to reach the server; default: the server "
        "Service's LoadBalancer ingress.",
    )


class DataMount(_Model):
    mount_path: str = Field(default="/data", pattern="^/")
    read_only: bool = True


class ClusterOverride(_Model):
    """Per-cluster settings, matched by cluster name or ManagedCluster labels; later wins."""

    cluster_name: str | None = Field(default=None, min_length=1)
    cluster_selector: LabelSelector | None = None
    env: list[EnvVar] = Field(default_factory=list)
    resources: Resources | None = None
    run_config: dict[str, RunConfigValue] = Field(default_factory=dict)


class ClientSpec(_Model):
    image: str = Field(default=constants.WORKLOAD_IMAGE, min_length=1)
    placement: PlacementSpec = Field(
        default_factory=PlacementSpec, json_schema_extra={"default": {}}
    )
    data_claim: str = Field(
        max_length=253,
        pattern=_DNS_SUBDOMAIN,
        description="ClusterClaim whose value is the data path on each cluster.",
    )
    data_mount: DataMount = Field(default_factory=DataMount, json_schema_extra={"default": {}})
    resources: Resources | None = None
    run_config: dict[str, RunConfigValue] = Field(
        default_factory=dict, description="Parameters passed to every client."
    )
    overrides: list[ClusterOverride] = Field(default_factory=list)


class FederatedLearningSpec(_Model):
    framework: Framework = Framework.FLOWER
    server: ServerSpec = Field(default_factory=ServerSpec, json_schema_extra={"default": {}})
    client: ClientSpec


# --- status --------------------------------------------------------------------------------
class Condition(_Model):
    type: str
    status: ConditionStatus
    reason: str = Field(pattern="^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = ""
    last_transition_time: datetime
    observed_generation: int | None = None


class ClusterStatus(_Model):
    name: str
    phase: ClusterPhase
    data_path: str | None = None
    reason: str = ""
    samples: int | None = None
    round: int | None = None
    loss: float | None = None
    accuracy: float | None = None
    last_report_time: datetime | None = None
    work_applied: bool = False


class ModelArtifact(_Model):
    path: str
    round: int | None = None
    sha256: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)


class HistoryEntry(_Model):
    """Metrics of one round on one cluster; cluster "global" is the sample-weighted mean."""

    round: int = Field(ge=0)
    cluster: str
    loss: float | None = None
    accuracy: float | None = None
    samples: int | None = None


class FederatedLearningStatus(_Model):
    phase: Phase = Phase.PENDING
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    round: int = 0
    total_rounds: int | None = None
    clients: str | None = Field(default=None, description="Ready/selected clusters, e.g. 2/3.")
    accuracy: float | None = None
    clusters: list[ClusterStatus] = Field(default_factory=list)
    model: ModelArtifact | None = None
    history: list[HistoryEntry] = Field(
        default_factory=list, description="Per-round metrics per cluster (latest entries)."
    )
    message: str = ""


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


def semantic_problems(spec: FederatedLearningSpec, name: str = "") -> list[str]:
    """Cross-field rules the CRD schema cannot express, each with the fix."""
    problems: list[str] = []
    server, client = spec.server, spec.client
    if len(name) > 63:
        problems.append(
            f"metadata.name is {len(name)} characters; labels on everything the resource "
            "creates carry it, so it must be at most 63: use a shorter name"
        )
    n = client.placement.number_of_clusters
    if n is not None and server.min_available_clients > n:
        problems.append(
            f"spec.server.minAvailableClients ({server.min_available_clients}) is larger than "
            f"spec.client.placement.numberOfClusters ({n}): lower minAvailableClients or raise "
            "numberOfClusters"
        )
    if server.strategy.name == StrategyName.FEDPROX and not server.strategy.params.proximal_mu:
        problems.append(
            "spec.server.strategy.params.proximalMu must be set above 0 when strategy.name is "
            "fedprox: set it (e.g. 0.01) or use strategy fedavg"
        )
    storage = server.storage
    if storage.type == StorageType.PVC and not storage.claim_name and not storage.size:
        problems.append(
            "spec.server.storage: type PVC needs claimName (an existing claim) or size (the "
            "controller creates one): set one of them"
        )
    if storage.size is not None and not _QUANTITY.match(storage.size):
        problems.append(
            f"spec.server.storage.size ({storage.size!r}) is not a Kubernetes quantity: "
            "write it like 1Gi"
        )
    for i, override in enumerate(client.overrides):
        if (override.cluster_name is None) == (override.cluster_selector is None):
            problems.append(
                f"spec.client.overrides[{i}]: set exactly one of clusterName or clusterSelector"
            )
    if client.data_mount.mount_path in {"/", "/etc", "/etc/ocm-fl"}:
        problems.append(
            f"spec.client.dataMount.mountPath ({client.data_mount.mount_path}) would hide "
            "system or config files: use a dedicated directory such as /data"
        )
    return problems
