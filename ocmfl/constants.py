"""Names every component agrees on: API group, labels, images, ports, signer.

Change a value here and every renderer, agent and test follows; never repeat these literals.
"""

from typing import Final

# --- the FederatedLearning API -------------------------------------------------------------
GROUP: Final = "federation-ai.open-cluster-management.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "FederatedLearning"
PLURAL: Final = "federatedlearnings"
SHORT_NAME: Final = "fl"
# The hub admin's per-namespace policy (hub_controller/policy.py); only one name is read.
POLICY_KIND: Final = "FederationPolicy"
POLICY_PLURAL: Final = "federationpolicies"
POLICY_SHORT_NAME: Final = "flpolicy"
POLICY_NAME: Final = "default"

# --- OCM -----------------------------------------------------------------------------------
CLUSTER_GROUP: Final = "cluster.open-cluster-management.io"
WORK_GROUP: Final = "work.open-cluster-management.io"
ADDON_GROUP: Final = "addon.open-cluster-management.io"
ADDON_NAME: Final = "federated-learning"
# Namespace on each managed cluster where the addon agent runs (OCM's default for addons).
AGENT_NAMESPACE: Final = "open-cluster-management-agent-addon"
HUB_NAMESPACE: Final = "open-cluster-management-hub"

# --- labels and annotations set on everything we create ------------------------------------
LABEL_PREFIX: Final = "federated-learning.open-cluster-management.io"
LABEL_OWNER_NAME: Final = f"{LABEL_PREFIX}/name"
LABEL_OWNER_NAMESPACE: Final = f"{LABEL_PREFIX}/namespace"
LABEL_OWNER_UID: Final = f"{LABEL_PREFIX}/uid"
LABEL_COMPONENT: Final = f"{LABEL_PREFIX}/component"  # "server" | "client" | "placement"
LABEL_CLUSTER: Final = f"{LABEL_PREFIX}/cluster"
FINALIZER: Final = f"{LABEL_PREFIX}/cleanup"
# OCM's labels on an addon agent's CertificateSigningRequest.
LABEL_OCM_CLUSTER_NAME: Final = "open-cluster-management.io/cluster-name"
LABEL_OCM_ADDON_NAME: Final = "open-cluster-management.io/addon-name"

# --- identities ----------------------------------------------------------------------------
# The agents ask for certificates, and the hub's signers answer, with CertificateSigningRequests.
CSR_API_VERSION: Final = "certificates.k8s.io/v1"
# Signer name of agent client certificates: only the project's own CSR signer
# (hub_controller/signer/) signs it, with the agent CA; OCM's addon manager never sees it (the
# AddOnTemplate registers no CustomSigner). Subject CN = "cluster:<name>", O =
# CERT_ORGANIZATION, so a certificate maps to exactly one cluster.
SIGNER_NAME: Final = "federated-learning.open-cluster-management.io/agent"
CERT_ORGANIZATION: Final = "federated-learning:agents"
CERT_CN_PREFIX: Final = "cluster:"  # CN = "cluster:<cluster-name>"
# The signer of the agents' hub kubeconfigs (OCM KubeClient registration), signed by the hub's
# kube-controller-manager after OCM's addon manager approves the CSR.
KUBE_APISERVER_CLIENT_SIGNER: Final = "kubernetes.io/kube-apiserver-client"
# kube-apiserver (>= 1.32) puts this into the user extra of an x509 requester, as
# "X509SHA256=<hex sha256 of the client certificate's DER>"; a CSR's spec.extra carries it.
CREDENTIAL_ID_EXTRA: Final = "authentication.kubernetes.io/credential-id"
# Fleet (Flower traffic) client certificates: signed by one federation's own Fleet CA, never by
# the hub CA, and with a subject no agent check accepts (CN "fleet:<cluster>", this O, and a
# URI SAN naming the federation), so a Fleet key can never pass as a cluster's agent.
FLEET_ORGANIZATION: Final = "federated-learning:fleet"
FLEET_CN_PREFIX: Final = "fleet:"  # CN = "fleet:<cluster-name>"
FLEET_URI_PREFIX: Final = "urn:ocm-fl:fleet:"  # + "<federation uid>:cluster:<cluster-name>"
# Fleet certificates are requested by each cluster's agent (the key is made on the cluster)
# from this signer; the CSR also carries the cluster's SuperNode public key as a URI SAN.
FLEET_SIGNER_NAME: Final = "federated-learning.open-cluster-management.io/fleet"
SUPERNODE_KEY_URI_PREFIX: Final = "urn:ocm-fl:supernode-key:"  # + base64url(OpenSSH key)
# The Secret the agent writes in each client namespace: Fleet key + cert, SuperNode key.
CLIENT_IDENTITY_SECRET: Final = "fl-client-identity"

