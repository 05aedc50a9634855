"""Task "breast-cancer": scikit-learn's bundled Wisconsin breast cancer table (569 x 30, 2 classes).

Nothing is downloaded. Features are standardised with the whole table's mean and standard
deviation when the data is prepared (a demo data-preparation step, not a federated one).
"""

from __future__ import annotations

import numpy as np

from workloads.tasks.common import FloatArray, IntArray, Task

NUM_FEATURES = 30
NUM_CLASSES = 2


def load_dataset() -> tuple[FloatArray, IntArray]:
    """The whole table, standardised per feature."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    raw = np.asarray(bunch.data, dtype=np.float64)
    std = raw.std(axis=0)
    std[std == 0] = 1.0
    x = ((raw - raw.mean(axis=0)) / std).astype(np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    return x, y


TASK = Task(
    name="breast-cancer",
    num_features=NUM_FEATURES,
    num_classes=NUM_CLASSES,
    load_dataset=load_dataset,
)

__all__ = ["TASK", "load_dataset"]
