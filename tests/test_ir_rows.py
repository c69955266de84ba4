"""Row kernels (ir/rows.py, ir/schedule_reduce.py): a layer norm, a softmax and their gradients
run row by row in one kernel. Checked against PyTorch (forward and backward, float32 and
float64, random shapes: rows shorter and longer than the cache bound, sizes 0 and 1, rows of
several axes), the loop IR interpreter against the native code, and 1, 2 and 4 threads giving
the same bits. Every compiled call is also checked against the reference interpreter
(tests/conftest.py). How many times the kernels stream the large tensors through memory is
counted from the fused kernels."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tracer as tr
import tracer.nn.functional as F
from tracer import ir
from tracer.ir.loop_interpreter import run_program
from tracer.runtime.compiled import CompiledFunction
from tracer.runtime.pipeline import compile_graph
from torch_oracle import compare_with_torch



@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))


def layer_norm_step(x, weight, bias, grad_output):
    """Layer norm composed as users write it, forward and backward (the benchmark's program);
    the same code runs on tracer and torch tensors."""
    mean = x.mean(dim=-1, keepdim=True)
    centered = x - mean
    variance = (centered * centered).mean(dim=-1, keepdim=True)
    y = centered / (variance + 1e-5).sqrt() * weight + bias  # (a global float: a runtime input)
    y.backward(grad_output)
    return y.detach(), x.grad, weight.grad, bias.grad


def cross_entropy_step(logits, targets):
    """Softmax cross-entropy against probabilities, forward and backward (the benchmark's)."""
    shifted = logits - logits.max(dim=1, keepdim=True).values
    log_probabilities = shifted - shifted.exp().sum(dim=1, keepdim=True).log()
    loss = -(targets * log_probabilities).sum() / logits.shape[0]
    loss.backward()
    return loss.detach(), logits.grad


def layer_norm_arrays(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [(3 * rng.standard_normal(shape) + 1).astype(dtype),
            (1 + 0.1 * rng.standard_normal(shape[-1:])).astype(dtype),
            (0.1 * rng.standard_normal(shape[-1:])).astype(dtype),
            rng.standard_normal(shape).astype(dtype)]


def cross_entropy_arrays(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    targets = np.abs(rng.standard_normal(shape)).astype(dtype)
    targets /= np.maximum(targets.sum(1, keepdims=True), 1e-3)
    return [(3 * rng.standard_normal(shape)).astype(dtype), targets]


def tracer_arguments(step, arrays):
    """The step's tensors: the ones it differentiates with respect to require grad."""
    differentiated = 3 if step is layer_norm_step else 1
    return [tr.tensor(a, requires_grad=n < differentiated) for n, a in enumerate(arrays)]


def torch_results(step, arrays):
    differentiated = 3 if step is layer_norm_step else 1
    tensors = [torch.tensor(a, requires_grad=n < differentiated) for n, a in enumerate(arrays)]
    return [r.detach().numpy() for r in step(*tensors)]


def compiled(step, arrays) -> CompiledFunction:
    """The step's optimized program, compiled under the current settings (thread count)."""
    text = tr.trace(step).ir(*tracer_arguments(step, arrays), stage="optimized")
    return compile_graph(ir.parse_function(text))


def assert_close_to_torch(results, expected, dtype):
    """The step's results (a compiled program's first outputs; the rest are the .grad it writes
    back) against PyTorch's."""
    rtol, atol = (1e-4, 1e-5) if dtype == np.float32 else (1e-10, 1e-12)
    assert len(results) >= len(expected)
    for actual, wanted in zip(results, expected):
        actual = np.asarray(actual)
        scale = max(1.0, float(np.abs(wanted).max(initial=0.0)))
        np.testing.assert_allclose(actual, wanted, rtol=rtol, atol=atol * scale)


def kinds(function: CompiledFunction) -> list[str]:
    return [kernel.kind for kernel in function.fused.kernels]


def passes(function: CompiledFunction, size: int) -> int:
    """How many times the kernels read or write a buffer of `size` elements: the passes over
    memory of the large tensors."""
    return sum(value.type.size == size for kernel in function.fused.kernels
               for value in (*kernel.inputs, *kernel.results))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_forward_and_backward_is_one_row_kernel(dtype):
    arrays = layer_norm_arrays((37, 24), dtype)
    function = compiled(layer_norm_step, arrays)
    # the column sums (weight and bias gradients) are added up by chunks of rows, then combined
    assert kinds(function) == ["rows", "combine"]
    # x and grad_output are read once, y and x.grad written once
    assert passes(function, 37 * 24) == 4
    fused = function.stage_text("fused")
    # kept for the later parts, divisions they would each compute again: the normalized row
    # (%15) and the output's gradient times the weight over the deviation (%26), which the
    # gradient's row sum reads in a pass of its own before the gradient's loop
    assert "kernel_0 rows[37] in 32 chunks keeping rows of %15, %26(" in fused
    assert "kernel_1 combine of 32 chunks(" in fused
    assert_close_to_torch(function(arrays), torch_results(layer_norm_step, arrays), dtype)
    # through the API: the same results (conftest compares them with the reference interpreter)
    traced = tr.trace(layer_norm_step)(*tracer_arguments(layer_norm_step, arrays))
    assert_close_to_torch([t.numpy() for t in traced], torch_results(layer_norm_step, arrays),
                          dtype)


def test_softmax_cross_entropy_is_one_row_kernel_and_its_loss_a_total_by_chunks():
    # (19 classes: a loop of fewer than two vectors' iterations gets no vectorization hint)
    arrays = cross_entropy_arrays((50, 19), np.float32)
    function = compiled(cross_entropy_step, arrays)
    # the loss: a total over the rows by chunks, combined, then divided by the batch size
    assert kinds(function) == ["rows", "combine", "loop"]
    assert passes(function, 50 * 19) == 3  # reads logits and targets, writes the gradient
    text = function.stage_text("loops")
    assert "kernel_0 rows, range [0, 32) (chunks of 50 rows):" in text
    # the exponentials, which the sum, the loss's gradient and its row sum read, are computed
    # once per element: the sum's loop stores them into the chunk's row, later loops load them
    fused = function.stage_text("fused")
    (exponentials,) = set(re.findall(r"(%\d+) : f32\[50,19\] = exp ", fused))
    assert f"keeping rows of {exponentials}(" in fused
    assert text.count(" = exp ") == 1
    # (and once more at the argmax, where its gradient gets the max's: ir/one_hot.py; and by
    # the gradient's row sum, a loop of its own: tests/test_scaled_sums.py says why)
    assert text.count("store out1[") == 1 and text.count("= load out1[") == 3
    assert_close_to_torch(function(arrays), torch_results(cross_entropy_step, arrays),
                          np.float32)
    # a float32 loop that sums in float64 runs its float32 work at full width, 8 lanes
    assert '!"llvm.loop.vectorize.width", i32 8' in function.llvm_ir
    assert "fpext <8 x float>" in function.stage_text("llvm")


# User-facing functions of rows: the forward alone reads the input once and writes the result
# once; the forward and backward together read the input and the incoming gradient once and
# write the result and the gradient once (tr.value_and_grad of sum(f(x) * g) returns both).
ROW_FUNCTIONS = [
    ("softmax", lambda x: F.softmax(x, dim=-1), lambda x: torch.softmax(x, dim=-1)),
    ("log_softmax", lambda x: F.log_softmax(x, dim=-1), lambda x: torch.log_softmax(x, dim=-1)),
    ("logsumexp", lambda x: F.logsumexp(x, -1), lambda x: torch.logsumexp(x, -1)),
    ("layer_norm", lambda x: F.layer_norm(x, (x.shape[-1],)),
     lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],))),
]


@pytest.mark.parametrize("name, function, torch_function", ROW_FUNCTIONS,
                         ids=[case[0] for case in ROW_FUNCTIONS])
def test_row_functions_make_at_most_two_passes_forward_and_two_backward(
        name, function, torch_function):
    x = np.random.default_rng(3).standard_normal((40, 24)).astype(np.float32)
    g = np.random.default_rng(4).standard_normal(torch_function(torch.tensor(x)).shape).astype(
        np.float32)

    def forward_backward(x, g):
        return tr.value_and_grad(lambda x: (function(x) * g).sum())(x)

    for program, most in ((function, 2), (forward_backward, 4)):
        arguments = [x] if program is function else [x, g]
        text = tr.trace(program).ir(*arguments, stage="optimized")
        compiled_program = compile_graph(ir.parse_function(text))
        assert "rows" in kinds(compiled_program), name
        assert passes(compiled_program, x.size) <= most, compiled_program.stage_text("fused")
    compare_with_torch(function, torch_function, [x], traced=True)


def test_cross_entropy_with_labels_against_torch():
    """Integer labels pick the log-probabilities with a gather, which reads them at a computed
    column: the pick is not taken into the row kernel, but the result is PyTorch's."""
    rng = np.random.default_rng(5)
    logits, labels = rng.standard_normal((30, 7)), rng.integers(0, 7, 30)
    compare_with_torch(lambda x, y: F.cross_entropy(x, y),
                       lambda x, y: torch.nn.functional.cross_entropy(x, y),
                       [logits, labels], traced=True)


SHAPES = [(1, 1), (1, 7), (7, 1), (0, 5), (5, 0), (2, 3), (33, 17), (64, 129)]
# (the benchmark's cross-entropy is written for a batch of rows: no rows of several axes)
STEPS = [(layer_norm_step, shape) for shape in [*SHAPES, (3, 4, 10)]] + [
    (cross_entropy_step, shape) for shape in SHAPES]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("step, shape", STEPS, ids=[
    f"{step.__name__}-{'x'.join(map(str, shape))}" for step, shape in STEPS])
def test_row_kernels_on_shapes_against_torch(step, shape, dtype):
    arrays = (layer_norm_arrays if step is layer_norm_step else cross_entropy_arrays)(
        shape, dtype, seed=sum(shape))
    if step is cross_entropy_step and shape[1] == 0:  # no classes: no maximum, in both
        with pytest.raises(IndexError):
            torch_results(step, arrays)
        with pytest.raises(tr.ShapeMismatchError, match="max over an empty dimension"):
            tr.trace(step)(*tracer_arguments(step, arrays))
        return
    results = tr.trace(step)(*tracer_arguments(step, arrays))
    assert_close_to_torch([t.numpy() for t in results], torch_results(step, arrays), dtype)


@pytest.mark.parametrize("bound, grouped", [(1 << 19, True), (200, False)],
                         ids=["row within the cache bound", "row beyond it"])
def test_rows_longer_than_the_cache_bound_stay_separate_kernels(monkeypatch, bound, grouped):
    """One row of x, grad_output, y and x.grad (4 x 60 float32) and the partial column sums
    (2 x 60 float64) take 1920 bytes; beyond the bound the kernels stream the rows as before."""
    monkeypatch.setattr("tracer.ir.rows.ROW_CACHE_BYTES", bound)
    arrays = layer_norm_arrays((9, 60), np.float32)
    function = compiled(layer_norm_step, arrays)
    assert ("rows" in kinds(function)) == grouped
    if not grouped:
        assert passes(function, 9 * 60) > 4
    assert_close_to_torch(function(arrays), torch_results(layer_norm_step, arrays), np.float32)


def test_the_loop_interpreter_runs_a_row_kernel_as_the_native_code_does():
    arrays = layer_norm_arrays((6, 5), np.float64)
    function = compiled(layer_norm_step, arrays)
    native = function(arrays)
    for splits in (1, 2, 3):  # the chunks run as threads would run them, one after the other
        interpreted = run_program(function.loops, arrays, splits=splits)
        for a, b in zip(native, interpreted):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
    expected = ir.interpret(function.function, arrays)
    for a, b in zip(interpreted, expected):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("step", [layer_norm_step, cross_entropy_step],
                         ids=["layer_norm", "cross_entropy"])
def test_one_two_and_four_threads_give_the_same_bits(monkeypatch, step):
    """The chunks of rows depend on the shape only: whichever thread runs a chunk, its rows and
    its partial sums are computed by the same code, and the combine adds the partials in chunk
    order, so every result has the same bits."""
    monkeypatch.setattr("tracer.ir.schedule_threads.PARALLEL_WORK_PER_THREAD", 1)
    arrays = (layer_norm_arrays if step is layer_norm_step else cross_entropy_arrays)(
        (100, 24), np.float32)
    results = {}
    for threads in (1, 2, 4):
        monkeypatch.setenv("TRACER_NUM_THREADS", str(threads))
        function = compiled(step, arrays)
        (rows,) = [k for k in function.kernels if k.kind == "rows"]
        assert rows.threads == threads
        results[threads] = [function(arrays) for _ in range(3)]  # and the same run to run
    first = results[1][0]
    for runs in results.values():
        for run in runs:
            for a, b in zip(run, first):
                np.testing.assert_array_equal(a, b)
    assert_close_to_torch(first, torch_results(step, arrays), np.float32)


def test_a_row_value_read_at_another_row_or_index_is_not_taken_in():
    """x - s.T reads row sums s across a row (a transpose), and s[index] at computed rows (a
    gather): neither can run row by row with the kernel computing s."""
    def program(x, index):
        s = x.sum(1, keepdim=True)
        return x / s.t() + s[index]

    x = np.random.default_rng(6).random((5, 5)) + 1
    index = np.array([4, 0, 2, 2, 1])
    text = tr.trace(program).ir(x, index, stage="optimized")
    function = compile_graph(ir.parse_function(text))
    assert "rows" not in kinds(function)
    (result,) = function([x, index])
    s = x.sum(1, keepdims=True)
    np.testing.assert_allclose(result, x / s.T + s[index], rtol=1e-13)


def test_rows_of_several_axes_and_a_maximum_across_rows():
    """Rows of shape (3, 4) (row numbers split by division), weight and bias gradients summed
    over both row axes, and a maximum across rows (its partials start at -inf, and a nan wins as
    in PyTorch)."""
    arrays = layer_norm_arrays((3, 4, 10), np.float32)
    function = compiled(layer_norm_step, arrays)
    assert kinds(function) == ["rows", "combine"]
    assert "chunks of 12 rows" in function.stage_text("loops")
    assert_close_to_torch(function(arrays), torch_results(layer_norm_step, arrays), np.float32)

    def peaks(x):
        centered = x - x.mean(dim=1, keepdim=True)
        return centered.amax(0), (centered * centered).sum()

    x = np.random.default_rng(7).standard_normal((20, 6))
    x[3, 2] = np.nan
    text = tr.trace(peaks).ir(x, stage="optimized")
    function = compile_graph(ir.parse_function(text))
    assert kinds(function)[:2] == ["rows", "combine"]
    peak, total = function([x])
    centered = torch.tensor(x) - torch.tensor(x).mean(dim=1, keepdim=True)
    np.testing.assert_allclose(peak, centered.amax(0).numpy(), rtol=1e-14)
    assert np.isnan(peak[2]) and np.isnan(total)


def test_a_traced_training_step_with_layer_norm_accumulates_gradients_as_torch():
    """Called twice without zeroing, x.grad and the parameters' .grad add up; the SGD update of
    weight and bias reads the combined column sums."""
    arrays = layer_norm_arrays((16, 8), np.float64)

    def step(x, weight, bias, grad_output):
        layer_norm_step(x, weight, bias, grad_output)
        with torch.no_grad() if isinstance(x, torch.Tensor) else tr.no_grad():
            weight.sub_(0.1 * weight.grad)
            bias.sub_(0.1 * bias.grad)
        return x.grad

    ours = tracer_arguments(layer_norm_step, arrays)
    theirs = [torch.tensor(a, requires_grad=n < 3) for n, a in enumerate(arrays)]
    traced = tr.trace(step)
    for _ in range(2):
        traced(*ours)
        step(*theirs)
    for a, b in zip(ours[:3], theirs[:3]):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_a_model_step_runs_its_layer_norm_backward_and_weight_gradients_in_one_row_kernel():
    """layer_norm -> linear -> cross_entropy with labels -> SGD (x the output of an earlier
    layer, so it gets a gradient): the layer norm's forward is a row kernel before the matmul;
    its backward, after the matmul that gives its incoming gradient, is another, which also sums
    the weight and bias gradients (those kernels came before the backward's row sums, and run
    with them). Two steps against PyTorch's."""
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal((48, 20)), rng.standard_normal((20, 7)) * 0.3,
              1 + 0.1 * rng.standard_normal(20), 0.1 * rng.standard_normal(20)]
    labels = rng.integers(0, 7, 48)

    def step(x, w, weight, bias, labels, library=tr, functional=F):
        logits = functional.layer_norm(x, (20,), weight, bias) @ w
        loss = functional.cross_entropy(logits, labels)
        loss.backward()
        with library.no_grad():
            for parameter in (w, weight, bias):
                parameter.sub_(0.5 * parameter.grad)
                parameter.grad = None
        return loss, x.grad

    ours = [tr.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    traced = tr.trace(step)
    text = traced.ir(*ours, tr.tensor(labels), stage="fused")
    kernels = [line.split(" = kernel_")[1] for line in text.splitlines() if " = kernel_" in line]
    assert [kernel.split("(")[0].split()[1] for kernel in kernels] == [
        "rows[48]", "matmul", "rows[48]", "loop[]", "scatter[48,7]", "rows[48]", "matmul",
        "rows[48]", "combine", "matmul", "loop[20]"]
    # the backward's row kernel reads the matmul's gradient, the forward's values per row and x
    matmul_gradient = text.splitlines()[[" = kernel_6 " in line for line in
                                         text.splitlines()].index(True)].split(" : ")[0].strip()
    assert kernels[7].startswith(f"7 rows[48] in 32 chunks({matmul_gradient}, ")
    assert "%x, " in kernels[7]
    for _ in range(2):
        for a in ours[:1] + theirs[:1]:
            a.grad = None
        loss, x_grad = traced(*ours, tr.tensor(labels))
        expected, expected_grad = step(*theirs, torch.tensor(labels), torch, torch.nn.functional)
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)
        np.testing.assert_allclose(x_grad.numpy(), expected_grad.numpy(), rtol=1e-10,
                                   atol=1e-12)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)