# --- images (the local node maps these repositories to local entry points) -----------------
IMAGE_REGISTRY: Final = "quay.io/ocm-fl"
WORKLOAD_IMAGE: Final = f"{IMAGE_REGISTRY}/workload:0.1.0"  # Flower + torch: server and client
ADDON_IMAGE: Final = f"{IMAGE_REGISTRY}/addon:0.1.0"  # hub controller, aggregator and agent

# --- ports ---------------------------------------------------------------------------------
AGGREGATOR_PORT: Final = 9443  # hub: agent -> aggregator gRPC over mTLS
HUB_METRICS_PORT: Final = 9090  # hub: Prometheus /metrics
HUB_HEALTH_PORT: Final = 8080  # hub: kopf liveness /healthz (ocm-fl-hub --liveness)
AGENT_LOCAL_PORT: Final = 8088  # cluster: FL client -> agent, HTTP JSON (POST /v1/metrics)
AGENT_HEALTH_PORT: Final = 8089  # cluster: agent /healthz
SUPERLINK_PORT: Final = 9092  # hub server pod: SuperLink, loopback only (all three APIs)
FLEET_PROXY_PORT: Final = 9443  # hub server pod: mTLS proxy exposing only /v1/fleet/
SUPERNODE_PORT: Final = 9094  # cluster client pod: SuperNode local runtime API
# cluster: the client's launcher -> agent, its log's last lines when its ClientApp raised
CLIENT_LOG_PATH: Final = "/v1/client-log"
# The agent's switch (AddOnDeploymentConfig variable CLIENT_LOGS): "off" keeps client logs
# on the cluster; anything else (default "on") sends them with the reports.
ENV_CLIENT_LOGS: Final = "OCMFL_CLIENT_LOGS"

# --- env vars passed to workloads ----------------------------------------------------------
ENV_AGENT_ENDPOINT: Final = "OCMFL_AGENT_ENDPOINT"  # e.g. http://127.0.0.1:8088
ENV_CLUSTER_NAME: Final = "OCMFL_CLUSTER_NAME"
ENV_DATA_DIR: Final = "OCMFL_DATA_DIR"
ENV_FL_NAME: Final = "OCMFL_FL_NAME"
ENV_FL_NAMESPACE: Final = "OCMFL_FL_NAMESPACE"
ENV_FL_UID: Final = "OCMFL_FL_UID"
# Per-federation token for the agent's local metrics API: the work puts it in Secret
# CLIENT_TOKEN_SECRET (key CLIENT_TOKEN_KEY) in the client namespace, mounted read-only into
# the client pod at CLIENT_TOKEN_DIR; the SDK sends it as `Authorization: Bearer <token>` and
# the agent compares it with that Secret (its RBAC may get Secrets of this name only).
CLIENT_TOKEN_SECRET: Final = "fl-client-token"
CLIENT_TOKEN_KEY: Final = "token"
CLIENT_TOKEN_DIR: Final = "/var/run/ocm-fl/client-token"
ENV_CLIENT_TOKEN_FILE: Final = "OCMFL_CLIENT_TOKEN_FILE"
# Server side: what `ocm-fl-server` tells the app's ServerApp (workloads.sdk reads them; Flower's
# run config only takes keys the app declares, so the platform's own settings travel as env).
ENV_STORAGE: Final = "OCMFL_STORAGE"  # model store: absolute directory or s3://bucket/prefix
ENV_INIT_MODEL: Final = "OCMFL_INIT_MODEL"  # starting model: path inside the store, or absolute
ENV_ROUNDS: Final = "OCMFL_ROUNDS"  # rounds the resource asks for (spec.server.rounds)
ENV_MIN_CLIENTS: Final = "OCMFL_MIN_CLIENTS"  # successful results a round needs
ENV_ROUND_TIMEOUT: Final = "OCMFL_ROUND_TIMEOUT"  # seconds a round waits for replies
ENV_PRIVACY: Final = "OCMFL_PRIVACY"  # JSON of spec.privacy.differentialPrivacy (ServerApp)
ENV_SECURE_AGGREGATION: Final = "OCMFL_SECURE_AGGREGATION"  # JSON of spec.privacy.secureAggregation
ENV_NODE_NAMES: Final = "OCMFL_NODE_NAMES"  # JSON file {cluster: node id} the launcher keeps
# Where apps live in the project's images (examples/apps is copied here; the local node maps it).
APPS_DIR: Final = "/opt/ocm-fl/apps"
# Directories the platform mounts into server and client pods (models, state, TLS, keys,
# tokens, scratch, config) and the service account's: an app path may never point into them
# (a tenant could have written code there). tests/unit/test_policy.py checks the pods' mounts.
PLATFORM_MOUNT_DIRS: Final = (
    "/var/lib/ocm-fl",
    "/var/lib/ocm-fl-client",
    "/var/run/ocm-fl",
    "/var/tmp/ocm-fl",
    "/etc/ocm-fl",
    "/var/run/secrets",
)

