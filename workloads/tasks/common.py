"""Shared torch training and evaluation for small classification tasks on in-memory arrays."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Task:
    """A classification task: how to build its model and where its full data set comes from."""

    name: str
    num_features: int
    num_classes: int
    build_model: Callable[[], nn.Module]
    load_dataset: Callable[[], tuple[FloatArray, IntArray]]


@dataclass(frozen=True)
class FitResult:
    """What one local training pass produced (loss/accuracy measured during the last epoch)."""

    loss: float
    accuracy: float
    samples: int


@dataclass(frozen=True)
class EvalResult:
    """Loss and accuracy of a model on a data set."""

    loss: float
    accuracy: float
    samples: int


def build_model(task: Task, seed: int) -> nn.Module:
    """Build the task's model with deterministic initial weights."""
    torch.manual_seed(seed)
    return task.build_model()


def get_weights(model: nn.Module) -> list[npt.NDArray[np.float32]]:
    """The model's parameters and buffers as numpy arrays, in state_dict order."""
    return [v.detach().cpu().numpy().copy() for v in model.state_dict().values()]


def set_weights(model: nn.Module, weights: Sequence[npt.NDArray[np.generic]]) -> None:
    """Load numpy arrays (state_dict order) into the model."""
    keys = list(model.state_dict().keys())
    if len(keys) != len(weights):
        raise ValueError(f"model has {len(keys)} tensors, got {len(weights)} arrays")
    state = {k: torch.from_numpy(np.asarray(w).copy()) for k, w in zip(keys, weights, strict=True)}
    model.load_state_dict(state, strict=True)


def train(
    model: nn.Module,
    x: FloatArray,
    y: IntArray,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    proximal_mu: float = 0.0,
    seed: int = 0,
) -> FitResult:
    """Train ``model`` in place with SGD; ``proximal_mu`` > 0 adds FedProx's proximal term.

    The proximal term is mu/2 * ||w - w_global||^2 where w_global are the weights the model
    had when training started (the global model the server sent).
    """
    if len(x) == 0:
        raise ValueError("cannot train on an empty partition")
    generator = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    global_params = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    model.train()
    total_loss, correct, seen = 0.0, 0, 0
    for _ in range(max(1, epochs)):
        total_loss, correct, seen = 0.0, 0, 0
        order = torch.randperm(len(xt), generator=generator)
        for start in range(0, len(xt), batch_size):
            idx = order[start : start + batch_size]
            xb, yb = xt[idx], yt[idx]
            optimizer.zero_grad()
            logits = model(xb)
            loss = criterion(logits, yb)
            if proximal_mu > 0.0:
                prox = sum(
                    ((p - g) ** 2).sum()
                    for p, g in zip(model.parameters(), global_params, strict=True)
                )
                loss = loss + (proximal_mu / 2.0) * prox
            loss.backward()
            optimizer.step()
            total_loss += float(loss.item()) * len(idx)
            correct += int((logits.argmax(dim=1) == yb).sum().item())
            seen += len(idx)
    return FitResult(loss=total_loss / seen, accuracy=correct / seen, samples=len(x))


def evaluate(model: nn.Module, x: FloatArray, y: IntArray) -> EvalResult:
    """Cross-entropy loss and accuracy of ``model`` on (x, y)."""
    if len(x) == 0:
        raise ValueError("cannot evaluate on an empty data set")
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
        yt = torch.from_numpy(y)
        loss = float(nn.functional.cross_entropy(logits, yt).item())
        accuracy = float((logits.argmax(dim=1) == yt).float().mean().item())
    return EvalResult(loss=loss, accuracy=accuracy, samples=len(x))
