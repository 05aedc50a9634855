"""Differential privacy on the platform (docs/privacy.md).

Server side: when the resource sets ``spec.privacy.differentialPrivacy``, ``run_strategy``
wraps the app's strategy (`wrap_strategy`): in mode central with `CentralDp`, Flower's
client-side-clipping wrapper, which asks every client to clip its update to the clipping norm
and adds Gaussian noise of std noiseMultiplier x clippingNorm / n to the average of the n
results (every result weighs the same: with sample-count weights one cluster could move the
average by more than clippingNorm / n, and the noise would not cover it). `spent` accounts the
rounds with Flower's RDP accountant (dp-accounting), in both modes; each checkpoint and the
final model record it, and it reaches the resource's status.

Client side: the platform's ClientApp worker on every cluster wraps whatever ClientApp the
tenant ships in `privacy_mod` (workloads/sdk/worker.py), so none of this depends on the app:

- a train message that asks for clipping (Flower's ``clipping_norm`` in its config) gets its
  reply's update (reply minus the model received) scaled to that norm at most;
- the cluster's `ClientPrivacy` (its ClusterClaim requirement merged with the resource's local
  DP, handed to the worker by ``ocm-fl-client --privacy``) clips to its own norm as well, adds
  Gaussian noise of its std to every floating-point value of the reply, and refuses a train
  message whose server does not run the central DP the cluster requires (the reply is an
  error starting with `REFUSAL`, which fails the run: `refusal_in`).

Integer arrays of a reply are replaced by the ones received: they are not clipped or noised,
so they may not carry anything back.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping, Strategy
from flwr.serverapp.strategy.dp_fixed_clipping import DifferentialPrivacyFixedClippingBase
from flwr.supercore import log as flwr_log
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM
from flwr.supercore.privacy_accounting import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyConfig,
    SamplingMethod,
)
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

from ocmfl.constants import ENV_PRIVACY
from ocmfl.privacy import ADAPTIVE, CENTRAL, ClientPrivacy, DpSettings, adaptive_update_noise
from workloads.sdk.platform import ServerPlatform, exported

log = logging.getLogger(__name__)

# The noise multiplier the server adds (in every train config of a CentralDp run): a cluster
# that requires central DP checks it before it answers.
KEY_NOISE_MULTIPLIER = "ocmfl.dp.noise-multiplier"
# Set with adaptive clipping: each client reports whether its update was within the norm.
KEY_ADAPTIVE = "ocmfl.dp.adaptive"
KEY_UNCLIPPED = "ocmfl.dp.unclipped"
REFUSAL = "PrivacyRequirementError"
REFUSAL_CODE = 1033  # Flower's Error codes below 1000 are its own


class CentralDp(DifferentialPrivacyClientSideFixedClipping):
    """Flower's central DP with client-side fixed clipping, with the noise scaled to the
    results actually received and every result weighing the same."""

    def __init__(self, strategy: Strategy, dp: DpSettings) -> None:
        assert dp.noise_multiplier is not None
        super().__init__(strategy, dp.noise_multiplier, dp.clipping_norm, num_sampled_clients=1)
        # The round's privacy, which the clusters check (the updates' own noise may be more).
        self.declared_noise = dp.noise_multiplier

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config[KEY_NOISE_MULTIPLIER] = float(self.declared_noise)
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        results = [r for r in replies if not r.has_error()]  # the grid judged the errors
        if not results:
            return None, None
        # The noise's std is noise_multiplier x clipping_norm / (results averaged).
        self.num_sampled_clients = len(results)
        weight_key = getattr(self.strategy, "weighted_by_key", None)
        for reply in results:
            for record in reply.content.metric_records.values():
                if isinstance(weight_key, str) and weight_key in record:
                    record[weight_key] = 1
        return super().aggregate_train(server_round, results)


class AdaptiveCentralDp(CentralDp):
    """`CentralDp` with the clipping norm adapted each round (Andrew et al. 2021): every client
    reports whether its update was within the norm; the server counts those bits with Gaussian
    noise of std clippedCountStddev and moves the norm geometrically towards the target
    quantile, C <- C exp(-lr (unclipped share - target)). The updates' noise multiplier grows to
    `adaptive_update_noise` so the round stays as private as noiseMultiplier says (which the
    accountant uses). Flower's own adaptive wrappers count the clipped updates in the same
    rule, which moves the norm the wrong way, so this does not use them."""

    def __init__(
        self, strategy: Strategy, dp: DpSettings, rng: np.random.Generator | None = None
    ) -> None:
        super().__init__(strategy, dp)
        assert dp.noise_multiplier is not None and dp.clipped_count_stddev is not None
        self.count_stddev = dp.clipped_count_stddev
        self.noise_multiplier = adaptive_update_noise(dp.noise_multiplier, self.count_stddev)
        self.target = dp.target_unclipped_quantile
        self.learning_rate = dp.clip_learning_rate
        self.rng = rng if rng is not None else np.random.default_rng()
        self.norms: list[float] = []  # the norm of each round so far

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config[KEY_ADAPTIVE] = True
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        results = [r for r in replies if not r.has_error()]
        bits = [_unclipped_bit(r) for r in results]
        if any(b is None for b in bits):
            raise ValueError(
                f"adaptive clipping: a train reply has no {KEY_UNCLIPPED!r} metric (the "
                "platform's ClientApp worker adds it; was the client started without it?)"
            )
        out = super().aggregate_train(server_round, results)  # noise at this round's norm
        if results:
            self.norms.append(self.clipping_norm)
            noisy = sum(bool(b) for b in bits) + self.rng.normal(0.0, self.count_stddev)
            share = noisy / len(results)
            self.clipping_norm *= math.exp(-self.learning_rate * (share - self.target))
            flwr_log(logging.INFO, "ocm-fl privacy: round %d clipping norm %.4g, next %.4g "
                     "(noised unclipped share %.3g)", server_round, self.norms[-1],
                     self.clipping_norm, share)  # fmt: skip
        return out


def _unclipped_bit(reply: Message) -> bool | None:
    for record in reply.content.metric_records.values():
        if KEY_UNCLIPPED in record:
            return bool(record[KEY_UNCLIPPED])
    return None


def dp_settings(platform: ServerPlatform) -> DpSettings | None:
    """The resource's DP settings the launcher exported ($OCMFL_PRIVACY), if any."""
    return exported(platform.privacy, ENV_PRIVACY, DpSettings.from_spec)


