"""Logistic regression (one linear layer, softmax over 2 classes) and its local training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from torch import nn


def build_model(features: int) -> nn.Module:
    """A linear layer: features -> 2 logits, zero-initialised (the usual start)."""
    model = nn.Linear(features, 2)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    return model


def load_data(directory: Path) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """``data.npz`` of a data directory: x float32 [n, features], y int64 [n]."""
    with np.load(directory / "data.npz", allow_pickle=False) as data:
        return data["x"].astype(np.float32), data["y"].astype(np.int64)


def fit(
    model: nn.Module,
    x: npt.NDArray[np.float32],
    y: npt.NDArray[np.int64],
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    l2: float,
    seed: int,
) -> tuple[float, float]:
    """Mini-batch gradient descent on the L2-regularised log loss; (loss, accuracy)."""
    generator = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=l2)
    for _ in range(max(1, epochs)):
        order = torch.randperm(len(xt), generator=generator)
        for start in range(0, len(xt), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad()
            torch.autograd.backward(nn.functional.cross_entropy(model(xt[idx]), yt[idx]))
            optimizer.step()
    return score(model, x, y)


def score(
    model: nn.Module, x: npt.NDArray[np.float32], y: npt.NDArray[np.int64]
) -> tuple[float, float]:
    """(log loss, accuracy)."""
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
        yt = torch.from_numpy(y)
        return (
            float(nn.functional.cross_entropy(logits, yt).item()),
            float((logits.argmax(1) == yt).float().mean().item()),
        )


def number(value: object) -> float:
    """A run/node config or message config value that must be a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)
