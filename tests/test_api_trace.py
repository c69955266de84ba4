"""@tr.trace against eager mode: the seed training loop step by step, .grad and in-place write-back,
the signature cache, static arguments, IR stages (with a golden text), grad transforms, dumps."""
import inspect
import re

import numpy as np
import pytest

from tracer import ir
import tracer as tr
from tracer.runtime.pipeline import STAGES


class MyReLU(tr.Function):
    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        return input.clamp(min=0)

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        grad_input = grad_output.clone()
        grad_input[input < 0] = 0
        return grad_input


def small_step(x, y, w1, w2, lr):
    loss = (MyReLU.apply(x.mm(w1)).mm(w2) - y).pow(2).sum()
    loss.backward()
    with tr.no_grad():
        w1.sub_(lr * w1.grad)
        w2.sub_(lr * w2.grad)
    return loss


BASE_LINE = inspect.getsourcelines(MyReLU)[1]


def normalize(text):
    """Source lines relative to MyReLU's class line, rule labels without their global counter."""
    text = re.sub(r"test_api_trace\.py:(\d+)", lambda m: f"L{int(m.group(1)) - BASE_LINE}", text)
    return re.sub(r"@MyReLU\.\d+", "@MyReLU.#", text)


GOLDEN_TRACED = '''\
def small_step(%x: f32[2,3], %y: f32[2,2], %w1: f32[3,4], %w2: f32[4,2], %lr: f64[]):
  %0 : f32[2,4] = matmul %x, %w1                        # L15
  %1 : f32[] = constant {value=0.0, dtype=f32}          # L4 (MyReLU.forward)
  %2 : bool[2,4] = lt %0, %1                            # L4 (MyReLU.forward)
  %3 : f32[] = constant {value=0.0, dtype=f32}          # L4 (MyReLU.forward)
  %4 : f32[2,4] = select %2, %3, %0                     # L4 (MyReLU.forward)
  %5 : f32[2,4] = stop_gradient %4                      # L4 (MyReLU.forward)
  %6 : f32[2,4] = custom_vjp %5, %0 {num_outputs=1, rule=@MyReLU.#}  # L15
  %7 : f32[2,2] = matmul %6, %w2                        # L15
  %8 : f32[2,2] = sub %7, %y                            # L15
  %9 : f32[] = constant {value=2.0, dtype=f32}          # L15
  %10 : f32[2,2] = pow %8, %9                           # L15
  %11 : f32[2,2] = custom_vjp %10, %10, %8 {num_outputs=1, rule=@zero_kept.2}  # L15
  %12 : f32[] = reduce_sum %11 {axes=(0,1)}             # L15
  %13 : f32[] = constant {value=1.0, dtype=f32}         # L16
  %14, %15 : f32[3,4], f32[4,2] = gradient %12, %13, %w1, %w2  # L16
  %16 : f32[] = cast %lr {dtype=f32}                    # L18
  %17 : f32[3,4] = mul %16, %14                         # L18
  %18 : f32[3,4] = sub %w1, %17                         # L18
  %19 : f32[3,4] = stop_gradient %18                    # L18
  %20 : f32[] = cast %lr {dtype=f32}                    # L19
  %21 : f32[4,2] = mul %20, %15                         # L19
  %22 : f32[4,2] = sub %w2, %21                         # L19
  %23 : f32[4,2] = stop_gradient %22                    # L19
  return %12, %19, %14, %23, %15
'''