def wrap_strategy(strategy: Strategy, dp: DpSettings | None) -> Strategy:
    """The strategy run_strategy runs: the app's own, or CentralDp around it (mode central).
    An app that wraps its strategy in a Flower DP wrapper itself is refused: the platform
    applies spec.privacy, and two wrappers would add noise twice."""
    if dp is None:
        return strategy
    if isinstance(strategy, DifferentialPrivacyFixedClippingBase):
        raise ValueError(
            "spec.privacy.differentialPrivacy is set and the app's strategy is already a "
            f"Flower DP wrapper ({type(strategy).__name__}): pass the plain strategy to "
            "run_strategy, which applies the resource's settings"
        )
    if dp.mode != CENTRAL:
        return strategy
    return AdaptiveCentralDp(strategy, dp) if dp.clipping == ADAPTIVE else CentralDp(strategy, dp)


def spent(dp: DpSettings, rounds: int) -> dict[str, Any]:
    """The privacy spent after `rounds` rounds: one Gaussian release per round with the
    round's noise multiplier, composed by Flower's RDP accountant without sampling
    amplification (every cluster takes part in every round), at the settings' delta."""
    config = PrivacyConfig(
        target_delta=dp.delta,
        population_size=1,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION,
    )

    def epsilon(count: int) -> float | None:
        accountant = RdpAccountant(config)
        accountant.compose(GaussianPrivacyEvent(dp.round_noise_multiplier, 1, 1), count)
        value = accountant.get_privacy_spent().epsilon
        return value if math.isfinite(value) else None  # no bound at all: JSON has no inf

    return {
        "mode": dp.mode,
        "epsilon": epsilon(rounds) if rounds > 0 else 0.0,
        "round-epsilon": epsilon(1),
        "delta": dp.delta,
        "rounds": rounds,
        "noise-multiplier": dp.round_noise_multiplier,
        "clipping-norm": dp.clipping_norm,
    }


# --- client side ------------------------------------------------------------------------
def refuse(msg: Message, why: str) -> Message:
    """An error reply that refuses `msg` for a privacy requirement (it fails the run)."""
    log.error("%s: %s", REFUSAL, why)
    return Message(Error(code=REFUSAL_CODE, reason=f"{REFUSAL}: {why}"), reply_to=msg)


def refusal_in(reason: str) -> bool:
    """Whether a reply's error text is a privacy refusal (it fails the run)."""
    return REFUSAL in reason


