"""examples/digits.py: an MLP on scikit-learn's digits reaches 95% test accuracy, and its first
compiled steps equal the same MLP and Adam in PyTorch from the same weights on the same batches.
Needs scikit-learn (the `examples` extra), which `make test` does not install."""
import numpy as np
import pytest
import torch

import tracer as tr

pytest.importorskip("sklearn", reason="scikit-learn is not installed (the digits data set ships "
                                      "with it): pip install '.[examples]'")

import digits  # noqa: E402


def test_mlp_reaches_95_percent_test_accuracy(capsys):
    assert digits.main([]) >= 0.95  # 20 epochs: 97.3%
    assert "test accuracy" in capsys.readouterr().out


def test_steps_equal_torch():
    (x, y), _ = digits.load()
    tr.manual_seed(1)
    model = digits.MLP(dropout=0.0)
    reference = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Dropout(0.0), torch.nn.Linear(128, 10))
    reference.load_state_dict({name.removeprefix("layers."): torch.tensor(value.numpy())
                               for name, value in model.state_dict().items()})
    optimizer = torch.optim.Adam(reference.parameters(), lr=1e-3)
    step = digits.make_step(model, tr.optim.Adam(model.parameters(), lr=1e-3), x, y)
    inputs, labels = torch.tensor(x.numpy()), torch.tensor(y.numpy())
    tr.manual_seed(2)
    for rows in digits.batches(x.shape[0], 64)[:6]:
        index = torch.tensor(rows.numpy())
        optimizer.zero_grad()
        expected = torch.nn.functional.cross_entropy(reference(inputs[index]), labels[index])
        expected.backward()
        optimizer.step()
        np.testing.assert_allclose(step(rows).item(), expected.item(), rtol=1e-5)
    for name, parameter in model.named_parameters():
        np.testing.assert_allclose(parameter.detach().numpy(),
                                   reference.state_dict()[name.removeprefix("layers.")].numpy(),
                                   rtol=1e-4, atol=1e-6, err_msg=name)
