"""FedAvg's weighted average at memory speed, with Flower's results to float tolerance.

Flower's ``aggregate_arrayrecords`` deserialises every client's array (a copy), multiplies it
by its weight (a second full-size temporary) and adds it into the running sum: for K clients of
N float32 values it moves about 5 x K x N x 4 bytes through memory. Here each client's array is
a zero-copy view on the ``.npy`` bytes Flower received, and the sum is built block by block in
a cache-sized buffer, so each client's values are read from memory once and the result is
written once, straight into the new Array's bytes. With torch (the workload image has it) a
block is summed by fused multiply-adds on all cores (``acc.add_(x, alpha=w)``: one pass over
the block per client); a fused multiply-add rounds once where Flower's ``x*w`` then ``+`` rounds
twice, so results agree with Flower's to float rounding, not to the last bit. Without torch, and
for float16, numpy does Flower's very operations in Flower's order (bit-identical, about 0.6 of
the torch path's speed). ``FedAvg`` / ``FedProx`` are Flower's strategies with this aggregation.
"""

from __future__ import annotations

import ctypes
import functools
import io
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import FedProx as FlowerFedProx

BLOCK_BYTES = 256 * 1024  # one block of the sum and one of a product stay in L2 cache
# torch's block is shared out over its threads; the block's sum stays in the L3 cache while
# every client's part is added (2 MiB a thread: 26 GB/s here against 21 at 0.5 MiB), capped
# so that it still fits a shared L3 on many-core machines.
TORCH_BLOCK_BYTES_PER_THREAD = 2 * 1024 * 1024
TORCH_MAX_BLOCK_BYTES = 16 * 1024 * 1024
TORCH_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
MAX_THREADS = 8
NUMPY_STYPE = "numpy.ndarray"


def array_view(array: Array) -> npt.NDArray[Any]:
    """A read-only numpy view on an Array's bytes without copying (Flower's ``.numpy()``
    copies); falls back to ``.numpy()`` for anything but a plain ``.npy`` payload."""
    data = array.data
    if array.stype != NUMPY_STYPE or not isinstance(data, bytes):
        return array.numpy()
    layout = _npy_layout(data[: _npy_values_offset(data)])
    if layout is None:
        return array.numpy()
    shape, dtype, offset = layout
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)


def _npy_values_offset(data: bytes) -> int:
    """Where a ``.npy`` payload's values start (after magic, version, length and header);
    0 when it is not one."""
    if len(data) < 12 or not data.startswith(b"\x93NUMPY"):
        return 0
    if data[6] == 1:
        return 10 + int.from_bytes(data[8:10], "little")
    return 12 + int.from_bytes(data[8:12], "little")


@functools.lru_cache(maxsize=1024)
def _npy_layout(head: bytes) -> tuple[tuple[int, ...], np.dtype[Any], int] | None:
    """Shape, dtype and values' offset from a ``.npy`` header; None for what a plain view
    cannot show (not ``.npy``, Fortran order, objects). Cached: every client's copy of a
    layer has the same header, and numpy's header parser costs ~40 us a call."""
    stream = io.BytesIO(head)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    except ValueError:
        return None
    if fortran or dtype.hasobject:
        return None
    return tuple(shape), dtype, stream.tell()


def result_dtype(arrays: Sequence[npt.NDArray[Any]], factors: Sequence[float]) -> np.dtype[Any]:
    """The dtype Flower's ``array * weight`` gives (numpy's promotion rules)."""
    return (arrays[0].ravel()[:1] * factors[0]).dtype


def blockwise(arrays: Sequence[npt.NDArray[Any]], factors: Sequence[float]) -> bool:
    """Whether the blockwise path applies: large float arrays (small ones are not worth it)."""
    dtype = result_dtype(arrays, factors)
    return bool(np.issubdtype(dtype, np.floating)) and arrays[0].nbytes >= BLOCK_BYTES


