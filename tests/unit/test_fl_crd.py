"""The committed CRD is generated from the models and is a structural schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.codegen import crdgen

CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "federatedlearnings.yaml"


def _version() -> dict[str, Any]:
    version: dict[str, Any] = crdgen.crd()["spec"]["versions"][0]
    return version


def _nodes(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, sub in (node.get("properties") or {}).items():
            out += _nodes(sub, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            out += _nodes(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            out += _nodes(node["additionalProperties"], f"{path}{{}}")
    return out


def test_committed_crd_matches_the_models() -> None:
    assert CRD_FILE.read_text() == crdgen.render(), (
        "crds/federatedlearnings.yaml is stale: run "
        "`python -m hack.codegen.crdgen > crds/federatedlearnings.yaml`"
    )


@pytest.mark.parametrize("name", sorted(crdgen.FILES))
def test_every_committed_crd_matches_the_models(name: str) -> None:
    assert (CRD_FILE.parent / name).read_text() == crdgen.FILES[name](), (
        f"crds/{name} is stale: run `python -m hack.codegen.crdgen --write` and "
        "hack/sync-chart-crds.sh"
    )


def test_policy_crd_is_structural_with_defaults() -> None:
    version = crdgen.policy_crd()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    assert schema["required"] == ["spec"]
    spec = schema["properties"]["spec"]
    # Defaults make every field present for the admission policy's CEL (allow nothing); the
    # two caps and allowedClusterSets are optional (unset: no cap; the bound sets), and the
    # CEL checks has() on them.
    defaults = {k: v.get("default") for k, v in spec["properties"].items()}
    assert defaults == {
        "allowedImagePrefixes": [],
        "allowedDataClaims": [],
        "allowWritableDataMount": False,
        "allowHostPathStore": False,
        "allowedAdvertiseDomains": [],
        "allowedPriorityClasses": [],
        "allowedSchedulerNames": [],
        "allowedTolerationKeys": [],
        "allowedPlacementTolerationKeys": [],
        "allowKeylessTolerations": False,
        "allowedNodeSelectorKeys": [],
        "allowedLabelPrefixes": [],
        "allowedAnnotationPrefixes": [],
        "maxPodResources": {},
        "allowedClusterSets": None,
        "maxClusters": None,
        "maxRounds": None,
        "allowedAppPathPrefixes": [],
        "allowInstallDependencies": False,
        "allowedS3Buckets": [],
        "allowedS3Endpoints": [],
        "allowedEnv": [],
        "requirePrivacy": None,
        "requirePrivacyForClaims": None,
    }
    for path, node in _nodes(schema):
        assert not {"$ref", "anyOf", "allOf", "title"} & set(node), path


def test_schema_is_structural() -> None:
    schema = _version()["schema"]["openAPIV3Schema"]
    for path, node in _nodes(schema):
        for banned in ("$ref", "anyOf", "allOf", "oneOf", "$defs", "const", "title"):
            assert banned not in node, f"{path} has {banned}"
        assert (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ), f"{path} has no type"
        assert node.get("additionalProperties") is not False, path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def test_schema_carries_defaults_enums_bounds_and_required() -> None:
    spec = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    server = spec["properties"]["server"]
    assert spec["required"] == ["client"]
    assert server["properties"]["rounds"]["minimum"] == 1
    assert server["properties"]["minAvailableClients"]["minimum"] == 1
    assert server["properties"]["app"]["required"] == ["path"]
    assert "PersistentVolumeClaim" in server["properties"]["storage"]["properties"]["type"]["enum"]
    assert server["default"] == {}
    client = spec["properties"]["client"]
    assert "dataClaim" not in client.get("required", [])  # inferred from the placement
    # Fields of the incumbent controller are kept (not pruned) so the controller can say
    # what to write instead.
    assert server["properties"]["listeners"]["type"] == "array"
    assert client["properties"]["dataMount"]["properties"]["mountPath"]["default"] == "/data"
    assert client["properties"]["placement"]["x-kubernetes-preserve-unknown-fields"] is True
    limits = client["properties"]["resources"]["properties"]["limits"]
    assert limits["additionalProperties"] == {"x-kubernetes-int-or-string": True}


def test_printer_columns_short_name_and_status_subresource() -> None:
    crd = crdgen.crd()
    version = _version()
    assert crd["spec"]["names"]["shortNames"] == ["fl"]
    assert version["subresources"] == {"status": {}}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Phase", "Round", "Clients", "Accuracy", "Age"]


def test_generated_yaml_parses_back_to_the_crd() -> None:
    text = crdgen.render()
    assert yaml.safe_load(text) == crdgen.crd()


@pytest.mark.parametrize("which", ["fl", "policy"])
def test_every_spec_string_list_and_map_is_bounded(which: str) -> None:
    """One resource cannot carry unbounded input into hub etcd (issue 29 item 2); status is
    the controller's own and bounded by it."""
    made = crdgen.crd() if which == "fl" else crdgen.policy_crd()
    root = made["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path, node in _nodes(root):
        kind = node.get("type")
        if kind == "string":
            assert "maxLength" in node or "enum" in node, path
        elif kind == "array":
            assert "maxItems" in node, path
        elif kind == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path
