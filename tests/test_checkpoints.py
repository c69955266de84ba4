"""Checkpoints (issue 18, issue 14 part 4): tensors, parameters, state_dicts, modules and
optimizers pickle after training (nothing of the tape); tr.save / tr.load with weights_only's
allowlist; load_state_dict from torch tensors and numpy arrays; and resuming from a checkpoint
gives the very next step that not stopping gives, eagerly and traced."""
import copy
import io
import pickle

import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn
from tracer.nn import functional as F

rng = np.random.default_rng(14)
X = rng.standard_normal((12, 5)).astype(np.float32)
LABELS = rng.integers(0, 3, 12)


def _model_and_optimizer(seed=0):
    tr.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    return model, tr.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)


def _step(model, optimizer, x, labels):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), labels)
    loss.backward()
    optimizer.step()
    return loss


def _trained(steps=3):
    model, optimizer = _model_and_optimizer()
    for _ in range(steps):
        _step(model, optimizer, tr.tensor(X), tr.tensor(LABELS))
    return model, optimizer


def _values(model):
    return [p.detach().numpy().copy() for p in model.parameters()]


def test_a_tensor_pickles_as_its_values_dtype_shape_and_requires_grad():
    for value in (tr.tensor(2.5), tr.tensor([[1, 2], [3, 4]]), tr.tensor([True, False]),
                  tr.tensor(X, dtype=tr.float64, requires_grad=True),
                  tr.from_numpy(np.arange(6.0).reshape(2, 3).T)):  # not C-contiguous
        copy_ = pickle.loads(pickle.dumps(value))
        assert type(copy_) is tr.Tensor and copy_.dtype == value.dtype
        assert copy_.shape == value.shape and copy_.requires_grad == value.requires_grad
        np.testing.assert_array_equal(copy_.detach().numpy(), value.detach().numpy())
        assert copy_.is_leaf and copy_.grad is None
    # a non-leaf pickles as a leaf that requires grad, as PyTorch's does
    x = tr.tensor([1.0, 2.0], requires_grad=True)
    loaded = pickle.loads(pickle.dumps(x * 3))
    expected = pickle.loads(pickle.dumps(torch.tensor([1.0, 2.0], requires_grad=True) * 3))
    assert loaded.requires_grad == expected.requires_grad and loaded.is_leaf == expected.is_leaf
    assert loaded.tolist() == expected.tolist()


def test_after_an_eager_training_step_everything_pickles_without_the_tape():
    model, optimizer = _trained()
    assert next(model.parameters()).grad is not None
    state = pickle.loads(pickle.dumps(model.state_dict()))
    assert list(state) == list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for loaded, parameter in zip(state.values(), model.parameters()):
        np.testing.assert_array_equal(loaded.numpy(), parameter.detach().numpy())
    # a Parameter stays a Parameter; .grad is not saved (as in PyTorch)
    weight = pickle.loads(pickle.dumps(model[0].weight))
    assert isinstance(weight, nn.Parameter) and weight.requires_grad and weight.grad is None
    assert isinstance(pickle.loads(pickle.dumps(torch.nn.Parameter(torch.ones(1)))),
                      torch.nn.Parameter)
    # a whole module and optimizer, together: the optimizer's state stays keyed by the model's
    # own (unpickled) parameters
    model2, optimizer2 = pickle.loads(pickle.dumps((model, optimizer)))
    assert optimizer2.param_groups[0]["params"][0] is model2[0].weight
    assert set(map(id, optimizer2.state)) == set(map(id, model2.parameters()))
    np.testing.assert_array_equal(optimizer2.state[model2[0].weight]["exp_avg"].numpy(),
                                  optimizer.state[model[0].weight]["exp_avg"].numpy())
    np.testing.assert_array_equal(_values(copy.deepcopy(model))[0], _values(model)[0])


def test_pickling_a_traced_tensor_is_refused_and_a_stale_view_copy_too():
    @tr.trace
    def f(x):
        pickle.dumps(x * 2)
        return x

    with pytest.raises(tr.TracingError, match="cannot be pickled"):
        f(tr.ones(2))
    x = tr.ones(2, 3)
    row = x[0]
    x.add_(1)
    with pytest.raises(tr.InplaceError):
        pickle.dumps(row)


@pytest.mark.parametrize("target", ["path", "file"])
def test_save_and_load_a_checkpoint(tmp_path, target):
    model, optimizer = _trained()
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3,
                  "dtype": tr.float32, "device": tr.device("cpu"), "note": {1.5, 2j}}
    if target == "path":
        tr.save(checkpoint, tmp_path / "checkpoint.pt")
        loaded = tr.load(str(tmp_path / "checkpoint.pt"), map_location="cpu")
    else:
        buffer = io.BytesIO()
        tr.save(checkpoint, buffer)
        buffer.seek(0)
        loaded = tr.load(buffer, weights_only=True)
    assert loaded["epoch"] == 3 and loaded["dtype"] == tr.float32 and loaded["note"] == {1.5, 2j}
    assert loaded["device"] == tr.device("cpu")
    assert loaded["optimizer"]["param_groups"] == optimizer.state_dict()["param_groups"]
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(loaded["model"][name].numpy(), value.numpy())


