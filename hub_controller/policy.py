"""The hub admin's per-namespace policy for FederatedLearning resources, enforced twice.

A tenant who may create a FederatedLearning in their namespace must not pick any image, any
cluster's data, a writable data mount, a hub host directory or a certificate name of their
choosing. The hub admin states what each tenant namespace may use in a `FederationPolicy`
named `default` in that namespace (tenants get no RBAC to write it). No policy: nothing is
allowed.

It is enforced twice:
1. at the apiserver, by a ValidatingAdmissionPolicy (CEL) the Helm chart ships; it refuses a
   create (or a spec update) that breaks the namespace's policy, before anything exists;
2. by the controller (`violations`), on every reconcile, before it applies anything: it also
   sees what CEL cannot (the data claim it infers when `dataClaim` is unset, the storage type
   a spec without one gets, a policy tightened after the resource was admitted).

Both come from this module: `violations` is the controller's check and `admission_objects`
builds the ValidatingAdmissionPolicy and its bindings (hack.codegen.admissiongen writes them
into the chart). Each rule names the field and the fix in both.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Final
from urllib.parse import urlsplit

from kubernetes.utils.quantity import parse_quantity as _parse_quantity
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)
from pydantic.alias_generators import to_camel

from hub_controller.api import (
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    RESERVED_ENV_SUFFIXES,
    DpMode,
    FederatedLearningSpec,
    PodSettings,
    Quantity,
    Resources,
    StorageType,
    Toleration,
    data_claim_of,
    defaulted,
)
from ocmfl import constants
from ocmfl.privacy import ADAPTIVE

KIND: Final = constants.POLICY_KIND
PLURAL: Final = constants.POLICY_PLURAL
SHORT_NAME: Final = constants.POLICY_SHORT_NAME
# The one policy object the admission policy and the controller read in each namespace.
POLICY_NAME: Final = constants.POLICY_NAME
ADMISSION_API_VERSION: Final = "admissionregistration.k8s.io/v1"

# An IP address (v4 digits and dots, or anything with a colon: v6). Such a domain entry
# matches only itself, never as a suffix.
_IP_LIKE: Final = r"^[0-9.]+$|:"
_DOMAIN = r"^([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?\.)*[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$"
_DOMAIN_OR_IP = rf"({_DOMAIN})|^[0-9a-fA-F:.]+$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_ENV_PATTERN = r"^([-._a-zA-Z][-._a-zA-Z0-9]*)?\*?$"  # a name, a prefix*, or * (any)
ImagePrefix = Annotated[str, StringConstraints(min_length=1)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=253)]
Endpoint = Annotated[str, StringConstraints(max_length=2048, pattern="^https?://[^/]+/?$")]
AppPath = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern="^/")]
EnvPattern = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=_ENV_PATTERN)]
# Label and annotation keys under these domains are the platform's (selectors, ownership):
# a tenant can never set them, whatever the policy says.
PLATFORM_DOMAINS: Final = (constants.LABEL_PREFIX, constants.GROUP)
PLATFORM_DOMAINS_TEXT: Final = " and ".join(f"{d}/" for d in PLATFORM_DOMAINS)
# Resources a container may request without a cap in the policy; any other needs one.
UNCAPPED_RESOURCES: Final = ("cpu", "memory", "ephemeral-storage")
DEFAULT_SCHEDULER: Final = "default-scheduler"
# Top-level names that only resolve inside a cluster or a site (svc: Services; local: mDNS and
# cluster.local; internal: cloud metadata such as metadata.google.internal).
INTERNAL_SUFFIXES: Final = ("svc", "local", "internal", "localhost", "lan", "home", "corp")
ClaimName = Annotated[str, StringConstraints(max_length=253, pattern=_DNS_SUBDOMAIN)]
Domain = Annotated[str, StringConstraints(max_length=253, pattern=_DOMAIN_OR_IP)]


def allowed_none(description: str) -> Any:
    """A policy list field that allows nothing until the admin lists something (the CRD
    default `[]` keeps it present for the admission policy's CEL)."""
    return Field(default_factory=list, json_schema_extra={"default": []}, description=description)


def refused_unless(description: str) -> Any:
    """A policy switch that stays off (refused) until the admin sets it."""
    return Field(default=False, description=description)


class PrivacyRule(BaseModel):
    """The differential privacy a resource must set (spec.privacy.differentialPrivacy)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    mode: DpMode | None = Field(default=None, description="central or local; unset: either.")
    max_clipping_norm: float | None = Field(
        default=None, gt=0, description="clippingNorm must be at most this."
    )
    min_noise_multiplier: float | None = Field(
        default=None, gt=0, description="With mode central: noiseMultiplier must be at least this."
    )
    max_epsilon: float | None = Field(
        default=None, gt=0, lt=1, description="With mode local: epsilon must be at most this."
    )
    secure_aggregation: bool = Field(
        default=False,
        description="Also require spec.privacy.secureAggregation (SecAgg+: the server sees "
        "only the sum of the updates).",
    )

    def describe(self) -> str:
        parts = [f"mode {self.mode.value}" if self.mode else "mode central or local"]
        if self.max_clipping_norm is not None:
            parts.append(f"clippingNorm <= {self.max_clipping_norm:g}")
        if self.min_noise_multiplier is not None:
            parts.append(f"noiseMultiplier >= {self.min_noise_multiplier:g} (central)")
        if self.max_epsilon is not None:
            parts.append(f"epsilon <= {self.max_epsilon:g} (local)")
        if self.secure_aggregation:
            parts.append("secure aggregation")
        return ", ".join(parts)


class FederationPolicySpec(BaseModel):
    """What FederatedLearning resources in this namespace may use. Unset lists allow nothing."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    allowed_image_prefixes: list[ImagePrefix] = allowed_none(
        "spec.server.image and spec.client.image must start with one of these, "
        "e.g. quay.io/ocm-fl/ (end a registry path with / so quay.io/ocm-fl-evil/ does not "
        "match).",
    )
    allowed_data_claims: list[ClaimName] = allowed_none(
        "ClusterClaim names this namespace may use as its data claim "
        "(spec.client.dataClaim, or the one the placement selects when dataClaim is unset).",
    )
    allow_writable_data_mount: bool = refused_unless(
        "Allow spec.client.dataMount.readOnly: false (clients may write to the clusters' data).",
    )
    allow_host_path_store: bool = refused_unless(
        "Allow spec.server.storage.type HostPath (a directory on a hub node).",
    )
    allowed_advertise_domains: list[Domain] = allowed_none(
        "DNS suffixes spec.server.advertiseAddress may use: its host must equal "
        "one or be a subdomain of one (an IP address entry matches only that address). "
        "Empty: advertiseAddress is refused.",
    )
    allowed_priority_classes: list[Name] = allowed_none(
        "PriorityClasses spec.server.pod and spec.client.pod may name "
        "(priorityClassName). Empty: none (the cluster's default priority).",
    )
    allowed_scheduler_names: list[Name] = allowed_none(
        "Schedulers the pods may name (schedulerName), besides default-scheduler.",
    )
    allowed_toleration_keys: list[Name] = allowed_none(
        "Taint keys the pods may tolerate (spec.server.pod.tolerations, "
        "spec.client.pod.tolerations). A toleration without a key tolerates every taint: "
        "refused unless allowKeylessTolerations.",
    )
    allowed_placement_toleration_keys: list[Name] = allowed_none(
        "ManagedCluster taint keys spec.client.placement.tolerations may "
        "tolerate, e.g. cluster.open-cluster-management.io/unreachable.",
    )
    allow_keyless_tolerations: bool = refused_unless(
        "Allow tolerations without a key (operator Exists: every taint), on the "
        "pods and in the placement.",
    )
    allowed_node_selector_keys: list[Name] = allowed_none(
        "Node label keys spec.server.pod.nodeSelector and "
        "spec.client.pod.nodeSelector may use, e.g. kubernetes.io/arch.",
    )
    allowed_label_prefixes: list[Name] = allowed_none(
        "Pod label keys (spec.*.pod.labels) must start with one of these, e.g. "
        f"kueue.x-k8s.io/. Keys under {PLATFORM_DOMAINS_TEXT} are always refused.",
    )
    allowed_annotation_prefixes: list[Name] = allowed_none(
        "Pod annotation keys (spec.*.pod.annotations) must start with one of "
        f"these. Keys under {PLATFORM_DOMAINS_TEXT} are always refused.",
    )
    max_pod_resources: dict[Name, Quantity] = defaulted(
        dict,
        "Per-container caps on requests and limits (spec.server.resources, "
        "spec.client.resources, spec.client.overrides[].resources), e.g. {cpu: '4', memory: "
        "8Gi, nvidia.com/gpu: '1'}. cpu, memory and ephemeral-storage are uncapped unless "
        "listed; any other resource (GPUs, devices) is refused unless listed.",
    )
    allowed_cluster_sets: list[Name] | None = Field(
        default=None,
        description="ManagedClusterSets spec.client.placement.clusterSets may name; it must "
        "then name at least one. Unset: any set bound to this namespace (its "
        "ManagedClusterSetBindings, which OCM's placement enforces).",
    )
    max_clusters: int | None = Field(
        default=None,
        ge=1,
        description="Most clusters one federation may use: spec.client.placement."
        "numberOfClusters must then be set and at most this. Unset: no cap.",
    )
    max_rounds: int | None = Field(
        default=None, ge=1, description="Most rounds (spec.server.rounds). Unset: no cap."
    )
    allowed_app_path_prefixes: list[AppPath] = allowed_none(
        "spec.server.app.path must start with one of these, e.g. "
        f"{constants.APPS_DIR}/ (the project's example apps). Paths under the platform's own "
        f"mounts ({', '.join(constants.PLATFORM_MOUNT_DIRS)}) and paths with . or .. "
        "segments are always refused.",
    )
    allow_install_dependencies: bool = refused_unless(
        "Allow spec.server.app.installDependencies: true (Flower installs the "
        "app's dependencies from a package index at run time, next to the data).",
    )
    allowed_s3_buckets: list[Name] = allowed_none(
        "Buckets spec.server.storage.s3.bucketName and an s3:// "
        "spec.server.initModel may name (the model leaves the clusters' data only to these).",
    )
    allowed_s3_endpoints: list[Endpoint] = allowed_none(
        "URLs spec.server.storage.s3.endpoint may be (scheme, host and port; "
        "unset endpoint: AWS). Loopback, link-local and cluster-internal hosts are always "
        "refused.",
    )
    allowed_env: list[EnvPattern] = allowed_none(
        "Client env names (spec.client.overrides[].env) this namespace may set: "
        "exact names, or prefixes ending in * (e.g. MYAPP_*). Reserved names stay refused.",
    )

    require_privacy: PrivacyRule | None = Field(
        default=None,
        description="Every resource here must set spec.privacy.differentialPrivacy within "
        "this rule. Unset: privacy is the resource's choice (and the clusters' claims).",
    )
    require_privacy_for_claims: dict[ClaimName, PrivacyRule] = Field(
        default_factory=dict,
        description="Per data claim: a resource whose data claim is a key here must set "
        "spec.privacy.differentialPrivacy within its rule (as well as requirePrivacy).",
    )

    @field_validator("max_pod_resources")
    @classmethod
    def _quantities(cls, value: dict[str, Quantity]) -> dict[str, Quantity]:
        for key, qty in value.items():
            try:
                parse_quantity(qty)
            except ValueError:
                raise ValueError(f"{key}: {qty!r} is not a Kubernetes quantity") from None
        return value


