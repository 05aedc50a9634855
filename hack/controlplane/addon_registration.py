"""The addon part of OCM's registration agent, for kubelet nodes (TEST INFRASTRUCTURE).

On a real managed cluster OCM's registration agent makes a key for each addon registration,
sends a CSR with the subject the hub wrote into the ManagedClusterAddOn's status, and stores
the signed certificate and the key in the Secret the addon manager mounts into the agent:
`<addon>-<signer>-client-cert` for a `CustomSigner` registration, `<addon>-hub-kubeconfig`
(a kubeconfig for the hub beside them) for a `KubeClient` one. It sends the CSRs as the
cluster's registration identity (`system:open-cluster-management:<cluster>:...`, which OCM's
addon manager checks before approving a KubeClient CSR): impersonated here. The hub's
registration controller labels the ManagedCluster
`feature.open-cluster-management.io/addon-<addon>` from the addon's Available condition. The
plane runs neither, so this does both, the same way: the key is made here on the cluster side
and never goes to the hub; OCM's real addon manager approves the CSRs; it signs the
CustomSigner ones with the chart's CA, the hub's kube-controller-manager the KubeClient ones.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
import time
import warnings
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID

from ocmfl import constants, pki
from ocmfl.kube import Kube, KubeError, Obj

log = logging.getLogger(__name__)

ADDON_API = f"/apis/{constants.ADDON_GROUP}/v1alpha1"
KUBE_CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client"
KUBE_SIGNERS = (KUBE_CLIENT_SIGNER, "kubernetes.io/kubelet-serving")
MANAGED_CLUSTERS_GROUP = "system:open-cluster-management:managed-clusters"
# What the registration agent may do on the hub for its addons (OCM's hub grants its clusters'
# agents this and more): send CSRs and read their answers.
REGISTRATION_ROLE = "ocmfl:local:addon-registration"
FEATURE_LABEL = "feature.open-cluster-management.io/addon-{}"
RENEW_FRACTION = 0.2  # renew when less than this part of the lifetime is left


def secret_name(addon: str, signer: str) -> str:
    """The Secret the addon manager mounts for a custom-signer registration (OCM's rule)."""
    return f"{addon}-{signer.replace('/', '-')}-client-cert"


def hub_kubeconfig_secret_name(addon: str) -> str:
    """The Secret the addon manager mounts for a KubeClient registration (OCM's rule)."""
    return f"{addon}-hub-kubeconfig"


def registration_user(cluster: str) -> str:
    """The registration agent's hub identity, as OCM names it."""
    return f"system:open-cluster-management:{cluster}:registration-agent"


def hub_kubeconfig(server: str, ca_pem: bytes) -> str:
    """The kubeconfig the registration agent writes beside tls.crt and tls.key."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "hub",
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                    },
                }
            ],
            "users": [
                {"name": "user", "user": {"client-certificate": "tls.crt", "client-key": "tls.key"}}
            ],
            "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "user"}}],
            "current-context": "hub",
        }
    )


def make_csr(user: str, groups: list[str]) -> tuple[bytes, bytes]:
    """A CSR PEM for `user` in `groups` (as an OCM registration agent makes it) and its key PEM."""
    key = pki.generate_key("ec")
    # OCM's default user is longer than X.509's 64-character CN bound; Go does not enforce it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Attribute's length", category=UserWarning)
        name = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, user, _validate=False)]
            + [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g, _validate=False) for g in groups]
        )
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())
    return pki.csr_to_pem(csr), pki.key_to_pem(key)


class AddonRegistration:
    """One thread per cluster: certificates for its addons, and the hub's feature labels."""

    def __init__(
        self,
        cluster: str,
        cluster_kube: Kube,
        hub: Kube,
        stop: threading.Event,
        hub_server: str,
        hub_ca_pem: bytes,
    ) -> None:
        self.cluster = cluster
        self.kube = cluster_kube
        self.hub = hub
        self.stop = stop
        self.hub_server = hub_server  # where the cluster's pods reach the hub apiserver
        self.hub_ca_pem = hub_ca_pem
        self.rbac_done = False
        self.thread = threading.Thread(target=self._run, name=f"addon-reg-{cluster}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(2.0):
            try:
                self.sync()
            except (KubeError, OSError, ValueError) as e:
                log.warning("addon registration %s: %s; retrying", self.cluster, e)
            except Exception:  # keep going whatever happens; the log says why
                log.exception("addon registration %s crashed; retrying", self.cluster)

    def sync(self) -> None:
        got = self.hub.get(f"{ADDON_API}/namespaces/{self.cluster}/managedclusteraddons") or {}
        labels: dict[str, str | None] = {}
        for mca in got.get("items") or []:
            addon = mca["metadata"]["name"]
            status = mca.get("status") or {}
            namespace = status.get("namespace") or (mca.get("spec") or {}).get(
                "installNamespace", constants.AGENT_NAMESPACE
            )
            for reg in status.get("registrations") or []:
                signer = reg.get("signerName")
                if signer == KUBE_CLIENT_SIGNER:
                    self._certificate(addon, namespace, reg, hub_kubeconfig_secret_name(addon))
                elif signer and signer not in KUBE_SIGNERS:
                    self._certificate(addon, namespace, reg, secret_name(addon, signer))
            available = next(
                (c for c in status.get("conditions") or [] if c["type"] == "Available"), None
            )
            state = None
            if available is not None:
                state = "available" if available["status"] == "True" else "unhealthy"
            labels[FEATURE_LABEL.format(addon)] = state
        self._label(labels)

    def _label(self, want: dict[str, str | None]) -> None:
        mc = self.hub.get(f"/apis/{constants.CLUSTER_GROUP}/v1/managedclusters/{self.cluster}")
        if mc is None:
            return
        have = mc["metadata"].get("labels") or {}
        prefix = FEATURE_LABEL.format("")
        gone = {k: None for k in have if k.startswith(prefix) and k not in want}
        patch = {k: v for k, v in {**want, **gone}.items() if have.get(k) != v}
        if patch:
            self.hub.patch(
                f"/apis/{constants.CLUSTER_GROUP}/v1/managedclusters/{self.cluster}",
                {"metadata": {"labels": patch}},
            )

    def _registration_rbac(self) -> None:
        """Let the registration identities send CSRs (once per supervisor)."""
        if self.rbac_done:
            return
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": REGISTRATION_ROLE},
            "rules": [
                {
                    "apiGroups": ["certificates.k8s.io"],
                    "resources": ["certificatesigningrequests"],
                    "verbs": ["create", "get", "list", "watch"],
                }
            ],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": REGISTRATION_ROLE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": REGISTRATION_ROLE,
            },
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Group",
                    "name": MANAGED_CLUSTERS_GROUP,
                }
            ],
        }
        for path, body in (
            (f"{rbac}/clusterroles", role),
            (f"{rbac}/clusterrolebindings", binding),
        ):
            try:
                self.hub.create(path, body)
            except KubeError as e:
                if e.status != 409:
                    raise
        self.rbac_done = True

    def _send_csr(self, body: Obj) -> Obj:
        """POST a CSR as this cluster's registration agent (impersonated by the admin)."""
        self._registration_rbac()
        headers = {
            **self.hub._headers("application/json"),
            "Impersonate-User": registration_user(self.cluster),
            "Impersonate-Group": MANAGED_CLUSTERS_GROUP,
        }
        resp = self.hub._send(
            "POST",
            self.hub._url("/apis/certificates.k8s.io/v1/certificatesigningrequests", None),
            headers,
            body=json.dumps(body),
            preload_content=True,
        )
        if not 200 <= resp.status < 300:
            raise KubeError(resp.status, str(resp.reason), resp.data.decode(errors="replace"))
        made: Obj = json.loads(resp.data)
        return made

    def _certificate(self, addon: str, namespace: str, reg: dict[str, Any], name: str) -> None:
        signer = reg["signerName"]
        path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
        secret = self.kube.get(path)
        if secret is not None:
            cert = base64.b64decode((secret.get("data") or {}).get("tls.crt", ""))
            with contextlib.suppress(ValueError):
                if cert and pki.remaining_fraction(pki.load_cert_pem(cert)) > RENEW_FRACTION:
                    return
        subject = reg.get("subject") or {}
        csr_pem, key_pem = make_csr(subject.get("user", ""), list(subject.get("groups") or []))
        made = self._send_csr(
            {
                "apiVersion": "certificates.k8s.io/v1",
                "kind": "CertificateSigningRequest",
                "metadata": {
                    "generateName": f"addon-{self.cluster}-{addon}-",
                    "labels": {
                        "open-cluster-management.io/cluster-name": self.cluster,
                        "open-cluster-management.io/addon-name": addon,
                    },
                },
                "spec": {
                    "request": base64.b64encode(csr_pem).decode(),
                    "signerName": signer,
                    "usages": ["digital signature", "key encipherment", "client auth"],
                },
            }
        )
        csr_path = (
            f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{made['metadata']['name']}"
        )
        deadline = time.monotonic() + 60
        signed = ""
        while not signed and time.monotonic() < deadline and not self.stop.is_set():
            signed = ((self.hub.get(csr_path) or {}).get("status") or {}).get("certificate", "")
            if not signed:
                time.sleep(1.0)
        if not signed:
            log.warning("addon %s on %s: CSR %s not signed in 60 s", addon, self.cluster, csr_path)
            return
        if self.kube.get(f"/api/v1/namespaces/{namespace}") is None:
            self.kube.create(
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            )
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "type": "Opaque",
            "data": {
                "tls.crt": signed,
                "tls.key": base64.b64encode(key_pem).decode(),
            },
        }
        if signer == KUBE_CLIENT_SIGNER:
            kubeconfig = hub_kubeconfig(self.hub_server, self.hub_ca_pem)
            body["data"]["kubeconfig"] = base64.b64encode(kubeconfig.encode()).decode()
        if secret is None:
            self.kube.create(f"/api/v1/namespaces/{namespace}/secrets", body)
        else:
            self.kube.request("PUT", path, body)
        log.info(
            "addon %s on %s: certificate from %s stored in %s", addon, self.cluster, signer, name
        )
