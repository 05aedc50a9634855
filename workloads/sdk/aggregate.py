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
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
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
    dtype = result_dtype(views, factors)
    shape = views[0].shape
    header = io.BytesIO()
    fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(header, fields)
    head = header.getvalue()
    data, buf = _new_bytes(len(head) + views[0].size * dtype.itemsize)
    buf[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    weighted_sum(views, factors, buf[len(head) :].view(dtype))
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


class _FastAggregation(FlowerFedAvg):
    """Flower's FedAvg ``aggregate_train`` with the array average above."""

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the replies' ArrayRecords and MetricRecords (as Flower's FedAvg)."""
        valid, _ = self._check_and_log_replies(replies, is_train=True)
        if not valid:
            return None, None
        contents = [msg.content for msg in valid]
        arrays = aggregate_arrayrecords(contents, self.weighted_by_key)
        return arrays, self.train_metrics_aggr_fn(contents, self.weighted_by_key)


class FedAvg(_FastAggregation):
    """Flower's FedAvg, aggregating at memory speed (same arguments, same results)."""


class FedProx(_FastAggregation, FlowerFedProx):
    """Flower's FedProx, aggregating at memory speed (same arguments, same results)."""