def _config_number(msg: Message, key: str) -> float | None:
    for record in msg.content.config_records.values():
        value = record.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def privacy_mod(privacy: ClientPrivacy, rng: np.random.Generator | None = None) -> Mod:
    """The mod the worker puts around every ClientApp on a cluster (module docstring)."""
    generator = rng if rng is not None else np.random.default_rng()

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if msg.metadata.message_type.split(".")[0] != "train":
            return call_next(msg, context)
        server_clip = _config_number(msg, KEY_CLIPPING_NORM)
        why = privacy.refusal(server_clip, _config_number(msg, KEY_NOISE_MULTIPLIER))
        if why is not None:
            return refuse(msg, why)
        clip = privacy.clip_for(server_clip)
        if clip is None and privacy.noise_std is None:
            return call_next(msg, context)
        if len(msg.content.array_records) != 1:
            return refuse(msg, f"cluster {privacy.cluster}: a train message with "
                           f"{len(msg.content.array_records)} ArrayRecords cannot be clipped "
                           "(it needs exactly one, the model)")  # fmt: skip
        sent = next(iter(msg.content.array_records.values()))
        reply = call_next(msg, context)
        if reply.has_error():
            return reply
        if len(reply.content.array_records) != 1:
            return refuse(msg, f"cluster {privacy.cluster}: the app's reply has "
                           f"{len(reply.content.array_records)} ArrayRecords; a clipped reply "
                           "needs exactly one, the model")  # fmt: skip
        key, got = next(iter(reply.content.array_records.items()))
        if list(got.keys()) != list(sent.keys()):
            return refuse(msg, f"cluster {privacy.cluster}: the app's reply names other "
                           "arrays than the model it got, so it cannot be clipped")  # fmt: skip
        if server_clip is not None and _config_flag(msg, KEY_ADAPTIVE):
            # Adaptive clipping: whether the update was within the server's norm.
            within = update_norm(sent, got) <= server_clip
            for record in reply.content.metric_records.values():
                record[KEY_UNCLIPPED] = int(within)
                break
            else:
                reply.content["ocmfl.dp"] = MetricRecord({KEY_UNCLIPPED: int(within)})
        reply.content[key] = protect(sent, got, clip, privacy.noise_std, generator)
        noise = f", noise std {privacy.noise_std:.4g} added" if privacy.noise_std else ""
        shown = f"{clip:g}" if clip is not None else "(none)"
        flwr_log(logging.INFO, "ocm-fl privacy: cluster %s: train reply clipped to norm %s%s",
                 privacy.cluster, shown, noise)  # fmt: skip
        return reply

    return mod


def _config_flag(msg: Message, key: str) -> bool:
    return any(record.get(key) is True for record in msg.content.config_records.values())


def update_norm(sent: ArrayRecord, got: ArrayRecord) -> float:
    """The L2 norm of the update (got - sent) over the floating-point arrays."""
    total = 0.0
    for name in got:
        value = got[name].numpy()
        if np.issubdtype(value.dtype, np.floating):
            total += float(np.sum(np.square(_update(value, sent[name].numpy()))))
    return math.sqrt(total)


def protect(
    sent: ArrayRecord,
    got: ArrayRecord,
    clip: float | None,
    noise_std: float | None,
    rng: np.random.Generator,
) -> ArrayRecord:
    """`got` with its update (got - sent, over all floating-point arrays) scaled to L2 norm
    `clip` at most, then Gaussian noise of std `noise_std` on each floating-point value;
    integer arrays become the ones sent. Computed in float64, stored in `got`'s dtypes."""
    sent_values = {k: sent[k].numpy() for k in sent}
    got_values = {k: got[k].numpy() for k in got}
    floating = [k for k, v in got_values.items() if np.issubdtype(v.dtype, np.floating)]
    scale = 1.0
    if clip is not None:
        squares = sum(
            float(np.sum(np.square(_update(got_values[k], sent_values[k])))) for k in floating
        )
        norm = math.sqrt(squares)
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
    out: dict[str, Array] = {}
    for name, value in got_values.items():
        if name not in floating:
            out[name] = Array(np.asarray(sent_values[name]))
            continue
        base = sent_values[name].astype(np.float64)
        new = base + _update(value, sent_values[name]) * scale
        if noise_std:
            new += rng.normal(0.0, noise_std, size=new.shape)
        out[name] = Array(new.astype(value.dtype))
    return ArrayRecord(out)


def _update(value: npt.NDArray[Any], sent: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    if value.shape != sent.shape:
        raise ValueError(f"reply array of shape {value.shape} for a model array of {sent.shape}")
    return value.astype(np.float64) - sent.astype(np.float64)
