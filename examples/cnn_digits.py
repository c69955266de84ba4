"""A small CNN on scikit-learn's handwritten digits (8x8 images, 10 classes): two blocks of
Conv-BatchNorm-ReLU-MaxPool, then a Linear layer, trained with AdamW on mini-batches under a
cosine learning-rate schedule; each step -- picking the batch, forward, cross-entropy, backward,
AdamW's update and the batch norms' running statistics -- is one compiled call, and the schedule's
new rate reaches it without compiling again. With --checkpoint it saves the whole training state
after every epoch (model, optimizer, schedule, random generators), and --resume continues from it
with the steps an uninterrupted run would take. Without scikit-learn it trains on synthetic digits
(noisy copies of ten random 8x8 strokes) and says so.

    pip install '.[examples]'             # scikit-learn, which ships the digits data set
    PYTHONPATH=. python examples/cnn_digits.py --checkpoint cnn.pt
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import tracer as tr
import tracer.nn.functional as F
from tracer import nn

# the MLP example's batches, eval-mode accuracy and traced step (rows picked from the closure's data)
from digits import accuracy, batches, make_step


def synthetic_digits(count: int = 1797, seed: int = 0):
    """Images (count, 64) in [0, 16] and labels: ten random smooth 8x8 patterns, each image one
    of them shifted by up to a pixel, with noise (a stand-in with the digits' shapes)."""
    generator = np.random.default_rng(seed)
    strokes = generator.random((10, 10, 10)) ** 3
    templates = (strokes[:, :-2, :-2] + strokes[:, 1:-1, 1:-1] + strokes[:, 2:, 2:]) / 3
    labels = generator.integers(0, 10, count)
    shifts = generator.integers(0, 3, (count, 2))
    padded = np.pad(templates, ((0, 0), (1, 1), (1, 1)))
    images = np.stack([padded[label, dy:dy + 8, dx:dx + 8]
                       for label, (dy, dx) in zip(labels, shifts)])
    images = np.clip(images + 0.15 * generator.standard_normal(images.shape), 0, 1) * 16
    return images.reshape(count, 64), labels


def load(seed: int = 0):
    """(images (N, 1, 8, 8) scaled to [0, 1], labels) for training and test (75% / 25%), and the
    name of the data set: scikit-learn's digits, or synthetic ones without scikit-learn."""
    try:
        from sklearn.datasets import load_digits
        digits = load_digits()
        data, target, name = digits.data, digits.target, "scikit-learn's digits"
    except ImportError:
        (data, target), name = synthetic_digits(), "synthetic digits (no scikit-learn)"
    order = np.random.default_rng(seed).permutation(len(target))
    cut = len(target) * 3 // 4
    images = (data / 16.0).reshape(-1, 1, 8, 8)
    sets = [(tr.tensor(images[rows], dtype=tr.float32), tr.tensor(target[rows]))
            for rows in (order[:cut], order[cut:])]
    return sets[0], sets[1], name


class CNN(nn.Module):
    """(N, in_channels, size, size) images -> class scores; size divisible by 4."""

    def __init__(self, in_channels: int = 1, channels: int = 16, classes: int = 10,
                 size: int = 8):
        super().__init__()
        # (no bias in the convolutions: the batch norm after each would subtract it again)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
            nn.ReLU(), nn.MaxPool2d(2),                                        # 8x8 -> 4x4
            nn.Conv2d(channels, 2 * channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * channels), nn.ReLU(), nn.MaxPool2d(2))           # 4x4 -> 2x2
        self.classifier = nn.Linear(2 * channels * (size // 4) ** 2, classes)

    def forward(self, x):
        return self.classifier(F.flatten(self.features(x), 1))


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW's first learning rate")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--checkpoint", help="save the training state here after every epoch")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--stop-after", type=int, help="stop after this epoch (to resume later)")
    options = parser.parse_args(argv)
    (x, y), test_set, name = load()
    tr.manual_seed(0)
    model = CNN()
    optimizer = tr.optim.AdamW(model.parameters(), lr=options.lr)
    schedule = tr.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=options.epochs)
    first_epoch = 1
    if options.resume:
        saved = tr.load(options.checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        tr.set_rng_state(saved["rng"])  # the same batches as if it had not stopped
        first_epoch = saved["epoch"] + 1
    step = make_step(model, optimizer, x, y)
    started = time.perf_counter()
    last_epoch = options.stop_after or options.epochs
    for epoch in range(first_epoch, last_epoch + 1):
        losses = [step(rows).item() for rows in batches(x.shape[0], options.batch_size)]
        schedule.step()
        print(f"epoch {epoch:3}: loss {np.mean(losses):.4f}")
        if options.checkpoint:
            tr.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "schedule": schedule.state_dict(), "rng": tr.get_rng_state(),
                     "epoch": epoch}, options.checkpoint)
    seconds = time.perf_counter() - started
    result = accuracy(model, *test_set)
    print(f"{name}: epochs {first_epoch} to {last_epoch} in {seconds:.1f} s (the first step "
          f"compiles); test accuracy {result:.1%} ({test_set[1].shape[0]} images)")
    return result

if __name__ == "__main__":
    main()