class _Payload:
    def __reduce__(self):
        return (print, ("this must not run",))


def test_weights_only_refuses_every_class_and_function_outside_its_allowlist(capsys):
    for obj in (_Payload(), _trained()[0], np.ones(2)):
        buffer = io.BytesIO()
        tr.save(obj, buffer)
        buffer.seek(0)
        with pytest.raises(tr.serialization.WeightsOnlyError, match="weights_only=False"):
            tr.load(buffer)
        buffer.seek(0)
        with pytest.raises(pickle.UnpicklingError):  # as PyTorch's error class
            tr.load(buffer, weights_only=True)
    assert capsys.readouterr().out == ""
    buffer = io.BytesIO()
    tr.save(_trained()[0], buffer)
    buffer.seek(0)
    assert isinstance(tr.load(buffer, weights_only=False), nn.Sequential)


def test_add_safe_globals_allows_a_class():
    buffer = io.BytesIO()
    tr.save({"point": _Point(1, 2)}, buffer)
    buffer.seek(0)
    with pytest.raises(tr.serialization.WeightsOnlyError, match="_Point"):
        tr.load(buffer)
    tr.serialization.add_safe_globals([_Point])
    buffer.seek(0)
    assert tr.load(buffer)["point"] == _Point(1, 2)
    assert _Point in tr.serialization.get_safe_globals()


class _Point(tuple):
    def __new__(cls, x, y):
        return super().__new__(cls, (x, y))

    def __reduce__(self):
        return (_Point, tuple(self))


def test_a_torch_checkpoint_file_is_named_as_one(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "torch.pt")
    with pytest.raises(tr.TracerError, match="torch.load"):
        tr.load(tmp_path / "torch.pt")
    with pytest.raises(tr.ArgumentError, match="CPU"):
        tr.load(tmp_path / "torch.pt", map_location="cuda")


def test_load_state_dict_takes_torch_tensors_and_numpy_arrays():
    reference = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model, _ = _model_and_optimizer()
    model.load_state_dict(reference.state_dict())
    expected = reference(torch.tensor(X)).detach().numpy()
    np.testing.assert_allclose(model(tr.tensor(X)).detach().numpy(), expected, rtol=1e-5,
                               atol=1e-6)
    model2, _ = _model_and_optimizer(seed=1)
    model2.load_state_dict({k: v.numpy() for k, v in reference.state_dict().items()})
    np.testing.assert_array_equal(_values(model2)[2], reference[2].weight.detach().numpy())
    model2.load_state_dict(dict(reference.named_parameters()))  # parameters that require grad
    # refused as a whole: nothing changed by a load that fails on its last entry
    before = _values(model2)
    bad = dict(reference.state_dict(), **{"2.bias": np.zeros(4)})
    with pytest.raises(tr.ShapeMismatchError, match="2.bias has shape \\[4\\]"):
        model2.load_state_dict(bad)
    for old, new in zip(before, _values(model2)):
        np.testing.assert_array_equal(old, new)


def test_an_optimizer_loads_pytorchs_state_dict_and_takes_the_same_next_step():
    reference = torch.nn.Linear(5, 3)
    torch_optimizer = torch.optim.AdamW(reference.parameters(), lr=0.01)
    for _ in range(2):
        torch_optimizer.zero_grad()
        (reference(torch.tensor(X)) ** 2).sum().backward()
        torch_optimizer.step()
    model = nn.Linear(5, 3)
    optimizer = tr.optim.AdamW(model.parameters(), lr=0.5)
    model.load_state_dict(reference.state_dict())
    optimizer.load_state_dict(torch_optimizer.state_dict())
    assert optimizer.param_groups[0]["lr"] == 0.01
    torch_optimizer.zero_grad()
    (reference(torch.tensor(X)) ** 2).sum().backward()
    torch_optimizer.step()
    optimizer.zero_grad()
    (model(tr.tensor(X)) ** 2).sum().backward()
    optimizer.step()
    np.testing.assert_allclose(model.weight.detach().numpy(), reference.weight.detach().numpy(),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_resuming_from_a_checkpoint_gives_the_step_that_not_stopping_gives(traced, tmp_path):
    x, labels = tr.tensor(X), tr.tensor(LABELS)

    def stepper(model, optimizer):
        if not traced:
            return lambda: _step(model, optimizer, x, labels)
        step = tr.trace(lambda x, labels: _step(model, optimizer, x, labels))
        return lambda: step(x, labels)

    model, optimizer = _model_and_optimizer()
    run = stepper(model, optimizer)
    for _ in range(3):
        run()
    tr.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
            tmp_path / "checkpoint.pt")
    expected_loss = run().item()
    expected = _values(model)

    resumed, resumed_optimizer = _model_and_optimizer(seed=5)  # other initial values
    checkpoint = tr.load(tmp_path / "checkpoint.pt")
    resumed.load_state_dict(checkpoint["model"])
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    assert resumed_optimizer.state[resumed[0].weight]["step"].item() == 3
    loss = stepper(resumed, resumed_optimizer)().item()
    assert loss == expected_loss
    for mine, reference in zip(_values(resumed), expected):
        np.testing.assert_array_equal(mine, reference)
