"""Per-cluster stream and rate limits of the aggregator (pure apart from the clock).

One cluster's agent, or a stolen agent key, can otherwise open any number of streams and send
reports as fast as the network allows; these keep what one cluster costs the hub bounded, so
it cannot starve the other clusters' reports.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Final

ENV_PREFIX: Final = "OCMFL_AGGREGATOR_"


@dataclass(frozen=True)
class Limits:
    """Aggregator limits; each can be set from env OCMFL_AGGREGATOR_<NAME in upper case>."""

    max_streams_per_cluster: int = 4  # open report streams per cluster identity
    reports_per_s: float = 50.0  # per cluster, sustained
    report_burst: int = 500  # per cluster, at once (an agent resending its buffer)
    max_wait_s: float = 2.0  # a report waits this long for the rate limit, else is refused
    max_rows_per_cluster: int = 2_000  # rows kept per run and cluster (oldest evicted)
    max_rows_per_run: int = 200_000  # rows kept per run
    max_rows: int = 2_000_000  # rows kept in the whole store
    max_runs: int = 10_000  # runs (resource uids) kept
    max_metric_series: int = 5_000  # per-federation Prometheus label sets; the rest: "_other"
    # A report out of scope is looked up again for this long before it is refused (once per
    # stream, from its first miss): the hub's ManifestWork watch can trail the work that
    # started the reporting client.
    scope_grace_s: float = 5.0

    @classmethod
    def from_env(cls, env: Callable[[str], str | None] = os.environ.get) -> Limits:
        """Defaults, overridden by OCMFL_AGGREGATOR_MAX_STREAMS_PER_CLUSTER etc.; a value
        that is not a positive number is an error naming the variable."""
        values: dict[str, int | float] = {}
        for f in fields(cls):
            var = ENV_PREFIX + f.name.upper()
            raw = env(var)
            if not raw:
                continue
            kind = float if f.type in ("float", float) else int
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"{var}={raw!r}: must be a {kind.__name__}") from None
            if value <= 0:
                raise ValueError(f"{var}={raw!r}: must be positive")
            values[f.name] = value
        return cls(**values)  # type: ignore[arg-type]


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up; a reservation may go into debt."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self._clock = clock
        self._last = clock()

    def reserve(self, max_wait_s: float) -> float | None:
        """Take one token: the seconds to wait before using it, or None (nothing taken) when
        that would be longer than `max_wait_s`."""
        now = self._clock()
        self.tokens = min(self.burst, self.tokens + (now - self._last) * self.rate)
        self._last = now
        wait = max(0.0, (1.0 - self.tokens) / self.rate)
        if wait > max_wait_s:
            return None
        self.tokens -= 1.0
        return wait
