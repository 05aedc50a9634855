"""Flower's strategy loop with the platform around it, in one call: ``run_strategy``.

    result = run_strategy(strategy, grid, initial_arrays=ArrayRecord(model.state_dict()),
                          num_rounds=context.run_config["num-server-rounds"])

What the call adds to ``strategy.start``:
- the starting model: this resource's newest checkpoint (a restarted server resumes and runs
  only the remaining rounds), else the resource's ``initModel`` (.npz, Flower ArrayRecord,
  torch .pt/.pth state_dict or safetensors; names and shapes must fit ``initial_arrays``),
  else ``initial_arrays``;
- a checkpoint and a manifest entry every round (round, metrics per cluster, sha256, time,
  the resource uid) and the final model;
- a round fails the run when fewer than the platform's minimum of clients reply without error
  (Flower itself carries on and ends "completed"); the message carries the clients' errors;
- on the platform, the strategy's minimum node counts (``min_available_nodes``,
  ``min_train_nodes``, ``min_evaluate_nodes``) are the platform's minimum;
- clients see the global round in ``config["server-round"]`` also after a resume.

All of it goes through ``PlatformGrid``, a wrapper of Flower's Grid, which also pulls replies
every ``OCMFL_GRID_POLL_INTERVAL`` seconds (default 0.2; Flower's own grid waits 3 s between
pulls, which a round pays once per phase; ``0`` keeps Flower's). With
``evaluate_in_train=True`` the clients score the model they receive inside the train call
(``workloads.sdk.PlatformClientApp``), so a round has one phase instead of two.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.app.message_type import MessageType
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore.run import Run

from ocmfl.privacy import CENTRAL, SecAggSettings
from workloads.sdk.aggregate import RunningSum, folds_replies
from workloads.sdk.client import EVALUATE_IN_TRAIN, FOLDED_RECORD
from workloads.sdk.formats import ModelFormatError, check_compatible, reorder
from workloads.sdk.metrics import CLIENT_RECORD
from workloads.sdk.platform import ServerPlatform, env_number
from workloads.sdk.privacy import dp_settings, refusal_in, spent, wrap_strategy
from workloads.sdk.pull import can_bound, pull_replies
from workloads.sdk.secagg import secagg_settings, secure_round
from workloads.sdk.store import ModelStore, ModelStoreError
from workloads.sdk.wire import Narrowed, mark, narrow, widen, wire_dtype

log = logging.getLogger("flwr")

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
PHASES = ("train", "evaluate")
POLL_ENV = "OCMFL_GRID_POLL_INTERVAL"
DEFAULT_POLL_S = 0.2  # well under Flower's 3 s; faster mostly meets its 1 s object backoff


def poll_interval(env: Mapping[str, str] | None = None) -> float:
    """Seconds between reply pulls: $OCMFL_GRID_POLL_INTERVAL, else 0.2 (0: Flower's own
    send_and_receive, which pulls every 3 s)."""
    value = env_number(os.environ if env is None else env, POLL_ENV, float, 0.0)
    return DEFAULT_POLL_S if value is None else value


class TooFewResultsError(RuntimeError):
    """A round ended with fewer successful client replies than the platform's minimum."""


class PrivacyRefusedError(RuntimeError):
    """A cluster refused to answer: its data requires privacy this run does not give."""


class StartModelError(RuntimeError):
    """The starting model (checkpoint or initModel) cannot be used; the message says why."""


_FLOWER_REASON = re.compile(r"^<class '(?:[\w.]+\.)?(\w+)'>:<'(.*)'>$", re.S)


def error_text(reason: str) -> str:
    """Flower's "<class 'x.ValueError'>:<'message'>" as "ValueError: message"."""
    m = _FLOWER_REASON.match(reason.strip())
    return f"{m.group(1)}: {m.group(2)}" if m else reason.strip()


