"""The hub's two CAs bootstrapped, by the Helm chart's hook Jobs inside the hub.

    python -m hub_controller.bootstrap.ca_init ensure-secret --namespace NS \
        [--secret HUB_CA] [--agent-secret AGENT_CA]
    python -m hub_controller.bootstrap.ca_init publish --namespace NS --secret HUB_CA --adc ADC

`ensure-secret` creates each named kubernetes.io/tls Secret holding a new RSA CA when it is
absent, and never overwrites one: the hub CA (`--secret`, signs only the aggregator's server
certificate) and the agent CA (`--agent-secret`, signs only agent client certificates, through
the project's CSR signer). `publish` copies the hub CA *certificate* (public) into the
AddOnDeploymentConfig variables HUB_CA_BUNDLE_0.._3, from which the AddOnTemplate gives
agents the CA to verify the aggregator. The agent CA is never published. The private keys are
made here, in the cluster; they never pass through Helm.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ocmfl import constants, pki
from ocmfl.kube import Kube, path_of

TLS_SECRET_TYPE = "kubernetes.io/tls"


def ca_secret(name: str, namespace: str, pair: pki.CertAndKey) -> dict[str, Any]:
    """A CA Secret object (kubernetes.io/tls: tls.crt, tls.key)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": TLS_SECRET_TYPE,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "ocm-federated-learning"},
        },
        "data": {
            "tls.crt": base64.b64encode(pki.cert_to_pem(pair.cert)).decode(),
            "tls.key": base64.b64encode(pki.key_to_pem(pair.key)).decode(),
        },
    }


def bundle_variables(ca_pem: bytes) -> list[dict[str, str]]:
    """ADC customizedVariables carrying base64(ca_pem) in pieces of at most 1024 characters.

    Always returns every HUB_CA_BUNDLE_<i> (empty when unused) so a shorter new CA clears the
    tail of a longer old one. Raises ValueError when the certificate does not fit.
    """
    encoded = base64.b64encode(ca_pem).decode()
    size = constants.ADDON_VAR_MAX_LENGTH
    n = constants.ADDON_VAR_HUB_CA_BUNDLE_CHUNKS
    if len(encoded) > size * n:
        raise ValueError(f"CA bundle of {len(encoded)} base64 chars exceeds {n} x {size}")
    prefix = constants.ADDON_VAR_HUB_CA_BUNDLE_PREFIX
    return [{"name": f"{prefix}{i}", "value": encoded[i * size : (i + 1) * size]} for i in range(n)]


def merge_variables(
    existing: Sequence[Mapping[str, str]], updates: Sequence[Mapping[str, str]]
) -> list[dict[str, str]]:
    """`existing` with every variable named in `updates` replaced (order kept, new ones last)."""
    new = {u["name"]: dict(u) for u in updates}
    out = [new.pop(v["name"], dict(v)) for v in existing]
    out.extend(u for u in (dict(x) for x in updates) if u["name"] in new)
    return out


def join_bundle(variables: Sequence[Mapping[str, str]]) -> bytes:
    """Inverse of `bundle_variables`: the CA PEM that the agent's Secret ends up holding."""
    prefix = constants.ADDON_VAR_HUB_CA_BUNDLE_PREFIX
    values = {v["name"]: v.get("value", "") for v in variables}
    parts = (
        values.get(f"{prefix}{i}", "") for i in range(constants.ADDON_VAR_HUB_CA_BUNDLE_CHUNKS)
    )
    return base64.b64decode("".join(parts))


# --- I/O edge: the Kubernetes API --------------------------------------------------------------


def _adc_path(namespace: str, name: str) -> str:
    return path_of(f"{constants.ADDON_GROUP}/v1alpha1", "AddOnDeploymentConfig", namespace, name)


def ensure_secret(
    kube: Kube, namespace: str, name: str, validity_days: int, common_name: str | None = None
) -> bool:
    """Create the CA Secret when absent. True when it was created."""
    if kube.get(path_of("v1", "Secret", namespace, name)) is not None:
        return False
    pair = pki.create_ca(
        common_name or f"ocm-fl-ca-{namespace}",
        lifetime=dt.timedelta(days=validity_days),
        key_kind="rsa",
    )
    # None: created concurrently (409); keep theirs.
    created = kube.create(path_of("v1", "Secret", namespace), ca_secret(name, namespace, pair))
    return created is not None


def publish(kube: Kube, namespace: str, name: str, adc: str) -> None:
    """Write the CA certificate from Secret `name` into ADC `adc`'s HUB_CA_BUNDLE_* variables."""
    secret = kube.request("GET", path_of("v1", "Secret", namespace, name))
    ca_pem = base64.b64decode(secret["data"]["tls.crt"])
    pki.load_cert_pem(ca_pem)  # fail loudly on a malformed Secret
    obj = kube.request("GET", _adc_path(namespace, adc))
    current = obj.get("spec", {}).get("customizedVariables", [])
    merged = merge_variables(current, bundle_variables(ca_pem))
    if merged == current:
        return
    kube.patch(_adc_path(namespace, adc), {"spec": {"customizedVariables": merged}})


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (the chart's hook Jobs)."""
    parser = argparse.ArgumentParser(prog="python -m hub_controller.bootstrap.ca_init")
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("ensure-secret", help="create the CA Secrets if they are absent")
    e.add_argument("--validity-days", type=int, default=365)
    e.add_argument("--namespace", required=True)
    e.add_argument("--secret", help="the hub CA Secret (aggregator server certificate)")
    e.add_argument("--agent-secret", help="the agent CA Secret (agent client certificates)")
    p = sub.add_parser("publish", help="copy the hub CA certificate into the ADC variables")
    p.add_argument("--adc", required=True, help="AddOnDeploymentConfig name (same namespace)")
    p.add_argument("--namespace", required=True)
    p.add_argument("--secret", required=True, help="the hub CA Secret")
    args = parser.parse_args(argv)
    if args.command == "ensure-secret" and not (args.secret or args.agent_secret):
        parser.error("ensure-secret: name --secret and/or --agent-secret")
    kube = Kube(field_manager="ocm-fl-ca-init")
    if args.command == "ensure-secret":
        for name, prefix in ((args.secret, "ocm-fl-ca"), (args.agent_secret, "ocm-fl-agent-ca")):
            if not name:
                continue
            created = ensure_secret(
                kube, args.namespace, name, args.validity_days, f"{prefix}-{args.namespace}"
            )
            print(f"CA secret {args.namespace}/{name}: {'created' if created else 'exists'}")
    else:
        publish(kube, args.namespace, args.secret, args.adc)
        print(f"CA bundle published to AddOnDeploymentConfig {args.namespace}/{args.adc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
