"""Stopping background asyncio tasks, the same way in every process."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel each task that is not None and wait until it has ended (its CancelledError is
    the expected end; any other exception it raises propagates)."""
    for task in tasks:
        if task is None:
            continue
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
