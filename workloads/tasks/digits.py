"""Task "digits": scikit-learn's bundled 8x8 handwritten digits (1797 samples, 10 classes).

Nothing is downloaded: ``load_digits`` ships with scikit-learn. Pixels (0..16) are scaled to
0..1; the model is a small MLP 64 -> 64 -> 10.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from workloads.data import load_partition
from workloads.tasks.common import FloatArray, IntArray, Task, evaluate, train

NUM_FEATURES = 64
NUM_CLASSES = 10


def build_model() -> nn.Module:
    """A 64 -> 64 -> 10 MLP."""
    return nn.Sequential(nn.Linear(NUM_FEATURES, 64), nn.ReLU(), nn.Linear(64, NUM_CLASSES))


def load_dataset() -> tuple[FloatArray, IntArray]:
    """The whole digits data set, features scaled to 0..1."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.data, dtype=np.float32) / 16.0).astype(np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    return x, y


TASK = Task(
    name="digits",
    num_features=NUM_FEATURES,
    num_classes=NUM_CLASSES,
    build_model=build_model,
    load_dataset=load_dataset,
)

__all__ = ["TASK", "build_model", "evaluate", "load_dataset", "load_partition", "train"]
