"""Every Kubernetes permission the hub controller + aggregator needs, declared in one place.

The Helm chart (deploy/helm/ocm-federated-learning/templates/rbac.yaml) grants these;
tests/unit/test_deploy.py renders the chart and fails when a rule below is not covered, and
when controller code names a resource that is missing here. Add a rule here first when the
controller starts calling a new API.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from ocmfl import constants

# Default name of the CA Secret in the hub's namespace (chart value ca.secretName).
DEFAULT_CA_SECRET: Final = "ocm-fl-ca"

READ: Final = ("get", "list", "watch")
WRITE: Final = ("create", "update", "patch", "delete")
CRUD: Final = READ + WRITE


class Scope(StrEnum):
    """Where a rule must hold."""

    CLUSTER = "cluster"  # cluster-wide (ClusterRole)
    FL_NAMESPACES = "fl-namespaces"  # every namespace holding FederatedLearning resources
    RELEASE_NAMESPACE = "release-namespace"  # the hub's own namespace


@dataclass(frozen=True)
class Rule:
    """One RBAC permission: verbs on group/resource (optionally only some names) in a scope."""

    group: str
    resource: str
    verbs: tuple[str, ...]
    scope: Scope = Scope.CLUSTER
    resource_names: tuple[str, ...] = ()
    why: str = ""


HUB_RULES: Final[tuple[Rule, ...]] = (
    # The FederatedLearning API.
    Rule(constants.GROUP, constants.PLURAL, (*READ, "update", "patch"), why="reconcile, finalizer"),
    Rule(constants.GROUP, f"{constants.PLURAL}/status", ("get", "update", "patch"), why="status"),
    # The hub admin's tenant policy (hub_controller/policy.py): read, never written.
    Rule(constants.GROUP, constants.POLICY_PLURAL, READ, why="tenant policy per namespace"),
    # kopf itself: discovers CRDs, watches namespaces, posts events on the objects it handles.
    Rule("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch"), why="kopf scan"),
    Rule("", "namespaces", ("list", "watch"), why="kopf namespace discovery"),
    Rule("events.k8s.io", "events", ("create",), why="kopf events (new API)"),
    Rule("", "events", ("create",), why="kopf events"),
    # OCM: one Placement per resource (in its namespace), its decisions, the chosen clusters.
    Rule(constants.CLUSTER_GROUP, "placements", CRUD, why="Placement per FederatedLearning"),
    Rule(constants.CLUSTER_GROUP, "placementdecisions", READ, why="chosen clusters"),
    Rule(constants.CLUSTER_GROUP, "managedclusters", READ, why="cluster claims and health"),
    Rule(constants.CLUSTER_GROUP, "managedclustersetbindings", READ, why="explain no decisions"),
    # One ManifestWork per chosen cluster, in that cluster's namespace on the hub.
    Rule(constants.WORK_GROUP, "manifestworks", CRUD, why="per-cluster FL client"),
    Rule(constants.ADDON_GROUP, "managedclusteraddons", READ, why="agent available?"),
    # The FL server side on the hub, next to the FederatedLearning resource. kopf indexes
    # watch Jobs, Services and Pods cluster-wide (by label); writes stay in FL namespaces.
    Rule("batch", "jobs", READ, why="kopf index of server Jobs"),
    Rule("", "services", READ, why="kopf index of server Services"),
    Rule("", "pods", READ, why="kopf index of server pods"),
    Rule("batch", "jobs", CRUD, Scope.FL_NAMESPACES, why="FL server Job"),
    Rule("", "services", CRUD, Scope.FL_NAMESPACES, why="FL server Service"),
    Rule("", "secrets", CRUD, Scope.FL_NAMESPACES, why="server TLS, node keys"),
    Rule("", "configmaps", CRUD, Scope.FL_NAMESPACES, why="server config"),
    Rule("", "persistentvolumeclaims", CRUD, Scope.FL_NAMESPACES, why="model storage"),
    # The CA Secret, read by the CSR signer (only that Secret).
    Rule(
        "",
        "secrets",
        ("get",),
        Scope.RELEASE_NAMESPACE,
        resource_names=(DEFAULT_CA_SECRET,),
        why="CA for the CSR signer",
    ),
    # The project's own CSR signer for agent identities (same signer name as OCM's CustomSigner).
    Rule("certificates.k8s.io", "certificatesigningrequests", READ, why="agent CSRs"),
    Rule(
        "certificates.k8s.io",
        "certificatesigningrequests/approval",
        ("update",),
        why="approve agent CSRs",
    ),
    Rule(
        "certificates.k8s.io",
        "certificatesigningrequests/status",
        ("update", "patch"),
        why="write the signed certificate",
    ),
    Rule(
        "certificates.k8s.io",
        "signers",
        ("approve", "sign"),
        resource_names=(constants.SIGNER_NAME, constants.FLEET_SIGNER_NAME),
        why="only our signers",
    ),
    # Its own namespace: leader lease (if enabled).
    Rule("coordination.k8s.io", "leases", CRUD, Scope.RELEASE_NAMESPACE, why="leader lease"),
)

# The CA init hook Job (chart hook): create the CA Secret if absent, publish the CA certificate
# into the AddOnDeploymentConfig. Only in the release namespace.
CA_INIT_RULES: Final[tuple[Rule, ...]] = (
    Rule("", "secrets", ("get", "create"), Scope.RELEASE_NAMESPACE, why="CA Secret"),
    Rule(
        constants.ADDON_GROUP,
        "addondeploymentconfigs",
        ("get", "patch"),
        Scope.RELEASE_NAMESPACE,
        why="publish HUB_CA_BUNDLE",
    ),
)


def resources(rules: tuple[Rule, ...] = HUB_RULES) -> set[tuple[str, str]]:
    """The (group, resource) pairs the rules mention."""
    return {(r.group, r.resource) for r in rules}
