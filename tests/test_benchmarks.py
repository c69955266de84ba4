"""The benchmark programs (benchmarks/) cannot rot: each workload's check against its float64
reference, at tiny sizes, with the tracer and numpy (no timing, and torch only as the float64
reference of the higher-order steps); and the jax.jit programs where jax is installed (the bench
extra, which `make test` leaves out), in a process of their own."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import (compile_time, cross_entropy, dispatch, first_result, gelu,  # noqa: E402
                        layer_norm, two_layer)
from benchmarks.harness import checked_run  # noqa: E402
from benchmarks.peers import installed  # noqa: E402

# The tests of the jax programs run in a fresh process (test_the_jax_programs_in_a_fresh_process):
# importing jax into this one would change what later tests find -- ml_dtypes, which jax loads,
# gives numpy a bfloat16 (tests/test_nn_utils.py checks that a bfloat16 file is refused because
# numpy lacks it), and jax's threads make each os.fork() of a later test warn.
JAX_PROCESS = "TRACER_TEST_JAX_PROGRAMS"
requires_jax = pytest.mark.skipif(os.environ.get(JAX_PROCESS) != "1",
                                  reason="run by test_the_jax_programs_in_a_fresh_process")


def jax_program(programs):
    (program,) = [p for p in programs if p.peer == "jax.jit"]
    return program


@pytest.mark.parametrize("make_program", [two_layer.tracer_program, two_layer.numpy_program])
def test_training_step(make_program):
    inputs = two_layer.make_inputs((8, 12, 6, 3))
    expected, scales = two_layer.reference(inputs, 1e-3)
    checked_run(make_program(inputs, 1e-3), expected, two_layer.TOLERANCE, scales)


@pytest.mark.parametrize("module, size", [(gelu, 1000), (layer_norm, (6, 32)),
                                          (cross_entropy, (5, 7))])
@pytest.mark.parametrize("peer", ["tracer", "numpy"])
def test_forward_backward(module, size, peer):
    inputs = module.make_inputs(size)
    program = module.tracer_program(inputs) if peer == "tracer" else module.numpy_program(inputs)
    checked_run(program, module.reference(inputs), module.TOLERANCE)


@pytest.mark.parametrize("kind", ["value", "gradient"])
def test_dispatch(kind):
    x = dispatch.make_input()
    programs = dispatch.tracer_and_numpy_programs(x)[kind]
    for program in programs:
        checked_run(program, dispatch.reference(x)[kind], dispatch.TOLERANCE)


def test_compile_time_chain():
    x = np.random.default_rng(0).standard_normal(compile_time.SIZE).astype(np.float32)
    assert compile_time.first_call_seconds(compile_time.tracer_compile, x, 3) > 0


def test_first_result_in_a_fresh_process():
    assert first_result.first_result_seconds("tracer", warm=False) > 0


def test_transformer_training_step():
    from benchmarks import transformer
    inputs = transformer.make_inputs((2, 4, 1, 2, 8))
    expected, scales = transformer.reference(inputs)
    checked_run(transformer.tracer_program(inputs), expected, transformer.TOLERANCE, scales)
    checked_run(transformer.tracer_model_program(inputs), expected, transformer.TOLERANCE,
                scales)


def test_cnn_training_step():
    from benchmarks import cnn
    inputs = cnn.make_inputs((3, 2, 4, 8))
    expected, scales = cnn.reference(inputs, use_torch=False)
    checked_run(cnn.tracer_program(inputs), expected, cnn.TOLERANCE, scales)


def test_mlp_training_step_and_its_kernel_profile():
    from benchmarks import kernel_profile, mlp
    inputs = mlp.make_inputs((6, 10, 8, 3))
    expected, scales = mlp.reference(inputs)
    checked_run(mlp.tracer_program(inputs), expected, mlp.TOLERANCE, scales)
    text = kernel_profile.profile_text("MLP", mlp.tracer_program(inputs).build, calls=2, top=3)
    lines = text.splitlines()
    assert lines[0].startswith("MLP: ") and "by kind: " in lines[1] and "matmul" in lines[1]
    assert len(lines) == 5 and all("x floor" in line for line in lines[2:])


def test_the_thread_scaling_probe_times_each_kernel_on_one_and_two_threads():
    from benchmarks import mlp, thread_scaling
    build = mlp.tracer_program(mlp.make_inputs((64, 10, 8, 3))).build
    lines = thread_scaling.lines(build, calls=2, top=2)
    assert lines[0].startswith("1 thread: median call ") and lines[1].startswith("2 threads: ")
    assert lines[2].startswith("  two-thread launches a call: shared ")
    kinds = [line for line in lines[3:] if "): 1 thread " in line]
    assert any(line.split()[0] == "matmul" for line in kinds)
    kernels = [line for line in lines if line.lstrip().startswith("kernel_")]
    assert len(kernels) == 2 and len(lines) == 3 + len(kinds) + 2
    assert all(float(line.split("1 thread")[1].split()[0]) > 0 for line in kernels)


def test_the_capture_cost_probe_reports_each_way_of_reaching_a_tensor():
    # (it reads a traced function's compiled entry: a change of that private call breaks it,
    # which the whole `make bench` run found before this test)
    from benchmarks import capture_cost
    lines = capture_cost.lines(repeats=2, budget=0.2)
    assert [line.split(":")[0] for line in lines[-3:]] == ["arguments", "model object",
                                                          "global tensor"]
    assert all(float(line.split("guard check ")[1].split()[0]) > 0 for line in lines[-3:])


@pytest.mark.parametrize("workload, size", [("pinn_workload", 16), ("wgan_workload", (8, 8)),
                                            ("per_sample_workload", (4, 3, 5, 2))])
def test_higher_order_steps(workload, size):
    # (their float64 reference is PyTorch's eager step, installed with the test dependencies)
    from benchmarks import higher_order
    programs, expected, scales = getattr(higher_order, workload)(size)
    dtype = next(d for _, _, w, d in higher_order.WORKLOADS if w.__name__ == workload)
    checked_run(programs[0], expected, higher_order.TOLERANCE[dtype], scales)


def test_per_sample_gradient_norms_batched_and_unrolled():
    # the probe's two tracer steps, tiny: the vmap pass against one gradient per sample
    import tracer as tr
    from benchmarks import per_sample_gradients

    params, x, y = per_sample_gradients.make_arguments(batch=3, dtype=np.float64)
    arguments = ({k: tr.tensor(v) for k, v in params.items()}, tr.tensor(x), tr.tensor(y))
    batched, unrolled = per_sample_gradients.tracer_steps()
    norms = batched(*arguments).numpy()
    assert norms.shape == (3,) and np.all(norms > 0)
    np.testing.assert_allclose(norms, unrolled(*arguments).numpy(), rtol=1e-12)


def test_the_thread_probe_times_a_step_in_a_fresh_process(tmp_path, monkeypatch):
    # benchmarks/threads.py: one setting of one workload, briefly; what its line reads is a time
    from benchmarks import threads

    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    seconds = threads.measure("seed", one_thread=True, busy=False, seconds=0.05)
    assert 0 < seconds < 5


# The jax.jit programs -------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                    reason="jax is not installed (the bench extra)")
def test_the_jax_programs_in_a_fresh_process():
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", __file__, "-k", "test_jax_"],
        env={**os.environ, JAX_PROCESS: "1"}, capture_output=True, text=True)
    summary = (finished.stdout.strip().splitlines() or [""])[-1]
    assert finished.returncode == 0 and "passed" in summary and "skipped" not in summary, (
        finished.stdout[-5000:] + finished.stderr[-2000:])

@requires_jax
def test_jax_training_step():
    inputs = two_layer.make_inputs((8, 12, 6, 3))
    expected, scales = two_layer.reference(inputs, 1e-3)
    checked_run(jax_program(two_layer.jax_step_programs(inputs, 1e-3)), expected,
                two_layer.TOLERANCE, scales)


@requires_jax
@pytest.mark.parametrize("module, size, make_programs", [
    (gelu, 1000, "jax_gelu_programs"), (layer_norm, (6, 32), "jax_layer_norm_programs"),
    (cross_entropy, (5, 7), "jax_cross_entropy_programs")])
def test_jax_forward_backward(module, size, make_programs):
    inputs = module.make_inputs(size)
    checked_run(jax_program(getattr(module, make_programs)(inputs)), module.reference(inputs),
                module.TOLERANCE)


@requires_jax
@pytest.mark.parametrize("kind", ["value", "gradient"])
def test_jax_dispatch(kind):
    x = dispatch.make_input()
    checked_run(jax_program(dispatch.jax_dispatch_programs(x)[kind]), dispatch.reference(x)[kind],
                dispatch.TOLERANCE)


@requires_jax
def test_jax_model_steps():
    from benchmarks import cnn, mlp, transformer
    inputs = mlp.make_inputs((6, 10, 8, 3))
    expected, scales = mlp.reference(inputs)
    checked_run(jax_program(mlp.jax_mlp_programs(inputs)), expected, mlp.TOLERANCE, scales)
    inputs = transformer.make_inputs((2, 4, 1, 2, 8))
    expected, scales = transformer.reference(inputs)
    checked_run(jax_program(transformer.jax_transformer_programs(inputs)), expected,
                transformer.TOLERANCE, scales)
    inputs = cnn.make_inputs((3, 2, 4, 8))
    expected, scales = cnn.reference(inputs, use_torch=False)
    checked_run(jax_program(cnn.jax_cnn_programs(inputs)), expected, cnn.TOLERANCE, scales)


@requires_jax
def test_jax_batch_norm_statistics_are_torchs():
    # the benchmark checks the CNN step's loss and parameters; its new running statistics, which
    # no later result of the step reads, are checked here against torch's BatchNorm2d
    import torch
    from benchmarks import cnn
    jnp = installed("jax").numpy
    size, weights, (x, y) = cnn.make_inputs((3, 2, 4, 8))
    model = cnn.torch_cnn(size).double()
    model.load_state_dict({name: torch.tensor(value) for name, value in weights.items()})
    expected_loss = model.loss(torch.tensor(x, dtype=torch.float64), torch.tensor(y))
    params = {k: jnp.asarray(v) for k, v in weights.items() if k.endswith(("weight", "bias"))}
    statistics = {k: jnp.asarray(v) for k, v in weights.items() if "running" in k}
    loss, updated = cnn.jax_cnn_loss(params, statistics, jnp.asarray(x), jnp.asarray(y))
    assert abs(float(loss) - expected_loss.item()) < 1e-5 * abs(expected_loss.item())
    assert sorted(updated) == sorted(statistics)
    for name, value in updated.items():
        np.testing.assert_allclose(np.asarray(value), model.state_dict()[name].numpy(),
                                   rtol=1e-5, atol=1e-6)


@requires_jax
@pytest.mark.parametrize("workload, size", [("pinn_workload", 16), ("wgan_workload", (8, 8)),
                                            ("per_sample_workload", (4, 3, 5, 2))])
def test_jax_higher_order_steps(workload, size):
    from benchmarks import higher_order
    programs, expected, scales = getattr(higher_order, workload)(size)
    dtype = next(d for _, _, w, d in higher_order.WORKLOADS if w.__name__ == workload)
    checked_run(jax_program(programs), expected, higher_order.TOLERANCE[dtype], scales)


def test_the_own_gemm_benchmark_times_every_shape_and_the_peak():
    from benchmarks import own_gemm
    if not native_blas():
        pytest.skip("no OpenBLAS to compare with")
    lines = own_gemm.shapes(rounds=1)
    assert len(lines) == len(own_gemm.SHAPES)
    assert all("own " in line and "OpenBLAS " in line and "own/OpenBLAS time" in line
               for line in lines)
    assert own_gemm.peak().endswith(" GF/s")


def native_blas() -> bool:
    from tracer.runtime import native
    return native.blas_available()
