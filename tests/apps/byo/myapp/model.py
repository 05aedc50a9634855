"""The model and how to score it: plain torch and numpy."""

from pathlib import Path

import numpy as np
import torch
from torch import nn


def make_model() -> nn.Module:
    """Flattened 8x8 images in, 10 digit classes out."""
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def load(directory: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The data.npz in a data directory: x [n, 64] floats, y [n] labels."""
    with np.load(directory / "data.npz") as data:
        return torch.from_numpy(data["x"]).float(), torch.from_numpy(data["y"]).long()


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Share of samples the model gets right."""
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())
