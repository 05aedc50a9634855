"""FedAvg's weighted average at memory speed, with Flower's results.

Flower's ``aggregate_arrayrecords`` deserialises every client's array (a copy), multiplies it
by its weight (a second full-size temporary) and adds it into the running sum: for K clients of
N float32 values it moves about 5 x K x N x 4 bytes through memory. Here each client's array is
a zero-copy view on the ``.npy`` bytes Flower received, and the sum is built block by block in
a cache-sized buffer, so each client's values are read from memory once and the result written
once. The arithmetic is Flower's, in Flower's order (``a0*w0``, then ``+= ai*wi`` in client
order, in the array's own precision), so the results are the same to the last bit for float
arrays. ``FedAvg`` / ``FedProx`` are Flower's strategies with this aggregation.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import FedProx as FlowerFedProx

BLOCK_BYTES = 256 * 1024  # one block of the sum and one of a product stay in L2 cache
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


def weighted_sum(arrays: Sequence[npt.NDArray[Any]], factors: Sequence[float]) -> npt.NDArray[Any]:
    """``arrays[0]*factors[0] + arrays[1]*factors[1] + ...`` evaluated as Flower does (same
    dtypes, same order), blockwise so every input is read once."""
    first = arrays[0]
    out_dtype = (first.ravel()[:1] * factors[0]).dtype
    if not np.issubdtype(out_dtype, np.floating) or first.size * out_dtype.itemsize < BLOCK_BYTES:
        total = first * factors[0]
        for array, factor in zip(arrays[1:], factors[1:], strict=True):
            total += array * factor
        return total
    flats = [a.reshape(-1) for a in arrays]
    out = np.empty(first.size, dtype=out_dtype)
    block = max(1, BLOCK_BYTES // out_dtype.itemsize)
    scratch = np.empty(block, dtype=out_dtype)
    for start in range(0, first.size, block):
        stop = min(start + block, first.size)
        acc, tmp = out[start:stop], scratch[: stop - start]
        np.multiply(flats[0][start:stop], factors[0], out=acc)
        for flat, factor in zip(flats[1:], factors[1:], strict=True):
            np.multiply(flat[start:stop], factor, out=tmp)
            np.add(acc, tmp, out=acc)
    return out.reshape(first.shape)


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
    return ArrayRecord(
        {key: Array(np.asarray(weighted_sum(views, key_factors[key])))
         for key, views in per_key.items()}
    )  # fmt: skip


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
