"""Reading the hub's acks on a report stream, with the hub's own reason when it ends one.

The hub ends a stream it refuses with an error status, and sends that status first as a
closing Ack (`closing_code`, `closing_details`). The closing Ack is what a client should
believe: gRPC's Python client replaces a status that lands while it is writing with INTERNAL
"Internal error from Core" (grpc/grpc#36066), while messages received before the status are
still delivered.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TypeAlias

import grpc
import grpc.aio

from ocmfl.status.v1 import report_pb2

ReportCall: TypeAlias = "grpc.aio.StreamStreamCall[report_pb2.Report, report_pb2.Ack]"


class HubRefusal(grpc.aio.AioRpcError):  # type: ignore[misc]  # the stubs leave it Any
    """The hub ended the stream with this status (as it announced it, when it did)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)

    @classmethod
    def announced(cls, ack: report_pb2.Ack) -> HubRefusal | None:
        """The refusal a closing Ack announces; None for an ordinary ack."""
        if not ack.closing_code:
            return None
        code = grpc.StatusCode.__members__.get(ack.closing_code, grpc.StatusCode.UNKNOWN)
        return cls(code, ack.closing_details)

    def __str__(self) -> str:
        return f"{self.code().name}: {self.details()}"


async def hub_acks(call: ReportCall) -> AsyncGenerator[report_pb2.Ack, None]:
    """The call's acks until the hub ends the stream. An error ending raises HubRefusal with
    the status of the hub's closing Ack when it sent one, else the call's own status."""
    closing: HubRefusal | None = None
    try:
        async for ack in call:
            closing = HubRefusal.announced(ack) or closing
            if not ack.closing_code:
                yield ack
    except grpc.aio.AioRpcError as e:
        raise (closing or HubRefusal(e.code(), e.details() or "")) from e
    if closing is not None:
        raise closing


async def first_ack(call: ReportCall) -> report_pb2.Ack:
    """The first ack of a stream the hub may refuse as it opens, while the client writes:
    read as an iterator, because `call.read()` gives up at once on a call that a failed
    write has ended (and would never see the closing Ack). HubRefusal as hub_acks."""
    acks = hub_acks(call)
    try:
        return await anext(acks)
    except StopAsyncIteration:
        raise EOFError("the hub ended the stream without an error and without an ack") from None
    finally:
        await acks.aclose()


async def read_ack(call: ReportCall) -> report_pb2.Ack:
    """The next ack (`call.read()`); HubRefusal if the hub ends the stream with an error.
    Only for a call whose writes the hub has read (else use hub_acks or first_ack)."""
    try:
        ack = await call.read()
    except grpc.aio.AioRpcError as e:
        raise HubRefusal(e.code(), e.details() or "") from e
    if not isinstance(ack, report_pb2.Ack):  # EOF
        raise EOFError("the hub ended the stream without an error and without this ack")
    refusal = HubRefusal.announced(ack)
    if refusal is not None:
        raise refusal
    return ack