class FederationPolicy(BaseModel):
    """The whole FederationPolicy resource (used for the CRD schema)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    api_version: str | None = None
    kind: str | None = None
    spec: FederationPolicySpec


def parse_policy(spec: Mapping[str, Any] | None) -> FederationPolicySpec:
    """A FederationPolicy's spec as the model; ValueError naming the field when invalid."""
    try:
        return FederationPolicySpec.model_validate(dict(spec or {}))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"FederationPolicy {POLICY_NAME}: spec.{where}: {first['msg']}") from None


@dataclass(frozen=True)
class Violation:
    """One rule a spec breaks: the field (JSON path) and what to do about it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _fix(policy_field: str) -> str:
    return f"or ask the hub admin to add it to FederationPolicy {POLICY_NAME}.spec.{policy_field}"


def advertised_host(address: str) -> str:
    """The host of a host:port address, brackets stripped, lower case."""
    return address.rsplit(":", 1)[0].strip("[]").lower()


def domain_allows(domain: str, host: str) -> bool:
    """Whether an allowedAdvertiseDomains entry admits `host`: equal, or (for a DNS name) a
    subdomain of it. The same rule as the admission policy's CEL."""
    domain = domain.lower()
    if host == domain:
        return True
    return re.search(_IP_LIKE, domain) is None and host.endswith("." + domain)


def violations(
    spec: FederatedLearningSpec, policy: FederationPolicySpec | None, namespace: str
) -> list[Violation]:
    """Every rule of the namespace's policy `spec` breaks (empty: allowed). No policy: refused."""
    if policy is None:
        return [
            Violation(
                "metadata.namespace",
                f"namespace {namespace} has no FederationPolicy named {POLICY_NAME}: the hub "
                f"admin must create one (kind {KIND}, {constants.API_VERSION}) saying which "
                "images, data claims and storage FederatedLearning resources here may use",
            )
        ]
    out: list[Violation] = []
    prefixes = policy.allowed_image_prefixes
    for side, image in (("server", spec.server.image), ("client", spec.client.image)):
        if not any(image.startswith(p) for p in prefixes):
            out.append(
                Violation(
                    f"spec.{side}.image",
                    f"{image} is not allowed in namespace {namespace}: use an image starting "
                    f"with one of [{', '.join(prefixes)}], {_fix('allowedImagePrefixes')}",
                )
            )
    claim, inferred = data_claim_of(spec)
    if claim is not None and claim not in policy.allowed_data_claims:
        where = (
            "spec.client.placement (dataClaim unset: the ClusterClaim it selects with Exists)"
            if inferred
            else "spec.client.dataClaim"
        )
        out.append(
            Violation(
                "spec.client.placement" if inferred else "spec.client.dataClaim",
                f"data claim {claim} (from {where}) is not allowed in namespace {namespace}: "
                f"use one of [{', '.join(policy.allowed_data_claims)}], "
                + _fix("allowedDataClaims"),
            )
        )
    if not spec.client.data_mount.read_only and not policy.allow_writable_data_mount:
        out.append(
            Violation(
                "spec.client.dataMount.readOnly",
                f"a writable data mount is not allowed in namespace {namespace}: remove "
                "readOnly: false (clients read their data), or ask the hub admin to set "
                f"FederationPolicy {POLICY_NAME}.spec.allowWritableDataMount: true",
            )
        )
    if spec.server.storage.type == StorageType.HOST_PATH and not policy.allow_host_path_store:
        out.append(
            Violation(
                "spec.server.storage.type",
                f"HostPath storage (a directory on a hub node) is not allowed in namespace "
                f"{namespace}: use type PVC (or S3), or ask the hub admin to set "
                f"FederationPolicy {POLICY_NAME}.spec.allowHostPathStore: true",
            )
        )
    address = spec.server.advertise_address
    if address is not None:
        host = advertised_host(address)
        domains = policy.allowed_advertise_domains
        if not any(domain_allows(d, host) for d in domains):
            out.append(
                Violation(
                    "spec.server.advertiseAddress",
                    f"host {host} is not within the domains allowed in namespace {namespace} "
                    f"([{', '.join(domains)}]): leave advertiseAddress unset (the server "
                    f"Service's load balancer address) or use a host in one of them, "
                    + _fix("allowedAdvertiseDomains"),
                )
            )
    out += _pod_violations(spec, policy, namespace)
    out += _resource_violations(spec, policy, namespace)
    out += _run_violations(spec, policy, namespace)
    out += _s3_violations(spec, policy, namespace)
    out += _privacy_violations(spec, policy, namespace)
    return out


