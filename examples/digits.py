"""An MLP classifier on scikit-learn's handwritten digits (1,797 images of 8x8 pixels, 10 classes),
trained with Adam on mini-batches; each step -- picking the batch's rows by integer indexing,
forward, cross-entropy, backward and the Adam update -- is one compiled call.

    pip install '.[examples]'             # scikit-learn, which ships the digits data set
    PYTHONPATH=. python examples/digits.py
"""
from __future__ import annotations

import argparse
import time

import tracer as tr
import tracer.nn.functional as F
from tracer import nn


def load(seed: int = 0):
    """The digits scaled to [0, 1], split 75% / 25% into training and test sets (stratified)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0, digits.target, test_size=0.25, random_state=seed,
        stratify=digits.target)
    return ((tr.tensor(x_train, dtype=tr.float32), tr.tensor(y_train)),
            (tr.tensor(x_test, dtype=tr.float32), tr.tensor(y_test)))


class MLP(nn.Module):
    def __init__(self, features: int = 64, hidden: int = 128, classes: int = 10,
                 dropout: float = 0.1):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout),
                                    nn.Linear(hidden, classes))

    def forward(self, x):
        return self.layers(x)


def make_step(model: MLP, optimizer, x, y):
    """The training step on the rows `rows` of (x, y): the data are read from the closure, so they
    are runtime inputs of the compiled step, as the parameters and Adam's state are."""
    @tr.trace
    def step(rows):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[rows]), y[rows])
        loss.backward()
        optimizer.step()
        return loss
    return step


def batches(count: int, batch_size: int):
    """A new random order of `count` rows, cut into full batches of row indices (the last few rows
    of the order wait for the next epoch, so that every batch has the same shape: one signature)."""
    order = tr.randperm(count)
    return [order[start:start + batch_size]
            for start in range(0, count - batch_size + 1, batch_size)]


def accuracy(model: MLP, x, y) -> float:
    model.eval()
    with tr.no_grad():
        correct = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return correct


def train(model: MLP, train_set, epochs: int, batch_size: int = 64, lr: float = 1e-3,
          report=None) -> list[float]:
    """Adam over `epochs` passes of shuffled mini-batches; the loss of every step."""
    x, y = train_set
    step = make_step(model, tr.optim.Adam(model.parameters(), lr=lr), x, y)
    losses = []
    for epoch in range(1, epochs + 1):
        losses += [step(rows).item() for rows in batches(x.shape[0], batch_size)]
        if report is not None:
            report(epoch, losses[-1])
    return losses


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=2e-3, help="Adam's learning rate")
    options = parser.parse_args(argv)
    train_set, test_set = load()
    tr.manual_seed(0)
    model = MLP()
    started = time.perf_counter()
    train(model, train_set, options.epochs, lr=options.lr, report=lambda epoch, loss: print(
        f"epoch {epoch:3}: loss {loss:.4f}") if epoch % 5 == 0 or epoch == 1 else None)
    seconds = time.perf_counter() - started
    result = accuracy(model, *test_set)
    print(f"{options.epochs} epochs in {seconds:.1f} s (the first step compiles); "
          f"training accuracy {accuracy(model, *train_set):.1%}, test accuracy {result:.1%} "
          f"({test_set[1].shape[0]} images)")
    return result


if __name__ == "__main__":
    main()
