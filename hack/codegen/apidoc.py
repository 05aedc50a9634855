"""Generate the FederatedLearning API reference (Markdown) from the pydantic models.

`python -m hack.codegen.apidoc > docs/api.md`

Field names, defaults and descriptions come from each model's `model_fields`; types and
constraints from the model's JSON schema (the same schema `hack.codegen.crdgen` turns into
the CRD). Nothing about a field is written by hand here; `tests/unit/test_apidoc.py` fails
when docs/api.md differs from this output.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from enum import Enum
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from hack.codegen import crdgen
from hub_controller import api, policy
from ocmfl import constants

_CONSTRAINTS = (
    ("minimum", ">= {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "<= {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "min length {}"),
    ("maxLength", "max length {}"),
    ("minItems", "min items {}"),
    ("maxItems", "max items {}"),
    ("pattern", "pattern `{}`"),
)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline a `$ref`, keeping sibling keywords (default, description)."""
    while "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _non_null(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The schema of an optional field without its `null` alternative."""
    node = _resolve(node, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            return {**_resolve(options[0], defs), **rest}
    return node


def type_name(node: dict[str, Any], defs: dict[str, Any]) -> str:
    """A short type for a JSON schema node: string, integer, []T, map[string]T, enum values."""
    node = _non_null(node, defs)
    if "anyOf" in node:
        names = [type_name(o, defs) for o in node["anyOf"] if o.get("type") != "null"]
        if sorted(names) == ["integer", "string"]:
            return "int-or-string"
        return " or ".join(names)
    if "enum" in node:
        return "enum: " + ", ".join(f"`{v}`" for v in node["enum"])
    kind = node.get("type")
    if kind == "array":
        return "[]" + type_name(node.get("items", {}), defs)
    if kind == "object" and "properties" not in node:
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            return "map[string]" + type_name(extra, defs)
        return "object"
    if kind == "string" and node.get("format") == "date-time":
        return "string (date-time)"
    return str(kind or "any")


def constraints(node: dict[str, Any], defs: dict[str, Any], required: bool) -> str:
    """Required flag and the schema's bounds, lengths and patterns, comma-separated."""
    node = _non_null(node, defs)
    parts = ["**required**"] if required else []
    for key, template in _CONSTRAINTS:
        if key in node:
            parts.append(template.format(node[key]))
    if node.get("type") == "object" and node.get("additionalProperties") is True:
        parts.append("unlisted fields are kept as-is")
    return ", ".join(parts)


def default_text(field: FieldInfo) -> str:
    """The default as JSON (a nested object's default is `{}`: its own defaults apply)."""
    if field.is_required():
        return ""
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "`{}`"
    if value is None:
        return "unset"
    if isinstance(value, Enum):
        value = value.value
    return f"`{json.dumps(value)}`"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (directly, optionally, or as list items)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _is_list(annotation: Any) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    return any(_is_list(a) for a in typing.get_args(annotation))


def rows(model: type[BaseModel], prefix: str) -> list[tuple[str, str, str, str, str]]:
    """(path, type, default, constraints, description) for every field, depth first."""
    schema = model.model_json_schema(by_alias=True)
    defs: dict[str, Any] = schema.get("$defs", {})
    out: list[tuple[str, str, str, str, str]] = []
    for name, field in model.model_fields.items():
        alias = field.alias or name
        prop: dict[str, Any] = schema["properties"][alias]
        resolved = _non_null(prop, defs)
        child = _model_in(field.annotation)
        description = field.description or ""
        if not description:
            # An object or enum field without its own text takes its type's docstring.
            description = resolved.get("description", "")
            if not description and resolved.get("type") == "array":
                description = _resolve(resolved.get("items", {}), defs).get("description", "")
        path = f"{prefix}.{alias}"
        out.append(
            (
                path,
                type_name(prop, defs),
                default_text(field),
                constraints(prop, defs, field.is_required()),
                " ".join(description.split()),
            )
        )
        if child is not None:
            out += rows(child, path + ("[]" if _is_list(field.annotation) else ""))
    return out


def _table(model: type[BaseModel], prefix: str) -> list[str]:
    lines = [
        "| field | type | default | constraints | description |",
        "|---|---|---|---|---|",
    ]
    for path, kind, default, limits, description in rows(model, prefix):
        cells = (f"`{path}`", kind, default, limits, description)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def render() -> str:
    """The whole reference as Markdown."""
    version = crdgen.crd()["spec"]["versions"][0]
    columns = ", ".join(c["name"] for c in version["additionalPrinterColumns"])
    lines = [
        "# FederatedLearning API reference",
        "",
        "<!-- Generated by `python -m hack.codegen.apidoc > docs/api.md` from"
        " hub_controller/api.py; do not edit. -->",
        "",
        f"`apiVersion: {constants.API_VERSION}`, `kind: {constants.KIND}`, plural"
        f" `{constants.PLURAL}`, short name `{constants.SHORT_NAME}`, namespaced."
        f" `kubectl get {constants.SHORT_NAME}` columns: {columns}.",
        "",
        "Paths use JSON names; `[]` marks the items of a list. A default of `{}` means the"
        " object's own field defaults apply; `unset` means the field is left out. The CRD"
        " prunes unknown fields (the models forbid them), except in objects whose constraints"
        " say they are kept. The schema checks types, enums, bounds and patterns; the"
        " controller checks the rest (`hub_controller.api.semantic_problems`) and reports a"
        " refused spec as phase Failed, condition `Validated=False` (reason `InvalidSpec`) and"
        " an `InvalidSpec` event, each naming the field and the fix.",
        "",
        "## spec",
        "",
        *_table(api.FederatedLearningSpec, "spec"),
        "",
        "## status",
        "",
        "Written by the controller only. Condition types: "
        + ", ".join(f"`{t}`" for t in api.CONDITION_TYPES)
        + ".",
        "",
        *_table(api.FederatedLearningStatus, "status"),
        "",
        f"## {policy.KIND}",
        "",
        f"`apiVersion: {constants.API_VERSION}`, `kind: {policy.KIND}`, plural"
        f" `{policy.PLURAL}`, short name `{policy.SHORT_NAME}`, namespaced. Written by the hub"
        f" admin, one named `{policy.POLICY_NAME}` per tenant namespace; tenants need no access"
        " to it. It says what FederatedLearning resources in its namespace may use; a namespace"
        " without it may use nothing. The chart's ValidatingAdmissionPolicy refuses a create or"
        " spec change that breaks it, and the controller refuses it again (phase Failed,"
        " condition `Validated=False`, reason `PolicyViolation`), each naming the field and the"
        " fix (docs/security.md).",
        "",
        *_table(policy.FederationPolicySpec, "spec"),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