def _phase(msg: Message) -> str:
    """A message's phase: train, evaluate or query (its type without a suffix)."""
    return str(msg.metadata.message_type).split(".")[0]


def _plain(value: Any) -> Any:
    """Record values (and nested mappings/lists of them) as JSON-able Python values."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class PlatformGrid(Grid):
    """Flower's Grid with the platform's rules: global round numbers, per-cluster reply
    metrics (also the evaluation folded into train replies), a minimum of successful results
    per phase of a round, replies pulled every ``poll_s`` seconds (0: Flower's own
    send_and_receive), and with ``wire`` (e.g. "float16") the model narrowed on the wire
    (workloads.sdk.wire): the strategy sends and receives its own dtypes."""

    def __init__(
        self,
        grid: Grid,
        *,
        min_results: int = 1,
        round_offset: int = 0,
        node_names: Mapping[int, str] | None = None,
        poll_s: float = DEFAULT_POLL_S,
        fold_by: str | None = None,
        wire: str | None = None,
        secagg: SecAggSettings | None = None,
        secagg_weighted_by: str = "",
    ) -> None:
        self.inner = grid
        # SecAgg+ (workloads.sdk.secagg): every train phase is a secure round. Its replies
        # carry masked integers, not the model, so the wire is not narrowed then.
        self.secagg = secagg
        self.secagg_weighted_by = secagg_weighted_by
        self.wire = wire_dtype(wire) if secagg is None else None
        # The arrays the last push narrowed (name -> own dtype): replies are widened by it.
        self.narrowed: Narrowed = {}
        self.poll_s = poll_s
        # The weight key of a strategy that takes its train replies folded (RunningSum).
        self.fold_by = fold_by
        self.min_results = min_results
        self.round_offset = round_offset
        self.node_names = dict(node_names or {})
        # (global round, phase) -> cluster -> the reply's metrics
        self.replies: dict[tuple[int, str], dict[str, dict[str, Any]]] = {}
        # (global round, phase) -> cluster -> why it gave no result (an error reply, silence)
        self.failures: dict[tuple[int, str], dict[str, str]] = {}

    # --- delegation ------------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        """Delegated to Flower's grid."""
        self.inner.set_run(run)

    @property
    def run(self) -> Run:
        """Delegated to Flower's grid."""
        return self.inner.run

    def create_message(
        self,
        content: Any,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Delegated to Flower's grid."""
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        """Delegated to Flower's grid."""
        return self.inner.get_node_ids()

    def get_nodes(self) -> Iterable[Any]:
        """Delegated to Flower's grid."""
        return self.inner.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Global round numbers, then Flower's push."""
        return self.inner.push_messages(self._globalise(messages))

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Flower's pull (positional: the keyword changes in Flower 1.43), replies widened."""
        return [self._widen(m) for m in self.inner.pull_messages(message_ids)]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push, pull every ``poll_s`` until all replied or ``timeout`` passed (Flower's
        semantics), then the minimum-results rule and metrics per cluster."""
        sent = self._globalise(messages)
        if self.secagg is not None and sent and _phase(sent[0]) == MessageType.TRAIN:
            setup, replies = secure_round(
                self._send_stage,
                sent,
                self.secagg,
                timeout=timeout,
                weighted_by=self.secagg_weighted_by,
                names=lambda nid: self.node_names.get(nid, f"node-{nid}"),
            )
            if setup:
                self._check(setup, replies)
            return replies
        if self.poll_s <= 0:
            replies = [self._widen(m) for m in self.inner.send_and_receive(sent, timeout=timeout)]
        else:
            replies = self._push_and_poll(sent, timeout)
        if sent:
            self._check(sent, replies)
        return replies

    def _send_stage(self, sent: list[Message], timeout: float | None) -> list[Message]:
        """One SecAgg+ stage: push and pull as any phase, with no folding or checks."""
        if self.poll_s <= 0:
            return list(self.inner.send_and_receive(sent, timeout=timeout))
        return self._push_and_poll(sent, timeout, fold=False)

    def _push_and_poll(
        self, sent: list[Message], timeout: float | None, *, fold: bool = True
    ) -> list[Message]:
        if not sent:
            return []
        waiting = {i for i in self.inner.push_messages(sent) if i}
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        folder = self._folder(sent) if fold else None
        last = False
        while waiting:
            got = self._pull(waiting, deadline, folder)
            replies.extend(got)
            waiting.difference_update(m.metadata.reply_to_message_id for m in got)
            if not waiting or last:
                break
            if deadline is not None and time.monotonic() >= deadline:
                # One more pull: replies that came in while a pull waited for another
                # reply's objects until the deadline are in time.
                last = True
                continue
            time.sleep(self.poll_s)
        return replies

    def _pull(
        self,
        waiting: set[str],
        deadline: float | None,
        fold: Callable[[Message], object] | None = None,
    ) -> list[Message]:
        """Flower's pull; on Flower's deployment grid with a deadline, one that waits for a
        half-uploaded reply only until the deadline (workloads.sdk.pull). `fold` sees each
        reply as soon as it is whole."""

        def whole(reply: Message) -> object:
            self._widen(reply)
            return fold(reply) if fold is not None else None

        if deadline is None or not can_bound(self.inner):
            got = list(self.inner.pull_messages(waiting))
            for reply in got:
                whole(reply)
            return got
        return pull_replies(self.inner, waiting, deadline, whole)

    def _folder(self, sent: list[Message]) -> Callable[[Message], object] | None:
        """For a train phase of a strategy that takes folded replies: fold each successful
        reply's model into one running sum as it arrives (workloads.sdk.aggregate.RunningSum),
        so the ServerApp holds one reply's model at a time, not every client's."""
        if self.fold_by is None or not sent:
            return None
        if _phase(sent[0]) != MessageType.TRAIN:
            return None
        running = RunningSum(self.fold_by)

        def fold(reply: Message) -> object:
            if reply.has_error() or not reply.has_content():
                return False
            return running.fold(reply.content)

        return fold

    # --- the platform's part ---------------------------------------------------------------
    def _globalise(self, messages: Iterable[Message]) -> list[Message]:
        """Add the resumed rounds to config["server-round"] (strategies share one config
        record between a round's messages: each record is shifted once), and narrow the
        arrays for the wire."""
        out = list(messages)
        self._narrow(out)
        if not self.round_offset:
            return out
        shifted: set[int] = set()
        for msg in out:
            config = msg.content.config_records.get("config") if msg.has_content() else None
            if config is None or id(config) in shifted:
                continue
            shifted.add(id(config))
            value = config.get("server-round")
            if isinstance(value, int) and not isinstance(value, bool):
                config["server-round"] = value + self.round_offset
        return out

    def _narrow(self, messages: list[Message]) -> None:
        """With a wire dtype: each message's arrays narrowed, once per record (strategies
        share one RecordDict between a round's messages), and the message marked."""
        if self.wire is None:
            return
        done: set[int] = set()
        self.narrowed = {}
        for msg in messages:
            if not msg.has_content() or id(msg.content) in done:
                continue
            done.add(id(msg.content))
            narrowed: Narrowed = {}
            for key, record in list(msg.content.array_records.items()):
                msg.content[key], names = narrow(record, self.wire)
                narrowed.update(names)
            if narrowed:
                mark(msg.content, self.wire, narrowed)
                self.narrowed.update(narrowed)

    def _widen(self, reply: Message) -> Message:
        """A reply's narrowed arrays back in their own dtypes (in place), before the
        strategy or the running sum sees them."""
        if self.narrowed and reply.has_content() and not reply.has_error():
            for key, record in list(reply.content.array_records.items()):
                reply.content[key] = widen(record, self.narrowed)
        return reply

    def cluster_of(self, msg: Message) -> str:
        """The cluster a reply came from: the mark the SDK's ClientApp mod sets, else the
        name the node was registered under, else the node id."""
        if msg.has_content():
            record = msg.content.config_records.get(CLIENT_RECORD)
            if record is not None and record.get("cluster"):
                return str(record["cluster"])
        node = msg.metadata.src_node_id
        return self.node_names.get(node, f"node-{node}")

    def _check(self, sent: list[Message], replies: list[Message]) -> None:
        phase = _phase(sent[0])
        config = sent[0].content.config_records.get("config") if sent[0].has_content() else None
        raw_round = config.get("server-round") if config is not None else None
        rnd = raw_round if isinstance(raw_round, int) else 0
        # Who each message went to: an error reply may come from the SuperLink itself (e.g.
        # Node Unavailable), so the cluster is the one the message was sent to.
        dst = {m.metadata.message_id: m.metadata.dst_node_id for m in sent}

        def who(reply: Message) -> str:
            node = dst.get(reply.metadata.reply_to_message_id)
            if node is None:
                return self.cluster_of(reply)
            return self.node_names.get(node, f"node-{node}")

        failed = {who(r): error_text(r.error.reason or "") for r in replies if r.has_error()}
        errors = [f"{cluster}: {reason}" for cluster, reason in failed.items()]
        valid = [r for r in replies if not r.has_error()]
        answered = {r.metadata.reply_to_message_id for r in replies}
        silent = sorted(
            {self.node_names.get(n, f"node-{n}") for i, n in dst.items() if i not in answered}
        )
        for cluster in silent:  # e.g. its SuperNode died holding the message and came back
            failed.setdefault(cluster, "no reply before the round timeout")
        refused = [f"{c}: {why}" for c, why in failed.items() if refusal_in(why)]
        if refused:  # a cluster's data requires privacy this run does not give
            raise PrivacyRefusedError(f"round {rnd} {phase}: " + "; ".join(refused))
        need = min(self.min_results, len(sent))
        if len(valid) < need:
            if silent:
                errors.append(f"no reply from {', '.join(silent)} before the round timeout")
            detail = "; ".join(errors) if errors else "no reply before the round timeout"
            raise TooFewResultsError(
                f"round {rnd} {phase}: {len(valid)} successful client results, minimum is "
                f"{need} ({detail})"
            )
        if failed:
            # Enough results for the round, but a user still wants to see who missed it and
            # why: the log, and the checkpoint's metrics ("failed": {phase: {cluster: why}}).
            self.failures.setdefault((rnd, phase), {}).update(failed)
            log.warning(
                "round %d %s: %d of %d clients replied; without %s",
                rnd, phase, len(valid), len(sent),
                "; ".join(f"{c} ({why})" for c, why in sorted(failed.items())),
            )  # fmt: skip
        per_cluster = self.replies.setdefault((rnd, phase), {})
        for reply in valid:
            records = list(reply.content.metric_records.values())
            per_cluster[self.cluster_of(reply)] = _plain(records[0]) if records else {}
            folded = reply.content.config_records.get(FOLDED_RECORD)
            if phase == "train" and folded is not None:
                evaluated = self.replies.setdefault((rnd, "evaluate"), {})
                evaluated[self.cluster_of(reply)] = _plain(folded)

    def metrics_of_round(self, rnd: int) -> dict[str, dict[str, Any]]:
        """{"train": {cluster: metrics}, "evaluate": {...}} of a global round, and "failed":
        {phase: {cluster: why}} when a client that was sent a message gave no result."""
        out: dict[str, dict[str, Any]] = {p: self.replies.get((rnd, p), {}) for p in PHASES}
        failed = {p: self.failures[(rnd, p)] for p in PHASES if self.failures.get((rnd, p))}
        if failed:
            out["failed"] = failed
        return out


def _start_point(
    store: ModelStore | None, platform: ServerPlatform, initial: ArrayRecord
) -> tuple[int, ArrayRecord, str]:
    """(rounds already done, starting arrays, where they came from)."""
    if store is not None:
        try:
            checkpoint = store.latest()
        except ModelStoreError as exc:
            raise StartModelError(f"reading checkpoints in {store.location}: {exc}") from None
        if checkpoint is not None:
            source = f"checkpoint of round {checkpoint.round} ({store.url(checkpoint.entry)})"
            _fit(checkpoint.arrays, initial, source)
            return checkpoint.round, reorder(checkpoint.arrays, initial), source
    if platform.init_model:
        if store is None:
            raise StartModelError(
                f"initModel {platform.init_model!r} is set but the platform gave no model store"
            )
        try:
            start = store.read_model(platform.init_model)
        except ModelStoreError as exc:
            raise StartModelError(str(exc)) from None
        source = f"initModel {platform.init_model}"
        _fit(start, initial, source)
        return 0, reorder(start, initial), source
    return 0, initial, "the app's initial arrays"


def _fit(start: ArrayRecord, initial: ArrayRecord, source: str) -> None:
    try:
        check_compatible(start, initial, source)
    except ModelFormatError as exc:
        raise StartModelError(str(exc)) from None


MIN_NODE_ATTRS = ("min_available_nodes", "min_train_nodes", "min_evaluate_nodes")


def use_platform_minimum(strategy: Strategy, minimum: int) -> list[str]:
    """Set the strategy's minimum node counts (Flower's FedAvg defaults them to 2) to the
    platform's minimum (spec.server.minAvailableClients): with a minimum of 1 and one
    cluster, Flower's defaults would wait for a second node forever. Returns the attributes
    it changed."""
    changed = []
    for attr in MIN_NODE_ATTRS:
        if isinstance(getattr(strategy, attr, None), int) and getattr(strategy, attr) != minimum:
            setattr(strategy, attr, minimum)
            changed.append(attr)
    return changed


def run_strategy(
    strategy: Strategy,
    grid: Grid,
    *,
    initial_arrays: ArrayRecord,
    num_rounds: int | None = None,
    timeout: float | None = None,
    train_config: ConfigRecord | None = None,
    evaluate_config: ConfigRecord | None = None,
    evaluate_fn: EvaluateFn | None = None,
    store: ModelStore | None = None,
    platform: ServerPlatform | None = None,
    evaluate_in_train: bool = False,
    wire_dtype: str | None = None,
) -> Result:
    """Run ``strategy`` like ``strategy.start`` with the platform's start model, checkpoints,
    final model, resume and minimum-results rule (see the module docstring).

    ``evaluate_in_train``: train messages ask the clients to score the received model in
    the same call (``PlatformClientApp``); its metrics are the round's ``evaluate`` metrics
    (of the model the round started from). The strategy's own evaluation phase must then be
    off (``fraction_evaluate=0``), else every client would evaluate twice.

    ``wire_dtype="float16"``: the model travels as float16 both ways, half the bytes; the
    strategy, the checkpoints and the app's code keep their own dtypes (workloads.sdk.wire).

    ``num_rounds`` and ``timeout`` are the app's defaults; on the platform its own rounds
    (``spec.server.rounds``) and round timeout win. ``store`` defaults to the platform's
    store (none outside the platform: then nothing is stored). Returns Flower's Result;
    ``result.arrays`` is the final model.
    """
    platform = platform or ServerPlatform.from_env()
    if evaluate_in_train:
        if float(getattr(strategy, "fraction_evaluate", 0.0) or 0.0) > 0:
            raise ValueError(
                "evaluate_in_train=True needs the strategy's separate evaluation off: "
                "set fraction_evaluate=0"
            )
        train_config = ConfigRecord(dict(train_config or {}))
        train_config[EVALUATE_IN_TRAIN] = True
    total = platform.rounds or num_rounds
    if total is None or total < 1:
        raise ValueError("num_rounds must be >= 1 (or run on the platform, which sets it)")
    if platform.rounds and num_rounds and num_rounds != platform.rounds:
        log.warning("the platform asks for %d rounds (the app default is %d)", total, num_rounds)
    store = store if store is not None else ModelStore.from_platform(platform)
    done, start, source = _start_point(store, platform, initial_arrays)
    remaining = total - done
    log.info("starting from %s; %d of %d rounds to run", source, max(remaining, 0), total)
    if remaining <= 0:
        assert store is not None  # done > 0 only comes from a stored checkpoint
        if store.final() is None:
            last = store.latest()
            store.save_final(done, start, last.entry["metrics"] if last else {})
        result = Result()
        result.arrays = start
        return result

    if platform.resource_uid:  # on the platform: the resource's minimum is the rule
        changed = use_platform_minimum(strategy, platform.min_results)
        if changed:
            log.info("%s set to the platform's minimum, %d", ", ".join(changed),
                     platform.min_results)  # fmt: skip
    dp = dp_settings(platform)
    secagg = secagg_settings(platform)
    # Under SecAgg+ the weights go into the masked sum: the strategy's, or equal ones with
    # central DP (CentralDp weighs every result the same).
    weighted_by = (
        ""
        if dp is not None and dp.mode == CENTRAL
        else str(getattr(strategy, "weighted_by_key", "num-examples"))
    )
    strategy = wrap_strategy(strategy, dp)
    if secagg is not None:
        log.info("secure aggregation (SecAgg+): reconstruction threshold %d, shares %s, "
                 "weights %s", secagg.threshold, secagg.shares or "all clients",
                 weighted_by or "equal")  # fmt: skip
    if dp is not None:
        log.info("differential privacy %s: clipping norm %g, noise multiplier %.4g a round, "
                 "delta %g", dp.mode, dp.clipping_norm, dp.round_noise_multiplier,
                 dp.delta)  # fmt: skip
    wrapped = PlatformGrid(
        grid,
        min_results=platform.min_results,
        round_offset=done,
        node_names=platform.node_names(),
        poll_s=poll_interval(),
        fold_by=getattr(strategy, "weighted_by_key", None) if folds_replies(strategy) else None,
        wire=wire_dtype,
        secagg=secagg,
        secagg_weighted_by=weighted_by,
    )

    def on_round(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        server = evaluate_fn(server_round, arrays) if evaluate_fn is not None else None
        metrics = {"server": _plain(server) if server is not None else {}}
        if store is None:
            return server
        if server_round == 0:
            store.append_info(
                "starts",
                {"round": done, "rounds_to_run": remaining, "from": source, **metrics},
            )
            return server
        global_round = done + server_round
        wrapped.node_names.update(platform.node_names())
        metrics.update(wrapped.metrics_of_round(global_round))
        if dp is not None:
            metrics["privacy"] = spent(dp, global_round)
            norms = getattr(strategy, "norms", None)  # AdaptiveCentralDp: each round's norm
            if norms:
                metrics["privacy"]["clipping-norm"] = norms[-1]
            log.info("round %d: privacy spent epsilon %.4g at delta %g", global_round,
                     metrics["privacy"]["epsilon"], dp.delta)  # fmt: skip
        entry = store.save_checkpoint(global_round, arrays, metrics)
        log.info("round %d/%d checkpointed to %s", global_round, total, store.url(entry))
        return server

    round_timeout = platform.round_timeout or timeout or 3600.0
    result = strategy.start(
        grid=wrapped,
        initial_arrays=start,
        num_rounds=remaining,
        timeout=round_timeout,
        train_config=train_config,
        evaluate_config=evaluate_config,
        evaluate_fn=on_round,
    )
    if store is not None:
        final_arrays = result.arrays if result.arrays is not None else start
        last = store.latest()
        entry = store.save_final(total, final_arrays, last.entry["metrics"] if last else {})
        log.info("final model stored at %s (sha256 %s)", store.url(entry), entry["sha256"])
    return result
