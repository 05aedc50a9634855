"""TCP forwarding for Services (TEST INFRASTRUCTURE, the local node's kube-proxy stand-in).

Keeps a set of listeners (address, port) -> (pod address, target port) in sync with the
Services of one apiserver: ClusterIP:port for every Service with a ready pod, and pod:port for a
LoadBalancer Service whose port differs from its targetPort (the LB address is the pod's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading

log = logging.getLogger(__name__)

Addr = tuple[str, int]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class Forwarder:
    """Runs an asyncio loop in a daemon thread; `sync` replaces the forwarding table."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.routes: dict[Addr, Addr] = {}
        self.servers: dict[Addr, asyncio.Server] = {}
        self.failed: set[Addr] = set()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name=f"fwd-{name}", daemon=True
        )
        self.thread.start()

    def sync(self, routes: dict[Addr, Addr]) -> None:
        """Make the listeners match `routes` (thread-safe; returns at once)."""
        if routes != self.routes or self.failed:
            self.routes = dict(routes)
            asyncio.run_coroutine_threadsafe(self._apply(), self.loop)

    async def _apply(self) -> None:
        for addr in list(self.servers):
            if addr not in self.routes:
                self.servers.pop(addr).close()
        for addr in self.routes:
            if addr in self.servers:
                continue
            try:
                self.servers[addr] = await asyncio.start_server(
                    functools.partial(self._handle, addr), addr[0], addr[1], reuse_address=True
                )
                self.failed.discard(addr)
            except OSError as e:
                if addr not in self.failed:
                    log.warning("cannot listen on %s:%d for a service: %s", *addr, e)
                    self.failed.add(addr)

    async def _handle(
        self, addr: Addr, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        dst = self.routes.get(addr)
        if dst is None:
            writer.close()
            return
        try:
            up_r, up_w = await asyncio.open_connection(*dst)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))

    def close(self) -> None:
        async def stop() -> None:
            for s in self.servers.values():
                s.close()
            self.servers.clear()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(2)
        self.loop.call_soon_threadsafe(self.loop.stop)
