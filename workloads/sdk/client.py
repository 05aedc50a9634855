"""A ClientApp that can score the received model inside the train call.

Flower's strategies evaluate in a second phase per round: the server pushes evaluate messages,
every cluster starts another ClientApp process (imports, data load) and the server waits for
those replies too. ``PlatformClientApp`` is Flower's ``ClientApp`` plus one behaviour: when a
train message's config carries ``evaluate-in-train = True`` (``run_strategy(...,
evaluate_in_train=True)`` sets it), it first runs the app's own evaluate function on the same
message (the global model the round starts from), then the train function, and returns the
train reply with the evaluation's metrics in the ConfigRecord ``ocmfl.evaluate``. The train
reply keeps exactly one ArrayRecord and one MetricRecord, as Flower's strategies require; the
server side (``PlatformGrid``) records the folded metrics as the round's ``evaluate`` metrics.
Without the flag it is Flower's ClientApp unchanged, so separate evaluation stays available.
App-level mods (``agent_metrics``) see both calls, so the agent still gets evaluate metrics.
"""

from __future__ import annotations

import copy
from typing import Any

from flwr.app import ConfigRecord, Context, Message, MetricRecord
from flwr.app.message.message import make_message
from flwr.app.message_type import MessageType
from flwr.clientapp import ClientApp

from workloads.sdk.wire import wire_format

EVALUATE_IN_TRAIN = "evaluate-in-train"  # key in the train message's "config" ConfigRecord
FOLDED_RECORD = "ocmfl.evaluate"  # ConfigRecord of the evaluation, in the train reply


def wants_evaluation(msg: Message) -> bool:
    """True for a train message whose config asks for the folded evaluation."""
    if str(msg.metadata.message_type).split(".")[0] != MessageType.TRAIN:
        return False
    if not msg.has_content():
        return False
    config = msg.content.config_records.get("config")
    return config is not None and config.get(EVALUATE_IN_TRAIN) is True


def as_evaluate(msg: Message) -> Message:
    """The same message (same content, ids and round) as an evaluate message."""
    metadata = copy.copy(msg.metadata)
    action = str(msg.metadata.message_type).partition(".")[2]
    metadata.message_type = MessageType.EVALUATE + (f".{action}" if action else "")
    return make_message(metadata, msg.content)


def folded_metrics(reply: Message) -> dict[str, Any]:
    """The evaluate reply's metrics as the plain values a ConfigRecord holds."""
    if reply.has_error():
        raise RuntimeError(f"evaluation in the train call failed: {reply.error.reason}")
    records: list[MetricRecord] = list(reply.content.metric_records.values())
    if len(records) != 1:
        raise ValueError(
            f"the evaluate function returned {len(records)} MetricRecords; the evaluation "
            "folded into train needs exactly one"
        )
    return dict(records[0])


class PlatformClientApp(ClientApp):
    """Flower's ClientApp that folds evaluation into train when the server asks for it, and
    takes the model in the app's own dtypes when the server narrowed it for the wire
    (workloads.sdk.wire: widened once for both calls, the reply narrowed back)."""

    def __call__(self, message: Message, context: Context) -> Message:
        """Dispatch as Flower does; with ``evaluate-in-train`` run evaluate, then train."""
        return wire_format(message, context, self._dispatch)

    def _dispatch(self, message: Message, context: Context) -> Message:
        if not wants_evaluation(message):
            return super().__call__(message, context)
        evaluation = folded_metrics(super().__call__(as_evaluate(message), context))
        reply = super().__call__(message, context)
        if reply.has_content() and not reply.has_error():
            reply.content[FOLDED_RECORD] = ConfigRecord(evaluation)
        return reply