@pytest.mark.parametrize("checked", ["0", "1"], ids=["unchecked", "bounds-checked"])
def test_the_lane_hint_is_only_on_loops_llvm_vectorizes(monkeypatch, capfd, checked):
    """LLVM writes a remark to stderr for a loop it was asked to vectorize and cannot (one that
    returns early at a failed index or bounds check): the hint is left off those, so compiling a
    gather, its scatter-add gradient, bounds checks and row kernels (whose partial sums along a
    reduced trailing axis are stored to the same element again and again, which LLVM
    vectorizes) stays silent."""
    monkeypatch.setenv("TRACER_CHECK_BOUNDS", checked)
    rng = np.random.default_rng(9)
    compare_with_torch(lambda x, y: F.cross_entropy(x, y),
                       lambda x, y: torch.nn.functional.cross_entropy(x, y),
                       [rng.standard_normal((40, 9)).astype(np.float32), rng.integers(0, 9, 40)],
                       traced=True)

    def sums(x):  # sums over the rows and along the first trailing axis: partials kept by column
        centered = x - x.mean(dim=(1, 2), keepdim=True)
        return centered.sum((0, 2)), (centered * centered).sum((0, 1))

    compare_with_torch(sums, sums, [rng.standard_normal((30, 5, 6)).astype(np.float32)],
                       traced=True)
    assert "not vectorized" not in capfd.readouterr().err


