"""Secure aggregation (SecAgg+, workloads/sdk/secagg.py, docs/privacy.md): the tenant's strategy
gets only the aggregate, the server sees each client's update only masked, drop-outs within the
threshold still complete, and a cluster that requires it refuses a server that does not run it.

The clients are the platform's own mods (the worker's `GuardedClientApp` order: SecAgg+ outside
the privacy mod) around a small app, each with the Context Flower keeps for it between messages;
the messages go through `PlatformGrid` over an in-process grid. Flower's crypto (key agreement,
Shamir shares, masks) is the real one. The same run over real processes and TLS is
tests/integration/test_federation.py::test_secure_aggregation_*."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fl_fixtures import spec_dict
from flower_local import LocalGrid, stamp_task_identity
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.quantization import dequantize
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from hub_controller.api import SpecError, parse_spec
from ocmfl.privacy import (
    ClientPrivacy,
    PrivacySettingError,
    SecAggSettings,
    client_privacy,
    parse_requirement,
)
from workloads.sdk import FedAvg, ServerPlatform, run_strategy, to_numpy, to_record
from workloads.sdk.loop import PrivacyRefusedError, TooFewResultsError
from workloads.sdk.metrics import CLIENT_RECORD
from workloads.sdk.privacy import REFUSAL, privacy_mod
from workloads.sdk.secagg import secagg_mod

N = 2_000  # model values


@pytest.fixture(autouse=True)
def _task(monkeypatch: pytest.MonkeyPatch) -> None:
    stamp_task_identity(monkeypatch)


class Cluster:
    """One cluster's client: an app that adds `delta` to the model and reports `samples`,
    inside the platform's mods; it keeps Flower's per-node Context and what it replied."""

    def __init__(self, name: str, delta: np.ndarray, samples: int, privacy: ClientPrivacy) -> None:
        self.name, self.delta, self.samples = name, delta, samples
        self.context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                               run_config={})  # fmt: skip
        self.mod = secagg_mod(privacy, privacy_mod(privacy))
        self.app_calls = 0  # train messages its app saw
        self.replies: list[Message] = []
        self.drop_at: str | None = None  # a stage it does not answer (it dropped out)

    def app(self, msg: Message, _ctx: Context) -> Message:
        self.app_calls += msg.metadata.message_type == "train"
        got = to_numpy(msg.content.array_records["arrays"])
        content = RecordDict({
            "arrays": to_record({"w": got["w"] + self.delta, "steps": got["steps"] + 7}),
            "metrics": MetricRecord({"loss": 0.5, "num-examples": self.samples}),
            CLIENT_RECORD: ConfigRecord({"cluster": self.name}),
        })  # fmt: skip
        return Message(content, reply_to=msg)

    def __call__(self, msg: Message) -> Message:
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
        if configs is not None and configs.get(Key.STAGE) == self.drop_at:
            return Message(Error(code=0, reason="Node Unavailable"), reply_to=msg)
        reply = self.mod(msg, self.context, self.app)
        self.replies.append(reply)
        return reply


def _start() -> dict[str, np.ndarray]:
    return {"w": np.linspace(-1, 1, N).astype(np.float32), "steps": np.array([3], np.int64)}


def _platform(
    tmp_path: Path, secagg: dict[str, Any], min_results: int, **kw: Any
) -> ServerPlatform:
    return ServerPlatform(storage=str(tmp_path), resource_uid="uid-1", min_results=min_results,
                          secure_aggregation=json.dumps(secagg), **kw)  # fmt: skip


def _run(clusters: list[Cluster], platform: ServerPlatform) -> dict[str, np.ndarray]:
    grid = LocalGrid({i + 1: c for i, c in enumerate(clusters)})
    result = run_strategy(FedAvg(), grid, initial_arrays=to_record(_start()), num_rounds=1,
                          platform=platform)  # fmt: skip
    return to_numpy(result.arrays)


def _clusters(count: int, privacy: Callable[[str], ClientPrivacy] = ClientPrivacy) -> list[Cluster]:
    rng = np.random.default_rng(7)
    return [
        Cluster(f"c{i}", rng.normal(0, 0.05, N), samples=100 * i, privacy=privacy(f"c{i}"))
        for i in range(1, count + 1)
    ]


def _masked_update(cluster: Cluster, settings: SecAggSettings) -> np.ndarray:
    """What the server received from `cluster` in the collect stage, read as its update."""
    (reply,) = [
        r for r in cluster.replies
        if not r.has_error()
        and Key.MASKED_PARAMETERS in r.content.config_records.get(RECORD_KEY_CONFIGS, {})
    ]  # fmt: skip
    assert not reply.content.array_records  # no model leaves the cluster
    blobs = reply.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]
    vector = [bytes_to_ndarray(b) for b in blobs]  # type: ignore[union-attr,arg-type]
    return dequantize(vector[1:], settings.clipping_range, settings.quantization_range)[0]


def test_the_strategy_gets_the_weighted_average_and_the_server_sees_only_masked_updates(
    tmp_path: Path,
) -> None:
    clusters = _clusters(3)
    settings = SecAggSettings(threshold=2)
    got = _run(clusters, _platform(tmp_path, settings.to_spec(), min_results=3))

    weights = np.array([c.samples for c in clusters], np.float64)
    true = sum(w * c.delta for w, c in zip(weights, clusters, strict=True)) / weights.sum()
    # The aggregate is the sample-weighted average, to the quantization's precision
    # (2 * clippingRange / 2**22 per value and client, scaled by weight / maxWeight).
    assert np.abs(got["w"] - (_start()["w"] + true)).max() < 1e-3
    assert got["steps"].tolist() == [3]  # integer arrays are not summed: as sent
    for cluster in clusters:
        assert cluster.app_calls == 1  # the app trained once, in the collect stage
        seen = _masked_update(cluster, settings)
        own = cluster.delta * cluster.samples / settings.max_weight
        # The masked update is uniform noise over the range, unrelated to the true one.
        assert np.abs(seen - own).mean() > settings.clipping_range / 4
        assert abs(np.corrcoef(seen, own)[0, 1]) < 0.15


def test_a_drop_out_within_the_threshold_completes_without_that_cluster(tmp_path: Path) -> None:
    clusters = _clusters(4)
    clusters[1].drop_at = Stage.COLLECT_MASKED_VECTORS  # keys shared, then gone
    got = _run(clusters, _platform(tmp_path, {"reconstructionThreshold": 3}, min_results=3))
    stayed = [c for c in clusters if c.drop_at is None]
    weights = np.array([c.samples for c in stayed], np.float64)
    true = sum(w * c.delta for w, c in zip(weights, stayed, strict=True)) / weights.sum()
    # Its pairwise masks were rebuilt from the others' shares of its key.
    assert np.abs(got["w"] - (_start()["w"] + true)).max() < 1e-3


def test_too_many_drop_outs_fail_the_round_saying_why(tmp_path: Path) -> None:
    clusters = _clusters(3)
    clusters[0].drop_at = Stage.SHARE_KEYS
    with pytest.raises(TooFewResultsError, match=r"secure aggregation halted after the share "
                       r"keys stage: .* the reconstruction threshold is 3"):  # fmt: skip
        _run(clusters, _platform(tmp_path, {"reconstructionThreshold": 3}, min_results=2))


def test_a_cluster_that_requires_secagg_refuses_a_server_that_does_not_run_it(
    tmp_path: Path,
) -> None:
    def privacy(name: str) -> ClientPrivacy:
        requirement = parse_requirement("secagg") if name == "c2" else None
        return client_privacy(name, None, requirement)

    clusters = _clusters(3, privacy)
    plain = ServerPlatform(storage=str(tmp_path), resource_uid="uid-1", min_results=1)
    with pytest.raises(PrivacyRefusedError, match=f"{REFUSAL}: cluster c2 requires secure "
                       "aggregation"):  # fmt: skip
        _run(clusters, plain)
    assert clusters[1].app_calls == 0  # its app never saw the model
    clusters = _clusters(3, privacy)
    _run(clusters, _platform(tmp_path / "s", {"reconstructionThreshold": 2}, min_results=3))
    assert all(c.app_calls == 1 for c in clusters)


def test_secagg_settings_and_claims_are_checked_naming_the_field() -> None:
    assert parse_requirement("secagg").secagg
    both = parse_requirement("central-dp,clip=1,noise=1.2,secagg")
    assert both.secagg and both.noise == 1.2
    assert "and secure aggregation" in both.describe()
    with pytest.raises(PrivacySettingError, match="'clip=1' is not a setting of secagg"):
        parse_requirement("secagg,clip=1")

    def problems(secagg: dict[str, Any], min_clients: int = 3) -> str:
        body = spec_dict()
        body["server"]["minAvailableClients"] = min_clients
        body["privacy"] = {"secureAggregation": secagg}
        with pytest.raises(SpecError) as err:
            parse_spec(body)
        return str(err.value)

    assert "spec.privacy.secureAggregation.reconstructionThreshold (4) is larger than the 3 " \
        "clients" in problems({"reconstructionThreshold": 4})  # fmt: skip
    assert "reconstructionThreshold (5) is larger than shares (3)" in problems(
        {"reconstructionThreshold": 5, "shares": 3}, min_clients=6
    )
    assert "reconstructionThreshold" in problems({"reconstructionThreshold": 1})
    body = spec_dict()
    body["server"]["minAvailableClients"] = 3
    body["privacy"] = {"secureAggregation": {"reconstructionThreshold": 2}}
    assert parse_spec(body).privacy.secure_aggregation.reconstruction_threshold == 2  # type: ignore[union-attr]
    with pytest.raises(PrivacySettingError, match="reconstructionThreshold"):
        SecAggSettings.from_spec({"shares": 5})


def test_the_controller_hands_the_settings_to_the_server_launcher_which_exports_them() -> None:
    from fl_fixtures import REF

    from hub_controller.operator.desired.server import server_args
    from workloads import server_launcher
    from workloads.sdk.secagg import secagg_settings

    body = spec_dict()
    body["privacy"] = {"secureAggregation": {"reconstructionThreshold": 2, "maxWeight": 5000}}
    argv = server_args(REF, parse_spec(body))
    args = server_launcher.build_parser().parse_args(argv)
    args.app_dir = Path(__file__).resolve().parents[2] / "examples" / "apps" / "digits"
    platform = server_launcher.settings_from_args(args).platform
    exported = ServerPlatform.from_env(platform.to_env())
    assert secagg_settings(exported) == SecAggSettings(threshold=2, max_weight=5000)
