"""Make the pretrained starting model: ``python -m cnn_app.pretrain --out base.pth``.

Pretrains the CNN centrally on a public slice of scikit-learn's bundled digits (nothing is
downloaded) and saves its state_dict with ``torch.save``: the kind of file a FederatedLearning
names in ``spec.server.initModel``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from .task import DigitsCNN, train

PUBLIC_SAMPLES = 200  # the first digits, standing in for a public pretraining set


def pretrain(out: Path, epochs: int = 3, seed: int = 0) -> Path:
    """Write a pretrained state_dict to ``out``; return the path."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (np.asarray(digits.data[:PUBLIC_SAMPLES], dtype=np.float32) / 16.0).astype(np.float32)
    y = np.asarray(digits.target[:PUBLIC_SAMPLES], dtype=np.int64)
    torch.manual_seed(seed)
    model = DigitsCNN()
    train(model, x, y, epochs=epochs, lr=0.02, batch_size=32, seed=seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m cnn_app.pretrain", description=__doc__)
    p.add_argument("--out", type=Path, required=True, help="where to write the .pth")
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    print(pretrain(a.out, a.epochs))


if __name__ == "__main__":
    main()