def _privacy_violations(
    spec: FederatedLearningSpec, policy: FederationPolicySpec, namespace: str
) -> list[Violation]:
    rules: list[tuple[str, PrivacyRule]] = []
    if policy.require_privacy is not None:
        rules.append(("requirePrivacy", policy.require_privacy))
    claim = data_claim_of(spec)[0]
    by_claim = policy.require_privacy_for_claims
    if claim is not None and claim in by_claim:
        rules.append((f"requirePrivacyForClaims[{claim}]", by_claim[claim]))
    dp = spec.privacy.differential_privacy if spec.privacy is not None else None
    field = "spec.privacy.differentialPrivacy"
    out: list[Violation] = []
    secagg = spec.privacy.secure_aggregation if spec.privacy is not None else None
    for name, rule in rules:
        why = f"{_ns(namespace)} (FederationPolicy {POLICY_NAME}.spec.{name}: {rule.describe()})"
        if rule.secure_aggregation and secagg is None:
            out.append(Violation("spec.privacy.secureAggregation",
                                 f"secure aggregation is required {why}: set it"))  # fmt: skip
        if dp is None:
            out.append(Violation(field, f"differential privacy is required {why}: set it"))
            continue
        if rule.mode is not None and dp.mode != rule.mode:
            out.append(Violation(f"{field}.mode", f"{dp.mode.value} is not allowed {why}"))
        if rule.max_clipping_norm is not None and dp.clipping_norm > rule.max_clipping_norm:
            out.append(Violation(f"{field}.clippingNorm",
                                 f"{dp.clipping_norm:g} is too large {why}"))  # fmt: skip
        if rule.max_clipping_norm is not None and dp.clipping.value == ADAPTIVE:
            out.append(Violation(f"{field}.clipping", f"adaptive clipping is not allowed {why} "
                                 "(its norm moves): use fixed"))  # fmt: skip
        noise = dp.noise_multiplier
        if (
            rule.min_noise_multiplier is not None
            and dp.mode is DpMode.CENTRAL
            and (noise is None or noise < rule.min_noise_multiplier)
        ):
            out.append(Violation(f"{field}.noiseMultiplier", f"{noise} is too small {why}"))
        eps = dp.epsilon
        if (
            rule.max_epsilon is not None
            and dp.mode is DpMode.LOCAL
            and (eps is None or eps > rule.max_epsilon)
        ):
            out.append(Violation(f"{field}.epsilon", f"{eps} is too large {why}"))
    return out


CLUSTER_SETS: Final = "allowedClusterSets"


def _ns(namespace: str) -> str:
    return f"in namespace {namespace}"


def _not_allowed(
    field: str,
    what: str,
    namespace: str,
    use: str,
    allowed: Sequence[str],
    policy_field: str,
) -> Violation:
    """`<what> in namespace <ns>: <use> [<allowed>], or ask the hub admin to add it to
    FederationPolicy default.spec.<policy_field>` (the CEL twin: `_cel_not_allowed`)."""
    return Violation(
        field, f"{what} {_ns(namespace)}: {use} {_listed(allowed)}, {_fix(policy_field)}"
    )


def _listed(items: Sequence[str]) -> str:
    return f"[{', '.join(items)}]"


def parse_quantity(quantity: Quantity) -> Decimal:
    """A Kubernetes quantity as a number (ValueError when it is not one)."""
    return _parse_quantity(quantity)  # type: ignore[no-any-return,no-untyped-call]


def platform_key(key: str) -> bool:
    """Whether a label or annotation key is under one of the platform's own domains."""
    domain = key.split("/", 1)[0] if "/" in key else ""
    return any(domain == d or domain.endswith("." + d) for d in PLATFORM_DOMAINS)


def _toleration_violations(
    field: str,
    tolerations: Sequence[Toleration],
    allowed: Sequence[str],
    policy_field: str,
    policy: FederationPolicySpec,
    namespace: str,
) -> list[Violation]:
    out = []
    if not policy.allow_keyless_tolerations and any(not t.key for t in tolerations):
        out.append(
            Violation(
                field,
                f"a toleration without a key tolerates every taint and is not allowed "
                f"{_ns(namespace)}: name the taint's key, or ask the hub admin to set "
                f"FederationPolicy {POLICY_NAME}.spec.allowKeylessTolerations: true",
            )
        )
    bad = [t.key for t in tolerations if t.key and t.key not in allowed]
    if bad:
        out.append(
            _not_allowed(
                field,
                f"toleration keys {_listed(bad)} are not allowed",
                namespace,
                "use keys in",
                allowed,
                policy_field,
            )
        )
    return out


def _key_violations(
    field: str, keys: Sequence[str], allowed: Sequence[str], policy_field: str, namespace: str
) -> list[Violation]:
    """Label or annotation keys: never the platform's, and starting with an allowed prefix."""
    out = []
    ours = [k for k in keys if platform_key(k)]
    if ours:
        out.append(
            Violation(
                field,
                f"keys {_listed(ours)} are the platform's own (under {PLATFORM_DOMAINS_TEXT}): "
                "remove them",
            )
        )
    bad = [k for k in keys if not platform_key(k) and not any(k.startswith(p) for p in allowed)]
    if bad:
        out.append(
            _not_allowed(
                field,
                f"keys {_listed(bad)} are not allowed",
                namespace,
                "use keys starting with one of",
                allowed,
                policy_field,
            )
        )
    return out


def _pod_settings_violations(
    side: str, pod: PodSettings, policy: FederationPolicySpec, namespace: str
) -> list[Violation]:
    field = f"spec.{side}.pod"
    out = []
    name = pod.priority_class_name
    if name is not None and name not in policy.allowed_priority_classes:
        out.append(
            _not_allowed(
                f"{field}.priorityClassName",
                f"PriorityClass {name} is not allowed",
                namespace,
                "remove it or use one of",
                policy.allowed_priority_classes,
                "allowedPriorityClasses",
            )
        )
    scheduler = pod.scheduler_name
    schedulers = [DEFAULT_SCHEDULER, *policy.allowed_scheduler_names]
    if scheduler is not None and scheduler not in schedulers:
        out.append(
            _not_allowed(
                f"{field}.schedulerName",
                f"scheduler {scheduler} is not allowed",
                namespace,
                "remove it or use one of",
                schedulers,
                "allowedSchedulerNames",
            )
        )
    out += _toleration_violations(
        f"{field}.tolerations",
        pod.tolerations,
        policy.allowed_toleration_keys,
        "allowedTolerationKeys",
        policy,
        namespace,
    )
    bad = [k for k in pod.node_selector if k not in policy.allowed_node_selector_keys]
    if bad:
        out.append(
            _not_allowed(
                f"{field}.nodeSelector",
                f"node label keys {_listed(bad)} are not allowed",
                namespace,
                "use keys in",
                policy.allowed_node_selector_keys,
                "allowedNodeSelectorKeys",
            )
        )
    out += _key_violations(
        f"{field}.labels",
        list(pod.labels),
        policy.allowed_label_prefixes,
        "allowedLabelPrefixes",
        namespace,
    )
    out += _key_violations(
        f"{field}.annotations",
        list(pod.annotations),
        policy.allowed_annotation_prefixes,
        "allowedAnnotationPrefixes",
        namespace,
    )
    return out