def test_a_reduction_read_by_an_earlier_row_kernel_is_not_delayed_past_it():
    """x's column sum k comes before both row kernels; the row kernel over y (which runs where
    y's row sums came, before x's) reads k, so k may not join x's row kernel, which runs later:
    it stays a kernel of its own, before both."""
    def program(x, y):
        k = x.sum(0)
        y_sums = y.sum(1, keepdim=True)
        x_sums = x.sum(1, keepdim=True)
        return x / x_sums, y / y_sums + k

    rng = np.random.default_rng(10)
    x, y = rng.random((6, 4)) + 1, rng.random((5, 4)) + 1
    text = tr.trace(program).ir(x, y, stage="optimized")
    function = compile_graph(ir.parse_function(text))
    assert kinds(function) == ["accumulate", "rows", "rows"]
    x_normalized, y_normalized = function([x, y])
    np.testing.assert_allclose(x_normalized, x / x.sum(1, keepdims=True), rtol=1e-14)
    np.testing.assert_allclose(y_normalized, y / y.sum(1, keepdims=True) + x.sum(0), rtol=1e-14)


def test_the_verifier_checks_a_loop_bound_in_a_register():
    """A chunk's loop over its rows runs between registers: they must be defined before it."""
    from tracer.ir.loops import Loop, nested_statements
    from tracer.ir.verify import VerificationError
    from tracer.ir.verify_loops import verify_loops
    function = compiled(layer_norm_step, layer_norm_arrays((40, 3), np.float32))
    verify_loops(function.loops)  # as scheduled
    (rows,) = [loop for loop in nested_statements(function.kernels[0].body)
               if isinstance(loop, Loop) and isinstance(loop.end, str) and loop.end != "end"]
    rows.end = "%nowhere"
    with pytest.raises(VerificationError, match="%nowhere is used where it is not defined"):
        verify_loops(function.loops)
