"""Every Kubernetes permission the hub's two parts need, declared in one place: the controller
(operator + aggregator, CONTROLLER_RULES) and the signer (SIGNER_RULES), each with its own
ServiceAccount in the chart.

The Helm chart (deploy/helm/ocm-federated-learning/templates/rbac.yaml) grants these;
tests/unit/test_deploy.py renders the chart and fails when a rule below is not covered for
that part's ServiceAccount, and when a part's code names a resource that is missing here. Add
a rule here first when a part starts calling a new API.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from hub_controller.credentials_layout import FLEET_CA_SHARDS, fleet_ca_secret_name
from ocmfl import constants, csroutcome

# Default names of the two CA Secrets in the hub's namespace (chart values ca.secretName,
# agentCA.secretName): the hub CA (aggregator server certificate) and the agent CA (agent
# client certificates). The signer part mounts both; no part reads them through the API.
DEFAULT_CA_SECRET: Final = "ocm-fl-ca"
DEFAULT_AGENT_CA_SECRET: Final = "ocm-fl-agent-ca"

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


# kopf itself, in either part: discovers CRDs, watches namespaces, posts events on the
# objects it handles.
_KOPF: Final[tuple[Rule, ...]] = (
    Rule("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch"), why="kopf scan"),
    Rule("", "namespaces", ("list", "watch"), why="kopf namespace discovery"),
    Rule("events.k8s.io", "events", ("create",), why="kopf events (new API)"),
    Rule("", "events", ("create",), why="kopf events"),
)
# Addon membership (hub_controller/membership_indexes.py), in either part: the clusters, the
# addon's ManagedClusterAddOns, and OCM's addon hub-credential CSRs
# (kubernetes.io/kube-apiserver-client), which the hub only watches.
_MEMBERSHIP: Final[tuple[Rule, ...]] = (
    Rule(constants.CLUSTER_GROUP, "managedclusters", READ, why="cluster claims and health"),
    Rule(constants.ADDON_GROUP, "managedclusteraddons", READ, why="addon members, ledger"),
    Rule(
        "certificates.k8s.io",
        "certificatesigningrequests",
        READ,
        why="addon hub-credential CSRs (watched only); agent and Fleet CSRs",
    ),
)

# `ocm-fl-hub --role controller`: the operator and the aggregator. It parses tenant specs and
# serves gRPC, so it gets no CA key and no way to sign anything.
CONTROLLER_RULES: Final[tuple[Rule, ...]] = (
    *_KOPF,
    *_MEMBERSHIP,
    # The FederatedLearning API.
    Rule(constants.GROUP, constants.PLURAL, (*READ, "update", "patch"), why="reconcile, finalizer"),
    Rule(constants.GROUP, f"{constants.PLURAL}/status", ("get", "update", "patch"), why="status"),
    # The hub admin's tenant policy (hub_controller/policy.py): read, never written.
    Rule(constants.GROUP, constants.POLICY_PLURAL, READ, why="tenant policy per namespace"),
    # OCM: one Placement per resource (in its namespace), its decisions, the chosen clusters.
    Rule(constants.CLUSTER_GROUP, "placements", CRUD, why="Placement per FederatedLearning"),
    Rule(constants.CLUSTER_GROUP, "placementdecisions", READ, why="chosen clusters"),
    Rule(constants.CLUSTER_GROUP, "managedclustersetbindings", READ, why="explain no decisions"),
    # One ManifestWork per chosen cluster, in that cluster's namespace on the hub.
    Rule(constants.WORK_GROUP, "manifestworks", CRUD, why="per-cluster FL client"),
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
    # Its own namespace: leader lease (if enabled), the /metrics token it makes once, and the
    # aggregator's server certificate, which the signer keeps (read by name only).
    Rule("coordination.k8s.io", "leases", CRUD, Scope.RELEASE_NAMESPACE, why="leader lease"),
    Rule(
        "",
        "secrets",
        ("get",),
        Scope.RELEASE_NAMESPACE,
        resource_names=(constants.METRICS_TOKEN_SECRET, constants.AGGREGATOR_TLS_SECRET),
        why="the /metrics bearer token, the aggregator's certificate",
    ),
    Rule("", "secrets", ("create",), Scope.RELEASE_NAMESPACE, why="the /metrics token, once"),
)

# `ocm-fl-hub --role signer`: the CSR signers (agent and Fleet identities), the hub-identity
# ledger, the addon condition, the aggregator's certificate. The only part with the hub CA's
# and the agent CA's keys (mounted; never read through the API).
SIGNER_RULES: Final[tuple[Rule, ...]] = (
    *_KOPF,
    *_MEMBERSHIP,
    # The hub-identity ledger annotation (hub_controller/signer/ledger.py); only the hub
    # writes it (registration agents may patch only managedclusteraddons/status).
    Rule(constants.ADDON_GROUP, "managedclusteraddons", ("patch",), why="hub-identity ledger"),
    # Its own condition on each (why the agent has no identity: signer/addon_status.py).
    Rule(constants.ADDON_GROUP, "managedclusteraddons/status", ("patch",), why="agent condition"),
    # A Fleet CSR's federation must have a ManifestWork on the requesting cluster.
    Rule(constants.WORK_GROUP, "manifestworks", ("get", "list"), why="Fleet CSR's federation"),
    # CSRs: it may approve and sign for its own two signers, nothing else.
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
    # Each federation's credentials Secret (the server certificates written into it, read by
    # name) and its enrolled-keys shards.
    Rule("", "secrets", ("get", "create", "patch"), Scope.FL_NAMESPACES, why="server certs, keys"),
    # Federations: each one's credentials Secret is read on its events; a Fleet CA outlives
    # no federation.
    Rule(constants.GROUP, constants.PLURAL, READ, why="federations' server certificates"),
    # Each CSR's outcome, in the requesting cluster's namespace (signer/csr_outcome.py):
    # created once, immutable; never changed or deleted (the garbage collector does that).
    Rule("", "configmaps", ("create",), why="CSR outcomes for the agents"),
    # ... and the RoleBinding there for that cluster's agent user: only the outcome reader
    # role may be bound (the apiserver's escalation check).
    Rule("rbac.authorization.k8s.io", "rolebindings", ("create",), why="outcome reader"),
    Rule(
        "rbac.authorization.k8s.io",
        "clusterroles",
        ("bind",),
        resource_names=(csroutcome.READER_ROLE,),
        why="outcome reader, nothing else",
    ),
    # In its own namespace: the aggregator's server certificate and the federations' Fleet CAs
    # (fixed shard names), by name: the CA Secrets there stay unreadable through the API
    # (create cannot be limited by name; get and update are).
    Rule(
        "",
        "secrets",
        ("get", "update"),
        Scope.RELEASE_NAMESPACE,
        resource_names=(
            constants.AGGREGATOR_TLS_SECRET,
            *(fleet_ca_secret_name(i) for i in range(FLEET_CA_SHARDS)),
        ),
        why="the aggregator's certificate, Fleet CAs",
    ),
    Rule("", "secrets", ("create",), Scope.RELEASE_NAMESPACE, why="the aggregator's certificate"),
)

# One `ocm-fl-hub` running both parts (`--role all`, the local plane's hub) needs both.
HUB_RULES: Final[tuple[Rule, ...]] = (*CONTROLLER_RULES, *SIGNER_RULES)

# The CA init hook Job (chart hook): create the CA Secrets (hub CA, agent CA) if absent,
# publish the hub CA certificate into the AddOnDeploymentConfig. Only in the release namespace.
CA_INIT_RULES: Final[tuple[Rule, ...]] = (
    Rule("", "secrets", ("get", "create"), Scope.RELEASE_NAMESPACE, why="CA Secrets"),
    Rule(
        constants.ADDON_GROUP,
        "addondeploymentconfigs",
        ("get", "patch"),
        Scope.RELEASE_NAMESPACE,
        why="publish HUB_CA_BUNDLE",
    ),
)


# Every cluster's addon agent on the hub (its KubeClient hub kubeconfig, group
# system:open-cluster-management:addon:<addon>): create its CSRs, nothing else; it cannot read
# them, so it sees no other cluster's (agent_addon/csr.py, agent_addon/fleet_identity.py).
AGENT_HUB_RULES: Final[tuple[Rule, ...]] = (
    Rule(
        "certificates.k8s.io",
        "certificatesigningrequests",
        ("create",),
        why="the agent's own and its clients' Fleet CSRs",
    ),
)
# In its own cluster namespace only (the signer binds the role there to that cluster's agent
# user): the outcomes the signers mirror (ocmfl/csroutcome.py).
AGENT_CLUSTER_NAMESPACE_RULES: Final[tuple[Rule, ...]] = (
    Rule("", "configmaps", ("get",), why="the outcomes of its own CSRs"),
)


def resources(rules: tuple[Rule, ...] = HUB_RULES) -> set[tuple[str, str]]:
    """The (group, resource) pairs the rules mention."""
    return {(r.group, r.resource) for r in rules}
