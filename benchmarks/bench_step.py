"""The seed training step (two-layer net with a custom ReLU, SGD update in place), per step.

Compares, in one run: the traced step, the same step in eager mode, a hand-written numpy step (the
floor for an interpreter of the same graph), and PyTorch's eager step and torch.compile where torch
is installed. Prints medians and ratios to the traced step. Run: `make bench` or
`.venv/bin/python benchmarks/bench_step.py [--sizes N D_in H D_out] [--repeats R]`.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import tracer as tr  # noqa: E402
from run import median_time  # noqa: E402  (benchmarks/run.py, beside this file)
from two_layer_net import step  # noqa: E402


def make_arrays(sizes, seed: int = 0):
    generator = np.random.default_rng(seed)
    n, d_in, h, d_out = sizes
    return [generator.standard_normal(shape).astype(np.float32)
            for shape in ((n, d_in), (n, d_out), (d_in, h), (h, d_out))]


def tracer_runner(arrays, traced: bool):
    x, y, w1, w2 = (tr.tensor(a) for a in arrays)
    w1.requires_grad_()
    w2.requires_grad_()
    function = tr.trace(step) if traced else step
    return lambda: function(x, y, w1, w2, 1e-6)


def numpy_runner(arrays):
    x, y, w1, w2 = (a.copy() for a in arrays)
    learning_rate = np.float32(1e-6)

    def run():
        hidden = x @ w1
        relu = np.maximum(hidden, 0)
        prediction = relu @ w2
        difference = prediction - y
        loss = np.sum(difference * difference)
        grad_prediction = 2 * difference
        grad_w2 = relu.T @ grad_prediction
        grad_hidden = grad_prediction @ w2.T
        grad_hidden[hidden < 0] = 0
        grad_w1 = x.T @ grad_hidden
        np.subtract(w1, learning_rate * grad_w1, out=w1)
        np.subtract(w2, learning_rate * grad_w2, out=w2)
        return loss
    return run


def torch_runners(arrays, compile_too: bool):
    try:
        import torch
    except ImportError:
        return {}
    torch.set_num_threads(os.cpu_count() or 1)

    class MyReLU(torch.autograd.Function):
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

    def torch_step(x, y, w1, w2, learning_rate):
        loss = (MyReLU.apply(x.mm(w1)).mm(w2) - y).pow(2).sum()
        loss.backward()
        with torch.no_grad():
            w1.sub_(learning_rate * w1.grad)
            w2.sub_(learning_rate * w2.grad)
            w1.grad.zero_()
            w2.grad.zero_()
        return loss

    def runner(function):
        x, y, w1, w2 = (torch.from_numpy(a.copy()) for a in arrays)
        w1.requires_grad_()
        w2.requires_grad_()
        return lambda: function(x, y, w1, w2, 1e-6)

    runners = {f"torch {torch.__version__} eager": runner(torch_step)}
    if compile_too:
        runners["torch.compile"] = runner(torch.compile(torch_step))
    return runners


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=4, default=(64, 1000, 100, 10))
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--torch-compile", action="store_true",
                        help="also time torch.compile (slow to compile)")
    options = parser.parse_args()
    arrays = make_arrays(options.sizes)
    runners = {"tracer @trace": tracer_runner(arrays, traced=True),
               "tracer eager": tracer_runner(arrays, traced=False),
               "numpy by hand": numpy_runner(arrays)}
    runners.update(torch_runners(arrays, options.torch_compile))
    results = {name: median_time(run, options.repeats) for name, run in runners.items()}
    reference = results["tracer @trace"]
    print(f"seed step, sizes N, D_in, H, D_out = {tuple(options.sizes)}; median of "
          f"{options.repeats} steps")
    for name, seconds in results.items():
        print(f"  {name:<24} {seconds * 1e6:10.1f} us   {seconds / reference:6.2f}x traced")


if __name__ == "__main__":
    main()
