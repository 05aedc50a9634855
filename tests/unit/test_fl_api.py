"""FederatedLearning API models: defaults, camelCase JSON, validation messages."""

from __future__ import annotations

import pytest
from fl_fixtures import REF, spec, spec_dict

from hub_controller.api import (
    FederatedLearningStatus,
    FLRef,
    Phase,
    SpecError,
    StorageType,
    data_claim_of,
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
    assert s.server.app is not None and s.server.app.run_config == {}
    assert s.server.app.install_dependencies is False
    assert s.server.storage.type == StorageType.PVC  # on the hub's default StorageClass
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


def test_missing_data_claim_comes_from_the_one_exists_claim_key_or_is_asked_for() -> None:
    raw = spec_dict()
    del raw["client"]["dataClaim"]
    # The incumbent controller's rule: one claimSelector key with Exists names the claim.
    assert data_claim_of(parse_spec(raw)) == ("fl.data-path", True)
    assert data_claim_of(spec()) == ("fl.data-path", False)
    selector = raw["client"]["placement"]["predicates"][0]["requiredClusterSelector"]
    selector["claimSelector"]["matchExpressions"].append({"key": "gpu", "operator": "Exists"})
    with pytest.raises(SpecError) as exc:
        parse_spec(raw)
    assert "spec.client.dataClaim is required" in str(exc.value)
    assert "it selects 2: fl.data-path, gpu" in str(exc.value)


def test_zero_rounds_is_refused() -> None:
    with pytest.raises(SpecError, match=r"spec\.server\.rounds"):
        parse_spec(spec_dict(rounds=0))


def test_an_app_is_required() -> None:
    raw = spec_dict()
    del raw["server"]["app"]
    with pytest.raises(SpecError, match=r"spec\.server\.app\.path is required.*/opt/ocm-fl/apps/"):
        parse_spec(raw)
    with pytest.raises(SpecError, match=r"spec\.server\.app\.path"):
        parse_spec(spec_dict(app={"path": "relative/app"}))


def test_the_incumbent_controllers_spellings_are_accepted() -> None:
    s = parse_spec(spec_dict(storage={"type": "PersistentVolumeClaim", "name": "models"}))
    assert s.server.storage.is_pvc and s.server.storage.claim == "models"
    bucket = {"bucketName": "fl", "prefix": "runs"}
    s = parse_spec(spec_dict(storage={"type": "S3Bucket", "s3": bucket}))
    assert s.server.storage.is_s3 and s.server.storage.s3 is not None
    assert s.server.storage.s3.uri() == "s3://fl/runs"


def test_other_fields_get_an_error_naming_their_new_form() -> None:
    raw = spec_dict(
        task="digits",
        strategy={"name": "fedavg"},
        listeners=[{"name": "l", "port": 8080, "type": "NodePort"}],
        superlink="superlink.flower-system:9091",
    )
    raw["client"]["supernode"] = "flower-supernode:9094"
    with pytest.raises(SpecError) as exc:
        parse_spec(raw)
    problems = exc.value.problems
    assert any(p.startswith("spec.server.task (digits) was removed") and
               "spec.server.app.path: /opt/ocm-fl/apps/digits" in p for p in problems)  # fmt: skip
    assert any("spec.server.strategy was removed" in p and "app.runConfig" in p for p in problems)
    assert any("spec.server.listeners" in p and "advertiseAddress" in p for p in problems)
    assert any(p.startswith("spec.server.superlink is not used") for p in problems)
    assert any(p.startswith("spec.client.supernode is not used") for p in problems)


def test_pod_settings_are_validated() -> None:
    pod = {"labels": {"federated-learning.open-cluster-management.io/name": "x"}}
    with pytest.raises(SpecError, match=r"spec\.server\.pod\.labels .* belongs to the controller"):
        parse_spec(spec_dict(pod=pod))
    with pytest.raises(SpecError, match=r"tolerations\[0\]\.operator"):
        parse_spec(spec_dict(pod={"tolerations": [{"operator": "Maybe"}]}))


def test_s3_storage_needs_a_bucket() -> None:
    with pytest.raises(SpecError, match=r"type S3 needs s3\.bucketName"):
        parse_spec(spec_dict(storage={"type": "S3"}))
    with pytest.raises(SpecError, match="set type S3"):
        parse_spec(spec_dict(storage={"s3": {"bucketName": "b"}}))


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


def test_pvc_storage_without_claim_or_size_gets_a_default_claim() -> None:
    """A resource that says nothing about storage gets a controller-made claim of the default
    size: it passes an empty FederationPolicy (HostPath needs allowHostPathStore)."""
    from hub_controller.operator.desired.server import desired_model_claim

    for storage in ({"type": "PVC"}, None):
        spec = parse_spec(spec_dict(storage=storage) if storage else spec_dict())
        claim = desired_model_claim(FLRef(namespace="fl", name="mnist", uid="u"), spec)
        assert claim is not None
        assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
        assert "storageClassName" not in claim["spec"]  # the default StorageClass


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


def test_the_env_field_lists_every_reserved_name() -> None:
    from hub_controller.api import RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES, ClusterOverride

    text = ClusterOverride.model_fields["env"].description or ""
    assert all(f"{p}*" in text for p in RESERVED_ENV_PREFIXES)
    assert all(n in text for n in RESERVED_ENV_NAMES)
