"""docs/api.md is generated from the API models and lists every field."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from hack.codegen import apidoc
from hub_controller import api

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _paths(model: type[BaseModel], prefix: str) -> list[str]:
    return [row[0] for row in apidoc.rows(model, prefix)]


def test_committed_api_doc_matches_the_models() -> None:
    assert API_DOC.read_text() == apidoc.render(), (
        "docs/api.md is stale: run `python -m hack.codegen.apidoc > docs/api.md`"
    )


def test_every_top_level_field_is_documented_under_its_json_name() -> None:
    spec = _paths(api.FederatedLearningSpec, "spec")
    status = _paths(api.FederatedLearningStatus, "status")
    for name, field in api.FederatedLearningSpec.model_fields.items():
        assert f"spec.{field.alias or name}" in spec
    for name, field in api.FederatedLearningStatus.model_fields.items():
        assert f"status.{field.alias or name}" in status
    assert "spec.server.minAvailableClients" in spec
    assert "spec.client.overrides[].clusterName" in spec
    assert "status.clusters[].lastReportTime" in status


def test_rows_carry_type_default_constraints_and_description() -> None:
    rows = {r[0]: r[1:] for r in apidoc.rows(api.FederatedLearningSpec, "spec")}
    assert rows["spec.server.rounds"][:3] == ("integer", "`3`", ">= 1")
    assert rows["spec.server.storage.type"][0].startswith("enum: `HostPath`, `PVC`")
    assert rows["spec.server.app.path"][2] == "**required**, pattern `^/`"
    kind, default, limits, description = rows["spec.client.dataClaim"]
    assert (kind, default) == ("string", "unset")
    assert limits.startswith("max length 253")
    assert description.startswith("ClusterClaim whose value is the data path on each cluster.")
    assert rows["spec.server.resources.limits"][0] == "map[string]int-or-string"
    assert rows["spec.server.initModel"][1] == "unset"
    assert "kept as-is" in rows["spec.client.placement"][2]


def test_pipes_in_patterns_do_not_break_the_table() -> None:
    line = next(x for x in apidoc.render().splitlines() if "tolerations[].operator" in x)
    assert "Exists\\|Equal" in line
    assert line.count(" | ") == 4


def test_every_field_in_the_reference_has_a_description() -> None:
    empty = []
    for line in API_DOC.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.replace("\\|", "\0").strip("|").split("|")]
        assert len(cells) == 5, line
        if not cells[4]:
            empty.append(cells[0])
    assert empty == [], f"fields without a description in docs/api.md: {empty}"
