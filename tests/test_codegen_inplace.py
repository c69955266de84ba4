"""In-place updates: outputs written straight into the parameter's buffer where that is safe (no
copy back), the fallbacks where it is not, and the update fused into the gemm that computes the
gradient."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tracer import ir
import tracer as tr
from tracer.ir.loops import Gemm, Loop
from tracer.ir.types import TensorType
from tracer.runtime import native
from tracer.runtime.compiled import CompiledFunction
from tracer.runtime.pipeline import compile_graph
from two_layer_net import make_data, step


def update_function(dtype="f32", shape=(6, 5)) -> ir.Graph:
    """(w - lr * g, zeros): a parameter update and a gradient reset."""
    f = ir.Graph("update")
    w = f.add_parameter("w", TensorType(shape, dtype))
    g = f.add_parameter("g", TensorType(shape, dtype))
    lr = f.add_parameter("lr", TensorType((), dtype))
    b = ir.GraphBuilder(f)
    f.outputs = [b.reduce_sum(w, tuple(range(len(shape)))), b.sub(w, b.mul(lr, g)),
                 b.full(shape, 0, dtype)]
    return ir.optimize(f)


def arrays_for(function: ir.Graph, seed=0):
    rng = np.random.default_rng(seed)
    return [np.asarray((rng.normal(size=p.shape) * 10).astype(p.dtype)) for p in function.parameters]


@pytest.mark.parametrize("dtype", ["f32", "f64", "i64"])
def test_outputs_written_into_parameters(dtype):
    function = update_function(dtype)
    compiled = compile_graph(function, write_into={1: 0, 2: 1})
    assert compiled.in_place == {1: 0, 2: 1}
    arguments = arrays_for(function)
    w, g = arguments[0], arguments[1]
    expected = ir.interpret(function, [a.copy() for a in arguments])
    outputs = compiled(arguments)
    assert outputs[1] is w and outputs[2] is g  # written in place: nothing to copy back
    for actual, wanted in zip(outputs, expected):
        np.testing.assert_array_equal(actual, wanted) if dtype == "i64" else \
            np.testing.assert_allclose(actual, wanted, rtol=1e-6)
    assert not np.shares_memory(outputs[0], w)


@pytest.mark.parametrize("make", [
    lambda a: np.asfortranarray(a),                       # not C-contiguous
    lambda a: a.astype(np.float64),                       # another dtype: converted
    lambda a: np.lib.stride_tricks.as_strided(a, writeable=False),  # read-only
    lambda a: np.ascontiguousarray(np.repeat(a, 2, axis=1)[:, ::2]),  # a plain copy: fine
])
def test_unusable_argument_runs_on_a_copy(make):
    function = update_function("f32")
    compiled = compile_graph(function, write_into={1: 0, 2: 1})
    arguments = arrays_for(function)
    expected = ir.interpret(function, [a.copy() for a in arguments])
    arguments[0] = make(arguments[0])
    before = arguments[0].copy()
    outputs = compiled(arguments)
    usable = (arguments[0].flags.c_contiguous and arguments[0].dtype == np.float32
              and arguments[0].flags.writeable)
    assert (outputs[1] is arguments[0]) == usable
    if not usable:
        np.testing.assert_array_equal(arguments[0], before)  # untouched: the caller copies back
    np.testing.assert_allclose(outputs[1], expected[1], rtol=1e-6)
    np.testing.assert_allclose(outputs[0], expected[0], rtol=1e-5)


def test_overlapping_arguments_run_on_a_copy():
    function = update_function("f64", (4, 4))
    compiled = compile_graph(function, write_into={1: 0, 2: 1})
    storage = np.arange(16.0).reshape(4, 4)
    lr = np.array(0.5)
    expected = ir.interpret(function, [storage.copy(), storage.copy(), lr])
    outputs = compiled([storage, storage, lr])  # w and g are the same buffer
    assert outputs[1] is not storage and outputs[2] is not storage
    np.testing.assert_array_equal(storage, np.arange(16.0).reshape(4, 4))
    for actual, wanted in zip(outputs, expected):
        np.testing.assert_allclose(actual, wanted)


def test_refused_when_unsafe():
    f = ir.Graph("unsafe")
    w = f.add_parameter("w", TensorType((5, 5), "f64"))
    v = f.add_parameter("v", TensorType((5, 5), "f64"))
    b = ir.GraphBuilder(f)
    new_w = b.add(w, b.swap_last_axes(w))          # reads w transposed while writing it
    new_v = b.mul(v, 2.0)
    later = b.op("matmul", b.swap_last_axes(v), new_v)  # reads the old v after the update
    f.outputs = [new_w, new_v, later, new_v]
    f = ir.optimize(f)
    compiled = compile_graph(f, write_into={0: 0, 1: 1})
    assert compiled.in_place == {}
    assert set(compiled.plan.refused) == {0, 1}
    arguments = arrays_for(f)
    expected = ir.interpret(f, [a.copy() for a in arguments])
    original = [a.copy() for a in arguments]
    for actual, wanted in zip(compiled(arguments), expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-12)
    for a, o in zip(arguments, original):
        np.testing.assert_array_equal(a, o)
    # the same value written back to two parameters, or also returned: not in place
    g = ir.Graph("twice")
    x = g.add_parameter("x", TensorType((3,), "f64"))
    g.add_parameter("y", TensorType((3,), "f64"))  # the second target
    doubled = ir.GraphBuilder(g).mul(x, 2.0)
    g.outputs = [doubled, doubled]
    assert compile_graph(g, write_into={0: 0, 1: 1}).in_place == {}
    assert compile_graph(g, write_into={1: 0}).in_place == {}
    assert compile_graph(g, write_into={0: 1, 1: 1}).in_place == {}


def test_traced_sgd_step_updates_the_users_buffers():
    x, y, w1, w2 = make_data(N=8, D_in=12, H=6, D_out=3)
    traced = tr.trace(step)
    reference = [t.detach().clone().requires_grad_() for t in (w1, w2)]
    for _ in range(3):
        buffers = (w1._handle, w2._handle, None if w1.grad is None else w1.grad._handle)
        traced(x, y, w1, w2, 1e-3)
        assert w1._handle is buffers[0] and w2._handle is buffers[1]
        if buffers[2] is not None:
            assert w1.grad._handle is buffers[2]
    for _ in range(3):
        step(x, y, *reference, 1e-3)
    np.testing.assert_allclose(w1.detach().numpy(), reference[0].detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w2.detach().numpy(), reference[1].detach().numpy(), rtol=1e-5, atol=1e-6)
    entry = traced._signatures.entries[next(reversed(traced._signatures.entries))]
    # w1, w1.grad, w2, w2.grad all written in place
    assert len(entry.executable.in_place) == 4


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_traced_in_place_on_numpy_arguments(dtype):
    @tr.trace
    def bump(a, b):
        a.add_(b * 2)
        return a.sum()

    a = np.arange(6, dtype=dtype).reshape(2, 3)
    b = np.ones((2, 3), dtype)
    view = a
    total = bump(a, b)
    assert view is a and np.array_equal(a, np.arange(6).reshape(2, 3) + 2)
    assert total.item() == a.sum()
    # a Fortran-ordered argument (another signature): copied back, same result
    f = np.asfortranarray(np.arange(6, dtype=dtype).reshape(2, 3))
    bump(f, b)
    assert np.array_equal(f, np.arange(6).reshape(2, 3) + 2) and f.flags.f_contiguous
    # the same buffer passed twice through two views: the traced function took them for separate
    # values, which in general gives another answer than eager mode; refused, nothing changed
    c = np.arange(6, dtype=dtype).reshape(2, 3)
    with pytest.raises(tr.ArgumentError, match="shares memory"):
        bump(c, c[:])
    assert np.array_equal(c, np.arange(6).reshape(2, 3))


# The update fused into the gemm ------------------------------------------------------------------

needs_blas = pytest.mark.skipif(not native.blas_available(), reason="no BLAS gemm found")


def linear_update(variant: str, dtype="f64") -> ir.Graph:
    f = ir.Graph("linear_update")
    w = f.add_parameter("w", TensorType((7, 5), dtype))
    x = f.add_parameter("x", TensorType((3, 7), dtype))
    g = f.add_parameter("g", TensorType((3, 5), dtype))
    lr = f.add_parameter("lr", TensorType((), "f64"))
    b = ir.GraphBuilder(f)
    s = b.op("cast", lr, dtype=ir.types.as_dtype(dtype))
    m = b.op("matmul", b.swap_last_axes(x), g)
    new = {"sub_left": lambda: b.sub(w, b.mul(s, m)),
           "sub_right": lambda: b.sub(w, b.mul(m, s)),
           "add": lambda: b.add(b.mul(s, m), w),
           "neg": lambda: b.add(w, b.op("neg", b.mul(s, b.mul(m, s)))),
           "plain": lambda: b.sub(w, m),
           "with_grad": lambda: b.sub(w, b.mul(s, b.add(w, m))),
           }[variant]()
    f.outputs = [new]
    return ir.optimize(f)


@needs_blas
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("variant", ["sub_left", "sub_right", "add", "neg", "plain", "with_grad"])
@pytest.mark.parametrize("in_place", [True, False])
def test_update_fused_into_the_gemm(variant, dtype, in_place):
    function = linear_update(variant, dtype)
    compiled = compile_graph(function, write_into={0: 0} if in_place else None)
    fused = compiled.stage_text("fused")
    assert fused.count("kernel_") == 1 and "accumulate(" in fused and "beta=1" in fused
    assert compiled.plan.arena_size == 0  # the product is never stored
    assert compiled.in_place == ({0: 0} if in_place else {})
    arguments = arrays_for(function, seed=5)
    arguments[3] = np.array(0.25)
    w = arguments[0]
    expected = ir.interpret(function, [a.copy() for a in arguments])[0]
    (actual,) = compiled(arguments)
    assert (actual is w) == in_place
    rtol = 2e-5 if dtype == "f32" else 1e-12
    scale = np.abs(expected).max()
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


@needs_blas
def test_seed_step_updates_with_one_gemm_and_no_gradient_buffer():
    x, y, w1, w2 = make_data()
    traced = tr.trace(step)
    traced(x, y, w1, w2, 1e-6)  # first call: no .grad yet (w1 - lr * x^T g)
    fused = traced.ir(x, y, w1, w2, 1e-6, stage="fused")  # later calls: w1 - lr * (w1.grad + ...)
    # both updates scale by the same -learning_rate (its SSA number moves with the compositions)
    alphas = re.findall(r"matmul accumulate\(alpha=-(%\d+), beta=1\)", fused)
    assert len(alphas) == 2 and alphas[0] == alphas[1], fused
    # no kernel stores the weight gradients: the matmuls that compute them are inside the updates
    assert all("f32[1000,100]" not in line or "accumulate" in line or "broadcast" in line
               or "loop[1000,100]()" in line
               for line in fused.splitlines() if " = kernel_" in line), fused
    entry = traced._signatures.entries[next(reversed(traced._signatures.entries))]
    compiled = getattr(entry.executable, "compiled", entry.executable)  # conftest wraps it
    assert compiled.plan.arena_size < 1000 * 100 * 4  # no gradient-sized temporary
    assert len(compiled.in_place) == 4
    llvm = compiled.llvm_ir
    # beta = 1.0 in the two update gemms
    assert llvm.count(", float 0x3FF0000000000000, ptr %pc") == 2
    before = (w1._handle, w1.grad._handle)
    loss = traced(x, y, w1, w2, 1e-6)
    assert (w1._handle, w1.grad._handle) == before and np.isfinite(loss.item())
    # the first-call signature (no .grad): the update is the gemm alone, into w1 in place
    first = traced._signatures.entries[next(iter(traced._signatures.entries))].executable
    first = getattr(first, "compiled", first)
    updates = [kernel for kernel in first.loops.kernels
               if any(isinstance(s, Gemm) and s.accumulate for s in kernel.body)]
    assert first.in_place and updates and not any(isinstance(s, Loop) for kernel in updates
                                                  for s in kernel.body)


def test_seed_step_without_blas(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "blas_available", lambda: False)
    x, y, w1, w2 = make_data(N=16, D_in=40, H=12, D_out=3)
    reference = [t.detach().clone().requires_grad_() for t in (w1, w2)]
    traced = tr.trace(step)
    for _ in range(3):
        traced(x, y, w1, w2, 1e-4)
        step(x, y, *reference, 1e-4)
    fused = traced.ir(x, y, w1, w2, 1e-4, stage="fused")
    assert "accumulate(" not in fused and "tracer_sgemm" not in traced.ir(
        x, y, w1, w2, 1e-4, stage="llvm")
    np.testing.assert_allclose(w1.detach().numpy(), reference[0].detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(w2.detach().numpy(), reference[1].detach().numpy(), rtol=1e-5,
                               atol=1e-6)


def test_generated_loop_nest_accumulates_too(monkeypatch, tmp_path):
    """The matmul template's accumulate mode without a gemm (not chosen by the runtime today:
    it rounds term by term), in float64 against the interpreter."""
    import tracer.runtime.back_end
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "blas_available", lambda: False)
    monkeypatch.setattr(tracer.runtime.back_end, "fuse", lambda f, matmul_updates: ir.fusion.fuse(f))
    function = linear_update("with_grad", "f64")
    compiled = compile_graph(function, write_into={0: 0})
    assert "accumulate(" in compiled.stage_text("fused") and "tracer_dgemm" not in \
        compiled.llvm_ir
    arguments = arrays_for(function, seed=9)
    expected = ir.interpret(function, [a.copy() for a in arguments])[0]
    (actual,) = compiled(arguments)
    assert actual is arguments[0]
    np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())


# The fast call path --------------------------------------------------------------------------------

def general_path_calls(monkeypatch) -> list:
    """A list that gets an entry for every compiled call taking the general (Python) path instead
    of the native fast entry; the test is skipped where the fast entry cannot be built."""
    from tracer.runtime.code_settings import array_layout
    if array_layout() is None:
        pytest.skip("numpy's array struct layout not recognized: general path only")
    general = []
    original = CompiledFunction._call
    monkeypatch.setattr(CompiledFunction, "_call",
                        lambda self, arguments, share=False: general.append(1)
                        or original(self, arguments, share))
    return general


def test_fast_path_is_taken_for_plain_arrays_and_refused_otherwise(monkeypatch):
    function = update_function("f32")
    compiled = compile_graph(function, write_into={1: 0, 2: 1})
    general = general_path_calls(monkeypatch)
    arguments = arrays_for(function)
    expected = ir.interpret(function, [a.copy() for a in arguments])
    outputs = compiled(arguments)
    assert not general and outputs[1] is arguments[0]
    np.testing.assert_allclose(outputs[1], expected[1], rtol=1e-6)
    # refused by the native checks: not C-contiguous, read-only target, overlapping target
    cases = [np.asfortranarray(arrays_for(function)[0]),
             np.lib.stride_tricks.as_strided(arrays_for(function)[0], writeable=False)]
    for case in cases:
        arguments = arrays_for(function)
        arguments[0] = case
        expected = ir.interpret(function, [np.array(a) for a in arguments])
        outputs = compiled(arguments)
        assert outputs[1] is not case
        np.testing.assert_allclose(outputs[1], expected[1], rtol=1e-6)
    shared = arrays_for(function)
    shared[1] = shared[0]
    expected = ir.interpret(function, [np.array(a) for a in shared])
    outputs = compiled(shared)
    np.testing.assert_allclose(outputs[1], expected[1], rtol=1e-6)
    assert len(general) == 3


def many_updates_function(count: int) -> ir.Graph:
    """(w_k - g_k for each k): `count` parameters updated in place, as by an optimizer's step."""
    f = ir.Graph("updates")
    weights = [f.add_parameter(f"w{k}", TensorType((3,), "f32")) for k in range(count)]
    gradients = [f.add_parameter(f"g{k}", TensorType((3,), "f32")) for k in range(count)]
    b = ir.GraphBuilder(f)
    f.outputs = [b.sub(w, g) for w, g in zip(weights, gradients)]
    return ir.optimize(f)


