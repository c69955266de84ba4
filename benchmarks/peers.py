"""The other frameworks, each when installed: PyTorch eager, torch.compile (default, and
`fullgraph=True` with Dynamo tracing `.backward()`), and jax.jit."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import types
from typing import Callable

from benchmarks.harness import Program

THREADS = len(os.sched_getaffinity(0))


@functools.cache
def installed(name: str):
    """The module `torch` or `jax`, or None when it is not installed. torch uses every core
    this process may run on, as the tracer does; so does jax without a setting (XLA's CPU client
    sizes its thread pool by the process's CPU affinity: 2 threads here, 1 under `taskset -c 0`)."""
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    if name == "torch":
        module.set_num_threads(THREADS)
    return module


def fullgraph_setting():
    """The Dynamo setting under which `fullgraph=True` can include `.backward()`, or None in a
    torch version without it."""
    config = installed("torch")._dynamo.config
    return config.patch(trace_autograd_ops=True) if hasattr(config, "trace_autograd_ops") else None


def available(peer: str) -> bool:
    """Whether the peer (a column of the table) can run here."""
    if peer in ("tracer", "numpy"):
        return True
    if installed("jax" if peer == "jax.jit" else "torch") is None:
        return False
    return peer != "torch.compile fullgraph" or fullgraph_setting() is not None


def fresh_copy(function: Callable) -> Callable:
    """The function with a code object of its own: Dynamo keeps what it compiled on the code
    object, and one compiled variant must not run (or time) the code another compiled."""
    return types.FunctionType(function.__code__.replace(), function.__globals__,
                              function.__name__, function.__defaults__, function.__closure__)


def torch_programs(function: Callable, build: Callable[[Callable], Callable]) -> list[Program]:
    """`build(f)` makes fresh torch state and returns the call running `f` on it; the same
    function runs eagerly and compiled (each compiled variant from its own fresh copy)."""
    torch = installed("torch")
    if torch is None:
        return []

    def compiled(**options):
        return build(torch.compile(fresh_copy(function), **options))

    programs = [Program("torch eager", lambda: build(function)),
                Program("torch.compile", compiled)]
    if fullgraph_setting() is not None:
        programs.append(Program("torch.compile fullgraph",
                                lambda: compiled(fullgraph=True), setting=fullgraph_setting))
    return programs


def jax_programs(function: Callable, build: Callable[[Callable], Callable],
                 **jit_options) -> list[Program]:
    """`build(jax.jit(function))` makes fresh jax state and returns the call running it, when
    jax is installed. jax is imported when the program is built, not here: listing a workload's
    programs leaves the process as it was (jax's ml_dtypes gives numpy a bfloat16)."""
    if importlib.util.find_spec("jax") is None:
        return []
    return [Program("jax.jit", lambda: build(installed("jax").jit(function, **jit_options)))]


def notes() -> list[str]:
    """What was installed, and what was skipped and why."""
    torch, jax = installed("torch"), installed("jax")
    lines = [f"torch {torch.__version__} ({THREADS} threads)" if torch else
             "torch: not installed, its columns are empty",
             f"jax {jax.__version__} ({THREADS} threads; float32, the PINN's float64 under "
             "jax.enable_x64)" if jax else "jax: not installed, its column is empty"]
    if torch and fullgraph_setting() is None:
        lines.append("torch.compile fullgraph: skipped, this torch has no "
                     "torch._dynamo.config.trace_autograd_ops")
    return lines
