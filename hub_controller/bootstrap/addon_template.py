"""The OCM side of agent identities: what the AddOnTemplate registers (the chart carries it;
tests/unit/test_deploy.py keeps the two equal).

One registration only, `KubeClient`: OCM's registration agent on each cluster asks the hub
for a client certificate with the addon agent's default identity (`default_agent_subject`),
OCM's addon manager approves it, the hub's kube-controller-manager signs it
(kubernetes.io/kube-apiserver-client), and the agent gets a hub kubeconfig: Secret
`constants.HUB_KUBECONFIG_SECRET` (kubeconfig, tls.crt, tls.key), mounted at the directory of
{{HUB_KUBECONFIG}} (`/managed/hub-kubeconfig/kubeconfig`; the kubeconfig names the
certificate files relative to itself), renewed by the registration agent.

No `CustomSigner`: OCM v1.2's addon manager approves every CSR of a custom signer without
looking at the requester (ocm pkg/addon/templateagent/registration.go,
`CustomerSignerCSRApprover`) and signs the subject and SANs the CSR asks for, so anyone with a
bootstrap or cluster identity could get a certificate of the signing CA for any name. The
agent's aggregator identity comes only from the project's own signer (hub_controller/signer),
which OCM never signs for, with the agent kubeconfig above as the requester.
"""

from __future__ import annotations

from typing import Any, Final

from ocmfl import constants

# The agent's hub kubeconfig. Its identity's groups include agent_group(cluster); the chart's
# rbac.yaml lets the addon's group create CSRs (cluster-scoped: a RoleBinding cannot grant
# them). No hubPermissions: OCM v1.2 binds them to every group of the addon's subject
# (templateagent/registration.go buildSubjectsFromRegistration), which includes
# `system:open-cluster-management:addon:<addon>`, every cluster's agent; so a "CurrentCluster"
# grant reaches all clusters. The hub's signer binds the CSR-outcome reader in each cluster's
# namespace to that cluster's agent user alone (hub_controller/signer/csr_outcome.py).
KUBE_CLIENT_REGISTRATION: Final[dict[str, Any]] = {"type": "KubeClient"}

# Where OCM mounts it in the agent's pod ({{HUB_KUBECONFIG}}).
HUB_KUBECONFIG_PATH: Final = "/managed/hub-kubeconfig/kubeconfig"


def default_agent_subject(
    cluster: str, addon_name: str = constants.ADDON_NAME, agent_name: str | None = None
) -> dict[str, Any]:
    """OCM's default addon subject for `cluster` (addon-framework agent.DefaultUser/Groups;
    the template addon's agent name is `<addon>-agent`): the user and groups of the agent's
    hub kubeconfig."""
    agent = agent_name or f"{addon_name}-agent"
    return {
        "user": f"system:open-cluster-management:cluster:{cluster}:addon:{addon_name}"
        f":agent:{agent}",
        "groups": [
            f"system:open-cluster-management:cluster:{cluster}:addon:{addon_name}",
            f"system:open-cluster-management:addon:{addon_name}",
            "system:authenticated",
        ],
    }


def addon_registrations() -> list[dict[str, Any]]:
    """The AddOnTemplate's whole `spec.registration`: the KubeClient hub kubeconfig only."""
    return [dict(KUBE_CLIENT_REGISTRATION)]