def test_fast_path_overlap_check_is_linear_code_and_refuses_overlaps(monkeypatch):
    """A model's training step writes dozens of parameters (and AdamW's state) in place: the fast
    entry checks each against every other parameter in a loop, so its code grows linearly (its
    unrolled pairs once made LLVM take minutes on the transformer example's step)."""
    count = 40
    function = many_updates_function(count)
    compiled = compile_graph(function, write_into={k: k for k in range(count)})
    assert compiled.in_place == {k: k for k in range(count)}
    fast = compiled.llvm_ir.split("define ptr @tracer_fast(")[1].split("\n}\n")[0]
    # (~33 lines a parameter, its checks; 6 an output: unrolled pairs would be ~3,200 compares)
    assert len(fast.splitlines()) < 40 * (2 * count + count) + 60, "not linear in the parameters"
    general = general_path_calls(monkeypatch)
    arguments = arrays_for(function)
    expected = ir.interpret(function, [a.copy() for a in arguments])
    outputs = compiled(arguments)
    assert not general and all(outputs[k] is arguments[k] for k in range(count))
    for actual, wanted in zip(outputs, expected):
        np.testing.assert_array_equal(actual, wanted)
    # one byte-range overlap among many disjoint buffers, in either order in memory: the last
    # target shares an element with the first gradient (and the other way round)
    for first, second in ((count - 1, count), (count, count - 1)):
        arguments = arrays_for(function, seed=1)
        storage = np.arange(5, dtype=np.float32)
        arguments[first], arguments[second] = storage[0:3], storage[2:5]
        expected = ir.interpret(function, [np.array(a) for a in arguments])
        outputs = compiled(arguments)
        for actual, wanted in zip(outputs, expected):
            np.testing.assert_array_equal(actual, wanted)
    assert len(general) == 2


