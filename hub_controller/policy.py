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

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from pydantic.alias_generators import to_camel

from hub_controller.api import FederatedLearningSpec, StorageType, data_claim_of
from ocmfl import constants

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
ImagePrefix = Annotated[str, StringConstraints(min_length=1)]
ClaimName = Annotated[str, StringConstraints(max_length=253, pattern=_DNS_SUBDOMAIN)]
Domain = Annotated[str, StringConstraints(max_length=253, pattern=_DOMAIN_OR_IP)]


class FederationPolicySpec(BaseModel):
    """What FederatedLearning resources in this namespace may use. Unset lists allow nothing."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    allowed_image_prefixes: list[ImagePrefix] = Field(
        default_factory=list,
        json_schema_extra={"default": []},
        description="spec.server.image and spec.client.image must start with one of these, "
        "e.g. quay.io/ocm-fl/ (end a registry path with / so quay.io/ocm-fl-evil/ does not "
        "match).",
    )
    allowed_data_claims: list[ClaimName] = Field(
        default_factory=list,
        json_schema_extra={"default": []},
        description="ClusterClaim names this namespace may use as its data claim "
        "(spec.client.dataClaim, or the one the placement selects when dataClaim is unset).",
    )
    allow_writable_data_mount: bool = Field(
        default=False,
        description="Allow spec.client.dataMount.readOnly: false (clients may write to the "
        "clusters' data).",
    )
    allow_host_path_store: bool = Field(
        default=False,
        description="Allow spec.server.storage.type HostPath (a directory on a hub node).",
    )
    allowed_advertise_domains: list[Domain] = Field(
        default_factory=list,
        json_schema_extra={"default": []},
        description="DNS suffixes spec.server.advertiseAddress may use: its host must equal "
        "one or be a subdomain of one (an IP address entry matches only that address). "
        "Empty: advertiseAddress is refused.",
    )


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
                for e, m in _VALIDATIONS
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
