"""Eager cross_entropy and nll_loss of (N, C) inputs and integer labels, and log_softmax, each
of which runs as one tape node (tracer/nn/fused_losses.py, tracer/reductions.py), against
torch: values and gradients in float64 (to 1e-12) and float32 (to a few ulp), every reduction,
class weights, ignored labels, non-finite logits, second-order gradients, in-place changes; and
the values of the composition of primitives they replace (which traced code runs) to the last
bit."""
import numpy as np
import pytest
import torch

import tracer as tr

F = tr.nn.functional
# (rtol, atol); float32: 16 ulp of each value, and 4 of the largest where a sum rounds relative
# to it (numpy and torch add in different orders)
EPSILON32 = float(np.finfo(np.float32).eps)
TOLERANCES = {np.float64: (1e-12, 1e-15), np.float32: (16 * EPSILON32, 4 * EPSILON32)}


def _case(rows: int, classes: int, dtype, seed: int = 0):
    generator = np.random.default_rng(seed)
    logits = (generator.standard_normal((rows, classes)) * 3).astype(dtype)
    labels = generator.integers(0, classes, rows)
    return logits, labels


def _assert_close(ours: np.ndarray, theirs: np.ndarray, dtype) -> None:
    assert ours.dtype == theirs.dtype == dtype
    rtol, ulp = TOLERANCES[dtype]
    scale = float(np.abs(theirs[np.isfinite(theirs)]).max(initial=0))
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=ulp * max(scale, 1e-3)
                               if dtype == np.float32 else ulp)


LOSSES = ["cross_entropy", "nll_loss"]


