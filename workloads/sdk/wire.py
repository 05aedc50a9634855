"""A smaller wire format for the model: float16 on the wire, the app's own dtypes at both ends.

``run_strategy(..., wire_dtype="float16")`` halves the bytes of every model sent and received:
the server's grid (``PlatformGrid``) sends each float32 or float64 array whose values fit
float16's range as float16 and names the arrays it narrowed in the message (ConfigRecord
``ocmfl.wire``). On the client, ``PlatformClientApp`` (or the ``wire_format`` mod, for a plain
``ClientApp``) widens them back to their own dtypes before the app sees them, and narrows the
same arrays of the reply; the server widens the reply before its strategy aggregates. So the
app's code, the strategy, the aggregation, the checkpoints and the final model all keep their
own dtypes: only the values' precision on the wire changes (float16 keeps about 3 significant
digits; docs/workloads.md has the accuracy measured on the digits example).

An array whose values do not fit float16 (beyond +-65504, NaN or infinity) travels as it is,
as do integer arrays (counters such as BatchNorm's ``num_batches_tracked``). A client without
the widening (an app that uses neither) still works: it gets float16 arrays (torch's
``load_state_dict`` casts them into the model's own dtypes) and replies in full precision.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.app.message.message import make_message
from flwr.clientapp.typing import ClientAppCallable

from workloads.sdk.aggregate import array_view

WIRE_RECORD = "ocmfl.wire"  # ConfigRecord of a message whose arrays were narrowed
WIRE_DTYPES = {"float16": np.dtype(np.float16)}
NARROWED = (np.dtype(np.float32), np.dtype(np.float64))
CHECK_BLOCK = 1 << 22  # values a step when checking that an array fits the narrow dtype

# name -> the dtype (numpy's ``dtype.str``) the array had before it was narrowed
Narrowed = dict[str, str]


class WireFormatError(ValueError):
    """A wire format the SDK does not have."""


def wire_dtype(value: object) -> np.dtype[Any] | None:
    """The narrow dtype `value` names (None, "" or "float32": the app's own dtypes)."""
    if value is None or value in ("", "float32", "none"):
        return None
    if isinstance(value, str) and value in WIRE_DTYPES:
        return WIRE_DTYPES[value]
    raise WireFormatError(
        f"wire dtype {value!r} is not one the SDK has: use one of "
        f"{', '.join(['float32', *WIRE_DTYPES])} (float32: the arrays as the app made them)"
    )


def fits(values: npt.NDArray[Any], dtype: np.dtype[Any]) -> bool:
    """Whether every value of `values` is finite and within `dtype`'s range (block by block:
    no temporary the size of the array)."""
    limit = float(np.finfo(dtype).max)
    flat = values.reshape(-1)
    for start in range(0, flat.size, CHECK_BLOCK):
        block = flat[start : start + CHECK_BLOCK]
        low, high = float(block.min()), float(block.max())
        if not (-limit <= low and high <= limit):  # NaN fails both comparisons
            return False
    return True


def narrow(
    record: ArrayRecord, dtype: np.dtype[Any], only: Mapping[str, str] | None = None
) -> tuple[ArrayRecord, Narrowed]:
    """`record` with its float32/float64 arrays that fit `dtype` cast to it (with `only`: just
    the arrays it names, when still of the dtype it gives), and what was narrowed."""
    out = ArrayRecord()
    done: Narrowed = {}
    for name, array in record.items():
        values = array_view(array)
        wanted = only is None or only.get(name) == values.dtype.str
        if wanted and values.dtype in NARROWED and fits(values, dtype):
            out[name] = Array(values.astype(dtype))
            done[name] = values.dtype.str
        else:
            out[name] = array
    return out, done


def widen(record: ArrayRecord, narrowed: Mapping[str, str]) -> ArrayRecord:
    """`record` with each array `narrowed` names, when it came narrow, back in its own dtype."""
    if not any(name in narrowed for name in record):
        return record
    out = ArrayRecord()
    for name, array in record.items():
        values = array_view(array)
        own = narrowed.get(name)
        if own is not None and values.dtype in WIRE_DTYPES.values() and own != values.dtype.str:
            out[name] = Array(values.astype(np.dtype(own)))
        else:
            out[name] = array
    return out


def mark(content: RecordDict, dtype: np.dtype[Any], narrowed: Narrowed) -> None:
    """Name in `content` the arrays narrowed (for the client to widen and narrow back)."""
    content[WIRE_RECORD] = ConfigRecord(
        {"dtype": dtype.name, "names": list(narrowed), "dtypes": list(narrowed.values())}
    )


def marked(content: RecordDict) -> tuple[np.dtype[Any] | None, Narrowed] | None:
    """The wire dtype and the narrowed arrays a message's content names; None when none."""
    record = content.config_records.get(WIRE_RECORD)
    if record is None:
        return None
    names, dtypes = record.get("names") or [], record.get("dtypes") or []
    if not isinstance(names, list) or not isinstance(dtypes, list) or len(names) != len(dtypes):
        raise WireFormatError(f"malformed {WIRE_RECORD} record: names and dtypes must pair up")
    narrowed = {str(n): str(d) for n, d in zip(names, dtypes, strict=True)}
    return wire_dtype(record.get("dtype")), narrowed


def with_arrays(content: RecordDict, change: Any) -> RecordDict:
    """A new RecordDict: `content`'s records, each ArrayRecord passed through `change`."""
    out = RecordDict()
    for key, value in content.items():
        out[key] = change(value) if isinstance(value, ArrayRecord) else value
    return out


def wire_format(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """ClientApp mod: widen the arrays the server narrowed before the app sees them, and
    narrow the same arrays of the app's reply (``PlatformClientApp`` does this itself)."""
    if not msg.has_content():
        return call_next(msg, context)
    wire = marked(msg.content)
    if wire is None:
        return call_next(msg, context)
    dtype, narrowed = wire
    wide = make_message(msg.metadata, with_arrays(msg.content, lambda r: widen(r, narrowed)))
    reply = call_next(wide, context)
    if dtype is None or reply.has_error() or not reply.has_content():
        return reply
    reply.content = with_arrays(reply.content, lambda r: narrow(r, dtype, narrowed)[0])
    return reply