def _pod_violations(
    spec: FederatedLearningSpec, policy: FederationPolicySpec, namespace: str
) -> list[Violation]:
    out = _pod_settings_violations("server", spec.server.pod, policy, namespace)
    out += _pod_settings_violations("client", spec.client.pod, policy, namespace)
    out += _toleration_violations(
        "spec.client.placement.tolerations",
        spec.client.placement.tolerations,
        policy.allowed_placement_toleration_keys,
        "allowedPlacementTolerationKeys",
        policy,
        namespace,
    )
    return out


def over_cap(name: str, quantity: Quantity, caps: Mapping[str, Quantity]) -> bool:
    """Whether one request or limit breaks the caps: over its cap, or a resource other than
    cpu, memory and ephemeral-storage that has none."""
    cap = caps.get(name)
    if cap is None:
        return name not in UNCAPPED_RESOURCES
    return parse_quantity(quantity) > parse_quantity(cap)


def _resource_violations(
    spec: FederatedLearningSpec, policy: FederationPolicySpec, namespace: str
) -> list[Violation]:
    def parts(field: str, resources: Sequence[Resources | None]) -> list[tuple[str, list[Any]]]:
        return [
            (f"{field}.requests", [r.requests for r in resources if r is not None]),
            (f"{field}.limits", [r.limits for r in resources if r is not None]),
        ]

    places = [
        *parts("spec.server.resources", [spec.server.resources]),
        *parts("spec.client.resources", [spec.client.resources]),
        *parts("spec.client.overrides[].resources", [o.resources for o in spec.client.overrides]),
    ]
    caps = policy.max_pod_resources
    out = []
    for field, maps in places:
        bad = [f"{k}={v}" for m in maps for k, v in m.items() if over_cap(k, v, caps)]
        if bad:
            out.append(
                Violation(
                    field,
                    f"{_listed(bad)} are over the caps {_ns(namespace)} "
                    f"({_listed([f'{k}={v}' for k, v in caps.items()])}; cpu, memory and "
                    "ephemeral-storage are uncapped unless listed, any other resource needs a "
                    f"cap): ask for less, {_fix('maxPodResources')}",
                )
            )
    return out


def app_path_problem(path: str) -> str | None:
    """Why an app path may never be used, whatever the policy says; None if it may."""
    if any(part in (".", "..") for part in path.split("/")) or "//" in path:
        return "has . or .. segments or an empty one: write it without them"
    for d in constants.PLATFORM_MOUNT_DIRS:
        if path == d or path.startswith(d + "/"):
            return (
                f"is under the platform's mount {d} (tenants may have written there, or it "
                "holds secrets): use a directory inside the server image"
            )
    return None


