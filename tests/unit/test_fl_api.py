"""FederatedLearning API models: defaults, camelCase JSON, validation messages."""

from __future__ import annotations

import pytest
from fl_fixtures import REF, spec, spec_dict

from hub_controller.api import (
    FederatedLearningStatus,
    Phase,
    SpecError,
    StorageType,
    parse_spec,
)
from ocmfl import constants


def test_minimal_spec_gets_defaults() -> None:
    s = spec()
    assert s.framework.value == "flower"
    assert s.server.image == constants.WORKLOAD_IMAGE
    assert s.client.image == constants.WORKLOAD_IMAGE
    assert s.client.data_mount.mount_path == "/data"
    assert s.client.data_mount.read_only is True
    assert s.server.strategy.name.value == "fedavg"
    assert s.server.storage.type == StorageType.HOST_PATH
    assert s.server.timeouts.clients_ready_seconds > 0


def test_spec_round_trips_in_camel_case() -> None:
    dumped = spec().model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped["server"]["minAvailableClients"] == 2
    assert dumped["client"]["dataClaim"] == "fl.data-path"
    assert dumped["client"]["dataMount"] == {"mountPath": "/data", "readOnly": True}


def test_min_clients_above_number_of_clusters_names_both_fields_and_the_fix() -> None:
    raw = spec_dict(minAvailableClients=3)
    raw["client"]["placement"]["numberOfClusters"] = 2
    with pytest.raises(SpecError) as exc:
        parse_spec(raw, REF.name)
    assert str(exc.value) == (
        "spec.server.minAvailableClients (3) is larger than "
        "spec.client.placement.numberOfClusters (2): lower minAvailableClients or raise "
        "numberOfClusters"
    )


def test_missing_data_claim_is_reported_with_its_path() -> None:
    raw = spec_dict()
    del raw["client"]["dataClaim"]
    with pytest.raises(SpecError) as exc:
        parse_spec(raw)
    assert "spec.client.dataClaim" in str(exc.value)


def test_zero_rounds_is_refused() -> None:
    with pytest.raises(SpecError, match=r"spec\.server\.rounds"):
        parse_spec(spec_dict(rounds=0))


def test_unknown_strategy_is_refused() -> None:
    with pytest.raises(SpecError, match=r"spec\.server\.strategy\.name"):
        parse_spec(spec_dict(strategy={"name": "fedmagic"}))


def test_fedprox_without_mu_asks_for_proximal_mu() -> None:
    with pytest.raises(SpecError, match="proximalMu must be set"):
        parse_spec(spec_dict(strategy={"name": "fedprox"}))
    ok = parse_spec(spec_dict(strategy={"name": "fedprox", "params": {"proximalMu": 0.1}}))
    assert ok.server.strategy.params.proximal_mu == 0.1


def test_unknown_strategy_params_are_refused() -> None:
    with pytest.raises(SpecError, match=r"spec\.server\.strategy\.params\.serverLearningRate"):
        parse_spec(spec_dict(strategy={"params": {"serverLearningRate": 0.5}}))


def test_override_needs_exactly_one_of_name_or_selector() -> None:
    raw = spec_dict()
    raw["client"]["overrides"] = [{"env": [{"name": "A", "value": "1"}]}]
    with pytest.raises(SpecError, match=r"overrides\[0\]: set exactly one"):
        parse_spec(raw)


def test_bad_resource_quantity_is_refused() -> None:
    raw = spec_dict()
    raw["client"]["resources"] = {"limits": {"cpu": "lots"}}
    with pytest.raises(SpecError, match="not a Kubernetes quantity"):
        parse_spec(raw)


def test_pvc_storage_needs_claim_or_size() -> None:
    with pytest.raises(SpecError, match="claimName"):
        parse_spec(spec_dict(storage={"type": "PVC"}))
    assert parse_spec(spec_dict(storage={"type": "PVC", "size": "1Gi"}))


def test_advertise_address_must_be_host_port() -> None:
    with pytest.raises(SpecError, match="advertiseAddress"):
        parse_spec(spec_dict(advertiseAddress="no-port"))
    assert parse_spec(spec_dict(advertiseAddress="127.0.0.1:9443"))


def test_long_resource_name_is_refused_because_of_label_limits() -> None:
    with pytest.raises(SpecError, match=r"metadata\.name"):
        parse_spec(spec_dict(), "x" * 64)


def test_unknown_spec_field_is_refused() -> None:
    raw = spec_dict()
    raw["server"]["roundz"] = 3
    with pytest.raises(SpecError, match=r"spec\.server\.roundz"):
        parse_spec(raw)


def test_placement_keeps_fields_it_does_not_model() -> None:
    raw = spec_dict()
    raw["client"]["placement"]["prioritizerPolicy"] = {"mode": "Additive"}
    s = parse_spec(raw)
    dumped = s.client.placement.model_dump(by_alias=True, exclude_none=True)
    assert dumped["prioritizerPolicy"] == {"mode": "Additive"}


def test_empty_status_is_pending() -> None:
    assert FederatedLearningStatus().phase == Phase.PENDING
