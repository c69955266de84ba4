"""Custom Functions that compute in NumPy inside `@tr.trace` run as host callbacks: PyTorch's
"Creating extensions using numpy and scipy" tutorial (examples/numpy_extensions.py) trains the same
eagerly, traced and in PyTorch; the IR shows the node; a callback that changes its result's shape,
or raises, fails the call with the arguments unchanged; second order through it is refused."""
import threading

import numpy as np
import pytest
import torch

import tracer as tr
import numpy_extensions as ext


class TorchBadFFTFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input):
        return input.new(abs(np.fft.rfft2(input.detach().numpy())))

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.new(np.fft.irfft2(grad_output.numpy()))


class TorchScipyConv2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, filter, bias):
        input, filter, bias = input.detach(), filter.detach(), bias.detach()
        result = ext.correlate2d(input.numpy(), filter.numpy(), mode="valid") + bias.numpy()
        ctx.save_for_backward(input, filter, bias)
        return torch.as_tensor(result, dtype=input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        input, filter, bias = ctx.saved_tensors
        grad_output = grad_output.detach().numpy()
        grad_input = ext.convolve2d(grad_output, filter.numpy(), mode="full")
        grad_filter = ext.correlate2d(input.numpy(), grad_output, mode="valid")
        return (torch.from_numpy(grad_input), torch.from_numpy(grad_filter).to(torch.float),
                torch.from_numpy(np.sum(grad_output, keepdims=True)).to(torch.float))


def torch_copy(parameters):
    return [torch.tensor(p.detach().numpy().copy(), requires_grad=True) for p in parameters]


def torch_train(parameters, model, optimizer, batches):
    losses = []
    for image, target in batches:
        optimizer.zero_grad()
        loss = ((model(torch.from_numpy(image.numpy().copy())) -
                 torch.from_numpy(target.numpy().copy())) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_fft_function_trains_as_in_pytorch(traced):
    tr.manual_seed(0)
    model = ext.SpectrumModel(8)
    mask, readout = torch_copy([model.mask, model.readout])
    data = ext.batches(4, 8)
    losses = ext.train(model, tr.optim.Adam(model.parameters(), lr=0.05), data, traced)
    expected = torch_train(
        [mask, readout],
        lambda image: (TorchBadFFTFunction.apply(image * mask.tanh()) + 1).log() @ readout,
        torch.optim.Adam([mask, readout], lr=0.05), data)
    np.testing.assert_allclose(losses, expected, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(model.mask.detach().numpy(), mask.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model.readout.detach().numpy(), readout.detach().numpy(), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_scipy_convolution_trains_as_in_pytorch(traced):
    tr.manual_seed(0)
    conv = ext.ScipyConv2d(3, 3)
    filter, bias = torch_copy([conv.filter, conv.bias])
    data = ext.conv_batches(4, 10)
    losses = ext.train(conv, tr.optim.SGD(conv.parameters(), lr=0.01), data, traced)
    expected = torch_train([filter, bias],
                           lambda image: TorchScipyConv2dFunction.apply(image, filter, bias),
                           torch.optim.SGD([filter, bias], lr=0.01), data)
    np.testing.assert_allclose(losses, expected, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(conv.filter.detach().numpy(), filter.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(conv.bias.detach().numpy(), bias.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_input_gradient_through_the_scipy_function_matches_pytorch():
    tr.manual_seed(3)
    conv = ext.ScipyConv2d(3, 3)
    filter, bias = torch_copy([conv.filter, conv.bias])
    image = np.random.default_rng(3).standard_normal((10, 10)).astype(np.float32)
    seed = np.random.default_rng(4).standard_normal((8, 8)).astype(np.float32)

    @tr.trace
    def input_gradient(image):
        output = conv(image)
        output.backward(tr.from_numpy(seed))
        return image.grad

    torch_image = torch.tensor(image, requires_grad=True)
    TorchScipyConv2dFunction.apply(torch_image, filter, bias).backward(torch.from_numpy(seed))
    got = input_gradient(tr.tensor(image, requires_grad=True))
    np.testing.assert_allclose(got.numpy(), torch_image.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_the_ir_stages_and_the_report_show_the_callback(tmp_path):
    model = ext.SpectrumModel(8)
    optimizer = tr.optim.SGD(model.parameters(), lr=0.1)
    step = tr.trace(ext.training_step)
    image, target = ext.batches(1, 8)[0]
    optimized = step.ir(model, optimizer, image, target, stage="optimized")
    assert "host_callback" in optimized and "@host.BadFFTFunction.forward" in optimized
    assert "@host.BadFFTFunction.backward" in optimized
    loops = step.ir(model, optimizer, image, target, stage="loops")
    assert loops.count("host_callback, range [0, 1)") == 2 and "host_call @host." in loops
    assert "tracer_host_callback" in step.ir(model, optimizer, image, target, stage="llvm")
    step.report(tmp_path / "report.html")
    assert "host_callback" in (tmp_path / "report.html").read_text()


class Resizing(tr.autograd.Function):
    """Its output's length depends on its input's values: 4, or 5 past 1000."""

    @staticmethod
    def forward(ctx, x):
        values = x.detach().numpy()
        return tr.from_numpy(np.resize(values, 5 if np.abs(values).max() > 1000 else 4) * 2)

    @staticmethod
    def backward(ctx, grad):
        return tr.from_numpy(np.resize(grad.numpy() * 2, 4))


class Failing(tr.autograd.Function):
    """Raises in numpy code for an input with a negative sum."""

    @staticmethod
    def forward(ctx, x):
        if x.detach().numpy().sum() < 0:
            raise ValueError("a negative sum")
        return x.new(np.sqrt(x.detach().numpy()))

    @staticmethod
    def backward(ctx, grad):
        return grad


def sgd_step(function):
    @tr.trace
    def step(w, x):
        loss = (function.apply(w * x) ** 2).sum()
        loss.backward()
        with tr.no_grad():
            w -= 0.1 * w.grad
        return loss
    return step


def test_a_callback_that_returns_another_shape_fails_with_the_arguments_unchanged():
    step = sgd_step(Resizing)
    w, x = tr.ones(4, requires_grad=True), tr.tensor([1.0, 2.0, 3.0, 4.0])
    step(w, x)
    # the output's gradient 2 * 2 w x, doubled by the backward, times x
    assert w.grad.tolist() == [8.0, 32.0, 72.0, 128.0]
    step(w, x)  # (compiled again: w has a .grad now)
    w_before, grad_before = w.detach().numpy().copy(), w.grad.numpy().copy()
    with pytest.raises(tr.HostCallbackError, match=r"test_host_callbacks.py:\d+: Resizing.forward "
                       r".*returned shape \[5\] and dtype float32 as output 0, where it returned "
                       r"shape \[4\]"):
        step(w, tr.full((4,), 1e6))
    assert w.detach().numpy().tolist() == w_before.tolist() and w.grad.numpy().tolist() == grad_before.tolist()


def test_an_exception_in_the_callback_is_raised_with_the_arguments_unchanged():
    step = sgd_step(Failing)
    w = tr.ones(3, requires_grad=True)
    step(w, tr.tensor([1.0, 4.0, 9.0]))
    # the output's gradient 2 sqrt(w x), passed through by the backward, times x
    np.testing.assert_allclose(w.detach().numpy(), [0.8, -0.6, -4.4], rtol=1e-6)
    step(w, tr.tensor([1.0, 0.0, 0.0]))  # (compiled again: w has a .grad now)
    w_before, grad_before = w.detach().numpy().copy(), w.grad.numpy().copy()
    with pytest.raises(ValueError, match="a negative sum"):
        step(w, tr.tensor([-1.0, 0.0, 0.0]))
    assert w.detach().numpy().tolist() == w_before.tolist() and w.grad.numpy().tolist() == grad_before.tolist()


class NumpyBackwardSin(tr.autograd.Function):
    """A forward of tensor operations whose backward is numpy: only the backward is a callback,
    given the saved tensor and a tensor kept on ctx."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.scale = x.abs() + 1
        return x.sin() * ctx.scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        x, scale, g = x.numpy(), ctx.scale.numpy(), grad.numpy()
        return tr.from_numpy(g * (np.cos(x) * scale + np.sin(x) * np.sign(x)))


def test_a_numpy_backward_of_a_traced_forward_matches_pytorch():
    values = np.array([-1.5, -0.2, 0.3, 2.0], np.float32)

    @tr.trace
    def gradient(x):
        (NumpyBackwardSin.apply(x) ** 2).sum().backward()
        return x.grad

    traced = gradient(tr.tensor(values, requires_grad=True))
    optimized = gradient.ir(tr.tensor(values, requires_grad=True), stage="optimized")
    assert "@host.NumpyBackwardSin.backward" in optimized
    assert "@host.NumpyBackwardSin.forward" not in optimized
    x = torch.tensor(values, requires_grad=True)
    ((x.sin() * (x.abs() + 1)) ** 2).sum().backward()
    np.testing.assert_allclose(traced.numpy(), x.grad.numpy(), rtol=1e-6)


def test_a_second_order_gradient_through_a_numpy_backward_is_refused():
    @tr.trace
    def second(x):
        (g,) = tr.autograd.grad(ext.incorrect_fft(x).sum(), [x], create_graph=True)
        return tr.autograd.grad((g * g).sum(), [x])[0]

    with pytest.raises(tr.HostCallbackError, match="BadFFTFunction.backward runs on the host"):
        second(tr.randn(4, 4, requires_grad=True))


def test_the_compiled_step_calls_back_from_another_thread():
    model = ext.SpectrumModel(8)
    image, _ = ext.batches(1, 8)[0]
    forward = tr.trace(lambda image: model(image).detach())
    expected = model(image).detach().numpy()
    results = []
    thread = threading.Thread(target=lambda: results.append(forward(image).numpy()))
    thread.start()
    thread.join()
    np.testing.assert_allclose(results[0], expected, rtol=1e-6)


class SortWithIndex(tr.autograd.Function):
    """Two outputs of two dtypes from one callback: the sorted values and the int64 order (not
    differentiable); backward gets a gradient for each output (None-free: materialized)."""

    @staticmethod
    def forward(ctx, x):
        order = np.argsort(x.detach().numpy(), kind="stable")
        ctx.save_for_backward(tr.from_numpy(order))
        return tr.from_numpy(x.detach().numpy()[order]), tr.from_numpy(order)

    @staticmethod
    def backward(ctx, grad_values, grad_order):
        (order,) = ctx.saved_tensors
        result = np.zeros_like(grad_values.numpy())
        result[order.numpy()] = grad_values.numpy()
        return tr.from_numpy(result)


def test_a_callback_with_outputs_of_two_dtypes_matches_torch_sort():
    values = np.array([0.3, -2.0, 1.5, 0.0, -0.7], np.float32)
    weights = np.arange(1.0, 6.0, dtype=np.float32)

    @tr.trace
    def weighted_sort(x):
        ordered, order = SortWithIndex.apply(x)
        (ordered * tr.from_numpy(weights)).sum().backward()
        return ordered, order, x.grad

    ordered, order, grad = weighted_sort(tr.tensor(values, requires_grad=True))
    x = torch.tensor(values, requires_grad=True)
    expected, expected_order = torch.sort(x, stable=True)
    (expected * torch.from_numpy(weights)).sum().backward()
    assert ordered.tolist() == expected.tolist() and order.dtype == tr.int64
    assert order.tolist() == expected_order.tolist() and grad.tolist() == x.grad.tolist()
    fused = weighted_sort.ir(tr.tensor(values, requires_grad=True), stage="fused")
    assert "host_callback[5]" in fused


def test_as_tensor_and_new_as_pytorchs():
    # (the tutorial's constructors) as_tensor shares an array of the dtype asked for, copies
    # otherwise; new(data) takes the tensor's dtype
    for m in (tr, torch):
        array = np.arange(3.0, dtype=np.float32)
        shared, converted = m.as_tensor(array), m.as_tensor(array, dtype=m.float64)
        array[0] = 7.0
        assert shared.tolist() == [7.0, 1.0, 2.0] and converted.tolist() == [0.0, 1.0, 2.0]
        assert converted.dtype == m.float64
        made = m.ones(2, dtype=m.float32).new(np.array([1.5, 2.5]))
        assert made.dtype == m.float32 and made.tolist() == [1.5, 2.5]


class NumpyTanh(tr.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.result = np.tanh(x.detach().numpy())
        return tr.from_numpy(ctx.result)

    @staticmethod
    def backward(ctx, grad):
        return grad * tr.from_numpy(1 - ctx.result ** 2)


@pytest.mark.parametrize("lookup", [
    lambda x, i: x.index_select(0, i), lambda x, i: x.gather(0, i), lambda x, i: x[i],
    lambda x, i: tr.take_along_dim(x, i, dim=0)], ids=["index_select", "gather", "index", "take"])
def test_an_index_out_of_range_before_a_callback_fails_at_the_user_s_line_on_the_first_call(lookup):
    """The callback's forward is traced on this call's values computed by the reference
    semantics; an index outside its dimension there raised the reference's own IndexError from
    inside the compiler, naming no line (found by the long random-program run). Now it is
    reported at the user's line that indexed; a valid index then gives PyTorch's value and
    gradient."""
    @tr.trace
    def f(x, i):
        return NumpyTanh.apply(lookup(x, i).abs()).sum()

    x = tr.tensor([0.5, -0.25, 2.0], requires_grad=True)
    with pytest.raises(tr.IndexOutOfRangeError, match=r"test_host_callbacks.py:\d+: index -4 is out"):
        f(x, tr.tensor([-4]))
    assert x.detach().tolist() == [0.5, -0.25, 2.0] and x.grad is None
    loss = f(x, tr.tensor([1, 2]))
    loss.backward()
    torch_x = torch.tensor([0.5, -0.25, 2.0], requires_grad=True)
    expected = torch.tanh(torch_x[torch.tensor([1, 2])].abs()).sum()
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), torch_x.grad.numpy(), rtol=1e-6)


class TanhAndLargest(tr.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        values = x.detach().numpy()
        return tr.from_numpy(np.tanh(values)), float(np.abs(values).max())

    @staticmethod
    def backward(ctx, grad, _):
        return grad


def test_a_call_after_an_index_out_of_range_gets_the_forward_s_numbers_of_its_own_values():
    """The forward's non-tensor outputs are those of the run that traced it. A first call whose
    index is outside its dimension must not leave behind code traced on drawn samples: the next
    call, with valid indices of the same shapes, scaled by the drawn samples' largest magnitude
    (0.13 for 2.0). Its values are PyTorch's."""
    @tr.trace
    def f(x, i):
        y, largest = TanhAndLargest.apply(x[i])
        return y * largest

    x = tr.tensor([0.5, -0.25, 2.0])
    with pytest.raises(tr.IndexOutOfRangeError, match=r"test_host_callbacks.py:\d+: index 5 is out"):
        f(x, tr.tensor([5, 0]))
    torch_y = torch.tensor([0.5, -0.25, 2.0])[torch.tensor([2, 0])]
    np.testing.assert_allclose(f(x, tr.tensor([2, 0])).numpy(),
                               (torch.tanh(torch_y) * torch_y.abs().max()).numpy(), rtol=1e-6)