GOLDEN_GRAD = '''\
def small_step(%x: f32[2,3], %y: f32[2,2], %w1: f32[3,4], %w2: f32[4,2], %lr: f64[]):
  %0 : f32[2,4] = matmul %x, %w1                        # L15
  %1 : f32[] = constant {value=0.0, dtype=f32}          # L4 (MyReLU.forward)
  %2 : bool[2,4] = lt %0, %1                            # L4 (MyReLU.forward)
  %3 : f32[] = constant {value=0.0, dtype=f32}          # L4 (MyReLU.forward)
  %4 : f32[2,4] = select %2, %3, %0                     # L4 (MyReLU.forward)
  %5 : f32[2,4] = stop_gradient %4                      # L4 (MyReLU.forward)
  %6 : f32[2,4] = custom_vjp %5, %0 {num_outputs=1, rule=@MyReLU.#}  # L15
  %7 : f32[2,2] = matmul %6, %w2                        # L15
  %8 : f32[2,2] = sub %7, %y                            # L15
  %9 : f32[] = constant {value=2.0, dtype=f32}          # L15
  %10 : f32[2,2] = pow %8, %9                           # L15
  %11 : f32[2,2] = custom_vjp %10, %10, %8 {num_outputs=1, rule=@zero_kept.2}  # L15
  %12 : f32[] = reduce_sum %11 {axes=(0,1)}             # L15
  %13 : f32[] = constant {value=1.0, dtype=f32}         # L16
  %24 : f32[1,1] = reshape %13 {shape=(1,1)}            # L15 (backward)
  %25 : f32[2,2] = broadcast %24 {shape=(2,2)}          # L15 (backward)
  %26 : f32[] = constant {value=0.0, dtype=f32}         # L15 (backward)
  %27 : bool[] = eq %9, %26                             # L15 (backward)
  %28 : f32[] = constant {value=1.0, dtype=f32}         # L15 (backward)
  %29 : f32[] = sub %9, %28                             # L15 (backward)
  %30 : f32[2,2] = pow %8, %29                          # L15 (backward)
  %31 : f32[2,2] = mul %9, %30                          # L15 (backward)
  %32 : f32[2,2] = mul %25, %31                         # L15 (backward)
  %33 : f32[] = constant {value=0.0, dtype=f32}         # L15 (backward)
  %34 : f32[2,2] = select %27, %33, %32                 # L15 (backward)
  %35 : f32[2,2] = neg %34                              # L15 (backward)
  %36 : f32[2,4] = transpose %w2 {permutation=(1,0)}    # L15 (backward)
  %37 : f32[2,4] = matmul %34, %36                      # L15 (backward)
  %38 : f32[4,2] = transpose %6 {permutation=(1,0)}     # L15 (backward)
  %39 : f32[4,2] = matmul %38, %34                      # L15 (backward)
  %40 : f32[2,4] = reshape %37 {shape=(2,4)}            # L9 (MyReLU.backward)
  %41 : f32[] = constant {value=0.0, dtype=f32}         # L10 (MyReLU.backward)
  %42 : bool[2,4] = lt %0, %41                          # L10 (MyReLU.backward)
  %43 : i64[] = constant {value=0, dtype=i64}           # L10 (MyReLU.backward)
  %44 : f32[] = cast %43 {dtype=f32}                    # L10 (MyReLU.backward)
  %45 : f32[2,4] = select %42, %44, %40                 # L10 (MyReLU.backward)
  %46 : f32[3,2] = transpose %x {permutation=(1,0)}     # L15 (backward)
  %47 : f32[3,4] = matmul %46, %45                      # L15 (backward)
  %16 : f32[] = cast %lr {dtype=f32}                    # L18
  %17 : f32[3,4] = mul %16, %47                         # L18
  %18 : f32[3,4] = sub %w1, %17                         # L18
  %19 : f32[3,4] = stop_gradient %18                    # L18
  %20 : f32[] = cast %lr {dtype=f32}                    # L19
  %21 : f32[4,2] = mul %20, %39                         # L19
  %22 : f32[4,2] = sub %w2, %21                         # L19
  %23 : f32[4,2] = stop_gradient %22                    # L19
  return %12, %19, %47, %23, %39
'''


def golden_args():
    return (tr.zeros(2, 3), tr.zeros(2, 2), tr.zeros(3, 4, requires_grad=True),
            tr.zeros(4, 2, requires_grad=True), 0.1)


@pytest.mark.parametrize("stage,golden", [("traced", GOLDEN_TRACED), ("grad", GOLDEN_GRAD)])
def test_golden_ir_of_the_two_layer_step(stage, golden):
    text = tr.trace(small_step).ir(*golden_args(), stage=stage)
    assert normalize(text).rstrip("\n") == golden.rstrip("\n")


@pytest.mark.parametrize("stage", ["traced", "grad", "optimized"])
def test_ir_stages_parse_and_verify(stage):
    f = tr.trace(small_step)
    text = f.ir(*golden_args(), stage=stage)
    parsed = ir.parse_function(text)
    ir.verify(parsed)
    assert ir.format_function(parsed) == text
    assert f.cache_info() == (0, 0, 1)          # ir() compiles but does not count as a call
    f(*golden_args())
    assert f.cache_info() == (1, 0, 1)


