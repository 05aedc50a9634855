"""FedAvg's weighted average at memory speed, with Flower's results.

Flower's ``aggregate_arrayrecords`` deserialises every client's array (a copy), multiplies it
by its weight (a second full-size temporary) and adds it into the running sum: for K clients of
N float32 values it moves about 5 x K x N x 4 bytes through memory. Here each client's array is
a zero-copy view on the ``.npy`` bytes Flower received, and the sum is built block by block in
a cache-sized buffer (blocks shared out over the cores, numpy releasing the GIL), so each
client's values are read from memory once and the result written once. The arithmetic is
Flower's, in Flower's order (``a0*w0``, then ``+= ai*wi`` in client order, in the array's own
precision), so the results are the same to the last bit for float arrays. ``FedAvg`` /
``FedProx`` are Flower's strategies with this aggregation.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import FedProx as FlowerFedProx

BLOCK_BYTES = 256 * 1024  # one block of the sum and one of a product stay in L2 cache
MAX_THREADS = 8
NUMPY_STYPE = "numpy.ndarray"


def array_view(array: Array) -> npt.NDArray[Any]:
    """A read-only numpy view on an Array's bytes without copying (Flower's ``.numpy()``
    copies); falls back to ``.numpy()`` for anything but a plain ``.npy`` payload."""
    data = array.data
    if array.stype != NUMPY_STYPE or not isinstance(data, bytes):
        return array.numpy()
    header = io.BytesIO(data[:4096])
    try:
        version = np.lib.format.read_magic(header)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(header)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(header)
    except ValueError:
        return array.numpy()
    if fortran or dtype.hasobject:
        return array.numpy()
    count = int(np.prod(shape, dtype=np.int64))
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=header.tell())
    return flat.reshape(shape)


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
    """``arrays[0]*factors[0] + arrays[1]*factors[1] + ...`` evaluated as Flower does (same
    dtypes, same order), blockwise so every input is read once; into the flat ``out`` if
    given (blockwise path only)."""
    first = arrays[0]
    out_dtype = result_dtype(arrays, factors)
    if not blockwise(arrays, factors):
        total = first * factors[0]
        for array, factor in zip(arrays[1:], factors[1:], strict=True):
            total += array * factor
        return total
    flats = [a.reshape(-1) for a in arrays]
    out = np.empty(first.size, dtype=out_dtype) if out is None else out
    block = max(1, BLOCK_BYTES // out_dtype.itemsize)
    blocks = range(0, first.size, block)
    workers = min(_threads(), len(blocks))

    def part(first_block: int) -> None:
        # numpy releases the GIL in these ufuncs: the threads' blocks run in parallel.
        scratch = np.empty(block, dtype=out_dtype)
        for start in blocks[first_block::workers]:
            stop = min(start + block, first.size)
            acc, tmp = out[start:stop], scratch[: stop - start]
            np.multiply(flats[0][start:stop], factors[0], out=acc)
            for flat, factor in zip(flats[1:], factors[1:], strict=True):
                np.multiply(flat[start:stop], factor, out=tmp)
                np.add(acc, tmp, out=acc)

    if workers <= 1:
        part(0)
    else:
        list(_pool().map(part, range(workers)))
    return out.reshape(first.shape)


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
    """The weighted sum as a Flower Array. The blockwise path writes straight into the
    ``.npy`` bytes (the header ``np.save`` writes, then the values): one copy at the end
    instead of ``np.save``'s three."""
    if not blockwise(views, factors):
        return Array(np.asarray(weighted_sum(views, factors)))
    dtype = result_dtype(views, factors)
    shape = views[0].shape
    header = io.BytesIO()
    fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(header, fields)
    head = header.getvalue()
    buf = bytearray(len(head) + views[0].size * dtype.itemsize)
    buf[: len(head)] = head
    weighted_sum(views, factors, np.frombuffer(buf, dtype=dtype, offset=len(head)))
    return Array(dtype=str(dtype), shape=tuple(shape), stype=NUMPY_STYPE, data=bytes(buf))


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
