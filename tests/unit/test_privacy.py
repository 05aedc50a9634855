"""Differential privacy (docs/privacy.md): the resource's settings, a cluster's requirement,
what each cluster's client enforces, the ServerApp's noise and the privacy accounted.

Tests of the property, not of a flag: updates leave a cluster clipped, the noise added has the
configured standard deviation, the reported epsilon is the accountant's, and a run whose server
does not give a cluster the privacy its data requires fails naming that cluster.

The statistical tests compare a sample standard deviation s of N independent normal values
with the configured sigma: (s/sigma - 1) is about normal with std 1/sqrt(2N), and each test
allows 5.5 of those (two-sided false failure rate about 4e-8 per check)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dp_accounting import dp_event, rdp
from fl_fixtures import spec_dict
from flower_local import Handler, LocalGrid, stamp_task_identity
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from hub_controller.api import SpecError, parse_spec
from hub_controller.membership import ClusterInfo, resolve_clusters
from hub_controller.operator.desired.works import client_args
from ocmfl.privacy import (
    PRIVACY_CLAIM,
    ClientPrivacy,
    DpSettings,
    PrivacySettingError,
    client_privacy,
    gaussian_noise_multiplier,
    parse_requirement,
)
from workloads.sdk import FedAvg, ModelStore, ServerPlatform, run_strategy, to_numpy, to_record
from workloads.sdk.loop import PrivacyRefusedError
from workloads.sdk.metrics import CLIENT_RECORD
from workloads.sdk.privacy import REFUSAL, privacy_mod, spent

TOLERANCE_SDS = 5.5


@pytest.fixture(autouse=True)
def _task(monkeypatch: pytest.MonkeyPatch) -> None:
    stamp_task_identity(monkeypatch)


def _std_matches(values: np.ndarray, sigma: float) -> None:
    n = values.size
    s = float(np.std(values, ddof=1))
    assert abs(s / sigma - 1) < TOLERANCE_SDS / math.sqrt(2 * n), (s, sigma, n)


# --- the settings -------------------------------------------------------------------------
def test_a_cluster_requirement_is_parsed_and_bad_ones_name_the_claim_and_the_forms() -> None:
    local = parse_requirement("local-dp, clip=1.5, epsilon=0.5")
    assert (local.mode, local.clip, local.epsilon, local.delta) == ("local-dp", 1.5, 0.5, 1e-5)
    central = parse_requirement("central-dp,clip=1,noise=1.1")
    assert (central.clip, central.noise) == (1.0, 1.1)
    for bad, words in [
        ("dp", "must start with one of clipping, central-dp, local-dp"),
        ("central-dp,clip=1", "central-dp needs noise"),
        ("clipping,clip=-1", "clip must be a positive number"),
        ("clipping,clip=1,noise=2", "'noise=2' is not a setting of clipping"),
        ("local-dp,clip=1,epsilon=4", "epsilon 4 cannot be reached"),
    ]:
        with pytest.raises(PrivacySettingError) as err:
            parse_requirement(bad)
        assert PRIVACY_CLAIM in str(err.value) and words in str(err.value)


def test_the_resources_settings_are_checked_at_admission_naming_the_field() -> None:
    def problems(privacy: dict[str, Any]) -> str:
        with pytest.raises(SpecError) as err:
            parse_spec({**spec_dict(), "privacy": privacy}, "x")
        return str(err.value)

    dp = "spec.privacy.differentialPrivacy"
    assert f"{dp}.noiseMultiplier is required" in problems(
        {"differentialPrivacy": {"mode": "central", "clippingNorm": 1}}
    )
    assert f"{dp}.epsilon" in problems(
        {"differentialPrivacy": {"mode": "local", "clippingNorm": 1, "epsilon": 3}}
    )
    assert f"{dp}.mode" in problems({"differentialPrivacy": {"mode": "both", "clippingNorm": 1}})
    assert "spec.privacy.secureAggregation" in problems({"secureAggregation": {"shares": 3}})
    adaptive = {"mode": "central", "clippingNorm": 1, "noiseMultiplier": 1, "clipping": "adaptive"}
    assert f"{dp}.clippedCountStddev is required" in problems({"differentialPrivacy": adaptive})
    assert f"{dp}.clippedCountStddev (0.4) must be above noiseMultiplier / 2" in problems(
        {"differentialPrivacy": {**adaptive, "clippedCountStddev": 0.4}}
    )
    local = {**adaptive, "mode": "local", "epsilon": 0.5, "clippedCountStddev": 1}
    del local["noiseMultiplier"]
    assert f"{dp}.clipping: adaptive needs mode central" in problems({"differentialPrivacy": local})
    good = parse_spec({**spec_dict(), "privacy": {"differentialPrivacy": {
        **adaptive, "clippedCountStddev": 1}}}, "x")  # fmt: skip
    assert good.privacy is not None and good.privacy.differential_privacy is not None
    assert (
        DpSettings.from_spec(good.privacy.differential_privacy.model_dump(by_alias=True)).clipping
        == "adaptive"
    )
    ok = parse_spec(
        {**spec_dict(), "privacy": {"differentialPrivacy": {"mode": "central",
                                                            "clippingNorm": 0.5,
                                                            "noiseMultiplier": 1.2}}},
        "x",
    )  # fmt: skip
    assert ok.privacy is not None and ok.privacy.differential_privacy is not None


def test_each_cluster_gets_its_own_merged_privacy_and_a_bad_claim_gets_no_work() -> None:
    """The strictest clip and the largest noise of the resource's local DP and the cluster's
    requirement; a cluster whose claim is malformed is not trained on at all."""
    claims = {
        "c1": {"fl.data-path": "/data"},
        "c2": {"fl.data-path": "/data", PRIVACY_CLAIM: "local-dp,clip=0.5,epsilon=0.2"},
        "c3": {"fl.data-path": "/data", PRIVACY_CLAIM: "local-dp,clip=0.5"},
    }
    infos = {c: ClusterInfo(c, v, accepted=True) for c, v in claims.items()}
    by_name = {r.name: r for r in resolve_clusters(claims, infos, "fl.data-path")}
    assert by_name["c3"].data_path is None and "local-dp needs epsilon" in by_name["c3"].reason
    assert "its data requires local DP" in by_name["c2"].reason
    fl = parse_spec(
        {**spec_dict(), "privacy": {"differentialPrivacy": {"mode": "local", "clippingNorm": 2,
                                                            "epsilon": 0.5}}},
        "x",
    )  # fmt: skip

    def enforced(cluster: str) -> ClientPrivacy:
        args = client_args(fl, cluster, "h:1", "s", by_name[cluster].privacy)
        return ClientPrivacy.from_json(args[args.index("--privacy") + 1])

    z = gaussian_noise_multiplier
    assert enforced("c1") == ClientPrivacy("c1", clip=2.0, noise_std=2.0 * z(0.5, 1e-5))
    c2 = enforced("c2")
    strongest = max(2 * z(0.5, 1e-5), 0.5 * z(0.2, 1e-5))
    assert c2.clip == 0.5 and c2.noise_std == pytest.approx(strongest)
    assert "--privacy" not in client_args(parse_spec(spec_dict(), "x"), "c1", "h:1", "s")


# --- the client side ----------------------------------------------------------------------
def _train(arrays: dict[str, np.ndarray], config: dict[str, Any] | None = None) -> Message:
    content = RecordDict({"arrays": to_record(arrays), "config": ConfigRecord(config or {})})
    return Message(content, dst_node_id=1, message_type="train")


def _app_adding(delta: dict[str, np.ndarray]) -> Callable[[Message, Context], Message]:
    def app(msg: Message, _context: Context) -> Message:
        got = to_numpy(msg.content.array_records["arrays"])
        reply = RecordDict({"arrays": to_record({k: got[k] + delta[k] for k in got}),
                            "metrics": MetricRecord({"num-examples": 10})})  # fmt: skip
        return Message(reply, reply_to=msg)

    return app


def _context() -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def test_a_reply_leaves_the_cluster_clipped_to_the_smaller_norm_and_integers_as_sent() -> None:
    start: dict[str, np.ndarray] = {"w": np.ones((30, 30), np.float32),
                                    "steps": np.array([7], np.int64)}  # fmt: skip
    delta: dict[str, np.ndarray] = {"w": np.full((30, 30), 0.5, np.float32),
                                    "steps": np.array([1000], np.int64)}  # fmt: skip
    mod = privacy_mod(ClientPrivacy("c1", clip=3.0))
    reply = mod(_train(start, {KEY_CLIPPING_NORM: 2.0}), _context(), _app_adding(delta))
    out = to_numpy(reply.content.array_records["arrays"])
    update = out["w"].astype(np.float64) - start["w"]
    assert np.linalg.norm(update) == pytest.approx(2.0, rel=1e-6)  # 15 before, server's 2 wins
    assert np.allclose(update / np.linalg.norm(update), 1 / 30)  # same direction
    assert out["steps"].tolist() == [7] and out["w"].dtype == np.float32
    small: dict[str, np.ndarray] = {"w": np.full((30, 30), 1e-3, np.float32),
                                    "steps": np.array([0], np.int64)}  # fmt: skip
    kept = mod(_train(start, {}), _context(), _app_adding(small))
    assert np.allclose(to_numpy(kept.content.array_records["arrays"])["w"], 1.001)


def test_local_dp_noise_has_the_std_its_epsilon_and_delta_calibrate() -> None:
    privacy = client_privacy("c1", DpSettings("local", clipping_norm=1.0, epsilon=0.5), None)
    sigma = 1.0 * gaussian_noise_multiplier(0.5, 1e-5)
    assert privacy.noise_std == pytest.approx(sigma)
    start = {"w": np.zeros(200_000, np.float32)}
    mod = privacy_mod(privacy, np.random.default_rng(7))
    reply = mod(_train(start), _context(), _app_adding({"w": np.zeros(200_000, np.float32)}))
    _std_matches(to_numpy(reply.content.array_records["arrays"])["w"].astype(np.float64), sigma)


def test_a_cluster_requiring_central_dp_refuses_a_server_that_does_not_run_it() -> None:
    privacy = client_privacy("c2", None, parse_requirement("central-dp,clip=1,noise=1.5"))
    mod = privacy_mod(privacy)
    called = []

    def app(msg: Message, ctx: Context) -> Message:
        called.append(msg)
        return _app_adding({"w": np.ones(4, np.float32)})(msg, ctx)

    start = {"w": np.zeros(4, np.float32)}
    for config in ({}, {KEY_CLIPPING_NORM: 1.0, "ocmfl.dp.noise-multiplier": 1.0},
                   {"ocmfl.dp.noise-multiplier": 2.0}):  # fmt: skip
        reply = mod(_train(start, config), _context(), app)
        assert reply.has_error()
        reason = str(reply.error.reason)
        assert reason.startswith(REFUSAL) and "cluster c2 requires central DP" in reason
    assert not called  # the app never saw the data's model message
    ok = mod(_train(start, {KEY_CLIPPING_NORM: 1.0, "ocmfl.dp.noise-multiplier": 1.5}),
             _context(), app)  # fmt: skip
    assert not ok.has_error() and len(called) == 1
    # A larger server norm is answered, clipped to the cluster's own: the server's noise,
    # scaled to its larger norm, covers this cluster's smaller contribution.
    wide = mod(_train(start, {KEY_CLIPPING_NORM: 5.0, "ocmfl.dp.noise-multiplier": 2.0}),
               _context(), app)  # fmt: skip
    update = to_numpy(wide.content.array_records["arrays"])["w"]
    assert not wide.has_error() and np.linalg.norm(update) == pytest.approx(1.0, rel=1e-6)


# --- the server side, through run_strategy ------------------------------------------------
def _client(cluster: str, privacy: ClientPrivacy, delta: np.ndarray) -> Handler:
    """A cluster: its app adds `delta` to the model; the platform's mod wraps it."""
    mod = privacy_mod(privacy, np.random.default_rng(abs(hash(cluster)) % 1000))

    def app(msg: Message, _ctx: Context) -> Message:
        got = to_numpy(msg.content.array_records["arrays"])
        content = RecordDict({
            "arrays": to_record({"w": got["w"] + delta}),
            "metrics": MetricRecord({"loss": 0.5, "num-examples": 10 * (1 + len(cluster))}),
            CLIENT_RECORD: ConfigRecord({"cluster": cluster}),
        })  # fmt: skip
        return Message(content, reply_to=msg)

    return lambda msg: mod(msg, _context(), app)


