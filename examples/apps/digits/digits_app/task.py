"""The model, the data and the local training of the digits app (plain torch and numpy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

FEATURES, CLASSES = 64, 10


def build_model(seed: int = 0) -> nn.Module:
    """A 64 -> 64 -> 10 MLP with deterministic initial weights."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def load_data(directory: Path) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """``data.npz`` of a data directory: x float32 [n, 64], y int64 [n]."""
    with np.load(directory / "data.npz", allow_pickle=False) as data:
        return data["x"].astype(np.float32), data["y"].astype(np.int64)


@dataclass(frozen=True)
class Scores:
    """Loss and accuracy over some samples."""

    loss: float
    accuracy: float
    samples: int


def train(
    model: nn.Module,
    x: npt.NDArray[np.float32],
    y: npt.NDArray[np.int64],
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    proximal_mu: float = 0.0,
    seed: int = 0,
) -> Scores:
    """SGD in place; ``proximal_mu`` > 0 adds FedProx's mu/2 ||w - w_global||^2."""
    generator = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    anchor = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    loss_sum, correct = 0.0, 0
    for _ in range(max(1, epochs)):
        loss_sum, correct = 0.0, 0
        order = torch.randperm(len(xt), generator=generator)
        for start in range(0, len(xt), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad()
            logits = model(xt[idx])
            loss = nn.functional.cross_entropy(logits, yt[idx])
            if proximal_mu > 0:
                prox = sum(
                    ((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor, strict=True)
                )
                loss = loss + proximal_mu / 2 * prox
            torch.autograd.backward(loss)
            optimizer.step()
            loss_sum += float(loss.item()) * len(idx)
            correct += int((logits.argmax(1) == yt[idx]).sum().item())
    return Scores(loss_sum / len(x), correct / len(x), len(x))


def evaluate(model: nn.Module, x: npt.NDArray[np.float32], y: npt.NDArray[np.int64]) -> Scores:
    """Cross-entropy loss and accuracy."""
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
        yt = torch.from_numpy(y)
        loss = float(nn.functional.cross_entropy(logits, yt).item())
        accuracy = float((logits.argmax(1) == yt).float().mean().item())
    return Scores(loss, accuracy, len(x))


def setting(run_config: Mapping[str, Any], node_config: Mapping[str, Any], key: str) -> float:
    """A numeric training setting: this cluster's value (node config) wins over the run
    config."""
    return number(node_config.get(key, run_config[key]))


def number(value: object) -> float:
    """A run/node config or message config value that must be a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)
