"""`Writer.submit_many`: a batch handed to the loop in one wake-up, each write's outcome on
its own future, at most `limit` in flight."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, cast

import pytest

from hub_controller.operator.writer import AsyncKube, Writer


def test_a_batch_is_one_wake_up_with_every_outcome_and_the_bound_kept() -> None:
    writer = Writer.on_own_loop(object(), 3)  # type: ignore[arg-type]  # writes ignore it
    wakeups = 0
    real = writer.loop.call_soon_threadsafe

    def counting(*args: Any, **kw: Any) -> Any:
        nonlocal wakeups
        wakeups += 1
        return real(*args, **kw)

    writer.loop.call_soon_threadsafe = cast(Any, counting)  # type: ignore[method-assign]
    in_flight = peak = 0

    async def ok(i: int, _: AsyncKube) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return i

    async def bad(_: AsyncKube) -> int:
        raise ValueError("refused")

    writes = [lambda k, i=i: ok(i, k) for i in range(10)]
    futures = writer.submit_many([*writes, bad])
    concurrent.futures.wait(futures, timeout=10)
    assert wakeups == 1
    assert [f.result() for f in futures[:10]] == list(range(10))
    with pytest.raises(ValueError, match="refused"):
        futures[10].result()
    assert peak == 3
    assert writer.submit_many([]) == [] and wakeups == 1
    with pytest.raises(ValueError, match="refused"):
        writer.run_all([*writes[:2], bad])
    writer.loop.call_soon_threadsafe = real  # type: ignore[method-assign]
    writer.loop.call_soon_threadsafe(writer.loop.stop)
