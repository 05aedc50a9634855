"""run_strategy: Flower's own FedAvg loop with the platform's start model, checkpoints,
final model, resume by resource uid and minimum-results rule.

The grid is an in-process stand-in that hands each message to a ClientApp-like function
(the real transport is covered by the federation and e2e tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flower_local import Handler, LocalGrid, stamp_task_identity
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from workloads.sdk import (
    ModelStore,
    ServerPlatform,
    StartModelError,
    TooFewResultsError,
    run_strategy,
    to_numpy,
    to_record,
)
from workloads.sdk.metrics import CLIENT_RECORD


@pytest.fixture(autouse=True)
def _task(monkeypatch: pytest.MonkeyPatch) -> None:
    stamp_task_identity(monkeypatch)


def client(cluster: str, samples: int, fail: str = "") -> Handler:
    """A client that adds 1 to every array and reports its metrics (and its cluster)."""

    def handle(msg: Message) -> Message:
        if fail:  # what Flower replies when the ClientApp raises ValueError(fail)
            return Message(Error(code=2, reason=f"<class 'ValueError'>:<'{fail}'>"), reply_to=msg)
        content = RecordDict(
            {
                "metrics": MetricRecord({"loss": 0.5, "num-examples": samples}),
                CLIENT_RECORD: ConfigRecord({"cluster": cluster}),
            }
        )
        if msg.metadata.message_type == "train":
            arrays = to_numpy(msg.content.array_records["arrays"])
            content["arrays"] = to_record({k: v + 1 for k, v in arrays.items()})
        return Message(content, reply_to=msg)

    return handle


def _initial() -> ArrayRecord:
    return to_record({"w": np.zeros((2, 2), np.float32), "b": np.zeros(2, np.float32)})


def _platform(tmp_path: Path, **kw: Any) -> ServerPlatform:
    return ServerPlatform(storage=str(tmp_path), resource_uid="uid-1", min_results=2, **kw)


def _held_out(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    return MetricRecord({"w-mean": float(to_numpy(arrays)["w"].mean())})


def test_every_round_is_checkpointed_and_the_final_model_stored(tmp_path: Path) -> None:
    grid = LocalGrid({11: client("cluster1", 30), 12: client("cluster2", 10)})
    result = run_strategy(
        FedAvg(),
        grid,
        initial_arrays=_initial(),
        num_rounds=2,
        evaluate_fn=_held_out,
        platform=_platform(tmp_path),
    )
    assert to_numpy(result.arrays)["w"][0, 0] == 2.0
    manifest = ModelStore(tmp_path, "uid-1").manifest()
    assert [c["round"] for c in manifest["checkpoints"]] == [1, 2]
    first = manifest["checkpoints"][0]
    assert first["uid"] == "uid-1" and first["metrics"]["server"] == {"w-mean": 1.0}
    assert first["metrics"]["train"]["cluster1"]["num-examples"] == 30
    assert set(first["metrics"]["evaluate"]) == {"cluster1", "cluster2"}
    assert manifest["final"]["round"] == 2
    assert manifest["info"]["starts"] == [
        {"round": 0, "rounds_to_run": 2, "from": "the app's initial arrays",
         "server": {"w-mean": 0.0}}
    ]  # fmt: skip


def test_a_restarted_server_resumes_with_global_round_numbers(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "uid-1")
    store.save_checkpoint(2, {"w": np.full((2, 2), 5.0, np.float32), "b": np.zeros(2)}, {})
    grid = LocalGrid({11: client("cluster1", 3), 12: client("cluster2", 3)})
    result = run_strategy(
        FedAvg(), grid, initial_arrays=_initial(), platform=_platform(tmp_path, rounds=3)
    )
    assert to_numpy(result.arrays)["w"][0, 0] == 6.0  # one round on top of the checkpoint
    assert {r for _, r in grid.rounds_seen} == {3}  # clients saw round 3, not round 1
    starts = store.manifest()["info"]["starts"]
    assert starts[-1]["round"] == 2 and starts[-1]["rounds_to_run"] == 1
    # Another resource (new uid) on the same storage is refused: it cannot resume from (or
    # overwrite) this resource's checkpoints.
    other = LocalGrid({11: client("cluster1", 3), 12: client("cluster2", 3)})
    with pytest.raises(StartModelError, match="belongs to resource uid 'uid-1'"):
        run_strategy(
            FedAvg(),
            other,
            initial_arrays=_initial(),
            platform=ServerPlatform(storage=str(tmp_path), resource_uid="uid-2", rounds=1),
        )
    assert other.rounds_seen == []


def test_the_initial_model_comes_from_a_pth_in_the_store(tmp_path: Path) -> None:
    torch.save({"w": torch.full((2, 2), 7.0), "b": torch.ones(2)}, tmp_path / "base.pth")
    grid = LocalGrid({11: client("cluster1", 3), 12: client("cluster2", 3)})
    run_strategy(
        FedAvg(),
        grid,
        initial_arrays=_initial(),
        num_rounds=1,
        evaluate_fn=_held_out,
        platform=_platform(tmp_path, init_model="base.pth"),
    )
    start = ModelStore(tmp_path, "uid-1").manifest()["info"]["starts"][0]
    assert start["from"] == "initModel base.pth" and start["server"] == {"w-mean": 7.0}

    # Another resource (its own store: this one belongs to uid-1) with a model of wrong shape.
    (tmp_path / "u3").mkdir()
    torch.save({"w": torch.zeros(3, 3), "b": torch.ones(2)}, tmp_path / "u3" / "wrong.pth")
    with pytest.raises(StartModelError, match=r"initModel wrong\.pth .*'w' has shape \[3, 3\]"):
        run_strategy(
            FedAvg(),
            grid,
            initial_arrays=_initial(),
            num_rounds=1,
            platform=ServerPlatform(
                storage=str(tmp_path / "u3"), resource_uid="u3", init_model="wrong.pth"
            ),
        )


def test_client_errors_below_the_minimum_fail_with_the_apps_message(tmp_path: Path) -> None:
    grid = LocalGrid(
        {11: client("cluster1", 3), 12: client("cluster2", 3, fail="no column 'price'")}
    )
    with pytest.raises(TooFewResultsError) as err:
        run_strategy(FedAvg(), grid, initial_arrays=_initial(), num_rounds=2,
                     platform=_platform(tmp_path))  # fmt: skip
    text = str(err.value)
    assert "round 1 train: 1 successful client results, minimum is 2" in text
    assert "ValueError: no column 'price'" in text
    assert ModelStore(tmp_path, "uid-1").final() is None


def test_a_client_that_fails_above_the_minimum_is_named_in_the_checkpoint_and_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The round goes on with the others, but who missed it and why is kept: the round's
    checkpoint metrics ("failed") and a warning in the ServerApp's log."""
    grid = LocalGrid({11: client("cluster1", 3), 12: client("cluster2", 3, fail="disk full")})
    platform = ServerPlatform(storage=str(tmp_path), resource_uid="uid-1", min_results=1)
    with caplog.at_level("WARNING", logger="flwr"):
        run_strategy(FedAvg(), grid, initial_arrays=_initial(), num_rounds=2, platform=platform)
    checkpoints = ModelStore(tmp_path, "uid-1").manifest()["checkpoints"]
    assert [c["round"] for c in checkpoints] == [1, 2]
    for entry in checkpoints:
        assert set(entry["metrics"]["train"]) == {"cluster1"}
        assert entry["metrics"]["failed"]["train"] == {"node-12": "ValueError: disk full"}
    assert "round 1 train: 1 of 2 clients replied; without node-12 (ValueError: disk full)" in (
        caplog.text
    )


