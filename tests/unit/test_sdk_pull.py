"""A client that dies while it uploads its reply must not hold the round past its timeout:
the bounded pull (workloads.sdk.pull) and PlatformGrid's last pull at the deadline."""

from __future__ import annotations

import time
from collections.abc import Iterable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.app.message import remove_content_from_message
from flwr.common.constant import ErrorCode
from flwr.common.serde import message_to_proto
from flwr.proto.message_pb2 import PullObjectResponse
from flwr.proto.node_pb2 import Node
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree

from workloads.sdk import PlatformGrid, to_numpy, to_record
from workloads.sdk.pull import can_bound, pull_replies

if TYPE_CHECKING:  # pytest imports tests/unit's helpers by their bare names; mypy sees the path
    from tests.unit.flower_local import LocalGrid, stamp_task_identity
else:
    from flower_local import LocalGrid, stamp_task_identity


@pytest.fixture(autouse=True)
def _task(monkeypatch: pytest.MonkeyPatch) -> None:
    stamp_task_identity(monkeypatch)


def _reply(node: int, value: float) -> Message:
    asked = Message(RecordDict({"c": ConfigRecord({"x": 1})}), dst_node_id=node,
                    message_type="train")  # fmt: skip
    asked.metadata.__dict__["_message_id"] = f"asked-{node}"
    content = RecordDict({"arrays": to_record({"w": np.full(3, value, dtype=np.float32)})})
    reply = Message(content, reply_to=asked)
    reply.metadata.__dict__["_src_node_id"] = node
    return reply


class RuntimeAPI:
    """The SuperLink's side of Flower's Runtime API for pulls: two replies, the second one's
    arrays never uploaded (found, not available), as a client that died mid-upload leaves."""

    def __init__(self, replies: list[Message], dead: Message) -> None:
        self.replies = replies
        self.objects = {
            oid: obj.deflate() for m in replies for oid, obj in get_all_nested_objects(m).items()
        }
        # The message itself is registered; the objects under it never arrive.
        self.missing = set(get_all_nested_objects(dead)) - {dead.object_id}
        self.confirmed: list[str] = []

    def PullMessages(self, request: Any) -> Any:
        protos = []
        for m in self.replies:
            proto = message_to_proto(remove_content_from_message(m))
            proto.metadata.message_id = m.object_id  # the SuperLink stores it under its id
            protos.append(proto)
        trees = [get_object_tree(m) for m in self.replies]
        return SimpleNamespace(messages_list=protos, message_object_trees=trees)

    def PullObject(self, request: Any) -> PullObjectResponse:
        oid = request.object_id
        if oid in self.missing:
            return PullObjectResponse(object_found=True, object_available=False)
        return PullObjectResponse(
            object_found=True, object_available=True, object_content=self.objects[oid]
        )

    def ConfirmMessageReceived(self, request: Any) -> None:
        self.confirmed.append(request.message_object_id)


def test_a_half_uploaded_reply_is_waited_for_only_until_the_deadline() -> None:
    good, dead = _reply(11, 1.5), _reply(12, 2.5)
    api = RuntimeAPI([dead, good], dead)  # the dead one first: Flower's pull waits on it
    run = SimpleNamespace(run_id=7)
    grid = SimpleNamespace(_runtime_client=api, node=Node(node_id=1), _run=run)
    assert can_bound(grid)  # type: ignore[arg-type]
    started = time.monotonic()
    replies = pull_replies(grid, ["asked-11", "asked-12"], started + 1.0)  # type: ignore[arg-type]
    took = time.monotonic() - started
    # Flower's own pull would have retried the missing object for up to 2 hours.
    assert took < 5, took
    by_asked = {r.metadata.reply_to_message_id: r for r in replies}
    error = by_asked["asked-12"]
    assert error.has_error() and error.error.code == ErrorCode.MESSAGE_UNAVAILABLE
    assert error.error.reason is not None
    assert "within the round's timeout" in error.error.reason
    ok = by_asked["asked-11"]
    assert not ok.has_error()
    assert to_numpy(ok.content.array_records["arrays"])["w"].tolist() == [1.5, 1.5, 1.5]
    assert api.confirmed == [good.object_id]  # only the reply that came whole is confirmed


class SlowFirstPull(LocalGrid):
    """Its first pull takes longer than the round's timeout and returns nothing (it waited
    for a dead client's objects); the replies are there by the next pull."""

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        if self.pulls == 0:
            self.pulls += 1
            time.sleep(0.3)
            return []
        return super().pull_messages(message_ids)


def test_replies_that_came_while_a_pull_waited_past_the_deadline_count() -> None:
    def node(msg: Message) -> Message:
        return Message(RecordDict({"arrays": msg.content.array_records["arrays"]}), reply_to=msg)

    grid = SlowFirstPull({11: node})
    wrapped = PlatformGrid(grid, poll_s=0.01)
    content = RecordDict({"arrays": to_record({"w": np.ones(2, dtype=np.float32)}),
                          "config": ConfigRecord({"server-round": 1})})  # fmt: skip
    msg = grid.create_message(content, "train", 11, "g")
    replies = list(wrapped.send_and_receive([msg], timeout=0.1))
    assert len(replies) == 1 and not replies[0].has_error()
    assert grid.pulls == 2