def internal_host_problem(host: str) -> str | None:
    """Why an S3 endpoint's host is never allowed (loopback, link-local, unspecified, or a
    cluster-internal or numeric name a resolver would turn into one); None if it may be."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    # An IPv4-mapped IPv6 address is judged as a name (ending in a number: refused), as
    # Kubernetes' CEL does (its ip() refuses them).
    if ip is not None and not (ip.version == 6 and ip.ipv4_mapped is not None):
        if ip.is_loopback or ip.is_link_local or ip.is_unspecified:
            return "is a loopback, link-local or unspecified address"
        return None
    labels = host.split(".")
    if host == "localhost" or labels[-1] in INTERNAL_SUFFIXES or len(labels) == 1:
        return "is a cluster-internal or single-label name"
    if not labels[-1][:1].isalpha():
        return "ends in a number (a resolver reads it as an address)"
    return None


def _endpoint(url: str) -> str:
    url = url.lower()
    return url[:-1] if url.endswith("/") else url


def _s3_violations(
    spec: FederatedLearningSpec, policy: FederationPolicySpec, namespace: str
) -> list[Violation]:
    out = []
    s3 = spec.server.storage.s3
    buckets = policy.allowed_s3_buckets
    if s3 is not None and s3.bucket_name not in buckets:
        out.append(
            _not_allowed(
                "spec.server.storage.s3.bucketName",
                f"bucket {s3.bucket_name} is not allowed",
                namespace,
                "use one of",
                buckets,
                "allowedS3Buckets",
            )
        )
    if s3 is not None and s3.endpoint is not None:
        host = (urlsplit(s3.endpoint).hostname or "").lower()
        problem = internal_host_problem(host)
        allowed = [_endpoint(e) for e in policy.allowed_s3_endpoints]
        if problem is not None:
            out.append(
                Violation(
                    "spec.server.storage.s3.endpoint",
                    f"host {host} {problem}: S3 endpoints must be outside the cluster's and "
                    "the node's own addresses; use the store's public name",
                )
            )
        elif _endpoint(s3.endpoint) not in allowed:
            out.append(
                _not_allowed(
                    "spec.server.storage.s3.endpoint",
                    f"{s3.endpoint} is not allowed",
                    namespace,
                    "use one of",
                    allowed,
                    "allowedS3Endpoints",
                )
            )
    init = spec.server.init_model
    if init is not None and init.startswith("s3://"):
        bucket = init[len("s3://") :].split("/", 1)[0]
        if bucket not in buckets:
            out.append(
                _not_allowed(
                    "spec.server.initModel",
                    f"bucket {bucket} is not allowed",
                    namespace,
                    "use one of",
                    buckets,
                    "allowedS3Buckets",
                )
            )
    elif init is not None:
        problem = app_path_problem(init if init.startswith("/") else "/" + init)
        if problem is not None:
            out.append(Violation("spec.server.initModel", f"{init} {problem}"))
    return out


def _cluster_set_violations(
    spec: FederatedLearningSpec, policy: FederationPolicySpec, namespace: str
) -> list[Violation]:
    allowed = policy.allowed_cluster_sets
    if allowed is None:
        return []
    field, sets = "spec.client.placement.clusterSets", spec.client.placement.cluster_sets
    if not sets:
        what = "unset (every set bound to the namespace)"
        return [_not_allowed(field, what, namespace, "name sets from", allowed, CLUSTER_SETS)]
    bad = [s for s in sets if s not in allowed]
    if bad:
        what = f"cluster sets {_listed(bad)} are not allowed"
        return [_not_allowed(field, what, namespace, "use sets from", allowed, CLUSTER_SETS)]
    return []


def env_allowed(name: str, allowed: Sequence[str]) -> bool:
    """Whether an env name matches an allowedEnv entry (exact, or a prefix ending in *)."""
    return any(name.startswith(a[:-1]) if a.endswith("*") else name == a for a in allowed)


def _run_violations(
    spec: FederatedLearningSpec, policy: FederationPolicySpec, namespace: str
) -> list[Violation]:
    out = []
    if policy.max_rounds is not None and spec.server.rounds > policy.max_rounds:
        out.append(
            Violation(
                "spec.server.rounds",
                f"{spec.server.rounds} is over the cap of {policy.max_rounds} rounds "
                f"{_ns(namespace)}: ask for fewer, or ask the hub admin to raise "
                f"FederationPolicy {POLICY_NAME}.spec.maxRounds",
            )
        )
    out += _cluster_set_violations(spec, policy, namespace)
    wanted = spec.client.placement.number_of_clusters
    if policy.max_clusters is not None and (wanted is None or wanted > policy.max_clusters):
        out.append(
            Violation(
                "spec.client.placement.numberOfClusters",
                f"{'unset' if wanted is None else wanted} is over the cap of "
                f"{policy.max_clusters} clusters {_ns(namespace)}: set it to at most "
                f"{policy.max_clusters}, or ask the hub admin to raise FederationPolicy "
                f"{POLICY_NAME}.spec.maxClusters",
            )
        )
    app = spec.server.app
    if app is not None:
        problem = app_path_problem(app.path)
        if problem is not None:
            out.append(Violation("spec.server.app.path", f"{app.path} {problem}"))
        elif not any(app.path.startswith(p) for p in policy.allowed_app_path_prefixes):
            out.append(
                _not_allowed(
                    "spec.server.app.path",
                    f"{app.path} is not allowed",
                    namespace,
                    "use a path starting with one of",
                    policy.allowed_app_path_prefixes,
                    "allowedAppPathPrefixes",
                )
            )
        if app.install_dependencies and not policy.allow_install_dependencies:
            out.append(
                Violation(
                    "spec.server.app.installDependencies",
                    f"installing dependencies at run time is not allowed {_ns(namespace)}: "
                    "remove installDependencies: true (the images carry the app's "
                    f"dependencies), or ask the hub admin to set FederationPolicy "
                    f"{POLICY_NAME}.spec.allowInstallDependencies: true",
                )
            )
    names = [e.name for o in spec.client.overrides for e in o.env]
    bad = [n for n in names if not env_allowed(n, policy.allowed_env)]
    if bad:
        out.append(
            _not_allowed(
                "spec.client.overrides[].env",
                f"names {_listed(bad)} are not allowed",
                namespace,
                "use names in",
                policy.allowed_env,
                "allowedEnv",
            )
        )
    return out


# --- the ValidatingAdmissionPolicy ---------------------------------------------------------
# Variables the validations share. CRD defaults are applied before admission, so the
# defaulted fields (server, client, dataMount, storage) are present; has() guards the rest.
_VARIABLES: Final = (
    ("server", "object.spec.server"),
    ("client", "object.spec.client"),
    ("allowedImages", "params.spec.allowedImagePrefixes"),
    ("allowedClaims", "params.spec.allowedDataClaims"),
    ("allowedDomains", "params.spec.allowedAdvertiseDomains.map(d, d.lowerAscii())"),
    (
        "advertiseHost",
        "has(object.spec.server.advertiseAddress) ? object.spec.server.advertiseAddress"
        ".substring(0, object.spec.server.advertiseAddress.lastIndexOf(':'))"
        ".replace('[', '').replace(']', '').lowerAscii() : ''",
    ),
    (
        # The ClusterClaim keys the placement selects with Exists (the data claim when
        # dataClaim is unset), as a list of lists (CEL here has no flatten).
        "existsKeys",
        "has(object.spec.client.placement) && has(object.spec.client.placement.predicates) ? "
        "object.spec.client.placement.predicates.map(p, "
        "has(p.requiredClusterSelector) && has(p.requiredClusterSelector.claimSelector) && "
        "has(p.requiredClusterSelector.claimSelector.matchExpressions) ? "
        "p.requiredClusterSelector.claimSelector.matchExpressions"
        ".filter(e, e.operator == 'Exists').map(e, e.key) : []) : []",
    ),
)

_NS = "' in namespace ' + request.namespace + "
_ASK = "', or ask the hub admin to add it to FederationPolicy default.spec."

# (expression, messageExpression, reason): each message names the field and the fix.
_VALIDATIONS: Final = (
    (
        "variables.allowedImages.exists(p, variables.server.image.startsWith(p))",
        "'spec.server.image: ' + variables.server.image + ' is not allowed'" + f" + {_NS}"
        "': use an image starting with one of [' + variables.allowedImages.join(', ') + ']'"
        f" + {_ASK}allowedImagePrefixes'",
    ),
    (
        "variables.allowedImages.exists(p, variables.client.image.startsWith(p))",
        "'spec.client.image: ' + variables.client.image + ' is not allowed'" + f" + {_NS}"
        "': use an image starting with one of [' + variables.allowedImages.join(', ') + ']'"
        f" + {_ASK}allowedImagePrefixes'",
    ),
    (
        "!has(object.spec.client.dataClaim) || "
        "object.spec.client.dataClaim in variables.allowedClaims",
        "'spec.client.dataClaim: data claim ' + object.spec.client.dataClaim + ' is not allowed'"
        f" + {_NS}': use one of [' + variables.allowedClaims.join(', ') + ']'"
        f" + {_ASK}allowedDataClaims'",
    ),
    (
        "has(object.spec.client.dataClaim) || "
        "variables.existsKeys.all(keys, keys.all(k, k in variables.allowedClaims))",
        "'spec.client.placement: dataClaim is unset, so the ClusterClaim the placement "
        "selects with Exists is the data claim, and it is not allowed'"
        f" + {_NS}': set spec.client.dataClaim to one of [' + "
        "variables.allowedClaims.join(', ') + ']'"
        f" + {_ASK}allowedDataClaims'",
    ),
    (
        "params.spec.allowWritableDataMount || !has(variables.client.dataMount) || "
        "!has(variables.client.dataMount.readOnly) || variables.client.dataMount.readOnly",
        "'spec.client.dataMount.readOnly: a writable data mount is not allowed'"
        f" + {_NS}': remove readOnly: false, or ask the hub admin to set FederationPolicy "
        "default.spec.allowWritableDataMount: true'",
    ),
    (
        "params.spec.allowHostPathStore || !has(variables.server.storage) || "
        "!has(variables.server.storage.type) || variables.server.storage.type != 'HostPath'",
        "'spec.server.storage.type: HostPath storage (a directory on a hub node) is not "
        f"allowed' + {_NS}': use type PVC (or S3), or ask the hub admin to set "
        "FederationPolicy default.spec.allowHostPathStore: true'",
    ),
    (
        "variables.advertiseHost == '' || variables.allowedDomains.exists(d, "
        "variables.advertiseHost == d || "
        f"(!d.matches('{_IP_LIKE}') && variables.advertiseHost.endsWith('.' + d)))",
        "'spec.server.advertiseAddress: host ' + variables.advertiseHost + ' is not within "
        "the allowed domains'" + f" + {_NS}' ([' + variables.allowedDomains.join(', ') + ']): "
        "leave advertiseAddress unset or use a host in one of them'"
        f" + {_ASK}allowedAdvertiseDomains'",
    ),
)


def _cel_str(text: str) -> str:
    """A CEL string literal (single quotes; backslashes and quotes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(_cel_str(i) for i in items) + "]"


def _cel_ask(policy_field: str) -> str:
    return _cel_str(f", {_fix(policy_field)}")


def _cel_not_allowed(
    head: str, value: str, tail: str, use: str, allowed: str, policy_field: str
) -> str:
    """CEL for `<head><value><tail> in namespace <ns>: <use> [<allowed>], or ask the hub admin
    to add it to FederationPolicy default.spec.<policy_field>` (`value` and `allowed` are CEL:
    a string, and a list of strings), the words of the controller's `_not_allowed`."""
    return (
        _cel_str(head)
        + f" + {value} + "
        + _cel_str(f"{tail} in namespace ")
        + " + request.namespace + "
        + _cel_str(f": {use} [")
        + f" + {allowed}.join(', ') + "
        + _cel_str("]")
        + " + "
        + _cel_ask(policy_field)
    )


# CEL for "the object at `path` has `leaf`", one has() per step after object.spec.
def _has(path: str) -> str:
    parts = path.split(".")
    return " && ".join(f"has({'.'.join(parts[: i + 1])})" for i in range(2, len(parts)))


def _toleration_rules(
    field: str, path: str, allowed: str, policy_field: str
) -> list[tuple[str, str]]:
    keyed = "has(t.key) && t.key != ''"
    tols = f"{path}.tolerations"
    bad = f"{tols}.filter(t, {keyed} && !(t.key in {allowed})).map(t, t.key)"
    return [
        (
            f"params.spec.allowKeylessTolerations || !({_has(tols)}) || {tols}.all(t, {keyed})",
            _cel_str(
                f"{field}: a toleration without a key tolerates every taint and is not "
                "allowed in namespace "
            )
            + " + request.namespace + "
            + _cel_str(
                ": name the taint's key, or ask the hub admin to set FederationPolicy "
                f"{POLICY_NAME}.spec.allowKeylessTolerations: true"
            ),
        ),
        (
            f"!({_has(tols)}) || {bad}.size() == 0",
            _cel_not_allowed(
                f"{field}: toleration keys [",
                f"{bad}.join(', ')",
                "] are not allowed",
                "use keys in",
                allowed,
                policy_field,
            ),
        ),
    ]


_PLATFORM_KEY_RE: Final = "^([^/]*\\.)?(" + "|".join(re.escape(d) for d in PLATFORM_DOMAINS) + ")/"


def _key_rules(field: str, keys: str, allowed: str, policy_field: str) -> list[tuple[str, str]]:
    ours = f"{keys}.filter(k, k.matches({_cel_str(_PLATFORM_KEY_RE)}))"
    bad = (
        f"{keys}.filter(k, !k.matches({_cel_str(_PLATFORM_KEY_RE)}) && "
        f"!{allowed}.exists(p, k.startsWith(p)))"
    )
    present = _has(keys)
    return [
        (
            f"!({present}) || {ours}.size() == 0",
            _cel_str(f"{field}: keys [")
            + f" + {ours}.join(', ') + "
            + _cel_str(f"] are the platform's own (under {PLATFORM_DOMAINS_TEXT}): remove them"),
        ),
        (
            f"!({present}) || {bad}.size() == 0",
            _cel_not_allowed(
                f"{field}: keys [",
                f"{bad}.join(', ')",
                "] are not allowed",
                "use keys starting with one of",
                allowed,
                policy_field,
            ),
        ),
    ]


def _pod_rules(side: str) -> list[tuple[str, str]]:
    field = f"spec.{side}.pod"
    pod = f"object.spec.{side}.pod"
    prio = f"{pod}.priorityClassName"
    sched = f"{pod}.schedulerName"
    schedulers = f"([{_cel_str(DEFAULT_SCHEDULER)}] + params.spec.allowedSchedulerNames)"
    node_keys = "params.spec.allowedNodeSelectorKeys"
    bad_nodes = f"{pod}.nodeSelector.filter(k, !(k in {node_keys}))"
    return [
        (
            f"!({_has(prio)}) || {prio} in params.spec.allowedPriorityClasses",
            _cel_not_allowed(
                f"{field}.priorityClassName: PriorityClass ",
                prio,
                " is not allowed",
                "remove it or use one of",
                "params.spec.allowedPriorityClasses",
                "allowedPriorityClasses",
            ),
        ),
        (
            f"!({_has(sched)}) || {sched} in {schedulers}",
            _cel_not_allowed(
                f"{field}.schedulerName: scheduler ",
                sched,
                " is not allowed",
                "remove it or use one of",
                schedulers,
                "allowedSchedulerNames",
            ),
        ),
        *_toleration_rules(
            f"{field}.tolerations",
            pod,
            "params.spec.allowedTolerationKeys",
            "allowedTolerationKeys",
        ),
        (
            f"!({_has(pod + '.nodeSelector')}) || {bad_nodes}.size() == 0",
            _cel_not_allowed(
                f"{field}.nodeSelector: node label keys [",
                f"{bad_nodes}.join(', ')",
                "] are not allowed",
                "use keys in",
                node_keys,
                "allowedNodeSelectorKeys",
            ),
        ),
        *_key_rules(
            f"{field}.labels",
            f"{pod}.labels",
            "params.spec.allowedLabelPrefixes",
            "allowedLabelPrefixes",
        ),
        *_key_rules(
            f"{field}.annotations",
            f"{pod}.annotations",
            "params.spec.allowedAnnotationPrefixes",
            "allowedAnnotationPrefixes",
        ),
    ]


# A request or limit `m[k]` over the caps (the same rule as `over_cap`).
_OVER_CAP: Final = (
    "(k in params.spec.maxPodResources ? quantity(string(m[k])).compareTo("
    "quantity(string(params.spec.maxPodResources[k]))) > 0 : !(k in "
    + _cel_list(UNCAPPED_RESOURCES)
    + "))"
)


def _resource_rules() -> list[tuple[str, str]]:
    caps = "params.spec.maxPodResources"
    shown = f"{caps}.map(k, k + '=' + string({caps}[k])).join(', ')"
    out = []
    places = [
        ("spec.server.resources", "object.spec.server.resources", False),
        ("spec.client.resources", "object.spec.client.resources", False),
        ("spec.client.overrides[].resources", "object.spec.client.overrides", True),
    ]
    for field, path, per_override in places:
        for part in ("requests", "limits"):
            if per_override:
                maps = (
                    f"({_has(path)} ? {path}.filter(o, has(o.resources) && "
                    f"has(o.resources.{part})).map(o, o.resources.{part}) : [])"
                )
            else:
                maps = f"({_has(path + '.' + part)} ? [{path}.{part}] : [])"
            bad = f"{maps}.map(m, m.filter(k, {_OVER_CAP}).map(k, k + '=' + string(m[k])))"
            out.append(
                (
                    f"{maps}.all(m, m.all(k, !{_OVER_CAP}))",
                    _cel_str(f"{field}.{part}: [")
                    + f" + {bad}.filter(l, l.size() > 0).map(l, l.join(', ')).join(', ') + "
                    + _cel_str("] are over the caps in namespace ")
                    + " + request.namespace + "
                    + _cel_str(" ([")
                    + f" + {shown} + "
                    + _cel_str(
                        "]; cpu, memory and ephemeral-storage are uncapped unless listed, any "
                        "other resource needs a cap): ask for less"
                    )
                    + " + "
                    + _cel_ask("maxPodResources"),
                )
            )
    return out


# The same names as api.reserved_env, as one regular expression over the upper-cased name.
_RESERVED_ENV_RE: Final = (
    "^("
    + "|".join(re.escape(p) for p in RESERVED_ENV_PREFIXES)
    + ")|("
    + "|".join(re.escape(x) for x in RESERVED_ENV_SUFFIXES)
    + ")$|^("
    + "|".join(re.escape(n) for n in sorted(RESERVED_ENV_NAMES))
    + ")$"
)
_BAD_SEGMENT_RE: Final = "(^|/)\\.\\.?(/|$)|//"


def _clean_path(path: str) -> tuple[str, str]:
    """CEL for `path` (a string) having . or .. or empty segments, and for the platform mounts
    it is under (a list; the same rules as `app_path_problem`)."""
    mounts = _cel_list(constants.PLATFORM_MOUNT_DIRS)
    segments = f"{path}.matches({_cel_str(_BAD_SEGMENT_RE)})"
    under = f"{mounts}.filter(d, {path} == d || {path}.startsWith(d + '/'))"
    return segments, under


def _path_rules(field: str, path: str, skip: str, shown: str = "") -> list[tuple[str, str]]:
    """The two rules every path a tenant names obeys, whatever the policy (unless `skip`);
    the messages show `shown` (CEL; default: `path`), as the tenant wrote it."""
    segments, under = _clean_path(path)
    shown = shown or path
    return [
        (
            f"{skip} || !{segments}",
            f"'{field}: ' + {shown} + "
            + _cel_str(" has . or .. segments or an empty one: write it without them"),
        ),
        (
            f"{skip} || {segments} || {under}.size() == 0",
            f"'{field}: ' + {shown} + "
            + _cel_str(" is under the platform's mount ")
            + f" + {under}[0] + "
            + _cel_str(
                " (tenants may have written there, or it holds secrets): use a directory "
                "inside the server image"
            ),
        ),
    ]


def _run_rules() -> list[tuple[str, str]]:
    app = "object.spec.server.app"
    path = f"{app}.path"
    segments, under = _clean_path(path)
    overrides = "object.spec.client.overrides"
    allowed_env = (
        "params.spec.allowedEnv.exists(a, a.endsWith('*') ? "
        "e.name.startsWith(a.substring(0, a.size() - 1)) : e.name == a)"
    )
    bad_env = (
        f"({_has(overrides)} ? {overrides}.map(o, has(o.env) ? "
        f"o.env.filter(e, !{allowed_env}).map(e, e.name).join(', ') : '')"
        ".filter(s, s != '') : [])"
    )
    clusters = "object.spec.client.placement.numberOfClusters"
    reserved_env_names = (
        f"{overrides}.map(o, has(o.env) ? o.env.filter(e, e.name.upperAscii().matches("
        f"{_cel_str(_RESERVED_ENV_RE)})).map(e, e.name).join(', ') : '').filter(s, s != '')"
    )
    return [
        (
            "!has(params.spec.maxRounds) || !has(object.spec.server.rounds) || "
            "object.spec.server.rounds <= params.spec.maxRounds",
            "'spec.server.rounds: ' + string(object.spec.server.rounds) + "
            + _cel_str(" is over the cap of ")
            + " + string(params.spec.maxRounds) + "
            + _cel_str(" rounds in namespace ")
            + " + request.namespace + "
            + _cel_str(
                ": ask for fewer, or ask the hub admin to raise FederationPolicy "
                f"{POLICY_NAME}.spec.maxRounds"
            ),
        ),
        (
            f"!has(params.spec.maxClusters) || ({_has(clusters)} && "
            f"{clusters} <= params.spec.maxClusters)",
            "'spec.client.placement.numberOfClusters: ' + "
            f"({_has(clusters)} ? string({clusters}) : 'unset') + "
            + _cel_str(" is over the cap of ")
            + " + string(params.spec.maxClusters) + "
            + _cel_str(" clusters in namespace ")
            + " + request.namespace + "
            + _cel_str(": set it to at most ")
            + " + string(params.spec.maxClusters) + "
            + _cel_str(
                f", or ask the hub admin to raise FederationPolicy {POLICY_NAME}.spec.maxClusters"
            ),
        ),
        *_path_rules("spec.server.app.path", path, f"!has({app})"),
        (
            f"!has({app}) || {segments} || {under}.size() > 0 || "
            f"params.spec.allowedAppPathPrefixes.exists(p, {path}.startsWith(p))",
            _cel_not_allowed(
                "spec.server.app.path: ",
                path,
                " is not allowed",
                "use a path starting with one of",
                "params.spec.allowedAppPathPrefixes",
                "allowedAppPathPrefixes",
            ),
        ),
        (
            f"params.spec.allowInstallDependencies || !({_has(app + '.installDependencies')}) "
            f"|| !{app}.installDependencies",
            _cel_str(
                "spec.server.app.installDependencies: installing dependencies at run time is "
                "not allowed in namespace "
            )
            + " + request.namespace + "
            + _cel_str(
                ": remove installDependencies: true (the images carry the app's "
                "dependencies), or ask the hub admin to set FederationPolicy "
                f"{POLICY_NAME}.spec.allowInstallDependencies: true"
            ),
        ),
        (
            f"!({_has(overrides)}) || {overrides}.all(o, !has(o.env) || "
            f"o.env.all(e, !e.name.upperAscii().matches({_cel_str(_RESERVED_ENV_RE)})))",
            _cel_str("spec.client.overrides[].env: names [")
            + f" + {reserved_env_names}.join(', ') + "
            + _cel_str(
                "] are reserved: the platform sets them, or they hook code into the client's "
                "processes; use other names"
            ),
        ),
        (
            f"{bad_env}.size() == 0",
            _cel_not_allowed(
                "spec.client.overrides[].env: names [",
                f"{bad_env}.join(', ')",
                "] are not allowed",
                "use names in",
                "params.spec.allowedEnv",
                "allowedEnv",
            ),
        ),
    ]


def _s3_rules() -> list[tuple[str, str]]:
    s3 = "object.spec.server.storage.s3"
    buckets = "params.spec.allowedS3Buckets"
    host = f"url({s3}.endpoint).getHostname().lowerAscii()"
    last = f"{host}.split('.')[{host}.split('.').size() - 1]"
    ip_bad = (
        f"ip({host}).isLoopback() || ip({host}).isLinkLocalUnicast() || ip({host}).isUnspecified()"
    )
    internal = (
        f"{host} == 'localhost' || {last} in {_cel_list(INTERNAL_SUFFIXES)} || "
        f"!{host}.contains('.')"
    )
    numeric = f"!{last}.matches('^[a-z]')"
    loopback = _cel_str(" is a loopback, link-local or unspecified address")
    problem = (
        f"isIP({host}) ? ({ip_bad} ? {loopback} : '') : "
        f"({internal}) ? {_cel_str(' is a cluster-internal or single-label name')} : "
        f"{numeric} ? {_cel_str(' ends in a number (a resolver reads it as an address)')} : ''"
    )
    endpoint = f"{s3}.endpoint.lowerAscii()"
    trimmed = (
        f"({endpoint}.endsWith('/') ? {endpoint}.substring(0, {endpoint}.size() - 1) : {endpoint})"
    )
    allowed = (
        "params.spec.allowedS3Endpoints.map(e, e.lowerAscii().endsWith('/') ? "
        "e.lowerAscii().substring(0, e.size() - 1) : e.lowerAscii())"
    )
    init = "object.spec.server.initModel"
    init_bucket = f"{init}.substring(5).split('/')[0]"
    init_path = f"({init}.startsWith('/') ? {init} : '/' + {init})"
    has_endpoint = _has(f"{s3}.endpoint")
    return [
        (
            f"!({_has(s3)}) || {s3}.bucketName in {buckets}",
            _cel_not_allowed(
                "spec.server.storage.s3.bucketName: bucket ",
                f"{s3}.bucketName",
                " is not allowed",
                "use one of",
                buckets,
                "allowedS3Buckets",
            ),
        ),
        (
            f"!({has_endpoint}) || ({problem}) == ''",
            _cel_str("spec.server.storage.s3.endpoint: host ")
            + f" + {host} + ({problem}) + "
            + _cel_str(
                ": S3 endpoints must be outside the cluster's and the node's own addresses; "
                "use the store's public name"
            ),
        ),
        (
            f"!({has_endpoint}) || ({problem}) != '' || {trimmed} in {allowed}",
            _cel_not_allowed(
                "spec.server.storage.s3.endpoint: ",
                f"{s3}.endpoint",
                " is not allowed",
                "use one of",
                allowed,
                "allowedS3Endpoints",
            ),
        ),
        (
            f"!({_has(init)}) || !{init}.startsWith('s3://') || {init_bucket} in {buckets}",
            _cel_not_allowed(
                "spec.server.initModel: bucket ",
                init_bucket,
                " is not allowed",
                "use one of",
                buckets,
                "allowedS3Buckets",
            ),
        ),
        *_path_rules(
            "spec.server.initModel",
            init_path,
            f"!({_has(init)}) || {init}.startsWith('s3://')",
            shown=init,
        ),
    ]


def _cluster_set_rules() -> list[tuple[str, str]]:
    sets, allowed = "object.spec.client.placement.clusterSets", "params.spec.allowedClusterSets"
    named = f"{_has(sets)} && {sets}.size() > 0"
    return [
        (
            f"!has({allowed}) || ({named})",
            _cel_not_allowed(
                "spec.client.placement.clusterSets: ",
                "'unset'",
                " (every set bound to the namespace)",
                "name sets from",
                allowed,
                CLUSTER_SETS,
            ),
        ),
        (
            f"!has({allowed}) || !({named}) || {sets}.all(c, c in {allowed})",
            _cel_not_allowed(
                "spec.client.placement.clusterSets: cluster sets [",
                f"{sets}.filter(c, !(c in {allowed})).join(', ')",
                "] are not allowed",
                "use sets from",
                allowed,
                CLUSTER_SETS,
            ),
        ),
    ]


def _privacy_rules_of(rule: str, applies: str, shown: str) -> list[tuple[str, str]]:
    """CEL for one PrivacyRule (`rule`: its CEL path) that holds when `applies` (CEL); the
    messages name the rule as `shown` (CEL string). The twin of `_privacy_violations`."""
    dp = "object.spec.privacy.differentialPrivacy"
    has_dp = f"({_has(dp)})"
    secagg = f"({_has('object.spec.privacy.secureAggregation')})"
    why = f"{_NS}' (FederationPolicy default.spec.' + {shown} + ')'"
    return [
        (
            f"!({applies}) || !has({rule}.secureAggregation) || !{rule}.secureAggregation || "
            f"{secagg}",
            "'spec.privacy.secureAggregation: secure aggregation is required'"
            f" + {why} + ': set it'",
        ),
        (
            f"!({applies}) || {has_dp}",
            "'spec.privacy.differentialPrivacy: differential privacy is required'"
            f" + {why} + ': set it'",
        ),
        (
            f"!({applies}) || !{has_dp} || !has({rule}.mode) || {dp}.mode == {rule}.mode",
            f"'spec.privacy.differentialPrivacy.mode: ' + {dp}.mode + ' is not allowed' + {why}"
            f" + ': use ' + {rule}.mode",
        ),
        (
            f"!({applies}) || !{has_dp} || !has({rule}.maxClippingNorm) || "
            f"double({dp}.clippingNorm) <= double({rule}.maxClippingNorm)",
            f"'spec.privacy.differentialPrivacy.clippingNorm: ' + string({dp}.clippingNorm) + "
            f"' is too large' + {why} + ': use at most ' + string({rule}.maxClippingNorm)",
        ),
        (
            f"!({applies}) || !{has_dp} || !has({rule}.maxClippingNorm) || "
            f"!has({dp}.clipping) || {dp}.clipping != 'adaptive'",
            "'spec.privacy.differentialPrivacy.clipping: adaptive clipping is not allowed' + "
            f"{why} + ' (its norm moves): use fixed'",
        ),
        (
            f"!({applies}) || !{has_dp} || !has({rule}.minNoiseMultiplier) || "
            f"{dp}.mode != 'central' || (has({dp}.noiseMultiplier) && "
            f"double({dp}.noiseMultiplier) >= double({rule}.minNoiseMultiplier))",
            "'spec.privacy.differentialPrivacy.noiseMultiplier is too small' + "
            f"{why} + ': use at least ' + string({rule}.minNoiseMultiplier)",
        ),
        (
            f"!({applies}) || !{has_dp} || !has({rule}.maxEpsilon) || "
            f"{dp}.mode != 'local' || (has({dp}.epsilon) && "
            f"double({dp}.epsilon) <= double({rule}.maxEpsilon))",
            "'spec.privacy.differentialPrivacy.epsilon is too large' + "
            f"{why} + ': use at most ' + string({rule}.maxEpsilon)",
        ),
    ]


def _privacy_rules() -> list[tuple[str, str]]:
    """requirePrivacy, and requirePrivacyForClaims for a dataClaim the spec names (the
    controller also applies it to a data claim it infers from the placement)."""
    claim = "object.spec.client.dataClaim"
    by_claim = "params.spec.requirePrivacyForClaims"
    return [
        *_privacy_rules_of(
            "params.spec.requirePrivacy", "has(params.spec.requirePrivacy)", "'requirePrivacy'"
        ),
        *_privacy_rules_of(
            f"{by_claim}[{claim}]",
            f"has({by_claim}) && has({claim}) && {claim} in {by_claim}",
            f"'requirePrivacyForClaims[' + {claim} + ']'",
        ),
    ]


_POLICY_RULES: Final = (
    *_privacy_rules(),
    *_pod_rules("server"),
    *_pod_rules("client"),
    *_toleration_rules(
        "spec.client.placement.tolerations",
        "object.spec.client.placement",
        "params.spec.allowedPlacementTolerationKeys",
        "allowedPlacementTolerationKeys",
    ),
    *_resource_rules(),
    *_cluster_set_rules(),
    *_run_rules(),
    *_s3_rules(),
)


def admission_policy(name: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy: FederatedLearning specs checked against the namespace's
    FederationPolicy. Only creates and spec changes are checked: a metadata-only update (the
    controller's finalizer and bookkeeping) must pass even after the policy is gone, or a
    resource could never be deleted."""
    return {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": constants.API_VERSION, "kind": KIND},
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [constants.GROUP],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [constants.PLURAL],
                    }
                ]
            },
            "matchConditions": [
                {
                    "name": "spec-created-or-changed",
                    "expression": "request.operation == 'CREATE' || "
                    "!has(oldObject.spec) || oldObject.spec != object.spec",
                }
            ],
            "variables": [{"name": n, "expression": e} for n, e in _VARIABLES],
            "validations": [
                {"expression": e, "messageExpression": m, "reason": "Forbidden"}
                for e, m in (*_VALIDATIONS, *_POLICY_RULES)
            ],
        },
    }


def admission_bindings(policy_name: str, prefix: str) -> list[dict[str, Any]]:
    """The bindings: the FederationPolicy named `default` in the admitted object's namespace.

    A create with no such policy is refused (parameterNotFoundAction Deny); the apiserver's
    message then names only the policy and binding, so the binding's name says the fix. An
    update with no policy passes here (the controller refuses it): Deny would also refuse the
    controller's own finalizer removal when a namespace is deleted policy first.
    """
    out = []
    for operation, suffix, action in (
        ("CREATE", "needs-federationpolicy-default-in-namespace", "Deny"),
        ("UPDATE", "federation-policy-updates", "Allow"),
    ):
        out.append(
            {
                "apiVersion": ADMISSION_API_VERSION,
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": f"{prefix}-{suffix}"},
                "spec": {
                    "policyName": policy_name,
                    "validationActions": ["Deny"],
                    "paramRef": {"name": POLICY_NAME, "parameterNotFoundAction": action},
                    "matchResources": {
                        "resourceRules": [
                            {
                                "apiGroups": [constants.GROUP],
                                "apiVersions": ["*"],
                                "operations": [operation],
                                "resources": [constants.PLURAL],
                            }
                        ]
                    },
                },
            }
        )
    return out


def admission_objects(prefix: str) -> list[dict[str, Any]]:
    """The policy and its two bindings, named from `prefix` (the chart's full name)."""
    name = f"{prefix}-federation-policy"
    return [admission_policy(name), *admission_bindings(name, prefix)]