class _Subclass(np.ndarray):
    """An ndarray subclass: the fast entry takes ndarrays only."""


@pytest.mark.parametrize("case", ["dtype", "dtype object", "shape", "rank", "subclass", "list",
                                  "tuple"])
def test_fast_entry_refuses_what_it_does_not_check_itself(monkeypatch, case):
    """The fast entry checks each argument's type, rank, shape and dtype object natively (not in
    Python): what it does not know takes the general path, which converts it (or says why not)."""
    function = update_function("f32")
    compiled = compile_graph(function, write_into={1: 0, 2: 1})
    general = general_path_calls(monkeypatch)
    arguments = arrays_for(function)
    w, g, lr = (a.astype(np.float64) for a in arguments)
    expected = [w.sum(), w - lr * g, np.zeros_like(w)]  # (update_function's outputs)
    if case == "shape" or case == "rank":
        arguments[1] = arguments[1][:, :4] if case == "shape" else arguments[1].reshape(30)
        with pytest.raises(ValueError, match="argument 1 of update has shape"):
            compiled(arguments)
        assert general == [1]
        return
    if case == "dtype":  # converted: the float64 values rounded to float32
        arguments[1] = arguments[1].astype(np.float64)
    elif case == "dtype object":  # float32, as a dtype object equal to numpy's but not it
        arguments[1] = arguments[1].astype(np.dtype("float32", metadata={"unit": "m"}))
        assert arguments[1].dtype == np.float32 and arguments[1].dtype is not np.dtype("float32")
    elif case == "subclass":
        arguments[0] = arguments[0].view(_Subclass)
    elif case == "list":
        arguments[2] = arguments[2].tolist()  # a float, not an array
    outputs = compiled(tuple(arguments) if case == "tuple" else arguments)
    assert general == [1]
    for actual, wanted in zip(outputs, expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-6, atol=1e-5)
    # and the arrays that are its own still take the fast path
    compiled(arrays_for(function))
    assert general == [1]