# --- deployment: Helm chart (hub) and AddOnTemplate (agent) --------------------------------
# agent: where it keeps the key it makes and the certificate the hub's signer issues for it
# (a memory emptyDir in the AddOnTemplate's Deployment).
AGENT_CERT_DIR: Final = "/var/run/ocm-fl/agent-tls"
AGENT_HUB_CA_DIR: Final = "/etc/ocm-fl/hub-ca"  # agent: ca.crt (public) to verify the hub
# hub: the two CA Secrets (tls.crt, tls.key) as mounted. The hub CA signs only the
# aggregator's server certificate (agents trust it for the aggregator); the agent CA signs only
# agent client certificates (the aggregator trusts it for clients); it never leaves the hub.
HUB_CA_DIR: Final = "/etc/ocm-fl/ca"
AGENT_CA_DIR: Final = "/etc/ocm-fl/agent-ca"
# OCM's KubeClient registration: the Secret <addon>-hub-kubeconfig on each managed cluster
# (kubeconfig, tls.crt, tls.key), mounted into the agent at {{HUB_KUBECONFIG}}'s directory.
HUB_KUBECONFIG_SECRET: Final = f"{ADDON_NAME}-hub-kubeconfig"
# hub: which hub credentials OCM issued to a cluster's addon agent through that cluster's own
# registration agent (JSON list), on the cluster's ManagedClusterAddOn; written only by the hub.
ANNOTATION_HUB_IDENTITIES: Final = f"{LABEL_PREFIX}/hub-identities"
# AddOnDeploymentConfig customizedVariables used as {{NAME}} in the AddOnTemplate.
ADDON_VAR_HUB_AGGREGATOR_ADDRESS: Final = "HUB_AGGREGATOR_ADDRESS"  # host:port agents dial
# base64 of the CA certificate PEM, split over HUB_CA_BUNDLE_0.._3: an ADC value holds at
# most 1024 characters and an RSA CA certificate is longer. The template concatenates them.
ADDON_VAR_HUB_CA_BUNDLE_PREFIX: Final = "HUB_CA_BUNDLE_"
ADDON_VAR_HUB_CA_BUNDLE_CHUNKS: Final = 4
ADDON_VAR_MAX_LENGTH: Final = 1024
ADDON_VAR_IMAGE: Final = "IMAGE"
ADDON_VAR_LOG_LEVEL: Final = "LOG_LEVEL"
ADDON_VAR_CLIENT_LOGS: Final = "CLIENT_LOGS"  # "off": the agent's ENV_CLIENT_LOGS
ADDON_VAR_HUB_KUBECONFIG: Final = "HUB_KUBECONFIG"  # set by OCM for a KubeClient registration
ENV_HUB_AGGREGATOR_ADDRESS: Final = "OCMFL_HUB_AGGREGATOR_ADDRESS"  # hub (cert SAN) and agent
ENV_LOG_LEVEL: Final = "OCMFL_LOG_LEVEL"
ENV_AGENT_CERT_DIR: Final = "OCMFL_AGENT_CERT_DIR"
ENV_HUB_CA_FILE: Final = "OCMFL_HUB_CA_FILE"  # agent: PEM file of the hub CA
# agent: its hub kubeconfig (OCM KubeClient registration's {{HUB_KUBECONFIG}}), for its own
# certificate's CSRs and its clients' Fleet CSRs
ENV_HUB_KUBECONFIG: Final = "OCMFL_HUB_KUBECONFIG"
ENV_CA_DIR: Final = "OCMFL_CA_DIR"  # hub: directory with the hub CA tls.crt/tls.key
ENV_AGENT_CA_DIR: Final = "OCMFL_AGENT_CA_DIR"  # hub: directory with the agent CA tls.crt/tls.key
ENV_POD_NAMESPACE: Final = "OCMFL_POD_NAMESPACE"  # hub: its own namespace
# hub: the bearer token /metrics asks for (key `token`), in the hub's namespace; the hub makes
# it at its first start and keeps it (Prometheus reads the same Secret).
METRICS_TOKEN_SECRET: Final = "ocm-fl-metrics-token"
METRICS_TOKEN_KEY: Final = "token"
# hub: the aggregator's server certificate (kubernetes.io/tls), in the hub's namespace: the
# signer issues it from the hub CA and renews it; the aggregator reads it (never the CA key).
AGGREGATOR_TLS_SECRET: Final = "ocm-fl-aggregator-tls"
# hub: which parts `ocm-fl-hub` runs: "all" (default), "controller" (operator + aggregator,
# no CA key) or "signer" (the CSR signers, the ledger and the aggregator's certificate).
ENV_HUB_ROLE: Final = "OCMFL_HUB_ROLE"
ENV_WATCH_NAMESPACES: Final = "OCMFL_WATCH_NAMESPACES"  # hub: comma-separated; empty = all
# hub: where the aggregator's gRPC and /metrics listen (host:port); defaults 0.0.0.0 with the
# ports above. The local federation binds them to loopback addresses of its own.
ENV_AGGREGATOR_LISTEN: Final = "OCMFL_AGGREGATOR_LISTEN"
ENV_METRICS_LISTEN: Final = "OCMFL_METRICS_LISTEN"
# hub: JSON {cluster: url} overriding where a cluster's FL client finds its agent (default: the
# agent's Service on that cluster); the local federation's agents run as processes.
ENV_AGENT_ENDPOINTS: Final = "OCMFL_AGENT_ENDPOINTS"
# hub: the agent-identity CSR signer runs unless this is "false" (agents then get no identity)
ENV_RUN_CSR_SIGNER: Final = "OCMFL_RUN_CSR_SIGNER"
AGENT_STATE_DIR: Final = "/var/lib/ocm-fl"  # agent: unsent reports survive restarts here
ENV_AGENT_STATE_DIR: Final = "OCMFL_AGENT_STATE_DIR"
# hub: the admin's root for HostPath model stores (Helm value storage.hostPathRoot); each
# resource's store is <root>/<namespace>/<name>-<uid>, never a path a tenant names.
ENV_HOSTPATH_ROOT: Final = "OCMFL_HOSTPATH_ROOT"
# hub: comma-separated namespaces where the chart granted the hub its server-side writes (Helm
# value rbac.flNamespaces); a FederatedLearning elsewhere is refused. Empty: any namespace.
ENV_FL_NAMESPACES: Final = "OCMFL_FL_NAMESPACES"
# ocm-fl-server's exit code when training failed (its verdict, reason in the termination
# message): the server Job's podFailurePolicy fails the Job on it instead of retrying.
SERVER_FAILED_EXIT: Final = 1
DEFAULT_HOSTPATH_ROOT: Final = "/var/lib/ocm-fl/models"
# Pod security of the server and client pods (the restricted Pod Security profile): the uid
# and gid the workload image runs as, and the writable scratch directory (HOME, TMPDIR) its
# read-only root filesystem gets.
WORKLOAD_UID: Final = 65532
SCRATCH_DIR: Final = "/var/tmp/ocm-fl"
