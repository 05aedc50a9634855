"""Pulling replies from the SuperLink without letting one client's half-uploaded reply hold
the round beyond its timeout.

Flower 1.42's grid (`HttpGrid.pull_messages`) pulls each reply's objects with Flower's
defaults: an object the SuperLink knows but does not yet hold is asked again, backing off to
10 s, for up to 2 hours or 500 tries. A client that dies while it uploads its reply (its pod
deleted when its cluster leaves, its SuperNode killed) leaves exactly that: the SuperLink
answers "not yet" until the upload session expires (180 s), and every other reply of the round
waits behind it, past the round's timeout. `pull_replies` does the same requests as Flower's
grid (PullMessages, PullObject, ConfirmMessageReceived over its Runtime API client) but waits
for objects only until a deadline; a reply whose objects did not arrive by then is the error
reply Flower's grid makes for a missing object (MESSAGE_UNAVAILABLE), with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Message, Metadata
from flwr.app.error import Error
from flwr.app.message import make_message
from flwr.common.constant import ErrorCode
from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest
from flwr.proto.runtime_pb2 import PullAppMessagesRequest
from flwr.serverapp import Grid
from flwr.supercore.constant import SYSTEM_MESSAGE_TYPE
from flwr.supercore.date import now
from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
from flwr.supercore.inflatable.inflatable_protobuf_utils import make_pull_object_fn_protobuf
from flwr.supercore.inflatable.inflatable_utils import (
    ObjectPullError,
    inflate_object_from_contents,
    pull_objects,
)

MIN_OBJECT_WAIT_S = 1.0  # even past the deadline, a reply whose objects are in is taken


def can_bound(grid: Grid) -> bool:
    """The grid is Flower's deployment grid (it has the Runtime API client this module uses)."""
    return all(hasattr(grid, a) for a in ("_runtime_client", "node", "_run"))


def pull_replies(
    grid: Grid,
    message_ids: Iterable[str],
    deadline: float,
    on_reply: Callable[[Message], object] | None = None,
) -> list[Message]:
    """Flower's `pull_messages` on `grid`, waiting for a reply's objects at most until
    `deadline` (time.monotonic()), and at least MIN_OBJECT_WAIT_S. `on_reply` sees each reply
    as soon as it is whole, before the next one is pulled (it may drop what it no longer
    needs: the running sum of the round's models)."""
    client: Any = getattr(grid, "_runtime_client")  # noqa: B009 (not in Grid's type)
    node: Any = getattr(grid, "node")  # noqa: B009
    run_id: int = getattr(grid, "_run").run_id  # noqa: B009
    res = client.PullMessages(PullAppMessagesRequest(message_ids=list(message_ids)))
    replies: list[Message] = []
    for msg_proto, tree in zip(res.messages_list, res.message_object_trees, strict=True):
        msg_id = msg_proto.metadata.message_id
        wait_s = max(deadline - time.monotonic(), MIN_OBJECT_WAIT_S)
        try:
            contents = pull_objects(
                [t.object_id for t in iterate_object_tree(tree)],
                make_pull_object_fn_protobuf(client.PullObject, node, run_id),
                max_time=wait_s,
            )
        except ObjectPullError as exc:
            replies.append(_unavailable(run_id, node.node_id, msg_proto, exc, wait_s))
            continue
        client.ConfirmMessageReceived(
            ConfirmMessageReceivedRequest(node=node, run_id=run_id, message_object_id=msg_id)
        )
        message: Message = inflate_object_from_contents(msg_id, contents)  # type: ignore[assignment]
        message.metadata.__dict__["_message_id"] = msg_id  # as Flower's grid does
        if on_reply is not None:
            on_reply(message)
        replies.append(message)
    return replies


def _unavailable(
    run_id: int, node_id: int, msg_proto: Any, exc: ObjectPullError, wait_s: float
) -> Message:
    """The error reply for a reply whose objects did not all arrive (Flower's wording)."""
    return make_message(
        metadata=Metadata(
            run_id=run_id,
            message_id="",
            src_node_id=node_id,
            dst_node_id=node_id,
            message_type=SYSTEM_MESSAGE_TYPE,
            group_id="",
            ttl=0,
            reply_to_message_id=msg_proto.metadata.reply_to_message_id,
            created_at=now().timestamp(),
        ),
        error=Error(
            code=ErrorCode.MESSAGE_UNAVAILABLE,
            reason=(
                "Reply message objects are unavailable: the client did not finish uploading "
                f"its reply within the round's timeout (waited {wait_s:.0f}s). {exc}"
            ),
        ),
    )
