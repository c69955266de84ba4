"""The benchmark programs (benchmarks/) cannot rot: each workload's check against its float64
reference, at tiny sizes, with the tracer and numpy only (no timing, no jax, and torch only as the
float64 reference of the higher-order steps)."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import (compile_time, cross_entropy, dispatch, first_result, gelu,  # noqa: E402
                        layer_norm, two_layer)
from benchmarks.harness import checked_run  # noqa: E402


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