def test_stage_texts_printed_late_are_the_ones_of_the_compile():
    """The front-end stages are printed when first read, from the graphs each stage made: later
    calls (which update w1 and w2 in place), another signature and another compile of the same
    function leave those graphs as they were. (The test set-up reads each stage at once after
    its compile: here the kept graphs are printed again after all that.)"""
    f = tr.trace(small_step)
    args = golden_args()
    f(*args)
    entry = next(iter(f._signatures.entries.values()))
    at_compile = dict(entry.stages)
    assert list(at_compile) == ["traced", "grad", "optimized"]
    assert "= gradient " in at_compile["traced"] and "= gradient " not in at_compile["grad"]
    for _ in range(2):
        f(*args)  # the second signature (.grad set) and a call of it
    tr.trace(small_step)(*golden_args())
    assert len(f._signatures.entries) == 2
    # (a warm hit keeps what makes its optimized graph instead, when another test's compile of
    # the same program filled the disk cache first)
    late = {stage: ir.format_function(graph if isinstance(graph, ir.Graph) else graph())
            for stage, graph in entry.stages._graphs.items()}
    assert late == at_compile
    assert normalize(late["traced"]).rstrip("\n") == GOLDEN_TRACED.rstrip("\n")


def test_ir_unknown_stage_is_an_error():
    with pytest.raises(tr.TracerError):
        tr.trace(small_step).ir(*golden_args(), stage="nonsense")


def test_optimized_graph_computes_the_same_as_the_traced_one():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((2, 3), (2, 2), (3, 4), (4, 2))]
    f = tr.trace(small_step)
    args = [tr.tensor(a, requires_grad=i >= 2) for i, a in enumerate(arrays)] + [0.1]
    inputs = [a for a in arrays] + [np.array(0.1)]
    traced = ir.interpret(ir.parse_function(f.ir(*args, stage="grad")), inputs)
    optimized = ir.interpret(ir.parse_function(f.ir(*args, stage="optimized")), inputs)
    for a, b in zip(traced, optimized):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


# The seed training loop, eager vs traced ---------------------------------------------------------
def seed_step(x, y, w1, w2, learning_rate):
    y_pred = MyReLU.apply(x.mm(w1)).mm(w2)
    loss = (y_pred - y).pow(2).sum()
    loss.backward()
    with tr.no_grad():
        w1.sub_(learning_rate * w1.grad)
        w2.sub_(learning_rate * w2.grad)
        w1.grad.zero_()
        w2.grad.zero_()
    return loss


def make_data(seed, N, D_in, H, D_out):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, D_in)).astype(np.float32)
    y = rng.standard_normal((N, D_out)).astype(np.float32)
    w1 = rng.standard_normal((D_in, H)).astype(np.float32)
    w2 = rng.standard_normal((H, D_out)).astype(np.float32)
    return x, y, w1, w2


def run_loop(step, data, steps, lr):
    x, y, w1, w2 = (tr.tensor(data[0]), tr.tensor(data[1]), tr.tensor(data[2], requires_grad=True),
                    tr.tensor(data[3], requires_grad=True))
    history = []
    for _ in range(steps):
        loss = step(x, y, w1, w2, lr)
        history.append((loss.item(), w1.detach().numpy().copy(), w2.detach().numpy().copy(),
                        w1.grad.numpy().copy(), w2.grad.numpy().copy()))
    return history


def assert_histories_agree(eager, traced, rtol):
    for t, (e, c) in enumerate(zip(eager, traced)):
        assert c[0] == pytest.approx(e[0], rel=rtol), f"loss differs at step {t + 1}"
        for name, a, b in zip(("w1", "w2", "w1.grad", "w2.grad"), e[1:], c[1:]):
            scale = max(np.abs(a).max(), 1e-30)
            assert np.abs(a - b).max() <= rtol * scale, f"{name} differs at step {t + 1}"


def test_seed_loop_small_eager_and_traced_agree_step_by_step():
    data = make_data(1, N=8, D_in=20, H=10, D_out=3)
    eager = run_loop(seed_step, data, 30, 1e-3)
    f = tr.trace(seed_step)
    traced = run_loop(f, data, 30, 1e-3)
    # the same float32 operations, reordered only by the optimizer (x**2 -> x*x, ...)
    assert_histories_agree(eager, traced, rtol=1e-5)
    assert eager[-1][0] < eager[0][0] / 10
    assert f.cache_info() == (28, 2, 2)      # step 1 has no .grad yet; then one signature
    # grads were zeroed in place on every step
    assert not eager[-1][3].any() and not traced[-1][3].any()


