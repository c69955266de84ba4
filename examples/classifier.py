"""The tutorial after the seeds: a classifier written as a Module subclass, trained with Adam on
cross-entropy, eagerly and as one traced step (forward, backward and the Adam update in one
compiled call), then evaluated in eval mode.

    PYTHONPATH=. python examples/classifier.py
"""
import tracer as tr
import tracer.nn.functional as F
from tracer import nn


class Classifier(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int, dropout: float = 0.1):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout),
                                    nn.Linear(hidden, hidden), nn.GELU(),
                                    nn.Linear(hidden, classes))

    def forward(self, x):
        return self.layers(x)


def blobs(count: int, classes: int, seed: int = 0):
    """`count` points in the plane around one center per class, and their labels."""
    tr.manual_seed(seed)
    labels = tr.randint(0, classes, (count,))
    centers = tr.randn(classes, 2) * 3
    points = F.one_hot(labels, classes).float() @ centers + tr.randn(count, 2)
    return points, labels


def train_step(model, optimizer, x, labels):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), labels)
    loss.backward()
    optimizer.step()
    return loss


def train(model, x, labels, steps: int, lr: float = 0.01, traced: bool = False) -> list[float]:
    """Adam steps on the whole batch; the losses. Traced, the same step compiles into one call
    that reads the parameters, Adam's state and dropout's generator state from their objects and
    updates them in place."""
    optimizer = tr.optim.Adam(model.parameters(), lr=lr)
    model.train()
    step = tr.trace(train_step) if traced else train_step
    return [step(model, optimizer, x, labels).item() for _ in range(steps)]


def accuracy(model, x, labels) -> float:
    model.eval()
    with tr.no_grad():
        return (model(x).argmax(1) == labels).float().mean().item()


def main():
    x, labels = blobs(512, 4)
    for traced in (False, True):
        tr.manual_seed(1)
        model = Classifier(2, 64, 4)
        losses = train(model, x, labels, steps=100, traced=traced)
        print(f"{'traced' if traced else 'eager '}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
              f"accuracy {accuracy(model, x, labels):.1%}")


if __name__ == "__main__":
    main()
