"""The CNN, its data (8x8 digit images from data.npz) and local training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

CLASSES = 10


class DigitsCNN(nn.Module):
    """conv 1->32 -> conv 32->64 -> dense 4096->256 -> 10: 1,070,218 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU()
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for images [n, 1, 8, 8] (or flat pixels [n, 64])."""
        logits: torch.Tensor = self.head(self.features(x.reshape(-1, 1, 8, 8)))
        return logits


def load_data(directory: Path) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """``data.npz`` of a data directory: x float32 [n, 64] (pixels 0..1), y int64 [n]."""
    with np.load(directory / "data.npz", allow_pickle=False) as data:
        return data["x"].astype(np.float32), data["y"].astype(np.int64)


def train(
    model: nn.Module,
    x: npt.NDArray[np.float32],
    y: npt.NDArray[np.int64],
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int = 0,
) -> tuple[float, float]:
    """SGD in place; (loss, accuracy) over the last epoch."""
    generator = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
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
            torch.autograd.backward(loss)
            optimizer.step()
            loss_sum += float(loss.item()) * len(idx)
            correct += int((logits.argmax(1) == yt[idx]).sum().item())
    return loss_sum / len(x), correct / len(x)


def evaluate(
    model: nn.Module, x: npt.NDArray[np.float32], y: npt.NDArray[np.int64]
) -> tuple[float, float]:
    """(cross-entropy loss, accuracy)."""
    model.eval()
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
