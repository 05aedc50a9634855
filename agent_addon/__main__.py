"""`ocm-fl-agent`: the addon agent on a managed cluster."""

from __future__ import annotations

import asyncio
import contextlib
import signal

from agent_addon.agent import Agent, parse_args


async def _amain(argv: list[str] | None) -> None:
    agent = Agent(parse_args(argv))
    await agent.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await agent.stop(drain_s=10.0)


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_amain(argv))


if __name__ == "__main__":
    main()
