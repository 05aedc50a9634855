"""Secure aggregation (SecAgg+) on the platform (docs/privacy.md).

When the resource sets ``spec.privacy.secureAggregation``, every train phase of a run is one
SecAgg+ round (Bell et al., CCS 2020) instead of a plain send and receive, whatever strategy
the tenant's ServerApp runs: `PlatformGrid` hands the strategy's train messages to
`secure_round`, which drives Flower's four stages over the grid (setup: each client makes two
key pairs; share keys: each client splits its mask seed and its first secret key among its
neighbours, encrypted to each; collect masked vectors: each client trains, then uploads its
update masked by its own seed and the pairwise masks with its neighbours; unmask: the clients
hand the shares that remove the masks of the clients that answered, and rebuild the pairwise
masks of those that dropped out). The server learns the weighted sum of the updates and
nothing of one cluster's: the strategy gets, for each client that took part, a reply with its
own metrics and the aggregate model (the weighted average of the updates added to the model
sent), so any averaging strategy aggregates to that model.

On the clients, the platform's ClientApp worker puts `secagg_mod` around every ClientApp (outside
the privacy mod, so clipping and local noise come before masking). It answers the setup, share
keys and unmask stages itself with Flower's ``secaggplus_mod``; in the collect stage it runs the
app, turns the reply into the update Flower's mod masks (the reply minus the model received,
over the floating-point arrays), and sends the masked update instead of the model. A cluster
whose data requires secure aggregation (its privacy ClusterClaim, ``ClientPrivacy.secagg``)
refuses any train message outside a SecAgg+ round.

Differences from Flower's SecAggPlusWorkflow: the updates are masked, not the weights (their
values are small, so the quantization loses less); with central DP every client weighs the
same (as `CentralDp` has it); and a client's weight is capped at maxWeight rather than
overflowing.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.common import (
    Code,
    FitRes,
    Status,
    bytes_to_ndarray,
    ndarrays_to_parameters,
)
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.common.secure_aggregation.ndarrays_arithmetic import (
    factor_extract,
    get_parameters_shape,
    parameters_addition,
    parameters_mod,
    parameters_subtraction,
)
from flwr.common.secure_aggregation.quantization import dequantize
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    RECORD_KEY_STATE,
    Key,
    Stage,
)
from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
from flwr.compat.common import recorddict_compat as compat
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

from ocmfl.constants import ENV_SECURE_AGGREGATION
from ocmfl.privacy import ClientPrivacy, SecAggSettings
from workloads.sdk.platform import ServerPlatform, exported
from workloads.sdk.privacy import refuse

log = logging.getLogger("flwr")  # the ServerApp's and ClientApp's log

# Set in the collect stage's config: the metric that weighs a client's update ("" for equal
# weights, as with central DP). Flower's mod ignores keys it does not know in that stage.
WEIGHTED_BY = "ocmfl.weighted-by"
ERROR_CODE = 1001  # an error reply's code (Flower's codes stop below 1000)
STAGE_NAMES = {
    Stage.SETUP: "setup",
    Stage.SHARE_KEYS: "share keys",
    Stage.COLLECT_MASKED_VECTORS: "collect masked vectors",
    Stage.UNMASK: "unmask",
}

Send = Callable[[list[Message], float | None], list[Message]]


def floating_names(record: ArrayRecord) -> list[str]:
    """The arrays SecAgg+ sums: the floating-point ones, in the record's order (integer
    arrays, such as a batch-norm counter, go back as they were sent)."""
    return [k for k in record if np.issubdtype(record[k].numpy().dtype, np.floating)]


# --- server side --------------------------------------------------------------------------
class SecAggHalted(Exception):
    """The round cannot be unmasked (too few clients answered a stage)."""


@dataclass
class _Round:
    send: Send
    timeout: float | None
    group_id: str
    config: ConfigRecord | None
    names: Callable[[int], str]
    sampled: list[int]
    threshold: int
    active: set[int] = field(default_factory=set)
    failed: dict[int, str] = field(default_factory=dict)
    neighbours: dict[int, set[int]] = field(default_factory=dict)
    # The setup stage's message to each client: the round's replies answer these.
    setup_sent: dict[int, Message] = field(default_factory=dict)

    def stage(self, stage: str, make: Callable[[int], RecordDict]) -> dict[int, Message]:
        """Send one stage's message to every active client; the replies of those that
        answered well (the others are failed, with why)."""
        name = STAGE_NAMES[stage]
        out: dict[str, int] = {}
        messages = []
        for nid in sorted(self.active):
            content = make(nid)
            if self.config is not None and "config" not in content.config_records:
                content["config"] = self.config  # the round, for the clients' logs
            messages.append(
                Message(
                    content,
                    dst_node_id=nid,
                    message_type=MessageType.TRAIN,
                    group_id=self.group_id,
                )
            )
        replies = self.send(messages, self.timeout)
        for msg in messages:
            out[msg.metadata.message_id] = msg.metadata.dst_node_id
        if stage == Stage.SETUP:
            self.setup_sent = {m.metadata.dst_node_id: m for m in messages}
        got: dict[int, Message] = {}
        for reply in replies:
            nid = out.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
            if reply.has_error():
                self.failed[nid] = f"SecAgg+ {name} stage: {reply.error.reason}"
            elif RECORD_KEY_CONFIGS not in reply.content.config_records:
                self.failed[nid] = f"SecAgg+ {name} stage: the reply has no {RECORD_KEY_CONFIGS}"
            else:
                got[nid] = reply
        for nid in self.active - set(got):
            self.failed.setdefault(
                nid, f"no reply in the SecAgg+ {name} stage before the round timeout"
            )
        self.active = set(got)
        return got

    def check(self, after: str) -> None:
        """Halt when a client has fewer than `threshold` share holders left."""
        for nid in self.sampled:
            left = len(self.neighbours[nid] & self.active)
            if left < self.threshold:
                raise SecAggHalted(
                    f"secure aggregation halted after the {STAGE_NAMES[after]} stage: "
                    f"{self.names(nid)} has {left} of its {len(self.neighbours[nid])} share "
                    f"holders left, the reconstruction threshold is {self.threshold}"
                )


def secure_round(
    send: Send,
    messages: list[Message],
    settings: SecAggSettings,
    *,
    timeout: float | None,
    weighted_by: str,
    names: Callable[[int], str] = lambda nid: f"node-{nid}",
    rng: random.Random | None = None,
) -> tuple[list[Message], list[Message]]:
    """Run the strategy's train `messages` as one SecAgg+ round over `send` (push, then pull
    until all replied or `timeout`). Returns the setup messages sent and one reply to each:
    for a client whose masked update was summed, its own metrics and config records with the
    aggregate model in place of its own; for the others an error saying which stage they
    missed and why. Each message must carry the same model (one ArrayRecord)."""
    if not messages:
        return [], []
    first = messages[0]
    records = first.content.array_records
    if len(records) != 1 or any(m.content.array_records != records for m in messages[1:]):
        raise ValueError(
            "secure aggregation needs every train message of a round to carry the same "
            f"model in one ArrayRecord (the first has {len(records)})"
        )
    model_key, model = next(iter(records.items()))
    floats = floating_names(model)
    sampled = sorted({m.metadata.dst_node_id for m in messages})
    by_node = {m.metadata.dst_node_id: m for m in messages}
    config = first.content.config_records.get("config")
    state = _Round(
        send, timeout, first.metadata.group_id, config, names, sampled, settings.threshold,
        set(sampled),
    )  # fmt: skip
    n = len(sampled)
    if n < 2 or settings.threshold > n:
        raise SecAggHalted(
            f"secure aggregation: the round has {n} client(s) and the reconstruction threshold "
            f"is {settings.threshold}; it needs at least max(2, threshold) clients "
            "(spec.server.minAvailableClients)"
        )
    shares = settings.round_shares(n)
    order = list(sampled)
    (rng or random.SystemRandom()).shuffle(order)
    half = shares >> 1
    state.neighbours = {
        nid: {order[(i + off) % n] for off in range(-half, half + 1)} for i, nid in enumerate(order)
    }

    setup = ConfigRecord(
        {
            Key.STAGE: Stage.SETUP,
            Key.SAMPLE_NUMBER: n,
            Key.SHARE_NUMBER: shares,
            Key.THRESHOLD: settings.threshold,
            Key.CLIPPING_RANGE: float(settings.clipping_range),
            Key.TARGET_RANGE: int(settings.quantization_range),
            Key.MOD_RANGE: int(settings.modulus_range),
            Key.MAX_WEIGHT: float(settings.max_weight),
        }
    )

    def make_setup(nid: int) -> RecordDict:
        return RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(dict(setup))})

    halted: str | None = None
    summed: dict[int, Message] = {}
    aggregate: list[npt.NDArray[Any]] | None = None
    try:
        keys = {
            nid: _public_keys(r.content.config_records[RECORD_KEY_CONFIGS])
            for nid, r in state.stage(Stage.SETUP, make_setup).items()
        }
        state.check(Stage.SETUP)

        def make_share(nid: int) -> RecordDict:
            record = ConfigRecord(
                {str(o): list(keys[o]) for o in state.neighbours[nid] & state.active}
            )
            record[Key.STAGE] = Stage.SHARE_KEYS
            return RecordDict({RECORD_KEY_CONFIGS: record})

        forward: dict[int, tuple[list[int], list[bytes]]] = {nid: ([], []) for nid in sampled}
        for nid, reply in state.stage(Stage.SHARE_KEYS, make_share).items():
            res = reply.content.config_records[RECORD_KEY_CONFIGS]
            dsts = cast(list[int], res[Key.DESTINATION_LIST])
            texts = cast(list[bytes], res[Key.CIPHERTEXT_LIST])
            for dst, text in zip(dsts, texts, strict=True):
                forward[dst][0].append(nid)
                forward[dst][1].append(text)
        state.check(Stage.SHARE_KEYS)

        def make_collect(nid: int) -> RecordDict:
            content = RecordDict(dict(by_node[nid].content.items()))
            srcs = [s for s in forward[nid][0] if s in state.active]
            texts = [t for s, t in zip(*forward[nid], strict=True) if s in state.active]
            content[RECORD_KEY_CONFIGS] = ConfigRecord(
                {
                    Key.STAGE: Stage.COLLECT_MASKED_VECTORS,
                    Key.CIPHERTEXT_LIST: texts,
                    Key.SOURCE_LIST: srcs,
                    WEIGHTED_BY: weighted_by,
                }
            )
            return content

        shapes = [(1,)] + [model[k].numpy().shape for k in floats]
        masked: list[npt.NDArray[Any]] | None = None
        for nid, reply in state.stage(Stage.COLLECT_MASKED_VECTORS, make_collect).items():
            res = reply.content.config_records[RECORD_KEY_CONFIGS]
            try:
                blobs = cast(list[bytes], res[Key.MASKED_PARAMETERS])
                vector = [bytes_to_ndarray(b) for b in blobs]
            except (KeyError, TypeError, ValueError) as exc:
                state.failed[nid] = f"SecAgg+ collect stage: malformed masked vector ({exc})"
                continue
            if [v.shape for v in vector] != shapes:
                state.failed[nid] = (
                    "SecAgg+ collect stage: its masked vector's shapes "
                    f"{[v.shape for v in vector]} are not the model's {shapes}"
                )
                continue
            masked = vector if masked is None else parameters_addition(masked, vector)
            summed[nid] = reply
        state.active = set(summed)
        state.check(Stage.COLLECT_MASKED_VECTORS)
        assert masked is not None  # check() passed: at least `threshold` >= 2 clients summed
        dead = set(sampled) - state.active

        def make_unmask(nid: int) -> RecordDict:
            return RecordDict(
                {
                    RECORD_KEY_CONFIGS: ConfigRecord(
                        {
                            Key.STAGE: Stage.UNMASK,
                            Key.ACTIVE_NODE_ID_LIST: sorted(state.neighbours[nid] & set(summed)),
                            Key.DEAD_NODE_ID_LIST: sorted(state.neighbours[nid] & dead),
                        }
                    )
                }
            )

        collected: dict[int, list[bytes]] = {nid: [] for nid in sampled}
        for _nid, reply in state.stage(Stage.UNMASK, make_unmask).items():
            res = reply.content.config_records[RECORD_KEY_CONFIGS]
            owners = cast(list[int], res[Key.NODE_ID_LIST])
            for owner, share in zip(owners, cast(list[bytes], res[Key.SHARE_LIST]), strict=True):
                if owner in collected:
                    collected[owner].append(share)
        aggregate = _unmask(masked, collected, summed, keys, state, settings)
    except SecAggHalted as exc:
        halted = str(exc)
    except (KeyError, TypeError, ValueError) as exc:  # a reply that broke the protocol
        halted = f"secure aggregation failed: {type(exc).__name__}: {exc}"

    if halted is None:
        missing = ", ".join(names(n) for n in sorted(set(sampled) - set(summed))) or "none"
        log.info("SecAgg+ round: %d masked updates summed and unmasked (%s); without %s",
                 len(summed), ", ".join(names(n) for n in sorted(summed)), missing)  # fmt: skip
    replies: list[Message] = []
    for nid in sampled:
        sent = state.setup_sent.get(nid)
        if sent is None:
            continue
        if halted is None and nid in summed and aggregate is not None:
            content = _without_model(summed[nid].content)
            content[model_key] = _model_plus(model, floats, aggregate)
            replies.append(Message(content, reply_to=sent))
        else:
            why = state.failed.get(nid) or halted or "secure aggregation failed"
            replies.append(Message(Error(code=ERROR_CODE, reason=why), reply_to=sent))
    return list(state.setup_sent.values()), replies


def _without_model(content: RecordDict) -> RecordDict:
    """A reply's metric and config records (what the strategy reads besides the model),
    without its SecAgg+ record."""
    out = RecordDict()
    for key, record in content.config_records.items():
        if key != RECORD_KEY_CONFIGS:
            out[key] = record
    for key, metrics in content.metric_records.items():
        out[key] = metrics
    return out


def _public_keys(record: ConfigRecord) -> tuple[bytes, bytes]:
    first, second = record[Key.PUBLIC_KEY_1], record[Key.PUBLIC_KEY_2]
    if not isinstance(first, bytes) or not isinstance(second, bytes):
        raise TypeError("a setup reply's public keys are not bytes")
    return first, second


def _unmask(
    masked: list[npt.NDArray[Any]],
    collected: Mapping[int, list[bytes]],
    summed: Mapping[int, Message],
    keys: Mapping[int, tuple[bytes, bytes]],
    state: _Round,
    settings: SecAggSettings,
) -> list[npt.NDArray[Any]]:
    """The weighted average of the summed clients' updates, from their masked sum and the
    shares: each summed client's own mask is rebuilt from its seed, each dropped client's
    pairwise masks from its first secret key (Flower's SecAggPlusWorkflow.unmask_stage)."""
    vector = parameters_mod(masked, settings.modulus_range)
    shape = get_parameters_shape(vector)
    for nid, shares in collected.items():
        if len(shares) < state.threshold:
            raise SecAggHalted(
                f"secure aggregation halted in the unmask stage: {len(shares)} shares of "
                f"{state.names(nid)}'s secret came back, the reconstruction threshold is "
                f"{state.threshold}"
            )
        secret = combine_shares(shares)
        if nid in summed:
            mask = pseudo_rand_gen(secret, settings.modulus_range, shape)
            vector = parameters_subtraction(vector, mask)
            continue
        for other in state.neighbours[nid] - {nid}:
            shared = generate_shared_key(
                bytes_to_private_key(secret), bytes_to_public_key(keys[other][0])
            )
            mask = pseudo_rand_gen(shared, settings.modulus_range, shape)
            if nid > other:
                vector = parameters_addition(vector, mask)
            else:
                vector = parameters_subtraction(vector, mask)
    vector = parameters_mod(vector, settings.modulus_range)
    total_ratio, values = factor_extract(vector)
    if total_ratio <= 0:
        raise SecAggHalted("secure aggregation: the clients' weights sum to 0")
    average = dequantize(values, settings.clipping_range, settings.quantization_range)
    offset = -(len(summed) - 1) * settings.clipping_range
    scale = settings.quantization_range / float(total_ratio)
    return [(v + offset) * scale for v in average]


def _model_plus(
    model: ArrayRecord, floats: list[str], update: list[npt.NDArray[Any]]
) -> ArrayRecord:
    """The model sent plus the average update (in each array's own dtype)."""
    out: dict[str, Array] = {}
    deltas = dict(zip(floats, update, strict=True))
    for name in model:
        value = model[name].numpy()
        if name in deltas:
            value = (value.astype(np.float64) + deltas[name]).astype(value.dtype)
        out[name] = Array(np.asarray(value))
    return ArrayRecord(out)


# --- client side --------------------------------------------------------------------------
class _AppReplied(Exception):
    def __init__(self, reply: Message) -> None:
        super().__init__("the app replied with an error")
        self.reply = reply


def _error(msg: Message, why: str) -> Message:
    log.error("%s", why)
    return Message(Error(code=ERROR_CODE, reason=why), reply_to=msg)


def secagg_mod(privacy: ClientPrivacy, inner: Mod | None = None) -> Mod:
    """The mod the worker puts around every ClientApp (module docstring); `inner` (the privacy
    mod) runs between it and the app."""

    def call_app(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        return inner(msg, context, call_next) if inner is not None else call_next(msg, context)

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
            return call_app(msg, context, call_next)
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
        if configs is None:
            if privacy.secagg:
                return refuse(msg, privacy.secagg_refusal())
            return call_app(msg, context, call_next)
        stage = configs.get(Key.STAGE)
        try:
            if stage == Stage.SETUP:
                threshold, clients = configs.get(Key.THRESHOLD), configs.get(Key.SAMPLE_NUMBER)
                if not isinstance(threshold, int) or threshold < 2 or not isinstance(clients, int):
                    why = f"reconstruction threshold of {threshold!r} (at least 2)"
                    return _error(msg, f"SecAgg+ setup: cluster {privacy.cluster} refuses a {why}")
            if stage != Stage.COLLECT_MASKED_VECTORS:
                return secaggplus_mod(msg, context, call_next)
            return _collect(msg, context, call_next, call_app, configs)
        except _AppReplied as replied:
            return replied.reply
        except (KeyError, TypeError, ValueError) as exc:
            return _error(msg, f"SecAgg+ {STAGE_NAMES.get(str(stage), stage)} stage on cluster "
                          f"{privacy.cluster}: {type(exc).__name__}: {exc}")  # fmt: skip

    return mod


def _collect(
    msg: Message,
    context: Context,
    call_next: ClientAppCallable,
    call_app: Callable[[Message, Context, ClientAppCallable], Message],
    configs: ConfigRecord,
) -> Message:
    """The collect stage: run the app, mask its update with Flower's mod, and reply with the
    app's metrics and config records and the masked update in place of the model."""
    if len(msg.content.array_records) != 1:
        raise ValueError(
            f"a SecAgg+ train message carries {len(msg.content.array_records)} ArrayRecords; "
            "it needs exactly one, the model"
        )
    sent = next(iter(msg.content.array_records.values()))
    floats = floating_names(sent)
    weighted_by = str(configs.get(WEIGHTED_BY, ""))
    max_weight = float(cast(float, context.state.config_records[RECORD_KEY_STATE]["max_weight"]))
    replied: list[Message] = []

    def legacy_app(inner_msg: Message, ctx: Context) -> Message:
        # The app sees the train message as the strategy made it (Flower's mod has read the
        # stage's config already).
        del inner_msg.content[RECORD_KEY_CONFIGS]
        reply = call_app(inner_msg, ctx, call_next)
        if reply.has_error():
            raise _AppReplied(Message(reply.error, reply_to=msg))
        replied.append(reply)
        if len(reply.content.array_records) != 1:
            raise ValueError(f"the app's reply has {len(reply.content.array_records)} "
                             "ArrayRecords; SecAgg+ needs exactly one, the model")  # fmt: skip
        got = next(iter(reply.content.array_records.values()))
        if list(got.keys()) != list(sent.keys()):
            raise ValueError("the app's reply names other arrays than the model it got")
        update = [
            got[k].numpy().astype(np.float64) - sent[k].numpy().astype(np.float64) for k in floats
        ]
        weight = max_weight
        if weighted_by:
            value = None
            for record in reply.content.metric_records.values():
                value = record.get(weighted_by, value)
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"the app's reply has no positive {weighted_by!r} metric, "
                                 "the weight its strategy averages by")  # fmt: skip
            weight = min(float(value), max_weight)
        count = max(1, round(weight))  # Flower's mod weighs by count / maxWeight
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(update), count, {})
        return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=inner_msg)

    out = secaggplus_mod(msg, context, legacy_app)
    content = _without_model(replied[0].content)
    content[RECORD_KEY_CONFIGS] = out.content.config_records[RECORD_KEY_CONFIGS]
    return Message(content, reply_to=msg)


def secagg_settings(platform: ServerPlatform) -> SecAggSettings | None:
    """The resource's SecAgg+ settings the launcher exported ($OCMFL_SECURE_AGGREGATION)."""
    return exported(platform.secure_aggregation, ENV_SECURE_AGGREGATION, SecAggSettings.from_spec)
