"""Bounded buffer of reports not yet acknowledged by the hub.

Reports get increasing sequence numbers. When full, the oldest non-final report is dropped
(and counted); a final report is never dropped. The hub's Ack removes a report.
`save`/`load` keep pending reports across agent restarts (length-prefixed protobufs).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import OrderedDict
from pathlib import Path

from ocmfl.pki import write_atomic
from ocmfl.status.v1 import report_pb2


class ReportBuffer:
    """Unacknowledged reports in sequence order; single event loop, not thread-safe."""

    def __init__(self, capacity: int = 1000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._items: OrderedDict[int, report_pb2.Report] = OrderedDict()
        self._next_seq = 1
        self.dropped = 0
        self.acked = 0
        self._changed = asyncio.Event()
        self.dirty = False  # changed since the last save

    def __len__(self) -> int:
        return len(self._items)

    def add(self, report: report_pb2.Report) -> report_pb2.Report:
        """Assign the next sequence number and keep `report` until acked; returns it."""
        report.sequence = self._next_seq
        self._next_seq += 1
        self._items[report.sequence] = report
        while len(self._items) > self.capacity:
            victim = next((s for s, r in self._items.items() if not r.final), None)
            if victim is None:  # only finals left: keep them all
                break
            del self._items[victim]
            self.dropped += 1
        self._notify()
        return report

    def ack(self, sequence: int) -> bool:
        """Forget the report with this sequence; False when it was not pending."""
        if self._items.pop(sequence, None) is None:
            return False
        self.acked += 1
        self._notify()
        return True

    def drop_first(self) -> report_pb2.Report | None:
        """Drop the oldest pending report (the hub refused it as malformed)."""
        if not self._items:
            return None
        _, report = self._items.popitem(last=False)
        self.dropped += 1
        self._notify()
        return report

    def pending(self, after: int = 0) -> list[report_pb2.Report]:
        """Pending reports with a sequence above `after`, oldest first."""
        return [r for s, r in self._items.items() if s > after]

    def has_final(self) -> bool:
        return any(r.final for r in self._items.values())

    def save(self, path: Path) -> None:
        """Write every pending report to `path` atomically (oldest first)."""
        blob = b"".join(
            struct.pack(">I", len(data)) + data
            for data in (r.SerializeToString() for r in self._items.values())
        )
        write_atomic(path, blob, 0o600)
        self.dirty = False

    def load(self, path: Path) -> int:
        """Queue the reports saved at `path` (renumbered); how many. A torn tail is ignored."""
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return 0
        n, pos = 0, 0
        while pos + 4 <= len(blob):
            (size,) = struct.unpack_from(">I", blob, pos)
            chunk = blob[pos + 4 : pos + 4 + size]
            if len(chunk) < size:
                break
            self.add(report_pb2.Report.FromString(chunk))
            pos += 4 + size
            n += 1
        return n

    def _notify(self) -> None:
        self.dirty = True
        # Wake every current waiter; later waiters wait on a fresh event.
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait_changed(self, timeout: float | None = None) -> None:
        """Wait until something is added, acked or dropped (or `timeout` passes)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def wait_empty(self, timeout: float) -> bool:
        """True once every report has been acknowledged (within `timeout` seconds)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._items:
            left = deadline - loop.time()
            if left <= 0:
                return False
            await self.wait_changed(min(left, 0.1))
        return True