def _dp_platform(tmp_path: Path, dp: dict[str, Any], min_results: int = 3) -> ServerPlatform:
    return ServerPlatform(storage=str(tmp_path), resource_uid="uid-1", min_results=min_results,
                          privacy=json.dumps(dp))  # fmt: skip


def test_central_dp_clips_on_the_clusters_and_adds_the_configured_noise_to_the_average(
    tmp_path: Path,
) -> None:
    """Three clusters push the model far (norm 100 each); each update arrives clipped to the
    norm, the three count alike, and the average gets noise of std z * C / 3."""
    n, clip, z = 120_000, 1.0, 0.8
    direction = np.full(n, 1 / math.sqrt(n))
    grid = LocalGrid({i: _client(f"c{i}", ClientPrivacy(f"c{i}"), 100 * direction)
                      for i in (1, 2, 3)})  # fmt: skip
    dp = {"mode": "central", "clippingNorm": clip, "noiseMultiplier": z, "delta": 1e-5}
    result = run_strategy(FedAvg(), grid, initial_arrays=to_record({"w": np.zeros(n, np.float32)}),
                          num_rounds=1, platform=_dp_platform(tmp_path, dp))  # fmt: skip
    residual = to_numpy(result.arrays)["w"].astype(np.float64) - clip * direction
    _std_matches(residual, z * clip / 3)
    privacy = ModelStore(tmp_path, "uid-1").manifest()["final"]["metrics"]["privacy"]
    assert privacy["mode"] == "central" and privacy["rounds"] == 1


