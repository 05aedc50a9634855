"""The SDK's round-latency features: evaluation folded into the train call
(PlatformClientApp + run_strategy(evaluate_in_train=True)), replies pulled on a short interval
(PlatformGrid), and FedAvg's average at memory speed with Flower's results."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from flower_local import LocalGrid, stamp_task_identity
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords as flower_aggregate

from workloads.sdk import (
    EVALUATE_IN_TRAIN,
    FOLDED_RECORD,
    ModelStore,
    PlatformClientApp,
    PlatformGrid,
    ServerPlatform,
    agent_metrics,
    aggregate,
    run_strategy,
    to_numpy,
    to_record,
)
from workloads.sdk.aggregate import (
    FedAvg,
    FedProx,
    FoldedArrayRecord,
    RunningSum,
    aggregate_arrayrecords,
    array_view,
    folds_replies,
)
from workloads.sdk.loop import poll_interval


@pytest.fixture(autouse=True)
def _task(monkeypatch: pytest.MonkeyPatch) -> None:
    stamp_task_identity(monkeypatch)


def make_app(calls: list[str]) -> PlatformClientApp:
    """A ClientApp whose train adds 1 to the model and whose evaluate reports its mean."""
    app = PlatformClientApp(mods=[agent_metrics])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        calls.append("train")
        arrays = to_numpy(msg.content.array_records["arrays"])
        content = RecordDict(
            {
                "arrays": to_record({k: v + 1 for k, v in arrays.items()}),
                "metrics": MetricRecord({"train-loss": 0.5, "num-examples": 10}),
            }
        )
        return Message(content, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        calls.append("evaluate")
        mean = float(to_numpy(msg.content.array_records["arrays"])["w"].mean())
        metrics = MetricRecord({"eval-mean": mean, "num-examples": 10})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return app


def nodes(calls: list[str]) -> dict[int, Any]:
    app = make_app(calls)

    def node(cluster: str) -> Any:
        context = Context(1, 1, {"cluster-name": cluster}, RecordDict(), {})
        return lambda msg: app(msg, context)

    return {11: node("cluster1"), 12: node("cluster2")}


def _initial() -> ArrayRecord:
    return to_record({"w": np.zeros((2, 2), np.float32)})


def test_evaluation_folded_into_train_is_one_phase_with_evaluate_metrics(tmp_path: Path) -> None:
    calls: list[str] = []
    grid = LocalGrid(nodes(calls))
    platform = ServerPlatform(storage=str(tmp_path), resource_uid="u", min_results=2)
    run_strategy(FedAvg(fraction_evaluate=0.0), grid, initial_arrays=_initial(), num_rounds=2,
                 platform=platform, evaluate_in_train=True)  # fmt: skip
    assert {t for t, _ in grid.rounds_seen} == {"train"}  # no separate evaluate messages
    assert calls == ["evaluate", "train"] * 4  # 2 clusters x 2 rounds, received model first
    checkpoints = ModelStore(tmp_path, "u").manifest()["checkpoints"]
    # Round r scores the model the round started from: 0 in round 1, 1 in round 2.
    assert [c["metrics"]["evaluate"]["cluster1"]["eval-mean"] for c in checkpoints] == [0.0, 1.0]
    assert set(checkpoints[1]["metrics"]["evaluate"]) == {"cluster1", "cluster2"}
    assert checkpoints[1]["metrics"]["train"]["cluster2"]["num-examples"] == 10


def test_without_the_switch_evaluation_stays_a_separate_phase(tmp_path: Path) -> None:
    calls: list[str] = []
    grid = LocalGrid(nodes(calls))
    platform = ServerPlatform(storage=str(tmp_path), resource_uid="u", min_results=2)
    run_strategy(FedAvg(), grid, initial_arrays=_initial(), num_rounds=1, platform=platform)
    assert sorted({t for t, _ in grid.rounds_seen}) == ["evaluate", "train"]
    assert sorted(calls) == ["evaluate", "evaluate", "train", "train"]
    [checkpoint] = ModelStore(tmp_path, "u").manifest()["checkpoints"]
    assert checkpoint["metrics"]["evaluate"]["cluster1"]["eval-mean"] == 1.0  # the new model


def test_folding_with_the_strategys_own_evaluation_on_is_refused() -> None:
    with pytest.raises(ValueError, match="fraction_evaluate=0"):
        run_strategy(FedAvg(), LocalGrid(nodes([])), initial_arrays=_initial(), num_rounds=1,
                     platform=ServerPlatform(), evaluate_in_train=True)  # fmt: skip


def test_the_folded_reply_keeps_one_metric_record_for_flowers_strategies() -> None:
    calls: list[str] = []
    app = make_app(calls)
    content = RecordDict({"arrays": _initial(), "config": _config(folded=True)})
    msg = Message(content, dst_node_id=1, message_type="train")
    reply = app(msg, Context(1, 1, {}, RecordDict(), {}))
    assert len(reply.content.metric_records) == 1 and len(reply.content.array_records) == 1
    assert reply.content.config_records[FOLDED_RECORD]["eval-mean"] == 0.0
    assert reply.metadata.message_type == "train"
    plain_msg = Message(
        RecordDict({"arrays": _initial(), "config": _config(folded=False)}),
        dst_node_id=1,
        message_type="train",
    )
    plain = app(plain_msg, Context(1, 1, {}, RecordDict(), {}))
    assert FOLDED_RECORD not in plain.content.config_records
    assert calls == ["evaluate", "train", "train"]


def _config(folded: bool) -> Any:
    from flwr.app import ConfigRecord

    return ConfigRecord({"server-round": 1, EVALUATE_IN_TRAIN: folded})


def test_replies_are_pulled_until_all_are_in_at_the_set_interval() -> None:
    grid = LocalGrid(nodes([]), per_pull=1)  # one reply per pull: three pulls for two replies
    wrapped = PlatformGrid(grid, poll_s=0.01)
    messages = [
        grid.create_message(
            RecordDict({"arrays": _initial(), "config": _config(False)}), "train", node, "g"
        )
        for node in (11, 12)
    ]
    replies = list(wrapped.send_and_receive(messages, timeout=5))
    assert len(replies) == 2 and grid.pulls == 2
    assert set(wrapped.replies[(1, "train")]) == {"cluster1", "cluster2"}


def test_poll_interval_setting() -> None:
    assert poll_interval({}) == 0.2
    assert poll_interval({"OCMFL_GRID_POLL_INTERVAL": "0"}) == 0.0
    with pytest.raises(ValueError, match="OCMFL_GRID_POLL_INTERVAL"):
        poll_interval({"OCMFL_GRID_POLL_INTERVAL": "fast"})


def _replies(shapes: dict[str, tuple[int, ...]], dtype: Any, clients: int) -> list[RecordDict]:
    rng = np.random.default_rng(1)
    out = []
    for c in range(clients):
        arrays = {
            k: np.asarray(rng.standard_normal(s) * 10).astype(dtype) for k, s in shapes.items()
        }
        metrics = MetricRecord({"num-examples": 7 + 13 * c})
        out.append(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                    "metrics": metrics,
                }
            )
        )
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64])
@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_the_fast_average_equals_flowers(
    dtype: Any, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if engine == "numpy":  # an app image without torch
        monkeypatch.setattr(aggregate, "_torch", lambda: None)
    else:
        assert aggregate._torch() is not None  # the dev install has torch: the path is tested
        # Several torch blocks plus a ragged end in "big" (300k values), as in the numpy path.
        monkeypatch.setattr(aggregate, "TORCH_BLOCK_BYTES_PER_THREAD", 64 * 1024)
    # Big enough for the blockwise path (several blocks plus a ragged end) and small arrays.
    shapes = {"big": (301, 997), "small": (3, 4), "scalar": ()}
    clients = 5
    records = _replies(shapes, dtype, clients)
    ours = aggregate_arrayrecords(records, "num-examples")
    theirs = flower_aggregate(records, "num-examples")
    assert list(ours.keys()) == list(theirs.keys())
    weights = np.array([7 + 13 * c for c in range(clients)], dtype=np.float64)
    factors = weights / weights.sum()
    for key in shapes:
        a, b = ours[key].numpy(), theirs[key].numpy()
        assert a.dtype == b.dtype and a.shape == b.shape
        if not np.issubdtype(a.dtype, np.floating):
            assert np.array_equal(a, b)
            continue
        # Float tolerance: each of the 2K roundings errs by at most half an ulp of the
        # running magnitude, which is at most sum(|factor * value|).
        inputs = [cast(ArrayRecord, r["arrays"])[key].numpy().astype(np.float64) for r in records]
        magnitude = sum(f * np.abs(x) for f, x in zip(factors, inputs, strict=True))
        bound = 2 * clients * np.finfo(a.dtype).eps * magnitude
        assert np.all(np.abs(a.astype(np.float64) - b.astype(np.float64)) <= bound), key
        if a.dtype != np.float16 and (engine == "numpy" or key != "big"):
            assert np.array_equal(a, b)  # Flower's operations in Flower's order
            assert ours[key].data == theirs[key].data  # the very bytes np.save writes
        if key == "big":
            assert ours[key].data[:10] == theirs[key].data[:10]  # np.save's .npy header
            assert np.array_equal(array_view(ours[key]), a)


def test_array_views_share_the_received_bytes() -> None:
    array = Array(np.arange(12, dtype=np.float32).reshape(3, 4))
    view = array_view(array)
    assert np.shares_memory(view, np.frombuffer(array.data, dtype=np.uint8))
    assert np.array_equal(view, array.numpy())
    fortran = Array(np.asfortranarray(np.arange(6.0).reshape(2, 3)))
    assert np.array_equal(array_view(fortran), fortran.numpy())


@pytest.mark.parametrize(("ours", "theirs"), [(FedAvg(), FlowerFedAvg())])
def test_the_strategies_aggregate_train_equals_flowers(ours: Any, theirs: Any) -> None:
    records = _replies({"w": (50_000,), "b": (10,)}, np.float32, clients=3)
    msgs = [Message(r, dst_node_id=1, message_type="train") for r in records]
    replies = [Message(m.content, reply_to=m) for m in msgs]
    (a, am), (b, bm) = ours.aggregate_train(1, replies), theirs.aggregate_train(1, replies)
    assert a is not None and b is not None and am == bm
    assert all(np.allclose(a[k].numpy(), b[k].numpy(), rtol=1e-5, atol=1e-6) for k in b)
    assert FedProx(proximal_mu=0.1).proximal_mu == 0.1


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64])
def test_replies_folded_as_they_arrive_average_as_flower_does(dtype: Any) -> None:
    shapes = {"big": (301, 997), "small": (3, 4), "scalar": ()}
    clients = 5
    records = _replies(shapes, dtype, clients)
    theirs = flower_aggregate(records, "num-examples")  # before folding empties the records
    inputs = {
        key: [cast(ArrayRecord, r["arrays"])[key].numpy().astype(np.float64) for r in records]
        for key in shapes
    }
    running = RunningSum("num-examples")
    for record in records:
        assert running.fold(record)
        # The reply's model is gone from the reply: only the running sum holds it.
        assert isinstance(record["arrays"], FoldedArrayRecord) and not record["arrays"]
    ours = running.result()
    assert list(ours.keys()) == list(theirs.keys()) and not running.sums
    weights = np.array([7 + 13 * c for c in range(clients)], dtype=np.float64)
    factors = weights / weights.sum()
    for key in shapes:
        a, b = ours[key].numpy(), theirs[key].numpy()
        assert a.dtype == b.dtype and a.shape == b.shape, key
        # Float tolerance: 2K roundings of at most half an ulp of the running magnitude
        # (float16's sum is kept in float64, so it rounds once, at the end).
        magnitude = sum(f * np.abs(x) for f, x in zip(factors, inputs[key], strict=True))
        eps = np.finfo(a.dtype).eps if np.issubdtype(a.dtype, np.floating) else 2.0**-52
        bound = 2 * clients * eps * magnitude
        assert np.all(np.abs(a.astype(np.float64) - b.astype(np.float64)) <= bound), key


def test_a_reply_flower_would_refuse_fails_the_round_with_flowers_reason() -> None:
    good, other = _replies({"w": (4,)}, np.float32, 2)
    other["arrays"] = ArrayRecord({"v": Array(np.zeros(4, np.float32))})
    running = RunningSum("num-examples")
    assert running.fold(good) and not running.fold(other)
    assert isinstance(other["arrays"], ArrayRecord) and list(other["arrays"]) == ["v"]
    msgs = [Message(r, dst_node_id=1, message_type="train") for r in (good, other)]
    replies = [Message(m.content, reply_to=m) for m in msgs]
    with pytest.raises(InconsistentMessageReplies, match="same keys"):
        FedAvg().aggregate_train(1, replies)
    [no_weight] = _replies({"w": (4,)}, np.float32, 1)
    no_weight["metrics"] = MetricRecord({"loss": 1.0})
    assert not RunningSum("num-examples").fold(no_weight)


def test_run_strategy_folds_each_train_reply_once_and_trains_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folded: list[int] = []
    real_fold = RunningSum.fold

    def counting_fold(self: RunningSum, content: RecordDict) -> bool:
        folded.append(id(self))
        return real_fold(self, content)

    monkeypatch.setattr(RunningSum, "fold", counting_fold)
    grid = LocalGrid(nodes([]), per_pull=1)
    platform = ServerPlatform(storage=str(tmp_path), resource_uid="u", min_results=2)
    result = run_strategy(FedAvg(fraction_evaluate=0.0), grid, initial_arrays=_initial(),
                          num_rounds=3, platform=platform)  # fmt: skip
    assert result.arrays is not None
    assert np.array_equal(result.arrays["w"].numpy(), np.full((2, 2), 3.0, np.float32))
    assert len(folded) == 6 and len(set(folded)) == 3  # 2 replies x 3 rounds, a sum a round
    final = ModelStore(tmp_path, "u").final()
    assert final is not None and np.array_equal(final.arrays["w"].numpy(), np.full((2, 2), 3.0))


def test_a_strategy_with_its_own_aggregation_gets_every_reply_whole(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    class Custom(FedAvg):
        def aggregate_train(self, server_round: int, replies: Any) -> Any:
            replies = list(replies)
            seen.append([type(m.content["arrays"]).__name__ for m in replies])
            return super().aggregate_train(server_round, replies)

    assert not folds_replies(Custom()) and folds_replies(FedAvg()) and folds_replies(FedProx())
    platform = ServerPlatform(storage=str(tmp_path), resource_uid="u", min_results=2)
    result = run_strategy(Custom(fraction_evaluate=0.0), LocalGrid(nodes([])),
                          initial_arrays=_initial(), num_rounds=1, platform=platform)  # fmt: skip
    assert seen == [["ArrayRecord", "ArrayRecord"]]
    assert result.arrays is not None and float(result.arrays["w"].numpy()[0, 0]) == 1.0
