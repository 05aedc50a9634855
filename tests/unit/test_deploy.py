"""The deployable artefacts: Helm chart, OCM addon objects, RBAC, scripts, Dockerfiles.

Chart tests need the helm binary that hack/tools/build-helm.sh builds from the Go module
registry (hack/setup.sh, run by `make test` / .ci/run, builds it); they skip, saying so, only
when it is absent. shellcheck comes from Debian (hack/install-system-deps.sh).
"""

from __future__ import annotations

import ast
import base64
import importlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa

from hack.images.deploy import dockerfile_instructions
from hub_controller import policy
from hub_controller.bootstrap import ca_init, rbac
from ocmfl import certlife, constants, csroutcome, pki
from ocmfl.kube import KINDS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "ocm-federated-learning"
NAMESPACE = "ocm-fl-system"
RELEASE = "ocm-fl"
HUB_ROLE = f"{RELEASE}-ocm-federated-learning"  # the hub controller's ClusterRole, Deployment
SIGNER = f"{HUB_ROLE}-signer"  # the signer part's Deployment, ServiceAccount and ClusterRole


# --- helm ---------------------------------------------------------------------------------------


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


@cache
def _render_cached(helm: str, sets: tuple[str, ...], crds: bool) -> tuple[dict[str, Any], ...]:
    cmd = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    if crds:
        cmd.append("--include-crds")
    for s in sets:
        cmd += ["--set", s]
    res = _run(cmd)
    assert res.returncode == 0, res.stderr
    return tuple(d for d in yaml.safe_load_all(res.stdout) if d)