def test_seed_loop_real_sizes_20_steps():
    data = make_data(0, N=64, D_in=1000, H=100, D_out=10)
    eager = run_loop(seed_step, data, 20, 1e-6)
    traced = run_loop(tr.trace(seed_step), data, 20, 1e-6)
    # float32 sums over 1000 terms, in a possibly different order: a few ulps of the largest term
    assert_histories_agree(eager, traced, rtol=1e-4)
    assert traced[-1][0] < traced[0][0] / 10


# .grad and in-place write-back --------------------------------------------------------------------------
def test_grad_and_inplace_updates_equal_eager():
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((2, 3), (2, 2), (3, 4), (4, 2))]

    def fresh():
        return [tr.tensor(a, requires_grad=i >= 2) for i, a in enumerate(arrays)]

    eager, traced = fresh(), fresh()
    f = tr.trace(small_step)
    for _ in range(3):            # .grad accumulates (no zero_), as in eager mode
        le = small_step(*eager, 0.01)
        lt = f(*traced, 0.01)
        assert lt.item() == pytest.approx(le.item(), rel=1e-6)
        for e, t in zip(eager, traced):
            np.testing.assert_allclose(t.detach().numpy(), e.detach().numpy(), rtol=1e-6, atol=1e-6)
            assert (e.grad is None) == (t.grad is None)
            if e.grad is not None:
                np.testing.assert_allclose(t.grad.numpy(), e.grad.numpy(), rtol=1e-5, atol=1e-6)
                assert t.grad.dtype == e.grad.dtype
    # the first call had no .grad, the later ones do: two signatures
    assert f.cache_info() == (1, 2, 2)


def test_inplace_into_numpy_argument_and_returned_tensors():
    a = np.ones(3, np.float32)

    @tr.trace
    def f(x):
        x.mul_(3.0)
        return x * 2

    r = f(a)
    np.testing.assert_array_equal(a, [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(r.numpy(), [6.0, 6.0, 6.0])
    t = tr.tensor([1.0, 2.0])
    out = tr.trace(lambda x: x)(t)
    assert out is t  # the argument itself, as torch.compile returns it
    out = tr.trace(lambda x: x)(a)
    out.fill_(0.0)
    np.testing.assert_array_equal(a, [3.0, 3.0, 3.0])  # a numpy argument returned: a new tensor


def test_traced_backward_only_reaches_arguments_that_require_grad():
    @tr.trace
    def f(x, w):
        (x * w).sum().backward()

    x, w = tr.tensor([1.0, 2.0]), tr.tensor([3.0, 4.0], requires_grad=True)
    f(x, w)
    assert x.grad is None
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0])
    f(x, w)
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0])   # accumulates like eager


# Cache behaviour ---------------------------------------------------------------------------------------
def test_python_scalar_is_a_runtime_input():
    @tr.trace
    def scale(x, lr):
        return x * lr

    x = tr.tensor([1.0, 2.0])
    for lr in (0.5, 0.25, 3.0, 1e-6):
        r = scale(x, lr)
        np.testing.assert_allclose(r.numpy(), np.float32([1.0, 2.0]) * np.float32(lr))
        assert r.dtype == tr.float32
    assert scale.cache_info() == (3, 1, 1)
    scale(x, 2)                         # an int is a different signature (int64 scalar)
    assert scale.cache_info().misses == 2
    np.testing.assert_array_equal(scale(x, 3).numpy(), [3.0, 6.0])


def test_seed_step_learning_rate_change_does_not_recompile():
    f = tr.trace(small_step)
    args = golden_args()[:4]
    for lr in (0.1, 0.01, 0.001):
        f(*args, lr)
    assert f.cache_info() == (1, 2, 2)  # the first call had no .grad; then one signature


def test_static_argnums_bakes_and_recompiles():
    calls = []

    def power(x, n):
        calls.append(n)
        result = x
        for _ in range(n - 1):            # Python control flow on a static int
            result = result * x
        return result

    f = tr.trace(power, static_argnums=(1,))
    x = tr.tensor([2.0, 3.0])
    np.testing.assert_array_equal(f(x, 3).numpy(), [8.0, 27.0])
    np.testing.assert_array_equal(f(x, 2).numpy(), [4.0, 9.0])
    np.testing.assert_array_equal(f(x, 3).numpy(), [8.0, 27.0])
    assert f.cache_info() == (1, 2, 2)
    assert calls == [3, 2]
    assert "constant" not in f.ir(x, 3) or "%n" not in f.ir(x, 3)
    g = tr.trace(power, static_argnums=1)
    np.testing.assert_array_equal(g(x, 1).numpy(), [2.0, 3.0])


