"""The model's wire format (workloads.sdk.wire): float16 on the wire, the app's own dtypes
at both ends; arrays that do not fit travel as they are; a bad choice names the valid ones.

The grid is the in-process stand-in of tests/unit/flower_local.py, so what a handler gets is
exactly what the server's grid pushed (the real transport: tests/integration)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flower_local import LocalGrid, stamp_task_identity
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from workloads.sdk import (
    FedAvg,
    ModelStore,
    PlatformClientApp,
    ServerPlatform,
    WireFormatError,
    run_strategy,
    to_numpy,
    to_record,
    wire_format,
)
from workloads.sdk.wire import WIRE_RECORD, narrow, widen, wire_dtype

F16 = np.dtype(np.float16)


@pytest.fixture(autouse=True)
def _task(monkeypatch: pytest.MonkeyPatch) -> None:
    stamp_task_identity(monkeypatch)


def dtypes(record: ArrayRecord) -> dict[str, np.dtype]:
    return {k: v.dtype for k, v in to_numpy(record).items()}


def _model() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.normal(0, 0.1, (64, 32)).astype(np.float32),
        "b": rng.normal(0, 0.1, 32).astype(np.float64),
        "steps": np.array([7], np.int64),  # a counter: never narrowed
        "huge": np.array([1e6, 2.0], np.float32),  # beyond float16's range: sent as it is
    }


def test_narrow_then_widen_gives_the_own_dtypes_back_within_float16_precision() -> None:
    model = _model()
    model["nan"] = np.array([np.nan, 1.0], np.float32)
    small, narrowed = narrow(to_record(model), F16)
    sent = to_numpy(small)
    assert narrowed == {"w": "<f4", "b": "<f8"}
    assert sent["w"].dtype == F16 and sent["b"].dtype == F16
    assert sent["steps"].dtype == np.int64 and sent["huge"].dtype == np.float32
    assert sent["nan"].dtype == np.float32
    assert sum(a.nbytes for a in sent.values()) < 0.55 * sum(a.nbytes for a in model.values())
    back = to_numpy(widen(small, narrowed))
    assert {k: v.dtype for k, v in back.items()} == {k: v.dtype for k, v in model.items()}
    np.testing.assert_allclose(back["w"], model["w"], rtol=1e-3, atol=1e-7)
    np.testing.assert_array_equal(back["huge"], model["huge"])


def test_a_wire_dtype_the_sdk_does_not_have_names_the_ones_it_has(tmp_path: Path) -> None:
    assert wire_dtype("float32") is None and wire_dtype(None) is None
    with pytest.raises(WireFormatError, match=r"'int8' .* use one of float32, float16"):
        run_strategy(FedAvg(), LocalGrid({}), initial_arrays=to_record(_model()), num_rounds=1,
                     platform=ServerPlatform(), wire_dtype="int8")  # fmt: skip


def _app(seen: list[tuple[str, dict[str, np.dtype]]]) -> PlatformClientApp:
    """Train adds 1 to every float array; evaluate reports the mean of w. Both record the
    dtypes the app's code was given."""
    app = PlatformClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = to_numpy(msg.content.array_records["arrays"])
        seen.append(("train", {k: v.dtype for k, v in arrays.items()}))
        new = {k: v + 1 if v.dtype.kind == "f" else v for k, v in arrays.items()}
        metrics = MetricRecord({"train-loss": 0.5, "num-examples": 10})
        return Message(RecordDict({"arrays": to_record(new), "metrics": metrics}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        arrays = to_numpy(msg.content.array_records["arrays"])
        seen.append(("evaluate", {k: v.dtype for k, v in arrays.items()}))
        metrics = MetricRecord({"eval-mean": float(arrays["w"].mean()), "num-examples": 10})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return app


class Wire:
    """Handlers that keep the dtypes of every array that crossed the (in-process) wire."""

    def __init__(self) -> None:
        self.down: list[dict[str, np.dtype]] = []
        self.up: list[dict[str, np.dtype]] = []

    def node(self, handle: Callable[[Message], Message]) -> Callable[[Message], Message]:
        def deliver(msg: Message) -> Message:
            if msg.content.array_records:
                self.down.append(dtypes(msg.content.array_records["arrays"]))
            reply = handle(msg)
            if reply.has_content() and reply.content.array_records:
                arrays = next(iter(reply.content.array_records.values()))
                self.up.append(dtypes(arrays))
            return reply

        return deliver


def _run(
    tmp_path: Path, wire: str | None, handler: Callable[[Message], Message], uid: str
) -> tuple[Wire, Any]:
    """Two rounds, two clients, client evaluation inside train."""
    net = Wire()
    grid = LocalGrid({11: net.node(handler), 12: net.node(handler)})
    platform = ServerPlatform(storage=str(tmp_path), resource_uid=uid, min_results=2)
    result = run_strategy(FedAvg(fraction_evaluate=0.0), grid, initial_arrays=to_record(_model()),
                          num_rounds=2, platform=platform, evaluate_in_train=True,
                          wire_dtype=wire)  # fmt: skip
    return net, result


def test_float16_on_the_wire_both_ways_the_apps_dtypes_at_both_ends(tmp_path: Path) -> None:
    seen: list[tuple[str, dict[str, np.dtype]]] = []
    seen_full: list[tuple[str, dict[str, np.dtype]]] = []
    context = Context(1, 1, {}, RecordDict(), {})
    app, app_full = _app(seen), _app(seen_full)
    net, result = _run(tmp_path / "f16", "float16", lambda m: app(m, context), "u16")
    _, full = _run(tmp_path / "f32", None, lambda m: app_full(m, context), "u32")

    # Round 1 (2 clients): floats that fit go as float16, the counter and the huge array as
    # they are; both ways. (Flower's FedAvg averages the counter into float64 for round 2.)
    on_wire = {"w": F16, "b": F16, "steps": np.dtype(np.int64), "huge": np.dtype(np.float32)}
    assert net.down[:2] == [on_wire] * 2 and net.up[:2] == [on_wire] * 2
    assert len(net.down) == len(net.up) == 4
    assert all(d["w"] == F16 and d["huge"] == np.float32 for d in net.down + net.up)
    # The app's code saw what it sees without the option, widened once for both its calls.
    assert seen == seen_full and [c for c, _ in seen] == ["evaluate", "train"] * 4
    final, expected = to_numpy(result.arrays), to_numpy(full.arrays)
    own = {k: v.dtype for k, v in expected.items()}
    assert {k: v.dtype for k, v in final.items()} == own
    stored = ModelStore(tmp_path / "f16", "u16").final()
    assert stored is not None and {k: v.dtype for k, v in to_numpy(stored.arrays).items()} == own
    # The same training in full precision: equal to float16's precision, the rest exact.
    np.testing.assert_allclose(final["w"], expected["w"], rtol=2e-3, atol=1e-4)
    np.testing.assert_allclose(final["steps"], expected["steps"], rtol=1e-3)
    np.testing.assert_array_equal(final["huge"], expected["huge"])


def test_a_client_without_the_widening_still_trains_and_replies_in_full(tmp_path: Path) -> None:
    """A plain handler (no PlatformClientApp, no mod) gets float16 arrays and replies in its
    own dtypes (float32 here, as a torch model's state_dict): the server takes them as they
    came, and the run completes."""

    def plain(msg: Message) -> Message:
        arrays = to_numpy(msg.content.array_records["arrays"])
        new = {k: v.astype(np.float32) + 1 if v.dtype.kind == "f" else v for k, v in arrays.items()}
        metrics = MetricRecord({"loss": 0.5, "num-examples": 10})
        return Message(RecordDict({"arrays": to_record(new), "metrics": metrics}), reply_to=msg)

    net, result = _run(tmp_path, "float16", plain, "u")
    assert net.down[0]["w"] == F16 and net.up[0]["w"] == np.float32
    final = to_numpy(result.arrays)
    assert final["w"].dtype == np.float32 and final["b"].dtype == np.float32


def test_the_mod_widens_for_a_plain_clientapp_and_leaves_unmarked_messages_alone() -> None:
    got: list[np.dtype] = []

    def inner(msg: Message, context: Context) -> Message:
        got.append(to_numpy(msg.content.array_records["arrays"])["w"].dtype)
        return Message(RecordDict({"arrays": msg.content["arrays"]}), reply_to=msg)

    small, narrowed = narrow(to_record(_model()), F16)
    content = RecordDict({"arrays": small, "config": ConfigRecord({"server-round": 1})})
    content[WIRE_RECORD] = ConfigRecord(
        {"dtype": "float16", "names": list(narrowed), "dtypes": list(narrowed.values())}
    )
    context = Context(1, 1, {}, RecordDict(), {})
    reply = wire_format(Message(content, dst_node_id=1, message_type="train"), context, inner)
    assert got == [np.float32] and to_numpy(reply.content.array_records["arrays"])["w"].dtype == F16

    unmarked = RecordDict({"arrays": to_record(_model())})
    reply = wire_format(Message(unmarked, dst_node_id=1, message_type="train"), context, inner)
    assert got[-1] == np.float32
    assert dtypes(reply.content.array_records["arrays"])["w"] == np.float32

    content[WIRE_RECORD] = ConfigRecord({"dtype": "float16", "names": ["w"], "dtypes": []})
    with pytest.raises(WireFormatError, match="names and dtypes must pair up"):
        wire_format(Message(content, dst_node_id=1, message_type="train"), context, inner)


def test_without_the_option_nothing_is_narrowed_or_marked(tmp_path: Path) -> None:
    seen: list[tuple[str, dict[str, np.dtype]]] = []
    app = _app(seen)
    context = Context(1, 1, {}, RecordDict(), {})
    net, _ = _run(tmp_path, None, lambda m: app(m, context), "u")
    assert all(d["w"] == np.float32 for d in net.down + net.up)
