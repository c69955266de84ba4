"""Random programs written with the Tensor API -- elementwise chains, broadcasting, reductions over
any axes, transposes, slices, matmul and custom Functions -- on random shapes with 0- and 1-sized
dimensions and non-contiguous inputs: the traced (compiled) values and gradients equal eager mode's,
and (through conftest) every compiled call equals the interpreter's."""
import numpy as np
from hypothesis import event, given, settings, strategies as st

import tracer as tr


class Square(tr.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return 2 * x * grad_output


class ClampedScale(tr.Function):
    """A Function with a non-tensor argument and an in-place change of a clone in backward."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        ctx.save_for_backward(x)
        return x.clamp(min=-1, max=1) * scale

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        grad = grad_output.clone() * ctx.scale
        grad[x.abs() > 1] = 0
        return grad, None


UNARY = [
    lambda x: x.tanh(),
    lambda x: (x * 0.5).exp(),
    lambda x: (x.abs() + 1).log(),
    lambda x: (x * x + 1).sqrt(),
    lambda x: x.sin() * x.cos(),
    lambda x: x.sigmoid(),
    lambda x: x.relu() - 0.5 * x,
    lambda x: x.clamp(min=-0.5, max=0.7),
    lambda x: Square.apply(x),
    lambda x: ClampedScale.apply(x, 1.5),
    lambda x: tr.where(x > 0.2, x, x * x),
    lambda x: -x / (x.abs() + 2),
]


@st.composite
def programs(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3, 3, 4]), min_size=rank,
                                max_size=rank)))
    steps = draw(st.lists(st.tuples(st.sampled_from(["unary", "broadcast", "reduce", "transpose",
                                                     "slice", "matmul"]),
                                    st.integers(0, 100)), min_size=1, max_size=6))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    layout = draw(st.sampled_from(["contiguous", "strided", "fortran"]))
    seed = draw(st.integers(0, 2 ** 16))
    return shape, steps, dtype, layout, seed


def run_program(x, other, steps):
    value = x
    for kind, choice in steps:
        if kind == "unary":
            value = UNARY[choice % len(UNARY)](value)
        elif kind == "broadcast" and value.ndim and value.shape[-1] in (1, other.shape[0]):
            value = value * other + 0.25  # a row broadcast along the leading dimensions
        elif kind == "reduce" and value.ndim:
            dim = choice % value.ndim
            value = value.sum(dim=dim, keepdim=bool(choice % 2)) if choice % 3 else value.mean(
                dim=dim, keepdim=True)
        elif kind == "transpose" and value.ndim >= 2:
            value = value.transpose(0, value.ndim - 1)
        elif kind == "slice" and value.ndim:
            value = value[..., choice % 2::2] if value.shape[-1] > 1 else value
        elif kind == "matmul" and value.ndim == 2:
            value = value @ value.t().tanh()
    return value


def step(x, other, steps):
    loss = (run_program(x, other, steps) ** 2).sum()
    loss.backward()
    if x.grad is not None:  # known when tracing: whether a gradient reaches x
        with tr.no_grad():
            x.sub_(0.125 * x.grad)
    return loss


@settings(max_examples=60, deadline=None)
@given(programs())
def test_traced_random_programs_equal_eager(program):
    shape, steps, dtype, layout, seed = program
    generator = np.random.default_rng(seed)
    if layout == "strided":
        base = generator.standard_normal(tuple(2 * d for d in shape)).astype(dtype)
        array = base[tuple(slice(None, None, 2) for _ in shape)]
    else:
        array = generator.standard_normal(shape).astype(dtype, order="F" if layout == "fortran"
                                                         else "C")
    other_array = generator.standard_normal(shape[-1:]).astype(dtype)
    results = []
    for traced in (False, True):
        x = tr.from_numpy(array.copy() if not traced else array).requires_grad_()
        other = tr.from_numpy(other_array)
        function = tr.trace(step, static_argnums=2) if traced else step
        loss = function(x, other, tuple(steps))
        results.append((loss.item(), None if x.grad is None else x.grad.numpy().copy(),
                        x.detach().numpy().copy()))
    (eager_loss, eager_grad, eager_x), (traced_loss, traced_grad, traced_x) = results
    event("gradient" if eager_grad is not None and eager_grad.size else "no gradient elements")
    tolerance = 2e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(traced_loss, eager_loss, rtol=tolerance, atol=tolerance)
    assert (eager_grad is None) == (traced_grad is None)
    scale = 1.0
    if eager_grad is not None:
        scale = max(1.0, float(np.abs(eager_grad).max(initial=0)))
        np.testing.assert_allclose(traced_grad, eager_grad, rtol=tolerance, atol=tolerance * scale)
    # The update was written into the caller's (possibly strided or Fortran-ordered) array.
    np.testing.assert_allclose(traced_x, eager_x, rtol=tolerance, atol=tolerance * scale)
