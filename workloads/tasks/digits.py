"""Task "digits": scikit-learn's bundled 8x8 handwritten digits (1797 samples, 10 classes).

Nothing is downloaded: ``load_digits`` ships with scikit-learn. Pixels (0..16) are scaled to
0..1; the apps in examples/apps bring their own models.
"""

from __future__ import annotations

import numpy as np

from workloads.tasks.common import FloatArray, IntArray, Task

NUM_FEATURES = 64
NUM_CLASSES = 10


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
    load_dataset=load_dataset,
)

__all__ = ["TASK", "load_dataset"]
