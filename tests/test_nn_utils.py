"""tr.nn.utils: gradient clipping against torch.nn.utils (eagerly and inside a traced training
step) and safetensors files exchanged with PyTorch's safetensors.torch."""
import numpy as np
import pytest
import torch
from safetensors.torch import load_file as torch_load_file
from safetensors.torch import save_file as torch_save_file

import tracer as tr
from tracer import nn
from tracer.nn import functional as F

rng = np.random.default_rng(21)
X = rng.standard_normal((9, 5))
LABELS = rng.integers(0, 3, 9)


def _pair(dtype=np.float64, seed=0):
    torch.manual_seed(seed)
    reference = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    reference = reference.to(getattr(torch, np.dtype(dtype).name))
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).to(np.dtype(dtype).name)
    model.load_state_dict(reference.state_dict())
    return model, reference


def _backward(model, reference, dtype, scale=1.0):
    x = X.astype(dtype) * scale
    F.cross_entropy(model(tr.tensor(x)), tr.tensor(LABELS)).backward()
    torch.nn.functional.cross_entropy(reference(torch.tensor(x)), torch.tensor(LABELS)).backward()


def _assert_grads_match(model, reference, dtype):
    tolerance = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-5,
                                                                                atol=1e-6)
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), **tolerance)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm_type", [2.0, 1, float("inf"), 3.0])
@pytest.mark.parametrize("max_norm", [0.05, 100.0])
def test_clip_grad_norm_is_pytorchs(norm_type, max_norm, dtype):
    model, reference = _pair(dtype)
    _backward(model, reference, dtype, scale=4.0)
    total = nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type=norm_type)
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm,
                                              norm_type=norm_type)
    assert total.dtype == expected.numpy().dtype and total.shape == ()
    np.testing.assert_allclose(total.item(), expected.item(), rtol=1e-5 if dtype == np.float32
                               else 1e-12)
    _assert_grads_match(model, reference, dtype)


def test_clip_grad_value_and_a_single_tensor_and_no_gradients():
    model, reference = _pair()
    _backward(model, reference, np.float64, scale=4.0)
    nn.utils.clip_grad_value_(model.parameters(), 0.01)
    torch.nn.utils.clip_grad_value_(reference.parameters(), 0.01)
    _assert_grads_match(model, reference, np.float64)
    norm = nn.utils.clip_grad_norm_(model[0].weight, 1e-3)  # one tensor, not an iterable
    expected = torch.nn.utils.clip_grad_norm_(reference[0].weight, 1e-3)
    np.testing.assert_allclose(norm.item(), expected.item(), rtol=1e-12)
    _assert_grads_match(model, reference, np.float64)
    assert nn.utils.clip_grad_norm_(nn.Linear(2, 2).parameters(), 1.0).item() == 0.0


def test_error_if_nonfinite_refuses_before_changing_the_gradients():
    model, _ = _pair()
    model(tr.tensor(X)).sum().backward()
    model[0].bias.grad[0] = float("inf")
    before = model[0].weight.grad.numpy().copy()
    with pytest.raises(nn.utils.NonFiniteNormError, match="non-finite"):
        nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(model[0].weight.grad.numpy(), before)
    # without the check, PyTorch scales by max_norm / (inf + 1e-6) = 0 (and inf * 0 = nan)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert not model[0].weight.grad.numpy().any()


def _clipped_step(model, optimizer, x, labels, functions):
    optimizer.zero_grad()
    loss = functions.nn.functional.cross_entropy(model(x), labels)
    loss.backward()
    norm = functions.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    optimizer.step()
    return loss, norm


def test_clip_grad_norm_inside_a_traced_step_is_the_eager_and_pytorch_step():
    traced_model, reference = _pair()
    eager_model, _ = _pair()
    traced_optimizer = tr.optim.SGD(traced_model.parameters(), lr=0.5, momentum=0.9)
    eager_optimizer = tr.optim.SGD(eager_model.parameters(), lr=0.5, momentum=0.9)
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5, momentum=0.9)
    step = tr.trace(lambda x, labels: _clipped_step(traced_model, traced_optimizer, x, labels, tr))
    x, labels = tr.tensor(X), tr.tensor(LABELS)
    for _ in range(4):
        loss, norm = step(x, labels)
        eager_loss, eager_norm = _clipped_step(eager_model, eager_optimizer, x, labels, tr)
        torch_loss, torch_norm = _clipped_step(reference, torch_optimizer, torch.tensor(X),
                                               torch.tensor(LABELS), torch)
        np.testing.assert_allclose([loss.item(), norm.item()],
                                   [eager_loss.item(), eager_norm.item()], rtol=1e-12)
        np.testing.assert_allclose([loss.item(), norm.item()],
                                   [torch_loss.item(), torch_norm.item()], rtol=1e-10)
    assert norm.item() > 0.1  # the clipping acted on every step
    for mine, theirs in zip(traced_model.parameters(), reference.parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), theirs.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)
    with pytest.raises(tr.TracingError, match="error_if_nonfinite"):
        tr.trace(lambda x: nn.utils.get_total_norm([x], error_if_nonfinite=True))(tr.ones(2))


def test_weights_saved_by_pytorch_as_safetensors_load_and_go_back(tmp_path):
    model, reference = _pair(np.float32, seed=3)
    fresh, _ = _pair(np.float32, seed=4)
    torch_save_file(reference.state_dict(), tmp_path / "torch.safetensors")
    fresh.load_state_dict(nn.utils.load_safetensors(tmp_path / "torch.safetensors"))
    expected = reference(torch.tensor(X, dtype=torch.float32)).detach().numpy()
    np.testing.assert_allclose(fresh(tr.tensor(X, dtype=tr.float32)).detach().numpy(), expected,
                               rtol=1e-5, atol=1e-6)
    nn.utils.save_safetensors(fresh.state_dict(), tmp_path / "tracer.safetensors",
                              metadata={"format": "pt"})
    back = torch_load_file(tmp_path / "tracer.safetensors")
    assert list(back) == list(reference.state_dict()) or set(back) == set(reference.state_dict())
    for name, value in reference.state_dict().items():
        assert back[name].dtype == value.dtype
        torch.testing.assert_close(back[name], value, rtol=0, atol=0)


def test_safetensors_widen_narrow_dtypes_and_name_what_numpy_lacks(tmp_path):
    torch_save_file({"half": torch.tensor([0.5, -2.0], dtype=torch.float16),
                     "int": torch.tensor([3, -4], dtype=torch.int32)}, tmp_path / "narrow.st")
    loaded = nn.utils.load_safetensors(tmp_path / "narrow.st")
    assert loaded["half"].dtype == tr.float32 and loaded["half"].tolist() == [0.5, -2.0]
    assert loaded["int"].dtype == tr.int64 and loaded["int"].tolist() == [3, -4]
    loaded["half"].add_(1)  # a tensor of its own, writable
    torch_save_file({"b": torch.ones(2, dtype=torch.bfloat16)}, tmp_path / "bf16.st")
    with pytest.raises(tr.ArgumentError, match="bf16.st.*float32"):
        nn.utils.load_safetensors(tmp_path / "bf16.st")