def test_outside_the_platform_nothing_is_stored_and_the_app_default_rounds_apply() -> None:
    grid = LocalGrid({11: client("cluster1", 3)})
    one = FedAvg(min_available_nodes=1, min_train_nodes=1, min_evaluate_nodes=1)
    result = run_strategy(one, grid, initial_arrays=_initial(), num_rounds=2,
                          platform=ServerPlatform())  # fmt: skip
    assert to_numpy(result.arrays)["w"][0, 0] == 2.0
    with pytest.raises(ValueError, match="num_rounds must be >= 1"):
        run_strategy(one, grid, initial_arrays=_initial(), platform=ServerPlatform())


def test_a_round_below_the_minimum_names_the_clusters_that_failed_or_never_replied() -> None:
    """A SuperNode killed mid-round: the SuperLink answers for it (Node Unavailable, sent
    from the SuperLink itself) or, when it came back without the message, nobody answers
    until the round timeout. Either way the error names that cluster."""
    from workloads.sdk.loop import PlatformGrid

    names = {11: "cluster1", 12: "cluster2", 13: "cluster3"}
    grid = PlatformGrid(LocalGrid({}), min_results=3, node_names=names)
    sent = []
    for i, node in enumerate(names, 1):
        config = ConfigRecord({"server-round": 2})
        msg = Message(RecordDict({"config": config}), dst_node_id=node, message_type="train")
        msg.metadata.__dict__["_message_id"] = f"m{i}"
        sent.append(msg)
    ok = Message(RecordDict({"metrics": MetricRecord({"loss": 0.1})}), reply_to=sent[0])
    unavailable = Message(Error(code=5, reason="Error: Node Unavailable"), reply_to=sent[1])
    unavailable.metadata.__dict__["_src_node_id"] = 1  # the SuperLink's own node id
    with pytest.raises(TooFewResultsError) as err:
        grid._check(sent, [ok, unavailable])
    text = str(err.value)
    assert "round 2 train: 1 successful client results, minimum is 3" in text
    assert "cluster2: Error: Node Unavailable" in text
    assert "no reply from cluster3 before the round timeout" in text


def test_on_the_platform_a_minimum_of_one_trains_with_one_cluster(tmp_path: Path) -> None:
    """Flower's FedAvg waits for 2 nodes by default: with minAvailableClients 1 and a single
    cluster (drills 2-4 start so) the run would wait forever; the platform's minimum rules."""
    strategy = FedAvg()
    grid = LocalGrid({11: client("cluster1", 30)})
    result = run_strategy(
        strategy,
        grid,
        initial_arrays=_initial(),
        num_rounds=1,
        platform=ServerPlatform(storage=str(tmp_path), resource_uid="uid-1", min_results=1),
    )
    assert to_numpy(result.arrays)["w"][0, 0] == 1.0
    assert (strategy.min_available_nodes, strategy.min_train_nodes) == (1, 1)
    assert strategy.min_evaluate_nodes == 1