def test_the_reported_epsilon_is_the_rdp_accountants_for_the_settings() -> None:
    for dp, rounds in [(DpSettings("central", 1.0, noise_multiplier=1.1), 20),
                       (DpSettings("local", 1.0, epsilon=0.4, delta=1e-6), 5)]:  # fmt: skip
        accountant = rdp.RdpAccountant()
        accountant.compose(dp_event.GaussianDpEvent(dp.round_noise_multiplier), rounds)
        assert spent(dp, rounds)["epsilon"] == pytest.approx(accountant.get_epsilon(dp.delta))
        assert spent(dp, rounds)["delta"] == dp.delta
    # More rounds spend more.
    central = DpSettings("central", 1.0, noise_multiplier=1.1)
    assert spent(central, 1)["epsilon"] < spent(central, 20)["epsilon"]


def test_a_run_that_skips_a_clusters_required_privacy_fails_naming_the_cluster(
    tmp_path: Path,
) -> None:
    """Even with enough results from the others: the cluster's refusal fails the run."""
    strict = client_privacy("c2", None, parse_requirement("central-dp,clip=1,noise=1"))
    grid = LocalGrid({1: _client("c1", ClientPrivacy("c1"), np.ones(4)),
                      2: _client("c2", strict, np.ones(4))})  # fmt: skip
    platform = ServerPlatform(storage=str(tmp_path), resource_uid="uid-1", min_results=1)
    with pytest.raises(PrivacyRefusedError, match="PrivacyRequirementError: cluster c2 "
                       "requires central DP"):  # fmt: skip
        run_strategy(FedAvg(), grid, initial_arrays=to_record({"w": np.zeros(4, np.float32)}),
                     num_rounds=1, platform=platform)  # fmt: skip


