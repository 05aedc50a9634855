"""Generate the CRDs (FederatedLearning, FederationPolicy) from the pydantic models.

`python -m hack.codegen.crdgen > crds/federatedlearnings.yaml`
`python -m hack.codegen.crdgen federationpolicies > crds/federationpolicies.yaml`
`python -m hack.codegen.crdgen --write` writes every file in `FILES` (then run
hack/sync-chart-crds.sh for the chart's copies).

Pydantic writes JSON Schema 2020-12; a CRD needs a *structural* OpenAPI v3.0 schema. The
conversion inlines `$ref`s, turns `anyOf[X, null]` into X (optional fields are simply not
required), `anyOf[integer, string]` into `x-kubernetes-int-or-string`, other scalar unions and
open objects into `x-kubernetes-preserve-unknown-fields`, and numeric `exclusiveMinimum`
into the OpenAPI 3.0 boolean form.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from hub_controller import policy
from hub_controller.api import (
    SPEC_MAX_ITEMS,
    SPEC_MAX_PROPERTIES,
    SPEC_MAX_STRING,
    FederatedLearningSpec,
    FederatedLearningStatus,
)
from ocmfl import constants

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"

_DROP = {"title", "discriminator", "examples"}
_KEEP = {
    "type",
    "format",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "items",
    "properties",
    "required",
    "additionalProperties",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline a `$ref` (and single-element allOf) keeping sibling keywords."""
    while True:
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            rest = {k: v for k, v in node.items() if k != "$ref"}
            node = {**target, **rest}
        elif "allOf" in node and len(node["allOf"]) == 1:
            rest = {k: v for k, v in node.items() if k != "allOf"}
            node = {**node["allOf"][0], **rest}
        else:
            return node


def structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Convert one pydantic JSON-schema node into a structural CRD schema node."""
    node = _resolve(node, defs)
    if "anyOf" in node:
        options = [_resolve(o, defs) for o in node["anyOf"]]
        non_null = [o for o in options if o.get("type") != "null"]
        siblings = {k: v for k, v in node.items() if k != "anyOf"}
        if len(non_null) == 1:
            node = {**non_null[0], **siblings}
        else:
            types = sorted(str(o.get("type")) for o in non_null)
            out: dict[str, Any] = {}
            if types == ["integer", "string"]:
                out["x-kubernetes-int-or-string"] = True
            else:
                out["x-kubernetes-preserve-unknown-fields"] = True
            if "description" in siblings:
                out["description"] = siblings["description"]
            if siblings.get("default") is not None:
                out["default"] = siblings["default"]
            return out
    out = {}
    for key, value in node.items():
        if key in _DROP or key not in _KEEP:
            continue
        if key == "properties":
            out[key] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = structural(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = structural(value, defs)
            elif value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            # `false` is implied by a structural schema (unknown fields are pruned)
        elif key == "exclusiveMinimum":
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum":
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        elif key == "default" and value is None:
            continue
        else:
            out[key] = value
    if out.get("type") == "object" and not ({"properties", "additionalProperties"} & set(out)):
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "required" in out and not out["required"]:
        del out["required"]
    return out


def _schema_of(model: type[BaseModel]) -> Any:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return structural(raw, defs)


def bounded(node: dict[str, Any]) -> dict[str, Any]:
    """`node` with a bound on every string, list and map that has none (api.SPEC_MAX_*):
    user input, unlike status, has no other limit."""
    out = dict(node)
    if out.get("type") == "string" and "maxLength" not in out and "enum" not in out:
        out["maxLength"] = SPEC_MAX_STRING
    if out.get("type") == "array" and "maxItems" not in out:
        out["maxItems"] = SPEC_MAX_ITEMS
    is_map = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
    if out.get("type") == "object" and is_map and "maxProperties" not in out:
        out["maxProperties"] = SPEC_MAX_PROPERTIES
    if "properties" in out:
        out["properties"] = {k: bounded(v) for k, v in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = bounded(out[key])
    return out


def _namespaced_crd(
    kind: str,
    plural: str,
    short_name: str,
    description: str,
    properties: dict[str, Any],
    version_extra: dict[str, Any],
) -> dict[str, Any]:
    """A namespaced CustomResourceDefinition of one served and stored version; `properties`
    follow apiVersion, kind and metadata, `version_extra` goes before the schema."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{constants.GROUP}"},
        "spec": {
            "group": constants.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short_name],
            },
            "versions": [
                {
                    "name": constants.VERSION,
                    "served": True,
                    "storage": True,
                    **version_extra,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                **properties,
                            },
                        }
                    },
                }
            ],
        },
    }


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object for FederatedLearning."""
    spec_schema = bounded(_schema_of(FederatedLearningSpec))
    spec_schema["description"] = "Desired federation: server on the hub, clients on clusters."
    status_schema = _schema_of(FederatedLearningStatus)
    status_schema["description"] = "Observed state, written by the hub controller."
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Round", "type": "integer", "jsonPath": ".status.round"},
        {"name": "Clients", "type": "string", "jsonPath": ".status.clients"},
        {"name": "Accuracy", "type": "number", "jsonPath": ".status.accuracy"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return _namespaced_crd(
        constants.KIND,
        constants.PLURAL,
        constants.SHORT_NAME,
        "A federated-learning run across OCM managed clusters.",
        {"spec": spec_schema, "status": status_schema},
        {"subresources": {"status": {}}, "additionalPrinterColumns": columns},
    )


def policy_crd() -> dict[str, Any]:
    """The CustomResourceDefinition object for FederationPolicy (written by the hub admin)."""
    return _namespaced_crd(
        policy.KIND,
        policy.PLURAL,
        policy.SHORT_NAME,
        "The hub admin's policy for FederatedLearning resources in its namespace; only the one "
        f"named {policy.POLICY_NAME} is used.",
        {"spec": bounded(_schema_of(policy.FederationPolicySpec))},
        {},
    )


def _render(obj: dict[str, Any], args: str) -> str:
    header = f"# Generated by `python -m hack.codegen.crdgen{args}`; do not edit.\n"
    return header + yaml.safe_dump(obj, sort_keys=False, width=100)


def render() -> str:
    """The CRD as YAML text (what crds/federatedlearnings.yaml holds)."""
    return _render(crd(), "")


def render_policy() -> str:
    """The FederationPolicy CRD as YAML text (crds/federationpolicies.yaml)."""
    return _render(policy_crd(), " federationpolicies")


# File name in crds/ -> its text.
FILES: dict[str, Callable[[], str]] = {
    f"{constants.PLURAL}.yaml": render,
    f"{policy.PLURAL}.yaml": render_policy,
}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--write"]:
        for name, text in FILES.items():
            (CRD_DIR / name).write_text(text())
        return
    which = args[0] if args else constants.PLURAL
    sys.stdout.write(FILES[f"{which}.yaml"]())


if __name__ == "__main__":
    main()
