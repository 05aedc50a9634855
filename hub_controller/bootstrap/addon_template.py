"""The OCM side of agent identities: the AddOnTemplate CustomSigner registration.

OCM's addon manager approves and signs each agent's CSR for `constants.SIGNER_NAME` with the
CA in the `signingCA` Secret (kubernetes.io/tls, RSA key); the agent finds the result
(tls.crt, tls.key; no CA) mounted at `agent_cert_dir()`, renewed before expiry.

Why no `subject` by default: OCM (v1.2/v1.3, templateagent/registration.go) copies a
configured subject verbatim for every cluster, with no {{CLUSTER_NAME}} substitution, so
all clusters would share one identity. Without it OCM uses its default subject
(`default_agent_subject`), which names the cluster; `ocmfl.pki.cluster_from_subject`
accepts exactly that form (and our own CN=cluster:<name> form).
"""

from __future__ import annotations

from typing import Any

from ocmfl import constants


def agent_cert_dir(signer_name: str = constants.SIGNER_NAME) -> str:
    """Where the template addon mounts the signed client cert: /managed/<signer, / -> ->."""
    return "/managed/" + signer_name.replace("/", "-")


def agent_cert_secret_name(
    addon_name: str = constants.ADDON_NAME, signer_name: str = constants.SIGNER_NAME
) -> str:
    """The Secret OCM writes on the managed cluster: <addon>-<signer, / -> ->-client-cert."""
    return f"{addon_name}-{signer_name.replace('/', '-')}-client-cert"


def default_agent_subject(
    cluster: str, addon_name: str = constants.ADDON_NAME, agent_name: str | None = None
) -> dict[str, Any]:
    """OCM's default addon subject for `cluster` (addon-framework agent.DefaultUser/Groups)."""
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


def custom_signer_registration(
    signing_ca_name: str,
    signing_ca_namespace: str = constants.HUB_NAMESPACE,
    *,
    signer_name: str = constants.SIGNER_NAME,
    subject: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """`spec.registration` of the AddOnTemplate: one CustomSigner entry.

    Pass `subject` ({user, groups, organizationUnit}) only if one identity for all clusters
    is really wanted; see the module docstring.
    """
    custom: dict[str, Any] = {
        "signerName": signer_name,
        "signingCA": {"name": signing_ca_name, "namespace": signing_ca_namespace},
    }
    if subject is not None:
        custom["subject"] = subject
    return [{"type": "CustomSigner", "customSigner": custom}]


# The agent's hub kubeconfig (OCM mounts it at {{HUB_KUBECONFIG}}): the agent asks the hub's
# Fleet signer for its clients' certificates with it (agent_addon.fleet_identity), so the
# clients' keys are made on the cluster. Its identity's groups include
# agent_group(cluster), which the Fleet signer checks; the chart's rbac.yaml lets the addon's
# group create CSRs. No hubPermissions: CSRs are cluster-scoped, a RoleBinding cannot grant them.
KUBE_CLIENT_REGISTRATION: dict[str, Any] = {"type": "KubeClient"}


def addon_registrations(
    signing_ca_name: str, signing_ca_namespace: str = constants.HUB_NAMESPACE, **kwargs: Any
) -> list[dict[str, Any]]:
    """The AddOnTemplate's whole `spec.registration`: the CustomSigner agent identity
    (reports to the aggregator) and a KubeClient hub kubeconfig (Fleet CSRs)."""
    return [
        *custom_signer_registration(signing_ca_name, signing_ca_namespace, **kwargs),
        dict(KUBE_CLIENT_REGISTRATION),
    ]