def render(helm: str, *sets: str, crds: bool = False) -> list[dict[str, Any]]:
    return list(_render_cached(helm, tuple(sets), crds))


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def agent_manifests(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    manifests: list[dict[str, Any]] = one(docs, "AddOnTemplate")["spec"]["agentSpec"]["workload"][
        "manifests"
    ]
    return manifests


def test_chart_lints_clean_with_strict(helm: str) -> None:
    res = _run([helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("ca.existingSecret=my-ca",),
        ("rbac.flNamespaces={team-a,team-b}", "metrics.serviceMonitor.enabled=true"),
        (
            "addon.installStrategy=Placements",
            "addon.placements[0].name=fl-clusters",
            "addon.placements[0].namespace=fl",
        ),
        ("aggregator.service.type=NodePort", "aggregator.service.nodePort=30443"),
    ],
)
def test_chart_lints_clean_with_value_variants(helm: str, sets: tuple[str, ...]) -> None:
    cmd = [helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        cmd += ["--set", s]
    res = _run(cmd)
    assert res.returncode == 0, res.stdout + res.stderr


def test_default_render_has_hub_and_addon_objects(helm: str) -> None:
    docs = render(helm)
    kinds = {d["kind"] for d in docs}
    assert {
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "ClusterManagementAddOn",
        "AddOnTemplate",
        "AddOnDeploymentConfig",
        "Job",
    } <= kinds
    assert "ServiceMonitor" not in kinds


def test_crds_render_from_the_charts_crds_dir(helm: str) -> None:
    docs = render(helm, crds=True)
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert names == {f"{constants.PLURAL}.{constants.GROUP}", f"{policy.PLURAL}.{constants.GROUP}"}


def test_hub_deployment_runs_ocm_fl_hub_non_root_with_read_only_root(helm: str) -> None:
    dep = one(render(helm), "Deployment", HUB_ROLE)
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == constants.ADDON_IMAGE
    assert c["command"] == ["ocm-fl-hub"]
    assert "--role=controller" in c["args"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    ports = {p["containerPort"] for p in c["ports"]}
    assert ports == {
        constants.AGGREGATOR_PORT,
        constants.HUB_METRICS_PORT,
        constants.HUB_HEALTH_PORT,
    }
    assert f"--liveness=http://0.0.0.0:{constants.HUB_HEALTH_PORT}/healthz" in c["args"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    # No CA key in the process that parses tenant specs and serves gRPC: only the agent CA's
    # certificate, as the trust for client certificates.
    assert set(mounts) == {constants.AGENT_CA_DIR, "/tmp"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    agent_ca = volumes[mounts[constants.AGENT_CA_DIR]]["secret"]
    assert agent_ca["secretName"] == rbac.DEFAULT_AGENT_CA_SECRET
    assert agent_ca["items"] == [{"key": "tls.crt", "path": "tls.crt"}]
    env = {e["name"]: e for e in c["env"]}
    assert constants.ENV_CA_DIR not in env
    assert env[constants.ENV_AGENT_CA_DIR]["value"] == constants.AGENT_CA_DIR
    assert env[constants.ENV_HOSTPATH_ROOT]["value"] == constants.DEFAULT_HOSTPATH_ROOT
    assert set(env) <= _env_constants()
    assert dep["spec"]["strategy"]["type"] == "Recreate"


def test_signer_deployment_alone_mounts_the_ca_keys(helm: str) -> None:
    """The signer part is its own Deployment, ServiceAccount and selector (the aggregator's
    Service never routes to it); it mounts both CA Secrets whole."""
    docs = render(helm)
    dep = one(docs, "Deployment", SIGNER)
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["ocm-fl-hub"] and "--role=signer" in c["args"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["serviceAccountName"] == SIGNER
    assert (
        pod["serviceAccountName"]
        != one(docs, "Deployment", HUB_ROLE)["spec"]["template"]["spec"]["serviceAccountName"]
    )
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[constants.HUB_CA_DIR]]["secret"]["secretName"] == rbac.DEFAULT_CA_SECRET
    agent_ca = volumes[mounts[constants.AGENT_CA_DIR]]["secret"]
    assert agent_ca["secretName"] == rbac.DEFAULT_AGENT_CA_SECRET and "items" not in agent_ca
    env = {e["name"]: e for e in c["env"]}
    assert env[constants.ENV_CA_DIR]["value"] == constants.HUB_CA_DIR
    assert env[constants.ENV_AGENT_CA_DIR]["value"] == constants.AGENT_CA_DIR
    # The agent signer runs by default (OCMFL_RUN_CSR_SIGNER=false would leave it out).
    assert constants.ENV_RUN_CSR_SIGNER not in env
    assert constants.ENV_HUB_AGGREGATOR_ADDRESS in env  # the name its certificate carries
    assert set(env) <= _env_constants()
    assert "ports" not in c or {p["name"] for p in c["ports"]} == {"health"}
    service_selectors = [d["spec"]["selector"] for d in docs if d["kind"] == "Service"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(not (sel.items() <= labels.items()) for sel in service_selectors)
    assert dep["spec"]["strategy"]["type"] == "Recreate"


def test_services_expose_aggregator_and_metrics_ports(helm: str) -> None:
    services = [d for d in render(helm) if d["kind"] == "Service"]
    ports = {p["port"] for s in services for p in s["spec"]["ports"]}
    assert ports == {constants.AGGREGATOR_PORT, constants.HUB_METRICS_PORT}


def test_service_monitor_is_a_toggle(helm: str) -> None:
    docs = render(
        helm, "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom"
    )
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"


def _env_constants() -> set[str]:
    return {v for k, v in vars(constants).items() if k.startswith("ENV_") and isinstance(v, str)}


# --- CA handling --------------------------------------------------------------------------------


def test_both_cas_are_created_by_hook_jobs_in_the_hub_never_rendered(helm: str) -> None:
    docs = render(helm)
    assert not [d for d in docs if d["kind"] == "Secret"], "the chart must not template a key"
    jobs = {d["metadata"]["annotations"]["helm.sh/hook"]: d for d in docs if d["kind"] == "Job"}
    assert set(jobs) == {"pre-install,pre-upgrade", "post-install,post-upgrade"}
    pre = jobs["pre-install,pre-upgrade"]["spec"]["template"]["spec"]["containers"][0]
    assert pre["command"] == ["python", "-m", "hub_controller.bootstrap.ca_init"]
    assert pre["args"][0] == "ensure-secret"
    args = pre["args"]
    assert args[args.index("--secret") + 1] == rbac.DEFAULT_CA_SECRET
    assert args[args.index("--agent-secret") + 1] == rbac.DEFAULT_AGENT_CA_SECRET
    assert args[args.index("--namespace") + 1] == NAMESPACE
    post = jobs["post-install,post-upgrade"]["spec"]["template"]["spec"]["containers"][0]
    assert post["args"][0] == "publish"
    assert post["args"][post["args"].index("--secret") + 1] == rbac.DEFAULT_CA_SECRET
    for job in jobs.values():
        _assert_hardened(job["spec"]["template"]["spec"])
    role = one(docs, "Role", f"{RELEASE}-ocm-federated-learning-ca-init")
    [read] = [r for r in role["rules"] if r["verbs"] == ["get"] and r["resources"] == ["secrets"]]
    assert read["resourceNames"] == [rbac.DEFAULT_CA_SECRET, rbac.DEFAULT_AGENT_CA_SECRET]


def test_existing_ca_secrets_with_bundle_need_no_jobs(helm: str) -> None:
    pem = pki.cert_to_pem(pki.create_ca().cert).decode()
    docs = render(
        helm, "ca.existingSecret=my-ca", "agentCA.existingSecret=my-agent-ca", f"ca.bundle={pem}"
    )
    assert not [d for d in docs if d["kind"] == "Job"]

    def secrets(name: str) -> set[str]:
        pod = one(docs, "Deployment", name)["spec"]["template"]["spec"]
        return {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}

    assert secrets(SIGNER) == {"my-ca", "my-agent-ca"}
    assert secrets(HUB_ROLE) == {"my-agent-ca"}  # its certificate only
    adc = one(docs, "AddOnDeploymentConfig")
    variables = adc["spec"]["customizedVariables"]
    assert all(len(v["value"]) <= constants.ADDON_VAR_MAX_LENGTH for v in variables)
    assert ca_init.join_bundle(variables) == pem.encode()


def test_an_existing_hub_ca_still_gets_a_generated_agent_ca(helm: str) -> None:
    pem = pki.cert_to_pem(pki.create_ca().cert).decode()
    docs = render(helm, "ca.existingSecret=my-ca", f"ca.bundle={pem}")
    [job] = [d for d in docs if d["kind"] == "Job"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--secret" not in args  # never creates a Secret under the admin's hub CA name
    assert args[args.index("--agent-secret") + 1] == rbac.DEFAULT_AGENT_CA_SECRET
    role = one(docs, "Role", f"{RELEASE}-ocm-federated-learning-ca-init")
    [read] = [r for r in role["rules"] if r["verbs"] == ["get"] and r["resources"] == ["secrets"]]
    assert read["resourceNames"] == [rbac.DEFAULT_AGENT_CA_SECRET]


def test_nothing_but_the_hub_reads_the_ca_secrets_and_ocm_gets_no_grant(helm: str) -> None:
    """OCM signs nothing with the project's CAs any more: no grant to its addon manager; the
    hub mounts both Secrets and has no API access to them; the agent CA is never published."""
    docs = render(helm)
    for d in docs:
        if d["kind"] not in ("Role", "ClusterRole") or d["metadata"]["name"].endswith("-ca-init"):
            continue
        for rule in d.get("rules") or []:
            assert "secrets" not in rule["resources"] or not set(
                rule.get("resourceNames") or []
            ) & {
                rbac.DEFAULT_CA_SECRET,
                rbac.DEFAULT_AGENT_CA_SECRET,
            }, d["metadata"]["name"]
    assert not [d for d in docs if "addon-manager" in d["metadata"]["name"]]
    published = yaml.safe_dump([one(docs, "AddOnTemplate"), one(docs, "AddOnDeploymentConfig")])
    assert rbac.DEFAULT_AGENT_CA_SECRET not in published
    assert constants.AGENT_CA_DIR not in published


def test_ca_bundle_variables_round_trip_within_the_adc_value_limit() -> None:
    pem = pki.cert_to_pem(pki.create_ca().cert)
    variables = ca_init.bundle_variables(pem)
    assert [v["name"] for v in variables] == [
        f"{constants.ADDON_VAR_HUB_CA_BUNDLE_PREFIX}{i}"
        for i in range(constants.ADDON_VAR_HUB_CA_BUNDLE_CHUNKS)
    ]
    assert all(len(v["value"]) <= constants.ADDON_VAR_MAX_LENGTH for v in variables)
    assert len(base64.b64encode(pem)) > constants.ADDON_VAR_MAX_LENGTH  # why it is split
    assert ca_init.join_bundle(variables) == pem


def test_publishing_the_bundle_keeps_other_variables() -> None:
    existing = [{"name": "IMAGE", "value": "x"}, {"name": "HUB_CA_BUNDLE_0", "value": "old"}]
    updates = ca_init.bundle_variables(b"pem")
    merged = ca_init.merge_variables(existing, updates)
    assert merged[0] == {"name": "IMAGE", "value": "x"}
    assert [v["name"] for v in merged[1:]] == [v["name"] for v in updates]
    assert ca_init.join_bundle(merged) == b"pem"


def test_too_long_ca_bundle_is_refused() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        ca_init.bundle_variables(b"x" * 4096)


def test_ca_secret_is_kubernetes_tls_with_rsa_key() -> None:
    pair = pki.create_ca()
    secret = ca_init.ca_secret("ocm-fl-ca", NAMESPACE, pair)
    assert secret["type"] == "kubernetes.io/tls"
    key = pki.load_key_pem(base64.b64decode(secret["data"]["tls.key"]))
    assert isinstance(key, rsa.RSAPrivateKey)


# --- OCM addon objects --------------------------------------------------------------------------


def test_values_mirror_shared_constants() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    image = f"{values['image']['repository']}:{values['image']['tag']}"
    assert image == constants.ADDON_IMAGE
    assert values["aggregator"]["port"] == constants.AGGREGATOR_PORT
    assert values["metrics"]["port"] == constants.HUB_METRICS_PORT
    assert values["hub"]["healthPort"] == constants.HUB_HEALTH_PORT
    assert values["storage"]["hostPathRoot"] == constants.DEFAULT_HOSTPATH_ROOT
    addon = values["addon"]
    assert addon["name"] == constants.ADDON_NAME
    assert addon["agentNamespace"] == constants.AGENT_NAMESPACE
    assert addon["signerName"] == constants.SIGNER_NAME
    assert addon["agentLocalPort"] == constants.AGENT_LOCAL_PORT
    assert addon["agentHealthPort"] == constants.AGENT_HEALTH_PORT
    assert "ocm" not in values  # OCM's addon manager needs nothing of this chart's CAs
    assert values["ca"]["secretName"] == rbac.DEFAULT_CA_SECRET
    assert values["agentCA"]["secretName"] == rbac.DEFAULT_AGENT_CA_SECRET
    assert addon["installStrategy"] == "Manual"


def test_cluster_management_addon_references_template_and_config(helm: str) -> None:
    docs = render(helm)
    cma = one(docs, "ClusterManagementAddOn")
    assert cma["metadata"]["name"] == constants.ADDON_NAME
    assert cma["spec"]["installStrategy"] == {"type": "Manual"}
    configs = {c["resource"]: c["defaultConfig"] for c in cma["spec"]["supportedConfigs"]}
    assert configs["addontemplates"]["name"] == one(docs, "AddOnTemplate")["metadata"]["name"]
    adc = one(docs, "AddOnDeploymentConfig")
    assert configs["addondeploymentconfigs"] == {
        "name": adc["metadata"]["name"],
        "namespace": NAMESPACE,
    }


def test_placements_install_strategy_lists_placements(helm: str) -> None:
    docs = render(
        helm,
        "addon.installStrategy=Placements",
        "addon.placements[0].name=fl-clusters",
        "addon.placements[0].namespace=fl",
    )
    strategy = one(docs, "ClusterManagementAddOn")["spec"]["installStrategy"]
    assert strategy == {
        "type": "Placements",
        "placements": [{"name": "fl-clusters", "namespace": "fl"}],
    }


def test_addon_template_registers_only_a_kube_client_hub_kubeconfig(helm: str) -> None:
    """No CustomSigner: OCM v1.2 approves any custom-signer CSR and signs what it asks for."""
    tmpl = one(render(helm), "AddOnTemplate")
    assert tmpl["spec"]["addonName"] == constants.ADDON_NAME
    # No hubPermissions either: OCM binds them to the group every cluster's agent is in.
    assert tmpl["spec"]["registration"] == [{"type": "KubeClient"}]
    assert "customSigner" not in yaml.safe_dump(tmpl)


def test_agent_runs_in_agent_namespace_with_cert_dir_and_variables(helm: str) -> None:
    manifests = agent_manifests(render(helm))
    dep = next(m for m in manifests if m["kind"] == "Deployment")
    assert dep["metadata"]["namespace"] == constants.AGENT_NAMESPACE
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "{{IMAGE}}"
    assert c["command"] == ["ocm-fl-agent"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert set(env) <= _env_constants()
    assert env[constants.ENV_AGENT_CERT_DIR] == constants.AGENT_CERT_DIR
    assert env[constants.ENV_HUB_KUBECONFIG] == "{{HUB_KUBECONFIG}}"
    # The agent's key and certificate: a writable directory in memory, made in the pod.
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == constants.AGENT_CERT_DIR]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory" and not mount.get("readOnly")
    assert env[constants.ENV_HUB_AGGREGATOR_ADDRESS] == "{{HUB_AGGREGATOR_ADDRESS}}"
    assert env[constants.ENV_CLUSTER_NAME] == "{{CLUSTER_NAME}}"
    assert env[constants.ENV_HUB_CA_FILE].startswith(constants.AGENT_HUB_CA_DIR + "/")
    ports = {p["containerPort"] for p in c["ports"]}
    assert ports == {constants.AGENT_LOCAL_PORT, constants.AGENT_HEALTH_PORT}
    _assert_hardened(pod)
    svc = next(m for m in manifests if m["kind"] == "Service")
    assert svc["spec"]["ports"][0]["port"] == constants.AGENT_LOCAL_PORT
    assert all(
        m["metadata"].get("namespace", constants.AGENT_NAMESPACE) == constants.AGENT_NAMESPACE
        for m in manifests
    )


def test_every_template_variable_is_set_by_the_deployment_config(helm: str) -> None:
    docs = render(helm)
    text = yaml.safe_dump(agent_manifests(docs))
    used = set(re.findall(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}", text))
    adc_vars = {
        v["name"] for v in one(docs, "AddOnDeploymentConfig")["spec"]["customizedVariables"]
    }
    bundle = {
        f"{constants.ADDON_VAR_HUB_CA_BUNDLE_PREFIX}{i}"
        for i in range(constants.ADDON_VAR_HUB_CA_BUNDLE_CHUNKS)
    }
    builtin = {"CLUSTER_NAME", "HUB_KUBECONFIG"}  # the latter from the KubeClient registration
    assert used - builtin - bundle <= adc_vars  # the bundle comes from the publish hook
    assert {
        constants.ADDON_VAR_HUB_AGGREGATOR_ADDRESS,
        constants.ADDON_VAR_IMAGE,
        constants.ADDON_VAR_LOG_LEVEL,
        constants.ADDON_VAR_CLIENT_LOGS,
    } <= adc_vars
    assert bundle <= used


def test_client_logs_are_on_by_default_and_reach_the_agent_as_its_switch(helm: str) -> None:
    docs = render(helm)
    adc = one(docs, "AddOnDeploymentConfig")["spec"]["customizedVariables"]
    assert {"name": constants.ADDON_VAR_CLIENT_LOGS, "value": "on"} in adc
    off = render(helm, "addon.clientLogs=off")
    variables = one(off, "AddOnDeploymentConfig")["spec"]["customizedVariables"]
    assert {"name": constants.ADDON_VAR_CLIENT_LOGS, "value": "off"} in variables
    [deployment] = [m for m in agent_manifests(docs) if m["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]
           ["containers"][0]["env"]}  # fmt: skip
    assert env[constants.ENV_CLIENT_LOGS] == "{{" + constants.ADDON_VAR_CLIENT_LOGS + "}}"


def test_agent_rbac_only_reads_pods_jobs_namespaces_applied_works_and_touches_two_secrets(
    helm: str,
) -> None:
    manifests = agent_manifests(render(helm))
    role = next(m for m in manifests if m["kind"] == "ClusterRole")
    secrets = {}
    for rule in role["rules"]:
        if rule["resources"] == ["secrets"]:
            # issue 12: each federation's local-API token (read) and its client identity (keys
            # made here by the agent, written by server-side apply); no other Secret
            [name] = rule["resourceNames"]
            secrets[name] = set(rule["verbs"])
            continue
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
        # appliedmanifestworks: a client namespace gets an identity only when the work agent
        # applied it from its federation's work (issue 29 item 4)
        assert set(rule["resources"]) <= {"pods", "jobs", "namespaces", "appliedmanifestworks"}
    assert secrets == {
        constants.CLIENT_TOKEN_SECRET: {"get"},
        "fl-client-identity": {"get", "create", "patch", "update"},
    }


def test_addon_agents_may_only_ask_for_certificates_on_the_hub(helm: str) -> None:
    """The KubeClient identity (every cluster's agent) creates CSRs and reads their outcomes in
    its own cluster namespace, nothing more; the hub's signers decide what each may get."""
    docs = render(helm)
    group = f"system:open-cluster-management:addon:{constants.ADDON_NAME}"
    [binding] = [
        d
        for d in docs
        if d["kind"] == "ClusterRoleBinding"
        and any(s.get("kind") == "Group" and s["name"] == group for s in d["subjects"])
    ]
    role = one(docs, "ClusterRole", binding["roleRef"]["name"])
    assert role["rules"] == [
        {"apiGroups": [r.group], "resources": [r.resource], "verbs": list(r.verbs)}
        for r in rbac.AGENT_HUB_RULES
    ]
    assert role["rules"][0]["verbs"] == ["create"]  # reading CSRs would show other clusters'
    # In its own cluster namespace (the signer binds it there to that cluster's agent user) it
    # reads the outcomes of its CSRs and nothing else.
    outcomes = one(docs, "ClusterRole", csroutcome.READER_ROLE)
    assert outcomes["rules"] == [
        {"apiGroups": [r.group], "resources": [r.resource], "verbs": list(r.verbs)}
        for r in rbac.AGENT_CLUSTER_NAMESPACE_RULES
    ]
    assert not [
        d
        for d in docs
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and d["roleRef"]["name"] == csroutcome.READER_ROLE
    ], "the chart must not bind it: the signer binds it per cluster namespace, user only"


def test_work_agents_may_apply_the_client_data_volumes_and_nothing_more(helm: str) -> None:
    """Client data comes as a PersistentVolume in each ManifestWork (cluster-scoped; OCM's work
    agent has only `admin`): a role OCM aggregates into the work agent's adds PVs alone."""
    label = "open-cluster-management.io/aggregate-to-work"
    [role] = [
        m
        for m in agent_manifests(render(helm))
        if m["kind"] == "ClusterRole" and (m["metadata"].get("labels") or {}).get(label) == "true"
    ]
    assert [(r["apiGroups"], r["resources"]) for r in role["rules"]] == [
        ([""], ["persistentvolumes"])
    ]


def test_aggregator_address_defaults_to_service_and_follows_external_address(helm: str) -> None:
    def address(docs: list[dict[str, Any]]) -> str:
        adc = one(docs, "AddOnDeploymentConfig")
        return next(
            str(v["value"])
            for v in adc["spec"]["customizedVariables"]
            if v["name"] == constants.ADDON_VAR_HUB_AGGREGATOR_ADDRESS
        )

    assert address(render(helm)).endswith(f".{NAMESPACE}.svc:{constants.AGGREGATOR_PORT}")
    assert address(render(helm, "aggregator.externalAddress=hub:30443")) == "hub:30443"


def test_chart_registration_equals_hub_controller_addon_template(helm: str) -> None:
    from hub_controller.bootstrap import addon_template

    docs = render(helm)
    rendered = one(docs, "AddOnTemplate")["spec"]["registration"]
    assert rendered == addon_template.addon_registrations()
    dep = next(m for m in agent_manifests(docs) if m["kind"] == "Deployment")
    env = {
        e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env[constants.ENV_AGENT_CERT_DIR] == constants.AGENT_CERT_DIR
    assert env[constants.ENV_HUB_KUBECONFIG] == f"{{{{{constants.ADDON_VAR_HUB_KUBECONFIG}}}}}"


def test_the_hub_approves_and_signs_only_its_own_signers_and_only_watches_the_rest(
    helm: str,
) -> None:
    """The hub's signer part watches OCM's addon hub-credential CSRs (the ledger) but may not
    approve or deny them; it may approve and sign the agent and Fleet signers only, and patch
    ManagedClusterAddOns (the ledger annotation). The controller part only reads CSRs."""
    controller = one(render(helm), "ClusterRole", HUB_ROLE)
    assert {
        v for r in controller["rules"] if "certificatesigningrequests" in r["resources"]
        for v in r["verbs"]
    } == {"get", "list", "watch"}  # fmt: skip
    assert not [r for r in controller["rules"] if "signers" in r["resources"]]
    role = one(render(helm), "ClusterRole", SIGNER)

    def verbs(resource: str) -> set[str]:
        return {v for r in role["rules"] if resource in r["resources"] for v in r["verbs"]}

    assert verbs("certificatesigningrequests") == {"get", "list", "watch"}
    assert verbs("certificatesigningrequests/approval") == {"update"}
    [signers] = [r for r in role["rules"] if r["resources"] == ["signers"]]
    assert signers["verbs"] == ["approve", "sign"]
    assert signers["resourceNames"] == [constants.SIGNER_NAME, constants.FLEET_SIGNER_NAME]
    assert constants.KUBE_APISERVER_CLIENT_SIGNER not in signers["resourceNames"]
    assert verbs("managedclusteraddons") == {"get", "list", "watch", "patch"}


def _assert_hardened(pod: dict[str, Any]) -> None:
    assert pod["securityContext"]["runAsNonRoot"] is True
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]


# --- RBAC ---------------------------------------------------------------------------------------


def _grants(roles: list[dict[str, Any]], rule: rbac.Rule) -> bool:
    for role in roles:
        for r in role.get("rules", []):
            if rule.group not in r.get("apiGroups", []) or rule.resource not in r.get(
                "resources", []
            ):
                continue
            names = r.get("resourceNames")
            if names and not (rule.resource_names and set(rule.resource_names) <= set(names)):
                continue
            if set(rule.verbs) <= set(r["verbs"]):
                return True
    return False


def _bound_roles(docs: list[dict[str, Any]], sa: str) -> dict[str | None, list[dict[str, Any]]]:
    """Roles bound to ServiceAccount `sa`, keyed by namespace (None: cluster-wide)."""
    out: dict[str | None, list[dict[str, Any]]] = {}
    for b in docs:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in b["subjects"]):
            continue
        ref = b["roleRef"]
        ns = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        role = one(
            [d for d in docs if d["metadata"].get("namespace") in (ns, None)],
            ref["kind"],
            ref["name"],
        )
        out.setdefault(ns, []).append(role)
    return out


@pytest.mark.parametrize(
    ("sets", "fl_namespaces"),
    [
        ((), ("fl",)),  # the default: namespaced
        (("rbac.flNamespaces={}",), ()),  # the admin's explicit cluster-wide grant
        (("rbac.flNamespaces={team-a,team-b}",), ("team-a", "team-b")),
    ],
)
@pytest.mark.parametrize(
    ("deployment", "rules"),
    [(HUB_ROLE, rbac.CONTROLLER_RULES), (SIGNER, rbac.SIGNER_RULES)],
    ids=["controller", "signer"],
)
def test_rendered_rbac_grants_every_declared_rule_to_each_part(
    helm: str,
    sets: tuple[str, ...],
    fl_namespaces: tuple[str, ...],
    deployment: str,
    rules: tuple[rbac.Rule, ...],
) -> None:
    docs = render(helm, *sets)
    sa = one(docs, "Deployment", deployment)["spec"]["template"]["spec"]["serviceAccountName"]
    roles = _bound_roles(docs, sa)
    cluster = roles.get(None, [])
    missing = []
    for rule in rules:
        if rule.scope is rbac.Scope.CLUSTER:
            ok = _grants(cluster, rule)
        elif rule.scope is rbac.Scope.RELEASE_NAMESPACE:
            ok = _grants(cluster + roles.get(NAMESPACE, []), rule)
        elif fl_namespaces:
            ok = all(_grants(roles.get(ns, []), rule) for ns in fl_namespaces)
            ok = ok and not _grants(cluster, rule)  # narrowed, not cluster-wide
        else:
            ok = _grants(cluster, rule)
        if not ok:
            missing.append(rule)
    assert not missing, f"chart does not grant: {missing}"


def test_by_default_the_hub_may_write_secrets_and_jobs_only_in_the_fl_namespaces(
    helm: str,
) -> None:
    """A default install grants no cluster-wide write on Secrets, Jobs or any other object of
    the server side, and tells the controller where it may run servers. One exception: the
    signer may create (never change or delete) ConfigMaps anywhere, for the CSR outcomes it
    leaves in cluster namespaces, which come and go with the fleet."""
    docs = render(helm)
    for deployment in (HUB_ROLE, SIGNER):
        pod = one(docs, "Deployment", deployment)["spec"]["template"]["spec"]
        roles = _bound_roles(docs, pod["serviceAccountName"])
        writes = {("", "secrets"), ("batch", "jobs"), ("", "configmaps"), ("", "services")}
        for role in roles.get(None, []):
            for r in role["rules"]:
                for group in r.get("apiGroups", []):
                    for resource in r.get("resources", []):
                        if (group, resource) in writes:
                            verbs = set(r["verbs"])
                            if deployment == SIGNER and (group, resource) == ("", "configmaps"):
                                verbs -= {"create"}  # CSR outcomes (signer/csr_outcome.py)
                            assert not verbs & {"create", "update", "patch", "delete"}, r
        assert set(roles) == {None, NAMESPACE, "fl"}, (deployment, set(roles))
    env = {
        e["name"]: e.get("value")
        for e in one(docs, "Deployment", HUB_ROLE)["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    assert env[constants.ENV_FL_NAMESPACES] == "fl"
    wide = render(helm, "rbac.flNamespaces={}")
    assert constants.ENV_FL_NAMESPACES not in str(one(wide, "Deployment", HUB_ROLE))


def test_rendered_ca_init_role_grants_declared_rules(helm: str) -> None:
    role = one(render(helm), "Role", f"{RELEASE}-ocm-federated-learning-ca-init")

    def allows(group: str, resource: str, verb: str) -> bool:  # the Job names its objects
        return any(
            group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
            for r in role["rules"]
        )

    for rule in rbac.CA_INIT_RULES:
        assert all(allows(rule.group, rule.resource, v) for v in rule.verbs), rule
    named = [r for r in role["rules"] if "create" not in r["verbs"]]
    assert all(r.get("resourceNames") for r in named), "get/patch must be limited by name"


@pytest.mark.parametrize(
    ("role", "rules"),
    [(HUB_ROLE, rbac.CONTROLLER_RULES), (SIGNER, rbac.SIGNER_RULES)],
    ids=["controller", "signer"],
)
def test_rendered_rbac_grants_nothing_undeclared(
    helm: str, role: str, rules: tuple[rbac.Rule, ...]
) -> None:
    """Each part's ClusterRole stays least-privilege: each (group, resource) and verb in it is
    declared for that part."""
    docs = render(helm, "rbac.flNamespaces={}")  # the widest variant
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        verbs.setdefault((rule.group, rule.resource), set()).update(rule.verbs)
    for r in one(docs, "ClusterRole", role)["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                assert (g, res) in verbs, f"undeclared grant {g}/{res} to {role}"
                assert set(r["verbs"]) <= verbs[(g, res)], (role, g, res, r["verbs"])
        assert "*" not in r["verbs"]


def test_the_release_namespace_cannot_be_an_fl_namespace(helm: str) -> None:
    """The CA Secrets live in the release namespace; the controller may read Secrets in every
    FL namespace, so the chart refuses that overlap, naming the value and the fix."""
    cmd = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    res = _run([*cmd, "--set", f"rbac.flNamespaces={{fl,{NAMESPACE}}}"])
    assert res.returncode != 0
    assert "rbac.flNamespaces must not include the release namespace" in res.stderr
    assert NAMESPACE in res.stderr and "another namespace" in res.stderr


def test_the_controller_can_neither_sign_nor_read_a_ca(helm: str) -> None:
    """What a compromised controller (it parses tenant specs, serves gRPC) cannot do: approve
    or sign a CSR, or read either CA Secret; the signer can do the first, neither reads."""
    docs = render(helm)
    controller = _bound_roles(
        docs, one(docs, "Deployment", HUB_ROLE)["spec"]["template"]["spec"]["serviceAccountName"]
    )
    grants = [(ns, r) for ns, roles in controller.items() for role in roles for r in role["rules"]]
    for _, r in grants:
        resources = set(r.get("resources", []))
        assert not resources & {"signers", "certificatesigningrequests/approval"}, r
        assert not resources & {"certificatesigningrequests/status"}, r
    for ca in (rbac.DEFAULT_CA_SECRET, rbac.DEFAULT_AGENT_CA_SECRET):
        readable = [
            r
            for ns, r in grants
            if ns in (None, NAMESPACE)
            and "secrets" in r.get("resources", [])
            and {"get", "list", "watch"} & set(r["verbs"])
            and ca in r.get("resourceNames", [ca])
        ]
        assert not readable, (ca, readable)


# ocmfl.kube.Kube methods -> the verb they ask for; "*": a path built here, used elsewhere.
_KUBE_VERBS = {
    "get": "get",
    "request": "get",
    "list_objects": "list",
    "create": "create",
    "delete": "delete",
    "patch": "patch",
    "put": "update",
    "apply": "patch",
}


def _resolve(node: ast.AST, module: Any) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [
            _resolve(v.value if isinstance(v, ast.FormattedValue) else v, module)
            for v in node.values
        ]
        return "".join(parts) if all(p is not None for p in parts) else None  # type: ignore[arg-type]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        owner = getattr(module, node.value.id, None)
        value = getattr(owner, node.attr, None)
        return value if isinstance(value, str) else None
    if isinstance(node, ast.Name):
        value = getattr(module, node.id, None)
        return value if isinstance(value, str) else None
    return None


_KOPF_WATCHERS = {"index": False, "event": False}
_KOPF_HANDLERS = {"create", "update", "delete", "resume", "field", "timer", "daemon"}


def _kopf_plural(call: ast.Call, module: Any) -> tuple[str, bool] | None:
    """(plural, is_handler) for `@kopf.index/on.*/timer/daemon(group, version, plural)`."""
    parts = []
    node: ast.AST = call.func
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not (isinstance(node, ast.Name) and node.id == "kopf") or len(call.args) < 3:
        return None
    kind = parts[0]
    if kind not in _KOPF_WATCHERS and kind not in _KOPF_HANDLERS:
        return None
    plural = _resolve(call.args[2], module)
    return (plural, kind in _KOPF_HANDLERS) if plural else None


def _controller_modules() -> Iterator[Path]:
    """Modules of the hub process (bootstrap/ runs as the chart's hook Job, checked below)."""
    for path in sorted((ROOT / "hub_controller").rglob("*.py")):
        if "bootstrap" not in path.relative_to(ROOT).parts:
            yield path


def _api_uses(path: Path) -> set[tuple[str, str]]:
    """(resource, verb) pairs this module asks the Kubernetes API for, as far as AST shows."""
    modname = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    # An import error fails the scan: a module it cannot read would hide its API uses.
    module = importlib.import_module(modname)
    uses: set[tuple[str, str]] = set()
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        kopf_plural = _kopf_plural(call, module)
        if kopf_plural is not None:
            plural, handler = kopf_plural
            uses.update((plural, v) for v in ("list", "watch"))
            if handler:  # kopf keeps handler progress and finalizers on the object
                uses.add((plural, "patch"))
            continue
        func = call.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called != "path_of" or len(call.args) < 2:
            continue
        api_version, kind = (_resolve(a, module) for a in call.args[:2])
        if api_version is None or kind is None:
            continue
        plural = KINDS[(api_version, kind)][0]
        node: ast.AST
        verb, node = "*", call
        while node in parents and not isinstance(node, ast.stmt):
            node = parents[node]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                verb = _KUBE_VERBS.get(node.func.attr, verb)
                break
        uses.add((plural, verb))
    return uses


def _part(path: Path) -> str:
    """Which part of `ocm-fl-hub` runs a module ("both": membership, shared helpers)."""
    parts = path.relative_to(ROOT / "hub_controller").parts
    if parts[0] == "signer":
        return "signer"
    if parts[0] in ("operator", "aggregator"):
        return "controller"
    return "both"


@pytest.mark.parametrize(
    ("part", "rules"),
    [("controller", rbac.CONTROLLER_RULES), ("signer", rbac.SIGNER_RULES)],
)
def test_each_parts_code_uses_only_its_declared_permissions(
    part: str, rules: tuple[rbac.Rule, ...]
) -> None:
    """Scan a part's modules (and the shared ones) for Kubernetes client calls; each must be
    declared for that part in rbac.py."""
    declared: dict[str, set[str]] = {}
    for rule in rules:
        declared.setdefault(rule.resource, set()).update(rule.verbs)
    undeclared = []
    for path in _controller_modules():
        if _part(path) not in (part, "both"):
            continue
        for resource, verb in _api_uses(path):
            verbs = declared.get(resource, set())
            if not verbs or (verb != "*" and verb not in verbs):
                undeclared.append(f"{path.relative_to(ROOT)}: {verb} {resource}")
    assert not undeclared, "add to hub_controller/bootstrap/rbac.py and the chart: " + ", ".join(
        undeclared
    )


def test_every_kind_the_kubernetes_layer_knows_is_declared() -> None:
    """The hub applies objects (Kube.apply) of kinds in ocmfl.kube.KINDS: all are granted."""
    declared = {r.resource for r in (*rbac.HUB_RULES, *rbac.CA_INIT_RULES)}
    missing = sorted(plural for plural, _ in KINDS.values() if plural not in declared)
    assert not missing, f"ocmfl.kube.KINDS has undeclared resources: {missing}"


def test_ca_init_uses_only_its_declared_permissions() -> None:
    declared = {(r.resource, v) for r in rbac.CA_INIT_RULES for v in r.verbs}
    uses = _api_uses(ROOT / "hub_controller" / "bootstrap" / "ca_init.py")
    resources = {resource for resource, _ in declared}
    assert uses and all(
        (res, verb) in declared or (verb == "*" and res in resources) for res, verb in uses
    )


# --- CRDs, scripts, Dockerfiles -----------------------------------------------------------------


def test_chart_crds_are_identical_to_generated_crds() -> None:
    src = sorted((ROOT / "crds").glob("*.yaml"))
    assert src, "crds/ is empty"
    dst = CHART / "crds"
    for f in src:
        copy = dst / f.name
        assert copy.is_file() and copy.read_bytes() == f.read_bytes(), (
            f"{copy} differs from {f}: run hack/sync-chart-crds.sh"
        )
    assert {p.name for p in dst.glob("*.yaml")} == {p.name for p in src}


def _repo_files(pattern: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", pattern],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / p for p in out if (ROOT / p).is_file()]


def test_all_shell_scripts_are_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck absent: bash hack/install-system-deps.sh installs it")
    scripts = _repo_files("*.sh")
    assert scripts
    res = _run([shellcheck, "--external-sources", *map(str, scripts)])
    assert res.returncode == 0, res.stdout + res.stderr


DOCKERFILES = sorted((ROOT / "deploy" / "images").glob("*.Dockerfile"))


def test_both_dockerfiles_exist() -> None:
    assert {p.name for p in DOCKERFILES} >= {"addon.Dockerfile", "workload.Dockerfile"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_runs_as_numeric_non_root_user(path: Path) -> None:
    users = [rest for word, rest in dockerfile_instructions(path) if word == "USER"]
    assert users, f"{path.name}: no USER"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, (
        f"{path.name}: final USER {users[-1]} is not numeric non-root"
    )


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_base_images_are_pinned_not_latest(path: Path) -> None:
    args = dict(
        rest.split("=", 1)
        for word, rest in dockerfile_instructions(path)
        if word == "ARG" and "=" in rest
    )
    stages: set[str] = set()
    for word, rest in dockerfile_instructions(path):
        if word != "FROM":
            continue
        parts = rest.split()
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), parts[0])
        if "as" in (p.lower() for p in parts):
            stages.add(parts[-1])
        if image in stages:
            continue
        assert ":" in image.split("/")[-1] or "@sha256:" in image, f"{path.name}: {image} unpinned"
        assert not image.endswith(":latest"), f"{path.name}: {image} uses latest"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_has_no_add_from_urls_and_no_torch_in_addon_image(path: Path) -> None:
    for word, rest in dockerfile_instructions(path):
        assert not (word == "ADD" and "://" in rest), f"{path.name}: ADD from a URL"
    if path.name == "addon.Dockerfile":
        assert not [rest for _, rest in dockerfile_instructions(path) if "torch" in rest.lower()]


# --- examples -----------------------------------------------------------------------------------


def test_example_federated_learning_is_valid_and_selects_clusters_by_its_data_claim() -> None:
    from hub_controller.api import FederatedLearning, SelectorOperator

    doc = yaml.safe_load((ROOT / "examples" / "federatedlearning.yaml").read_text())
    assert doc["apiVersion"] == constants.API_VERSION and doc["kind"] == constants.KIND
    fl = FederatedLearning.model_validate(doc)
    claim = fl.spec.client.data_claim
    selectors = [p.required_cluster_selector for p in fl.spec.client.placement.predicates]
    assert any(
        s is not None
        and s.claim_selector is not None
        and any(
            e.key == claim and e.operator == SelectorOperator.EXISTS
            for e in s.claim_selector.match_expressions
        )
        for s in selectors
    )
    assert fl.spec.server.min_available_clients == 2


def test_kind_demo_uses_the_examples_data_claim() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "federatedlearning.yaml").read_text())
    demo = (ROOT / "examples" / "kind" / "demo.sh").read_text()
    assert f"DATA_CLAIM:-{doc['spec']['client']['dataClaim']}}}" in demo
    assert "python -m workloads.data" in demo or "-m workloads.data partition" in demo


def test_addon_image_entry_points_import_without_workload_or_cli_packages() -> None:
    """The addon image has `.[hub,agent]` only: nothing it runs may import torch, Flower, the
    admin CLI (matplotlib, rich, typer) or hack/ (not shipped)."""
    modules = [
        "hub_controller.__main__",
        "hub_controller.operator.handlers",
        "hub_controller.aggregator.handlers",
        "hub_controller.signer.handlers",
        "hub_controller.bootstrap.ca_init",
        "agent_addon.__main__",
    ]
    code = (
        "import importlib, sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'torch', 'flwr', 'sklearn', 'workloads', 'matplotlib',"
        " 'rich', 'typer', 'ocmfl_cli', 'hack'}:\n"
        "            raise ImportError(f'{name} is not in the addon image')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
    )
    res = _run([sys.executable, "-c", code])
    assert res.returncode == 0, res.stderr[-3000:]


def test_aggregator_limits_values_become_the_hub_env_the_aggregator_reads(helm: str) -> None:
    from hub_controller.aggregator.limits import Limits

    docs = render(
        helm, "aggregator.limits.maxStreamsPerCluster=2", "aggregator.limits.reportsPerS=7.5"
    )
    (c,) = one(docs, "Deployment", HUB_ROLE)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    limits = Limits.from_env(env.get)
    assert (limits.max_streams_per_cluster, limits.reports_per_s) == (2, 7.5)
    assert limits.max_rows == Limits().max_rows


def test_certificate_lifetime_value_reaches_the_hub_env_only_when_set(helm: str) -> None:
    def env(*sets: str) -> dict[str, str]:
        (c,) = one(render(helm, *sets), "Deployment", HUB_ROLE)["spec"]["template"]["spec"][
            "containers"
        ]
        return {e["name"]: e.get("value", "") for e in c.get("env") or []}

    assert certlife.ENV_CERT_LIFETIME not in env()
    assert env("certificates.lifetimeSeconds=120")[certlife.ENV_CERT_LIFETIME] == "120"
