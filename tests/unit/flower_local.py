"""In-process Flower for unit tests: messages go straight to ClientApp-like callables.

Flower 1.42 needs a task identity to create messages (its runtime sets it); `stamp_task_identity`
sets one. The real transport is covered by the federation and e2e tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

Handler = Callable[[Message], Message]


def stamp_task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower 1.42 stamps messages with the process's task identity (set by its runtime)."""
    for attr in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, attr, 1)


class LocalGrid(Grid):
    """Delivers each message to the node's handler, in process."""

    def __init__(self, nodes: dict[int, Handler]) -> None:
        self.nodes = nodes
        self.rounds_seen: list[tuple[str, int]] = []

    def set_run(self, run: Any) -> None:
        pass

    @property
    def run(self) -> Any:
        raise NotImplementedError

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        replies = []
        for msg in messages:
            config = msg.content.config_records["config"]
            self.rounds_seen.append((msg.metadata.message_type, int(str(config["server-round"]))))
            replies.append(self.nodes[msg.metadata.dst_node_id](msg))
        return replies