def _both(logits, labels, weight=None, loss_name="cross_entropy", **options):
    """(loss, gradient of sum(loss * w)) from tracer and from torch, for one random w."""
    results = []
    for lib in (tr, torch):
        x = lib.tensor(logits, requires_grad=True)
        w = None if weight is None else lib.tensor(weight)
        loss = getattr(lib.nn.functional, loss_name)(x, lib.tensor(labels), w, **options)
        seed = np.random.default_rng(1).standard_normal(tuple(loss.shape)).astype(logits.dtype)
        (loss * lib.tensor(seed)).sum().backward()
        results.append((loss.detach().numpy(), x.grad.numpy()))
    return results


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("rows,classes", [(64, 10), (256, 1000), (5, 3), (1, 1)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("loss", LOSSES)
def test_matches_torch(dtype, rows, classes, reduction, loss):
    logits, labels = _case(rows, classes, dtype)
    (value, gradient), (expected, expected_gradient) = _both(logits, labels, loss_name=loss,
                                                            reduction=reduction)
    _assert_close(value, expected, dtype)
    _assert_close(gradient, expected_gradient, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("loss", LOSSES)
def test_weights_and_ignored_labels_match_torch(dtype, reduction, loss):
    logits, labels = _case(40, 7, dtype, seed=2)
    labels[::3] = -100
    labels[1] = 4
    weight = np.random.default_rng(3).uniform(0.2, 3.0, 7).astype(dtype)
    for options in (dict(weight=weight), dict(ignore_index=4), dict(weight=weight, ignore_index=4)):
        options = dict(options, reduction=reduction, loss_name=loss)
        kept = labels if "ignore_index" not in options else np.where(labels < 0, 0, labels)
        (value, gradient), (expected, expected_gradient) = _both(logits, kept, **options)
        _assert_close(value, expected, dtype)
        _assert_close(gradient, expected_gradient, dtype)


@pytest.mark.parametrize("loss", LOSSES)
def test_every_label_ignored_or_of_weight_zero_is_torchs_nan(loss):
    logits, labels = _case(4, 3, np.float64)
    (value, gradient), (expected, expected_gradient) = _both(logits, np.full(4, -100),
                                                            loss_name=loss)
    assert np.isnan(value) and np.isnan(expected)
    np.testing.assert_array_equal(gradient, expected_gradient)  # zeros: nothing counts
    weight = np.array([0.0, 1.0, 1.0])
    (value, gradient), (expected, expected_gradient) = _both(logits, np.zeros(4, np.int64), weight,
                                                            loss_name=loss)
    assert np.isnan(value) and np.isnan(expected)
    np.testing.assert_array_equal(gradient, expected_gradient)  # 0 * (1 / 0): nan, as torch's


def test_non_finite_logits_match_torch():
    logits, labels = _case(5, 4, np.float64)
    logits[0, 1] = np.inf
    logits[1, 2] = -np.inf
    logits[2, 0] = np.nan
    logits[3] = -np.inf
    for reduction in ("none", "sum"):
        (value, gradient), (expected, expected_gradient) = _both(logits, labels,
                                                                reduction=reduction)
        np.testing.assert_allclose(value, expected, rtol=1e-12)  # nan where torch's is
        np.testing.assert_allclose(gradient, expected_gradient, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("loss", LOSSES)
def test_values_are_the_compositions_to_the_last_bit(dtype, loss):
    """The fused eager loss of (N, C) equals that of (N, C, 1), which the composition of
    primitives computes (as traced code does), bit for bit; gradients to rounding."""
    logits, labels = _case(300, 17, dtype, seed=5)
    labels[::7] = -100
    y = tr.tensor(labels)
    weight = tr.tensor(np.linspace(0.5, 2.0, 17).astype(dtype))
    for options in ({}, dict(weight=weight), dict(reduction="none")):
        x = tr.tensor(logits, requires_grad=True)
        fused = getattr(F, loss)(x, y, **options)
        (fused * 1.5).sum().backward()
        extended = tr.tensor(logits[:, :, None], requires_grad=True)
        composed = getattr(F, loss)(extended, y[:, None], **options)
        (composed * 1.5).sum().backward()
        np.testing.assert_array_equal(fused.detach().numpy(),
                                      composed.detach().numpy().reshape(fused.shape))
        _assert_close(x.grad.numpy(), extended.grad.numpy()[:, :, 0], dtype)


@pytest.mark.parametrize("loss", LOSSES)
def test_second_order_gradient_matches_torch(loss):
    """create_graph through the fused node: the gradient of |d loss / d x|^2 equals torch's
    (nll_loss of log_softmax(x): its own gradient does not depend on its input)."""
    logits, labels = _case(6, 5, np.float64, seed=7)
    labels[2] = -100
    weight = np.array([0.5, 1.0, 2.0, 1.5, 1.0])
    results = []
    for lib in (tr, torch):
        x = lib.tensor(logits, requires_grad=True)
        inputs = x if loss == "cross_entropy" else x.log_softmax(1)
        value = getattr(lib.nn.functional, loss)(inputs, lib.tensor(labels), lib.tensor(weight))
        (gradient,) = lib.autograd.grad(value, x, create_graph=True)
        (gradient * gradient).sum().backward()
        results.append((gradient.detach().numpy(), x.grad.numpy()))
    (gradient, second), (expected, expected_second) = results
    np.testing.assert_allclose(gradient, expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(second, expected_second, rtol=1e-12, atol=1e-15)


def test_logits_changed_in_place_after_cross_entropy_keep_the_gradient():
    """PyTorch's cross_entropy backward reads log_softmax's result, not the logits: changing
    them after the loss is allowed and does not change the gradient; the fused node keeps what
    it read."""
    logits, labels = _case(8, 4, np.float64, seed=9)
    grads = []
    for lib in (tr, torch):
        x = lib.tensor(logits, requires_grad=True)
        h = x * 1.0
        value = lib.nn.functional.cross_entropy(h, lib.tensor(labels))
        with lib.no_grad():
            h.mul_(3.0)
        value.backward()
        grads.append(x.grad.numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("lib,error", [(tr, tr.InplaceError), (torch, RuntimeError)])
def test_input_changed_in_place_after_nll_loss_is_an_error_at_backward(lib, error):
    """PyTorch's nll_loss saves its input: changing it in place before the backward is an error
    there, and here too (the composition of primitives did not say so)."""
    x = lib.tensor(np.zeros((3, 4)), requires_grad=True)
    h = x * 1.0
    value = lib.nn.functional.nll_loss(h, lib.tensor([0, 1, 3]))
    with lib.no_grad():
        h.mul_(3.0)
    with pytest.raises(error, match="modified by an inplace|changed in place"):
        value.backward()


@pytest.mark.parametrize("loss", LOSSES)
def test_one_node_between_the_input_and_the_loss(loss):
    """The eager loss is one step of the tape (its speed comes from that), with nothing between
    it and its input's own producer."""
    x = tr.tensor(np.ones((4, 3), np.float32), requires_grad=True)
    h = x * 2.0
    value = getattr(F, loss)(h, tr.tensor([0, 1, 2, 0]))
    assert value.grad_fn.edges[-1] == (h.grad_fn, 0)
    with tr.no_grad():
        assert getattr(F, loss)(h, tr.tensor([0, 1, 2, 0])).grad_fn is None


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,dim", [((64, 10), 1), ((256, 1000), -1), ((7, 5), 0),
                                       ((3, 4, 5), 1), ((6,), 0)])
def test_log_softmax_matches_torch_and_the_composition(dtype, shape, dim):
    """Eager log_softmax (one tape node, tracer/reductions.py): torch's values and gradients;
    the composition's values (what traced code computes) to the last bit."""
    generator = np.random.default_rng(4)
    values = (generator.standard_normal(shape) * 3).astype(dtype)
    seed = generator.standard_normal(shape).astype(dtype)
    results = []
    for lib in (tr, torch):
        x = lib.tensor(values, requires_grad=True)
        y = lib.nn.functional.log_softmax(x, dim)
        (y * lib.tensor(seed)).sum().backward()
        results.append((y.detach().numpy(), x.grad.numpy()))
    (value, gradient), (expected, expected_gradient) = results
    _assert_close(value, expected, dtype)
    _assert_close(gradient, expected_gradient, dtype)
    np.testing.assert_array_equal(value, tr.tensor(values)._composed_log_softmax(dim).numpy())


def test_log_softmax_second_order_and_in_place_changes_are_torchs():
    """create_graph through the node; changing the input after it is allowed (PyTorch's backward
    reads the result), changing the result is an error at backward, in both."""
    values = np.random.default_rng(8).standard_normal((4, 6))
    results = []
    for lib in (tr, torch):
        x = lib.tensor(values, requires_grad=True)
        y = lib.nn.functional.log_softmax(x * 1.0, 1)
        (gradient,) = lib.autograd.grad((y * y).sum(), x, create_graph=True)
        (gradient * gradient).sum().backward()
        results.append((gradient.detach().numpy(), x.grad.numpy()))
        h = x * 1.0
        y = h.log_softmax(1)
        with lib.no_grad():
            h.mul_(2.0)
        y.sum().backward()
        results.append(x.grad.numpy().copy())
        y = (x * 1.0).log_softmax(1)
        with lib.no_grad():
            y.mul_(2.0)
        with pytest.raises((tr.InplaceError, RuntimeError),
                           match="modified by an inplace|changed in place"):
            y.sum().backward()
    (gradient, second), changed, (expected, expected_second), expected_changed = results
    np.testing.assert_allclose(gradient, expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(second, expected_second, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(changed, expected_changed, rtol=1e-12, atol=1e-15)
