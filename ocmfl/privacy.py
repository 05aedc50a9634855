"""Privacy settings (pure, no numpy): what a resource asks for, what a cluster's data requires,
and what the platform enforces on each cluster's client.

Two sources, two owners:

- `spec.privacy.differentialPrivacy` (the tenant's resource): `central` (each client clips its
  update, the server adds Gaussian noise to the average) or `local` (each client clips and adds
  noise before its update leaves the cluster); `spec.privacy.secureAggregation`
  (`SecAggSettings`): SecAgg+, so the server learns only the sum of the clients' updates.
- The ClusterClaim `PRIVACY_CLAIM` on a managed cluster (that cluster's admin, not the
  tenant): what the cluster's data requires, e.g. ``local-dp,epsilon=0.5,clip=1`` (see
  `parse_requirement`). The hub copies it from the ManagedCluster's claims into the cluster's
  ManifestWork; the cluster's client enforces it in the platform's ClientApp worker whatever the
  tenant's app does (`workloads/sdk/privacy.py`).

`client_privacy` merges both into the `ClientPrivacy` one cluster's client enforces: the
strictest clipping norm and the largest local noise of the two, and the central-DP check.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

PRIVACY_CLAIM: Final = "privacy.federated-learning.open-cluster-management.io"

CENTRAL: Final = "central"
LOCAL: Final = "local"
DP_MODES: Final = (CENTRAL, LOCAL)
DEFAULT_DELTA: Final = 1e-5
FIXED: Final = "fixed"
ADAPTIVE: Final = "adaptive"
# Adaptive clipping's defaults (Andrew et al. 2021, "Differentially Private Learning with
# Adaptive Clipping": the median, learning rate 0.2).
DEFAULT_TARGET_UNCLIPPED: Final = 0.5
DEFAULT_CLIP_LEARNING_RATE: Final = 0.2

# The cluster requirement's modes (the claim value's first item).
REQUIRE_CLIPPING: Final = "clipping"
REQUIRE_CENTRAL: Final = "central-dp"
REQUIRE_LOCAL: Final = "local-dp"
REQUIRE_SECAGG: Final = "secagg"
REQUIREMENT_MODES: Final = (REQUIRE_CLIPPING, REQUIRE_CENTRAL, REQUIRE_LOCAL, REQUIRE_SECAGG)
_REQUIREMENT_KEYS: Final = {
    REQUIRE_CLIPPING: ("clip",),
    REQUIRE_CENTRAL: ("clip", "noise"),
    REQUIRE_LOCAL: ("clip", "epsilon", "delta"),
    REQUIRE_SECAGG: (),
}
_REQUIREMENT_NEEDS: Final = {
    REQUIRE_CLIPPING: ("clip",),
    REQUIRE_CENTRAL: ("clip", "noise"),
    REQUIRE_LOCAL: ("clip", "epsilon"),
    REQUIRE_SECAGG: (),
}
REQUIREMENT_FORMS: Final = (
    "clipping,clip=C | central-dp,clip=C,noise=Z | local-dp,clip=C,epsilon=E[,delta=D] | "
    "secagg; any of the first three may add the item secagg"
)

# SecAgg+ defaults: Flower's SecAggPlusWorkflow's.
SECAGG_CLIPPING_RANGE: Final = 8.0
SECAGG_QUANTIZATION_RANGE: Final = 2**22
SECAGG_MODULUS_RANGE: Final = 2**32
SECAGG_MAX_WEIGHT: Final = 1000.0


class PrivacySettingError(ValueError):
    """A privacy setting is malformed or contradictory; the message names it and the fix."""


def gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """The Gaussian mechanism's noise multiplier (noise std / sensitivity) for one (epsilon,
    delta) release: sqrt(2 ln(1.25/delta)) / epsilon (Dwork and Roth, Theorem A.1, which holds
    for 0 < epsilon < 1; Flower's LocalDpMod uses the same calibration)."""
    return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def check_local_epsilon(epsilon: float, delta: float, field: str) -> None:
    """Refuse an (epsilon, delta) that the Gaussian mechanism's calibration cannot give."""
    if not 0 < epsilon < 1:
        raise PrivacySettingError(
            f"{field}: epsilon {epsilon:g} cannot be reached by the Gaussian mechanism's "
            "calibration, which holds only for 0 < epsilon < 1 per round: give an epsilon "
            "below 1 (the total over all rounds is reported in status)"
        )
    if not 0 < delta < 1:
        raise PrivacySettingError(f"{field}: delta {delta:g} must be between 0 and 1")


def adaptive_update_noise(noise_multiplier: float, count_stddev: float) -> float:
    """The noise multiplier of the updates' sum under adaptive clipping, so that it and the
    noised count of unclipped updates (std `count_stddev`) together are as private as one
    Gaussian release with `noise_multiplier` (Andrew et al. 2021, Theorem 1):
    (z**-2 - (2 sigma_b)**-2) ** -0.5."""
    return float((noise_multiplier**-2 - (2 * count_stddev) ** -2) ** -0.5)


def clipping_problems(
    clipping: str,
    mode: str,
    noise_multiplier: float | None,
    count_stddev: float | None,
    target: float,
    where: str,
) -> list[str]:
    """What adaptive clipping needs, each with the fix: mode central (the server adapts the
    norm and its noise follows it) and a clippedCountStddev above noiseMultiplier / 2 (the
    count's noise takes part of the privacy budget)."""
    if clipping != ADAPTIVE:
        return []
    problems = []
    if mode != CENTRAL:
        problems.append(
            f"{where}.clipping: adaptive needs mode central (the server adapts the norm to "
            "the noised count of unclipped updates); use fixed with local"
        )
    if count_stddev is None:
        problems.append(f"{where}.clippedCountStddev is required with adaptive clipping (the "
                        "noise on the count of unclipped updates; about clients / 20 is usual, "
                        "and it must be above noiseMultiplier / 2)")  # fmt: skip
    elif noise_multiplier is not None and not count_stddev > noise_multiplier / 2:
        problems.append(
            f"{where}.clippedCountStddev ({count_stddev:g}) must be above noiseMultiplier / 2 "
            f"({noise_multiplier / 2:g}): the count's noise cannot take more privacy than the "
            "whole round has; raise it or lower noiseMultiplier"
        )
    if not 0 < target < 1:
        problems.append(f"{where}.targetUnclippedQuantile must be between 0 and 1")
    return problems


def mode_problems(
    mode: str, noise_multiplier: float | None, epsilon: float | None, where: str
) -> list[str]:
    """What a DP mode needs and refuses, each with the fix (`where`: the settings' path):
    central needs noiseMultiplier and takes no epsilon, local the other way round. The
    resource's admission and the launchers' flags both check it here."""
    if mode == CENTRAL:
        needed, needed_hint = ("noiseMultiplier", noise_multiplier), "1.0 or more is usual"
        other, why = (
            ("epsilon", epsilon),
            "the noiseMultiplier sets the privacy and epsilon is reported",
        )
    else:
        needed, needed_hint = ("epsilon", epsilon), "0 < epsilon < 1 per round"
        other, why = (
            ("noiseMultiplier", noise_multiplier),
            "the epsilon and delta set each client's noise",
        )
    problems = []
    if needed[1] is None:
        problems.append(f"{where}.{needed[0]} is required with mode {mode} ({needed_hint})")
    if other[1] is not None:
        problems.append(
            f"{where}.{other[0]} is for the other mode; with {mode} {why}: remove {other[0]}"
        )
    return problems


@dataclass(frozen=True)
class DpSettings:
    """``spec.privacy.differentialPrivacy`` as the server and the clients use it."""

    mode: str
    clipping_norm: float  # with adaptive clipping: the first round's
    noise_multiplier: float | None = None  # central
    epsilon: float | None = None  # local, per round
    delta: float = DEFAULT_DELTA
    clipping: str = FIXED
    target_unclipped_quantile: float = DEFAULT_TARGET_UNCLIPPED  # adaptive
    clip_learning_rate: float = DEFAULT_CLIP_LEARNING_RATE  # adaptive
    clipped_count_stddev: float | None = None  # adaptive

    @classmethod
    def from_spec(cls, data: Mapping[str, Any]) -> DpSettings:
        """From the resource's camelCase JSON (the controller validated it; checked again
        here because the server and client launchers take it as a flag)."""
        where = "spec.privacy.differentialPrivacy"
        try:
            settings = cls(
                mode=str(data["mode"]),
                clipping_norm=float(data["clippingNorm"]),
                noise_multiplier=_number_or_none(data.get("noiseMultiplier")),
                epsilon=_number_or_none(data.get("epsilon")),
                delta=float(data.get("delta", DEFAULT_DELTA)),
                clipping=str(data.get("clipping", FIXED)),
                target_unclipped_quantile=float(
                    data.get("targetUnclippedQuantile", DEFAULT_TARGET_UNCLIPPED)
                ),
                clip_learning_rate=float(
                    data.get("clippingNormLearningRate", DEFAULT_CLIP_LEARNING_RATE)
                ),
                clipped_count_stddev=_number_or_none(data.get("clippedCountStddev")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PrivacySettingError(f"{where}: {exc!r} in {dict(data)!r}") from None
        if settings.clipping not in (FIXED, ADAPTIVE):
            raise PrivacySettingError(f"{where}.clipping {settings.clipping!r}: use fixed or "
                                      "adaptive")  # fmt: skip
        if settings.mode not in DP_MODES:
            raise PrivacySettingError(f"{where}.mode {settings.mode!r}: use central or local")
        if not settings.clipping_norm > 0:
            raise PrivacySettingError(f"{where}.clippingNorm must be > 0")
        problems = mode_problems(settings.mode, settings.noise_multiplier, settings.epsilon, where)
        problems += clipping_problems(
            settings.clipping,
            settings.mode,
            settings.noise_multiplier,
            settings.clipped_count_stddev,
            settings.target_unclipped_quantile,
            where,
        )
        if problems:
            raise PrivacySettingError("; ".join(problems))
        if settings.noise_multiplier is not None and not settings.noise_multiplier > 0:
            raise PrivacySettingError(f"{where}.noiseMultiplier must be > 0")
        if settings.epsilon is not None:
            check_local_epsilon(settings.epsilon, settings.delta, where)
        return settings

    def to_spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "clippingNorm": self.clipping_norm,
                               "delta": self.delta}  # fmt: skip
        if self.noise_multiplier is not None:
            out["noiseMultiplier"] = self.noise_multiplier
        if self.epsilon is not None:
            out["epsilon"] = self.epsilon
        if self.clipping == ADAPTIVE:
            out.update(
                clipping=ADAPTIVE,
                targetUnclippedQuantile=self.target_unclipped_quantile,
                clippingNormLearningRate=self.clip_learning_rate,
                clippedCountStddev=self.clipped_count_stddev,
            )
        return out

    @property
    def round_noise_multiplier(self) -> float:
        """Noise std / clipping norm of one round's release: the server's multiplier
        (central) or the one each client's (epsilon, delta) calibrates (local)."""
        if self.mode == CENTRAL:
            assert self.noise_multiplier is not None
            return self.noise_multiplier
        assert self.epsilon is not None
        return gaussian_noise_multiplier(self.epsilon, self.delta)


def _number_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class SecAggSettings:
    """``spec.privacy.secureAggregation`` (SecAgg+, Bell et al. 2020, Flower's implementation):
    each client masks its update so that only the sum over the round's clients can be
    unmasked. `shares`: how many clients (itself included) each client's secrets are split
    among, None for all of the round's; `threshold`: how many of those shares rebuild a
    secret, so a round survives as long as every client keeps `threshold` of its share holders
    (up to shares - threshold drop-outs among them). Each update value is clipped to
    [-clipping_range, clipping_range] and quantized to `quantization_range` levels; a client's
    weight (its sample count) counts up to `max_weight`."""

    threshold: int
    shares: int | None = None
    clipping_range: float = SECAGG_CLIPPING_RANGE
    quantization_range: int = SECAGG_QUANTIZATION_RANGE
    max_weight: float = SECAGG_MAX_WEIGHT
    modulus_range: int = SECAGG_MODULUS_RANGE

    @classmethod
    def from_spec(cls, data: Mapping[str, Any]) -> SecAggSettings:
        """From the resource's camelCase JSON (checked again: the launcher takes it as a
        flag)."""
        where = "spec.privacy.secureAggregation"
        try:
            shares = data.get("shares")
            settings = cls(
                threshold=int(data["reconstructionThreshold"]),
                shares=None if shares is None else int(shares),
                clipping_range=float(data.get("clippingRange", SECAGG_CLIPPING_RANGE)),
                quantization_range=int(data.get("quantizationRange", SECAGG_QUANTIZATION_RANGE)),
                max_weight=float(data.get("maxWeight", SECAGG_MAX_WEIGHT)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PrivacySettingError(f"{where}: {exc!r} in {dict(data)!r}") from None
        problems = secagg_problems(settings, None, where)
        if problems:
            raise PrivacySettingError("; ".join(problems))
        return settings

    def to_spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "reconstructionThreshold": self.threshold,
            "clippingRange": self.clipping_range,
            "quantizationRange": self.quantization_range,
            "maxWeight": self.max_weight,
        }
        if self.shares is not None:
            out["shares"] = self.shares
        return out

    def round_shares(self, clients: int) -> int:
        """The shares of a round with `clients` clients: all of them by default; fewer are
        made odd (each client's neighbours are the same number on either side)."""
        shares = clients if self.shares is None else min(self.shares, clients)
        if shares < clients and shares % 2 == 0:
            shares += 1
        return shares


def secagg_problems(settings: SecAggSettings, clients: int | None, where: str) -> list[str]:
    """What is wrong with SecAgg+ settings for rounds of at least `clients` clients (None:
    unknown), each with the fix."""
    problems = []
    if settings.threshold < 2:
        problems.append(f"{where}.reconstructionThreshold must be at least 2 (1 would let any "
                        "single share holder unmask a client's update)")  # fmt: skip
    if settings.shares is not None:
        if settings.shares < 3:
            problems.append(f"{where}.shares must be at least 3, or left out for all clients")
        elif settings.threshold > settings.shares:
            problems.append(
                f"{where}.reconstructionThreshold ({settings.threshold}) is larger than shares "
                f"({settings.shares}): no secret could be rebuilt; lower the threshold or raise "
                "shares"
            )
    if clients is not None and settings.threshold > clients:
        problems.append(
            f"{where}.reconstructionThreshold ({settings.threshold}) is larger than the "
            f"{clients} clients a round may have (spec.server.minAvailableClients): a round "
            f"could never unmask; lower it to {clients} or less, or raise minAvailableClients"
        )
    if not settings.clipping_range > 0:
        problems.append(f"{where}.clippingRange must be > 0")
    if not 0 < settings.quantization_range <= settings.modulus_range // 1024:
        problems.append(f"{where}.quantizationRange must be between 1 and 2**22 (sums of up to "
                        "1024 clients must not overflow the 2**32 modulus)")  # fmt: skip
    if not settings.max_weight > 0:
        problems.append(f"{where}.maxWeight must be > 0")
    return problems


@dataclass(frozen=True)
class ClusterRequirement:
    """What one cluster's data requires (from its `PRIVACY_CLAIM`)."""

    mode: str
    clip: float | None = None  # not with secagg alone
    noise: float | None = None  # central-dp: the least noise multiplier the server must add
    epsilon: float | None = None  # local-dp: the most epsilon per round
    delta: float = DEFAULT_DELTA
    secagg: bool = False  # the server must run SecAgg+ (mode secagg, or the item secagg)
    text: str = ""  # the claim's value, as written

    def describe(self) -> str:
        """The requirement in words, for refusals and status."""
        if self.mode == REQUIRE_SECAGG:
            return "secure aggregation (SecAgg+)"
        if self.mode == REQUIRE_CENTRAL:
            words = f"central DP (updates clipped to {self.clip:g}, server noise >= {self.noise:g})"
        elif self.mode == REQUIRE_LOCAL:
            words = (f"local DP (updates clipped to {self.clip:g}, epsilon <= {self.epsilon:g} "
                     f"per round at delta {self.delta:g})")  # fmt: skip
        else:
            words = f"clipping (updates clipped to {self.clip:g})"
        return words + (" and secure aggregation (SecAgg+)" if self.secagg else "")


def parse_requirement(value: str) -> ClusterRequirement:
    """The requirement a `PRIVACY_CLAIM` value states: a mode, then key=value items, comma
    separated, e.g. ``central-dp,clip=1.0,noise=1.1``; a malformed value raises
    PrivacySettingError naming the claim, the item and the forms it may take."""
    where = f"ClusterClaim {PRIVACY_CLAIM}={value!r}"
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items or items[0] not in REQUIREMENT_MODES:
        raise PrivacySettingError(
            f"{where}: it must start with one of {', '.join(REQUIREMENT_MODES)}; "
            f"the forms are {REQUIREMENT_FORMS}"
        )
    mode, numbers, secagg = items[0], {}, items[0] == REQUIRE_SECAGG
    for item in items[1:]:
        if item == REQUIRE_SECAGG and mode != REQUIRE_SECAGG:
            secagg = True
            continue
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in _REQUIREMENT_KEYS[mode]:
            takes = ", ".join(_REQUIREMENT_KEYS[mode]) or "nothing more"
            raise PrivacySettingError(
                f"{where}: {item!r} is not a setting of {mode} (it takes {takes}); the forms "
                f"are {REQUIREMENT_FORMS}"
            )
        try:
            number = float(raw)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number <= 0:
            raise PrivacySettingError(f"{where}: {key} must be a positive number, got {raw!r}")
        numbers[key] = number
    missing = [k for k in _REQUIREMENT_NEEDS[mode] if k not in numbers]
    if missing:
        raise PrivacySettingError(
            f"{where}: {mode} needs {', '.join(missing)}; the forms are {REQUIREMENT_FORMS}"
        )
    requirement = ClusterRequirement(
        mode=mode,
        clip=numbers.get("clip"),
        noise=numbers.get("noise"),
        epsilon=numbers.get("epsilon"),
        delta=numbers.get("delta", DEFAULT_DELTA),
        secagg=secagg,
        text=value,
    )
    if requirement.epsilon is not None:
        check_local_epsilon(requirement.epsilon, requirement.delta, where)
    return requirement


@dataclass(frozen=True)
class ClientPrivacy:
    """What one cluster's client enforces on every train reply (in the platform's worker).

    `clip`: the update (reply minus the model received) is scaled down to this L2 norm at
    most (a smaller norm the server asks for wins). `noise_std`: Gaussian noise of this
    standard deviation is added to every floating-point value of the reply. `central_noise`:
    train messages that do not ask for client clipping at most `clip` and declare server
    noise of at least this multiplier are refused. `requirement`: the cluster's requirement
    in words (empty: only the resource's own settings). `secagg`: train messages that are not
    part of a SecAgg+ round are refused."""

    cluster: str
    clip: float | None = None
    noise_std: float | None = None
    central_noise: float | None = None
    requirement: str = ""
    secagg: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClientPrivacy:
        """Parse what `to_json` wrote; anything else raises PrivacySettingError."""
        try:
            data: Any = json.loads(text)
            privacy = cls(**data)
        except (ValueError, TypeError) as exc:
            raise PrivacySettingError(f"privacy settings {text!r}: {exc}") from None
        for name in ("clip", "noise_std", "central_noise"):
            value = getattr(privacy, name)
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise PrivacySettingError(f"privacy settings: {name} must be > 0, got {value!r}")
        return privacy

    def refusal(self, server_clip: float | None, server_noise: float | None) -> str | None:
        """Why a train message with the server's clipping norm and declared noise multiplier
        must be refused on this cluster (None: it may be answered)."""
        if self.central_noise is None:
            return None
        # A server norm above this cluster's is answered: the reply is clipped to this
        # cluster's norm, and the server's noise, scaled to its own larger norm, covers it
        # with room to spare (so adaptive clipping may grow past it).
        asked = f"asked for clipping {server_clip:g}" if server_clip else "asked for no clipping"
        noise = f"noise {server_noise:g}" if server_noise else "no server noise"
        if server_clip is None or server_noise is None or server_noise < self.central_noise:
            return (
                f"cluster {self.cluster} requires {self.requirement}; the server {asked} with "
                f"{noise}: set spec.privacy.differentialPrivacy (mode central, "
                f"noiseMultiplier >= {self.central_noise:g}) and run the app with "
                "workloads.sdk.run_strategy"
            )
        return None

    def secagg_refusal(self) -> str:
        """Why a train message outside a SecAgg+ round is refused on this cluster."""
        return (
            f"cluster {self.cluster} requires {self.requirement}; the server sent its model "
            "update request in the clear: set spec.privacy.secureAggregation (e.g. "
            "reconstructionThreshold: 2) and run the app with workloads.sdk.run_strategy"
        )

    def clip_for(self, server_clip: float | None) -> float | None:
        """The clipping norm for one reply: the smaller of this cluster's and the server's."""
        norms = [n for n in (self.clip, server_clip) if n is not None]
        return min(norms) if norms else None


def client_privacy(
    cluster: str, dp: DpSettings | None, requirement: ClusterRequirement | None
) -> ClientPrivacy:
    """Merge the resource's DP settings and the cluster's requirement into what that
    cluster's client enforces."""
    clips: list[float] = []
    stds: list[float] = []
    if dp is not None and dp.mode == LOCAL:
        clips.append(dp.clipping_norm)
        stds.append(dp.clipping_norm * dp.round_noise_multiplier)
    central_noise = None
    if requirement is not None and requirement.clip is not None:
        clips.append(requirement.clip)
        if requirement.mode == REQUIRE_LOCAL:
            assert requirement.epsilon is not None  # parse_requirement checked it
            stds.append(
                requirement.clip * gaussian_noise_multiplier(requirement.epsilon, requirement.delta)
            )
        if requirement.mode == REQUIRE_CENTRAL:
            central_noise = requirement.noise
    return ClientPrivacy(
        cluster=cluster,
        clip=min(clips) if clips else None,
        noise_std=max(stds) if stds else None,
        central_noise=central_noise,
        requirement=requirement.describe() if requirement is not None else "",
        secagg=requirement is not None and requirement.secagg,
    )