def test_cache_key_includes_shape_dtype_requires_grad_and_grad_presence():
    @tr.trace
    def f(x):
        return (x * x).sum()

    f(tr.zeros(2, 3))
    f(tr.zeros(2, 3))
    assert f.cache_info() == (1, 1, 1)
    f(tr.zeros(3, 2))                                    # shape
    f(tr.zeros(2, 3, dtype=tr.float64))                  # dtype
    x = tr.zeros(2, 3, requires_grad=True)
    f(x)                                                 # requires_grad
    assert f.cache_info() == (1, 4, 4)
    x.grad = tr.ones(2, 3)
    f(x)  # a .grad that f does not read: no part of the signature
    assert f.cache_info() == (2, 4, 4)
    f(tr.zeros(3, 2))
    assert f.cache_info() == (3, 4, 4)
    f.cache_clear()
    assert f.cache_info() == (0, 0, 0)


def test_cache_key_includes_grad_presence_where_backward_accumulates_into_it(caplog):
    @tr.trace
    def f(x):
        (x * x).sum().backward()  # accumulates into the .grad x has

    x = tr.tensor([1.0, 2.0], requires_grad=True)
    f(x)
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])
    with caplog.at_level("INFO", logger="tracer.trace"):
        f(x)
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 8.0])
    f(x)
    np.testing.assert_array_equal(x.grad.numpy(), [6.0, 8.0 + 4.0])
    assert f.cache_info() == (1, 2, 2)
    assert ".grad of x: None -> shape (2,), dtype float32" in caplog.text


def test_cache_key_includes_grad_mode():
    @tr.trace
    def f(x):
        return x * 2

    x = tr.tensor([1.0], requires_grad=True)
    f(x)
    with tr.no_grad():
        f(x)
    assert f.cache_info().misses == 2


def test_numpy_and_list_arguments():
    @tr.trace
    def f(a, pair, scale=1.0):
        return a * pair[0] + pair[1] * scale

    a = np.array([1.0, 2.0], np.float32)
    r = f(a, (tr.tensor([3.0, 4.0]), tr.tensor([1.0, 1.0])), scale=2.0)
    np.testing.assert_array_equal(r.numpy(), [5.0, 10.0])
    r = f(a, (tr.tensor([3.0, 4.0]), tr.tensor([1.0, 1.0])), scale=3.0)
    np.testing.assert_array_equal(r.numpy(), [6.0, 11.0])
    assert f.cache_info() == (1, 1, 1)


def test_same_tensor_passed_twice():
    @tr.trace
    def f(a, b):
        a.add_(1.0)
        return a + b

    x = tr.tensor([1.0, 2.0])
    eager_x = tr.tensor([1.0, 2.0])
    e = f.python_function(eager_x, eager_x)
    r = f(x, x)
    np.testing.assert_array_equal(r.numpy(), e.numpy())
    np.testing.assert_array_equal(x.numpy(), eager_x.numpy())


# grad / value_and_grad --------------------------------------------------------------------------------
def loss_fn(w, x, y):
    return ((x @ w - y) ** 2).mean()


def test_grad_and_value_and_grad_eager_and_traced():
    rng = np.random.default_rng(5)
    w, x, y = rng.standard_normal((3, 2)), rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    expected_grad = 2 * x.T @ (x @ w - y) / 8
    expected_value = ((x @ w - y) ** 2).mean()
    args = [tr.tensor(a) for a in (w, x, y)]
    for g in (tr.grad(loss_fn), tr.trace(tr.grad(loss_fn))):
        np.testing.assert_allclose(g(*args).numpy(), expected_grad, rtol=1e-12)
    for vg in (tr.value_and_grad(loss_fn, argnums=(0, 2)),
               tr.trace(tr.value_and_grad(loss_fn, argnums=(0, 2)))):
        value, (gw, gy) = vg(*args)
        assert value.item() == pytest.approx(expected_value, rel=1e-12)
        np.testing.assert_allclose(gw.numpy(), expected_grad, rtol=1e-12)
        np.testing.assert_allclose(gy.numpy(), -2 * (x @ w - y) / 8, rtol=1e-12)
    # the inputs were not given .grad and do not require grad
    assert all(a.grad is None and not a.requires_grad for a in args)


