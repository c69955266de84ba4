"""examples/classifier.py, the tutorial after the seeds: its training run, eager and traced,
against the same model and Adam in PyTorch from the same initial weights."""
import os
import sys

import numpy as np
import torch

import tracer as tr

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

import classifier  # noqa: E402


def torch_losses(model, x, labels, steps):
    reference = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Dropout(0.0),
                                    torch.nn.Linear(16, 16), torch.nn.GELU(),
                                    torch.nn.Linear(16, 3))
    reference.load_state_dict({name.removeprefix("layers."): torch.tensor(value.numpy())
                               for name, value in model.state_dict().items()})
    optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    inputs, targets = torch.tensor(x.numpy()), torch.tensor(labels.numpy())
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(reference(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_classifier_trains_as_torch_does_eager_and_traced():
    x, labels = classifier.blobs(96, 3)
    for traced in (False, True):
        tr.manual_seed(1)
        model = classifier.Classifier(2, 16, 3, dropout=0.0)
        expected = torch_losses(model, x, labels, steps=6)
        losses = classifier.train(model, x, labels, steps=6, traced=traced)
        np.testing.assert_allclose(losses, expected, rtol=2e-5)
        assert 0.0 <= classifier.accuracy(model, x, labels) <= 1.0


def test_classifier_with_dropout_is_the_same_eager_and_traced():
    x, labels = classifier.blobs(96, 3)
    runs = []
    for traced in (False, True):
        tr.manual_seed(2)
        model = classifier.Classifier(2, 16, 3, dropout=0.3)
        runs.append(classifier.train(model, x, labels, steps=4, traced=traced))
    # the same masks (the generator's numbers are exact); float32 sums round differently
    np.testing.assert_allclose(runs[0], runs[1], rtol=2e-6)