def weighted_sum(
    arrays: Sequence[npt.NDArray[Any]],
    factors: Sequence[float],
    out: npt.NDArray[Any] | None = None,
) -> npt.NDArray[Any]:
    """``arrays[0]*factors[0] + arrays[1]*factors[1] + ...`` in Flower's dtypes and order,
    blockwise so every input is read once; into the flat ``out`` if given (blockwise path
    only)."""
    first = arrays[0]
    out_dtype = result_dtype(arrays, factors)
    if not blockwise(arrays, factors):
        total = first * factors[0]
        for array, factor in zip(arrays[1:], factors[1:], strict=True):
            total += array * factor
        return total
    flats = [a.reshape(-1) for a in arrays]
    out = np.empty(first.size, dtype=out_dtype) if out is None else out
    if not _torch_weighted_sum(flats, factors, out):
        _numpy_weighted_sum(flats, factors, out)
    return out.reshape(first.shape)


def _torch_weighted_sum(
    flats: Sequence[npt.NDArray[Any]], factors: Sequence[float], out: npt.NDArray[Any]
) -> bool:
    """The sum by torch's fused multiply-add, block by block on all of torch's threads;
    False (nothing done) without torch or for dtypes it does not take here."""
    torch = _torch()
    if torch is None or out.dtype not in TORCH_DTYPES or any(f.dtype != out.dtype for f in flats):
        return False
    with warnings.catch_warnings():
        # The received bytes are read-only and torch says so; nothing here writes to them.
        warnings.simplefilter("ignore", UserWarning)
        inputs = [torch.from_numpy(f) for f in flats]
    total = torch.from_numpy(out)
    block_bytes = min(TORCH_BLOCK_BYTES_PER_THREAD * torch.get_num_threads(), TORCH_MAX_BLOCK_BYTES)
    block = max(1, block_bytes // out.itemsize)
    for start in range(0, out.size, block):
        acc = total[start : start + block]
        torch.mul(inputs[0][start : start + block], factors[0], out=acc)
        for tensor, factor in zip(inputs[1:], factors[1:], strict=True):
            acc.add_(tensor[start : start + block], alpha=factor)
    return True


@functools.cache
def _torch() -> ModuleType | None:
    """torch when installed (the workload image has it; an app's own image may not)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _numpy_weighted_sum(
    flats: Sequence[npt.NDArray[Any]], factors: Sequence[float], out: npt.NDArray[Any]
) -> None:
    """The sum with Flower's very operations (bit-identical), blocks shared out over the
    cores on threads (numpy releases the GIL in these ufuncs)."""
    block = max(1, BLOCK_BYTES // out.itemsize)
    blocks = range(0, out.size, block)
    workers = min(_threads(), len(blocks))

    def part(first_block: int) -> None:
        scratch = np.empty(block, dtype=out.dtype)
        for start in blocks[first_block::workers]:
            stop = min(start + block, out.size)
            acc, tmp = out[start:stop], scratch[: stop - start]
            np.multiply(flats[0][start:stop], factors[0], out=acc)
            for flat, factor in zip(flats[1:], factors[1:], strict=True):
                np.multiply(flat[start:stop], factor, out=tmp)
                np.add(acc, tmp, out=acc)

    if workers <= 1:
        part(0)
    else:
        list(_pool().map(part, range(workers)))


def _threads() -> int:
    """Cores this process may use (the blockwise sum is compute-bound per block)."""
    return max(1, min(len(os.sched_getaffinity(0)), MAX_THREADS))


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="ocmfl-fedavg")


def aggregate_arrayrecords(records: list[RecordDict], weighting_metric_name: str) -> ArrayRecord:
    """Drop-in for Flower's ``aggregate_arrayrecords``: the weighted average of every
    ArrayRecord in ``records``, weights from each one's (only) MetricRecord."""
    weights = [
        cast(float, next(iter(record.metric_records.values()))[weighting_metric_name])
        for record in records
    ]
    total = sum(weights)
    factors = [w / total for w in weights]
    per_key: dict[str, list[npt.NDArray[Any]]] = {}
    key_factors: dict[str, list[float]] = {}
    for record, factor in zip(records, factors, strict=True):
        for array_record in record.array_records.values():
            for key, value in array_record.items():
                per_key.setdefault(key, []).append(array_view(value))
                key_factors.setdefault(key, []).append(factor)
    return ArrayRecord({key: _average(views, key_factors[key]) for key, views in per_key.items()})


def _average(views: Sequence[npt.NDArray[Any]], factors: Sequence[float]) -> Array:
    """The weighted sum as a Flower Array. The blockwise path writes the ``.npy`` header
    ``np.save`` writes, then the values, straight into the Array's new bytes object: no copy
    at all instead of ``np.save``'s three."""
    if not blockwise(views, factors):
        return Array(np.asarray(weighted_sum(views, factors)))
    return _array_in_place(
        result_dtype(views, factors),
        views[0].shape,
        lambda values: weighted_sum(views, factors, values),
    )


def _array_in_place(
    dtype: np.dtype[Any], shape: tuple[int, ...], fill: Callable[[npt.NDArray[Any]], object]
) -> Array:
    """A ``.npy`` Array of `dtype` and `shape` whose values `fill` writes into the flat view it
    gets: the header ``np.save`` writes, then the values, in the Array's own new bytes."""
    header = io.BytesIO()
    fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(header, fields)
    head = header.getvalue()
    size = int(np.prod(shape, dtype=np.int64))
    data, buf = _new_bytes(len(head) + size * dtype.itemsize)
    buf[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    fill(buf[len(head) :].view(dtype))
    return Array(dtype=str(dtype), shape=tuple(shape), stype=NUMPY_STYPE, data=data)


_bytes_from_size = ctypes.pythonapi.PyBytes_FromStringAndSize
_bytes_from_size.restype = ctypes.py_object
_bytes_from_size.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_bytes_address = ctypes.pythonapi.PyBytes_AsString
_bytes_address.restype = ctypes.c_void_p
_bytes_address.argtypes = (ctypes.py_object,)


def _new_bytes(size: int) -> tuple[bytes, npt.NDArray[np.uint8]]:
    """A new, not yet filled ``bytes`` object of ``size`` and a writable view on it: the C
    API's way to build bytes in place (``PyBytes_FromStringAndSize(NULL, size)``; valid
    while nothing else holds the object, so fill it before handing it out)."""
    if size < 2:  # CPython shares its 0- and 1-byte objects
        raise ValueError("in-place bytes need at least 2 bytes")
    data = cast(bytes, _bytes_from_size(None, size))
    memory = (ctypes.c_char * size).from_address(cast(int, _bytes_address(data)))
    return data, np.frombuffer(memoryview(memory).cast("B"), dtype=np.uint8)


FOLD_BLOCK = 1 << 20  # values a step when a reply is folded into the running sum


class RunningSum:
    """The weighted sum of one round's train replies, folded in one reply at a time as each is
    pulled, so that the ServerApp never holds every client's model at once (``PlatformGrid``
    does this for ``FedAvg`` and ``FedProx`` below). A folded reply's ArrayRecord is replaced
    by an empty ``FoldedArrayRecord``; ``result()`` is the weighted average.

    The sum of float32 arrays is kept in float32 (one model's memory), of every other type in
    float64; the result has Flower's dtype. Flower multiplies by ``weight / total`` and adds,
    this adds ``value * weight`` and divides by the total once: the same average to float
    rounding. A reply that Flower's aggregation would refuse (not one ArrayRecord and one
    MetricRecord, no weight, other array names or shapes than the replies before it) is left
    as it came, and ``problem`` says why: the round's aggregation then fails with that reason,
    as Flower's would."""

    def __init__(self, weighted_by_key: str) -> None:
        self.weighted_by_key = weighted_by_key
        self.sums: dict[str, npt.NDArray[Any]] = {}
        self.dtypes: dict[str, np.dtype[Any]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.total = 0.0
        self.count = 0
        self.problem: str | None = None

    def fold(self, content: RecordDict) -> bool:
        """Add this reply's arrays times its weight and drop them from `content`; False (the
        reply unchanged) when it cannot be folded."""
        if self.problem is not None:
            return False
        self.problem = self._refusal(content)
        if self.problem is not None:
            return False
        (record_key, record), metrics = (
            next(iter(content.array_records.items())),
            next(iter(content.metric_records.values())),
        )
        weight = float(cast(float, metrics[self.weighted_by_key]))
        for name, array in record.items():
            values = array_view(array)
            view = values.reshape(-1)
            if name not in self.sums:
                dtype = result_dtype([view], [weight])
                self.dtypes[name], self.shapes[name] = dtype, tuple(values.shape)
                wide = np.float32 if dtype == np.float32 else np.float64
                self.sums[name] = np.zeros(view.size, dtype=wide)
            acc = self.sums[name]
            for start in range(0, view.size, FOLD_BLOCK):
                end = min(start + FOLD_BLOCK, view.size)
                acc[start:end] += view[start:end] * weight
        self.total += weight
        self.count += 1
        content[record_key] = FoldedArrayRecord(self)
        return True

    def _refusal(self, content: RecordDict) -> str | None:
        """Why Flower's aggregation would refuse this reply, or None."""
        if len(content.array_records) != 1 or len(content.metric_records) != 1:
            return "Expected exactly one ArrayRecord and one MetricRecord in replies."
        metrics = next(iter(content.metric_records.values()))
        if self.weighted_by_key not in metrics:
            return (
                f"Missing required key `{self.weighted_by_key}` in the MetricRecord of "
                "reply messages. Cannot average ArrayRecords."
            )
        record = next(iter(content.array_records.values()))
        if isinstance(record, FoldedArrayRecord):
            return "a reply was folded twice"
        if self.count and list(record.keys()) != list(self.sums):
            return "All ArrayRecords must have the same keys for aggregation."
        for name, array in record.items():
            if name in self.shapes and tuple(array.shape) != self.shapes[name]:
                return (
                    f"array {name!r} has shape {tuple(array.shape)} in one reply and "
                    f"{self.shapes[name]} in another"
                )
        return None

    def result(self) -> ArrayRecord:
        """The weighted average (Flower's dtypes and shapes); the sums are released."""
        out = ArrayRecord()
        for name in list(self.sums):
            acc = self.sums.pop(name)

            def divide(values: npt.NDArray[Any], acc: npt.NDArray[Any] = acc) -> object:
                return np.divide(acc, self.total, out=values, casting="unsafe")

            out[name] = _array_in_place(self.dtypes[name], self.shapes[name], divide)
        return out


class FoldedArrayRecord(ArrayRecord):
    """What stays of a reply's ArrayRecord once ``RunningSum`` has folded it in."""

    def __init__(self, running: RunningSum) -> None:
        super().__init__()
        self.running = running


def folds_replies(strategy: object) -> bool:
    """Whether `strategy` aggregates with ``RunningSum`` (this module's FedAvg or FedProx,
    ``aggregate_train`` not overridden): then its replies may be folded as they arrive."""
    return (
        isinstance(strategy, _FastAggregation)
        and type(strategy).aggregate_train is _FastAggregation.aggregate_train
    )


def _folded(contents: Sequence[RecordDict]) -> RunningSum | None:
    """The running sum the replies were folded into; None when none was folded. Raises
    Flower's InconsistentMessageReplies when a reply could not be folded."""
    records = [next(iter(c.array_records.values()), None) for c in contents]
    runs = {id(r.running): r.running for r in records if isinstance(r, FoldedArrayRecord)}
    if not runs:
        return None
    (running,) = runs.values()
    if running.problem is not None or running.count != len(contents):
        raise InconsistentMessageReplies(
            reason=running.problem or "some replies were folded and others not"
        )
    return running


class _FastAggregation(FlowerFedAvg):
    """Flower's FedAvg ``aggregate_train`` with the array average above (or the running sum
    the platform's grid folded the replies into as they came)."""

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the replies' ArrayRecords and MetricRecords (as Flower's FedAvg)."""
        replies = list(replies)
        running = _folded([m.content for m in replies if not m.has_error()])
        valid, _ = self._check_and_log_replies(replies, is_train=True)
        if not valid:
            return None, None
        contents = [msg.content for msg in valid]
        if running is not None:
            arrays = running.result()
        else:
            arrays = aggregate_arrayrecords(contents, self.weighted_by_key)
        return arrays, self.train_metrics_aggr_fn(contents, self.weighted_by_key)


class FedAvg(_FastAggregation):
    """Flower's FedAvg, aggregating at memory speed (same arguments, same results)."""


class FedProx(_FastAggregation, FlowerFedProx):
    """Flower's FedProx, aggregating at memory speed (same arguments, same results)."""
