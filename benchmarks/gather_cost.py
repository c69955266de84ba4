"""What integer indexing costs: an embedding lookup with its gradient (`(E[idx] ** 2).sum()`,
backward), and softmax cross-entropy written with `logp[tr.arange(n), labels]` against the same
loss written with a one-hot matrix. The tracer's compiled step is timed against numpy by hand and
PyTorch eager, and against itself compiled without the index range check (which the project
always emits) to show what the check costs. Medians from interleaved rounds.

    python -m benchmarks.gather_cost [--repeats N]     (from the repository root)
"""
from __future__ import annotations

import argparse
import contextlib

import numpy as np
import torch

import tracer as tr
from benchmarks.harness import Timing, median_times
from tracer.codegen import render_kernel

ROWS, WIDTH, LOOKUPS = 50_000, 64, 32_768
BATCH, CLASSES = 4096, 1000


@contextlib.contextmanager
def without_index_checks():
    """Compile with the index check left out (wrapping kept): only to measure what it costs."""
    checked = render_kernel.KernelRenderer.checked_index

    def unchecked(self, statement):
        return render_kernel.wrap_index(self.w, self.index(statement.position), statement.size)

    render_kernel.KernelRenderer.checked_index = unchecked
    try:
        yield
    finally:
        render_kernel.KernelRenderer.checked_index = checked


def embedding_calls(rng) -> dict:
    table = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    index = rng.integers(-ROWS, ROWS, LOOKUPS)

    def lookup(E, idx):
        loss = (E[idx] ** 2).sum()
        loss.backward()
        return loss

    def numpy_step():
        rows = table[index]
        gradient = np.zeros_like(table)
        np.add.at(gradient, index, 2 * rows)
        return (rows ** 2).sum(), gradient

    torch_table = torch.tensor(table, requires_grad=True)
    torch_index = torch.tensor(index)

    def torch_step():
        torch_table.grad = None
        loss = (torch_table[torch_index] ** 2).sum()
        loss.backward()
        return loss, torch_table.grad

    calls = {"numpy": numpy_step, "torch eager": torch_step}
    expected = numpy_step()[1]
    for name, setting in (("tracer", contextlib.nullcontext), ("tracer unchecked",
                                                             without_index_checks)):
        E = tr.tensor(table, requires_grad=True)
        idx = tr.tensor(index)
        with setting():
            step = tr.trace(lookup)
            step(E, idx)
        E.grad = None
        step(E, idx)
        np.testing.assert_allclose(E.grad.numpy(), expected, rtol=1e-5, atol=1e-4)

        def run(step=step, E=E, idx=idx):
            E.grad = None
            return step(E, idx)
        calls[name] = run
    return calls


def cross_entropy_calls(rng) -> dict:
    logits = rng.standard_normal((BATCH, CLASSES)).astype(np.float32)
    labels = rng.integers(0, CLASSES, BATCH)
    one_hot = np.eye(CLASSES, dtype=np.float32)[labels]

    def picked(x, labels):
        loss = -x.log_softmax(1)[tr.arange(BATCH), labels].mean()
        loss.backward()
        return loss

    def with_one_hot(x, one_hot):
        loss = -(x.log_softmax(1) * one_hot).sum() / BATCH
        loss.backward()
        return loss

    calls = {}
    for name, function, target in (("tracer gather", picked, tr.tensor(labels)),
                                   ("tracer one-hot", with_one_hot, tr.tensor(one_hot))):
        x = tr.tensor(logits, requires_grad=True)
        step = tr.trace(function)
        step(x, target)

        def run(step=step, x=x, target=target):
            x.grad = None
            return step(x, target)
        calls[name] = run
    reference = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels))
    for run in calls.values():
        np.testing.assert_allclose(run().item(), reference.item(), rtol=1e-5)
    return calls


def lines(repeats: int = 50, budget: float = 60.0) -> list[str]:
    """The figures, one line each: medians of up to `repeats` calls within `budget` seconds
    per program (`make bench` runs this with fewer)."""
    found: list[str] = []
    rng = np.random.default_rng(0)
    for title, calls in ((f"embedding lookup fwd+bwd, {LOOKUPS} rows of {ROWS}x{WIDTH}",
                          embedding_calls(rng)),
                         (f"cross-entropy fwd+bwd, {BATCH}x{CLASSES}", cross_entropy_calls(rng))):
        times = median_times(calls, Timing(repeats=repeats, budget=budget))
        found.append(title + ": " + ", ".join(f"{name} {seconds * 1e3:.3f} ms"
                                              for name, seconds in times.items()))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    print("\n".join(lines(parser.parse_args().repeats)))


if __name__ == "__main__":
    main()
