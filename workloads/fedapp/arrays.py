"""Conversions between torch models, named numpy arrays and Flower ArrayRecords."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from flwr.app import Array, ArrayRecord


def named_to_array_record(arrays: Mapping[str, npt.NDArray[Any]]) -> ArrayRecord:
    """Named numpy arrays as an ArrayRecord (order kept)."""
    return ArrayRecord({k: Array.from_numpy_ndarray(np.asarray(v)) for k, v in arrays.items()})


def from_array_record(record: ArrayRecord) -> dict[str, npt.NDArray[Any]]:
    """An ArrayRecord as named numpy arrays (order kept)."""
    return {k: v.numpy() for k, v in record.items()}