def test_adaptive_clipping_moves_the_norm_to_the_updates_and_noises_at_the_rounds_norm(
    tmp_path: Path,
) -> None:
    """Three clusters whose updates have norms 1, 2 and 10; the norm starts at 0.1. Each
    round's noise has std z_update x (that round's norm) / 3, with z_update from Andrew et al.;
    over the rounds the norm climbs to the median of the update norms and stays near it."""
    from workloads.sdk.privacy import KEY_UNCLIPPED, AdaptiveCentralDp

    n, z, count_std = 60_000, 0.5, 0.5
    direction = np.full(n, 1 / math.sqrt(n))
    norms = {1: 1.0, 2: 2.0, 3: 10.0}
    grid = LocalGrid({i: _client(f"c{i}", ClientPrivacy(f"c{i}"), norms[i] * direction)
                      for i in norms})  # fmt: skip
    dp = DpSettings("central", 0.1, noise_multiplier=z, clipping="adaptive",
                    clipped_count_stddev=count_std, clip_learning_rate=1.0)  # fmt: skip
    wrapped = AdaptiveCentralDp(FedAvg(), dp, rng=np.random.default_rng(3))
    z_update = (z**-2 - (2 * count_std) ** -2) ** -0.5  # 0.577: more than z, as it must be
    assert wrapped.noise_multiplier == pytest.approx(z_update)

    # Round 1: every update clipped to 0.1 (all three bits 0), noise at norm 0.1.
    start = to_record({"w": np.zeros(n, np.float32)})
    replies = []
    for msg in wrapped.configure_train(1, start, ConfigRecord(), grid):
        msg.metadata.__dict__["_message_id"] = f"m{msg.metadata.dst_node_id}"
        replies.append(grid.nodes[msg.metadata.dst_node_id](msg))
    assert all(r.content["metrics"][KEY_UNCLIPPED] == 0 for r in replies)
    arrays, _ = wrapped.aggregate_train(1, replies)
    assert arrays is not None
    residual = to_numpy(arrays)["w"].astype(np.float64) - 0.1 * direction
    _std_matches(residual, z_update * 0.1 / 3)
    assert wrapped.norms == [0.1] and wrapped.clipping_norm > 0.1

    # Through run_strategy, twelve more rounds: the norm settles near the median norm, 2.
    run_strategy(wrapped, grid, initial_arrays=start, num_rounds=12,
                 platform=ServerPlatform(storage=str(tmp_path), resource_uid="uid-1",
                                         min_results=3))  # fmt: skip
    assert wrapped.norms[1:6] == sorted(wrapped.norms[1:6])  # climbing while all are clipped
    assert 1.0 < wrapped.norms[-1] < 4.0, wrapped.norms
