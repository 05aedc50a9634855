"""What a demo data set is: its shape and where its full table comes from (no model here:
models belong to the apps, see examples/apps)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Task:
    """A classification data set that `python -m workloads.data partition` can split."""

    name: str
    num_features: int
    num_classes: int
    load_dataset: Callable[[], tuple[FloatArray, IntArray]]