def test_value_and_grad_has_aux_eager_and_inside_trace():
    def f(w, x):
        prediction = x @ w
        return (prediction ** 2).sum(), prediction

    w, x = tr.tensor([1.0, -2.0]), tr.tensor([[1.0, 1.0], [2.0, 0.5]])
    vg = tr.value_and_grad(f, has_aux=True)

    @tr.trace
    def traced_step(w, x, lr):
        (value, aux), g = vg(w, x)
        return value, aux, w - lr * g

    (value, aux), g = vg(w, x)
    p = np.array([-1.0, 1.0])
    assert value.item() == 2.0
    np.testing.assert_array_equal(aux.detach().numpy(), p)   # aux is returned as computed
    np.testing.assert_array_equal(g.numpy(), 2 * np.array([[1.0, 1.0], [2.0, 0.5]]).T @ p)
    tv, taux, new_w = traced_step(w, x, 0.1)
    assert tv.item() == 2.0
    np.testing.assert_array_equal(taux.detach().numpy(), p)
    np.testing.assert_allclose(new_w.detach().numpy(), w.numpy() - 0.1 * g.numpy(), rtol=1e-6)
    gaux = tr.grad(f, has_aux=True)(w, x)
    np.testing.assert_array_equal(gaux[0].numpy(), g.numpy())
    np.testing.assert_array_equal(gaux[1].detach().numpy(), p)


def test_grad_of_function_not_depending_on_argument_is_zero():
    g = tr.grad(lambda w, x: (x * 2).sum(), argnums=0)
    for fn in (g, tr.trace(g)):
        np.testing.assert_array_equal(fn(tr.tensor([1.0, 2.0]), tr.tensor([3.0])).numpy(), [0, 0])


# TRACER_DUMP, gradcheck on traced functions ---------------------------------------------------------
def test_tracer_dump_writes_every_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACER_DUMP", str(tmp_path))
    f = tr.trace(small_step)
    args = golden_args()
    f(*args)
    files = sorted(p.name for p in tmp_path.iterdir())
    for stage in STAGES:
        matching = [name for name in files if name.startswith("small_step.") and f".{stage}." in name]
        assert len(matching) == 1, (stage, files)
        text = (tmp_path / matching[0]).read_text()
        assert text == f.ir(*golden_args(), stage=stage)
    f(*args)               # a second signature (.grad exists now) dumps a second set
    assert len(list(tmp_path.iterdir())) == 2 * len(files)


def test_gradcheck_on_traced_functions():
    rng = np.random.default_rng(2)

    def f(x, w):
        return MyReLU.apply(x @ w).tanh().sum(1) * x[:, 0]

    x = tr.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w = tr.tensor(rng.standard_normal((4, 5)), requires_grad=True)
    assert tr.gradcheck(f, (x, w))
    assert tr.gradcheck(tr.trace(f), (x, w))


def test_gradcheck_on_traced_function_detects_wrong_backward():
    class Wrong(tr.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x          # should be 2x

    x = tr.tensor([1.0, 2.0], dtype=tr.float64, requires_grad=True)
    with pytest.raises(tr.GradcheckError):
        tr.gradcheck(tr.trace(Wrong.apply), (x,))


def test_nested_trace_inlines():
    inner = tr.trace(lambda x: x * 2)
    outer = tr.trace(lambda x: inner(x) + 1)
    np.testing.assert_array_equal(outer(tr.tensor([1.0])).numpy(), [3.0])
    assert inner.cache_info().misses == 0


def test_inplace_under_no_grad_on_non_leaf_keeps_its_gradient_path():
    # PyTorch (and eager mode here): an in-place change under no_grad leaves y's grad_fn as it was,
    # so the gradient still flows to w as if the change were not there: w.grad == 3.
    def f(w):
        y = w * 3
        with tr.no_grad():
            y.add_(1.0)
        y.sum().backward()

    eager_w = tr.tensor([1.0, 2.0], requires_grad=True)
    f(eager_w)
    np.testing.assert_array_equal(eager_w.grad.numpy(), [3.0, 3.0])
    traced_w = tr.tensor([1.0, 2.0], requires_grad=True)
    tr.trace(f)(traced_w)
    assert traced_w.grad is not None, (
        "BUG: under @trace an in-place change under no_grad rebinds y to a stop_gradient value, so "
        "y.sum().backward() no longer reaches w (eager and PyTorch give w.grad == 3)")
    np.testing.assert_array_equal(traced_w.grad.numpy(), [3.0, 3.0])
