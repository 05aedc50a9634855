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
    """Delivers each message to the node's handler, in process. ``push_messages`` answers at
    once and ``pull_messages`` hands the replies out, ``per_pull`` at a time (None: all), as
    Flower's grid does over its Runtime API; ``send_and_receive`` does both in one go."""

    def __init__(self, nodes: dict[int, Handler], per_pull: int | None = None) -> None:
        self.nodes = nodes
        self.per_pull = per_pull
        self.rounds_seen: list[tuple[str, int]] = []
        self.pulls = 0
        self._waiting: dict[str, Message] = {}
        self._pushed = 0

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
        ids = []
        for msg in messages:
            self._pushed += 1
            msg.metadata.__dict__["_message_id"] = f"m{self._pushed}"  # as Flower's grid does
            self._waiting[msg.metadata.message_id] = self._deliver(msg)
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulls += 1
        ready = [i for i in message_ids if i in self._waiting][: self.per_pull]
        return [self._waiting.pop(i) for i in ready]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return [self._deliver(msg) for msg in messages]

    def _deliver(self, msg: Message) -> Message:
        config = msg.content.config_records["config"]
        self.rounds_seen.append((msg.metadata.message_type, int(str(config["server-round"]))))
        return self.nodes[msg.metadata.dst_node_id](msg)
