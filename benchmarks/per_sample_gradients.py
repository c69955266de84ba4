"""Per-sample gradient norms of an MLP (the clipping statistic of DP-SGD), batch 64:
`tr.vmap(tr.grad(loss), in_dims=(None, 0, 0))` under `@tr.trace`, batched by the vmap pass,
against the same step unrolled into one gradient per sample (what vmap did before it batched),
torch.func.vmap(grad) eagerly and under torch.compile, and jax.jit of jax.vmap(jax.grad) where jax
is installed, in one process.

    python -m benchmarks.per_sample_gradients [--quick]     (from the repository root)

Compile time is the first call with an empty disk cache (wall clock, and the CPU time of the
calling thread, which the tracer traces and compiles in); run time the median of interleaved
rounds. Every peer's norms are checked against float64 first."""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

from benchmarks.harness import Timing, check, median_times
from benchmarks.peers import installed

BATCH, FEATURES, HIDDEN, CLASSES = 64, 64, 128, 10
TOLERANCE = 1e-4  # float32 sums of up to 128 products, then a square root of sums of squares


def make_arguments(batch: int = BATCH, dtype=np.float32):
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES),
              "b1": np.zeros(HIDDEN), "w2": rng.standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN),
              "b2": np.zeros(CLASSES)}
    params = {k: v.astype(dtype) for k, v in params.items()}
    return params, rng.standard_normal((batch, FEATURES)).astype(dtype), \
        rng.integers(0, CLASSES, size=batch)


def _loss(functional):
    def loss(params, x, y):
        hidden = (x @ params["w1"] + params["b1"]).tanh()
        logits = (hidden @ params["w2"] + params["b2"]).unsqueeze(0)
        return functional.cross_entropy(logits, y.unsqueeze(0))
    return loss


def _norms(grads: dict):
    return sum(g.pow(2).sum(tuple(range(1, g.ndim))) for g in grads.values()).sqrt()


def tracer_steps():
    """(batched step, unrolled step) of the tracer, as functions of (params, x, y)."""
    import tracer as tr
    loss = _loss(tr.nn.functional)

    def batched(params, x, y):
        return _norms(tr.vmap(tr.grad(loss), in_dims=(None, 0, 0))(params, x, y))

    def unrolled(params, x, y):
        per_sample = [tr.grad(loss)(params, x[i], y[i]) for i in range(x.shape[0])]
        return _norms({k: tr.stack([g[k] for g in per_sample]) for k in params})
    return tr.trace(batched), tr.trace(unrolled)


def torch_step():
    import torch
    import torch.func as tf
    loss = _loss(torch.nn.functional)

    def step(params, x, y):
        return _norms(tf.vmap(tf.grad(loss), in_dims=(None, 0, 0))(params, x, y))
    return step


def jax_step():
    """jax.vmap(jax.grad(loss)) of the same loss (benchmarks/higher_order_jax.py's), its norms,
    under jax.jit; None without jax."""
    from benchmarks import higher_order_jax
    jax = installed("jax")
    if jax is None:
        return None
    step = jax.jit(lambda params, x, y: higher_order_jax.norms(
        higher_order_jax.per_sample_grads(params, x, y)))
    return lambda *arguments: jax.block_until_ready(step(*arguments))


def _first_call(call) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.thread_time()
    result = call()
    return time.perf_counter() - wall, time.thread_time() - cpu, result


def lines(quick: bool = False) -> list[str]:
    """The table's lines; `quick` leaves out the two slow compilations (the unrolled step and
    torch.compile) and times for 3 s instead of 10."""
    import torch
    import tracer as tr

    params, x, y = make_arguments()
    reference_params, reference_x, _ = make_arguments(dtype=np.float64)
    expected = torch_step()({k: torch.tensor(v) for k, v in reference_params.items()},
                            torch.tensor(reference_x), torch.tensor(y)).numpy()
    ours = ({k: tr.tensor(v) for k, v in params.items()}, tr.tensor(x), tr.tensor(y))
    theirs = ({k: torch.tensor(v) for k, v in params.items()}, torch.tensor(x), torch.tensor(y))
    batched, unrolled = tracer_steps()
    calls, compile_times = {}, {}
    peers = [("tracer batched (vmap pass)", batched, ours),
             ("tracer unrolled (a grad per sample)", unrolled, ours),
             ("torch.func eager", torch_step(), theirs),
             ("torch.compile(torch.func)", torch.compile(torch_step()), theirs)]
    jax_norms = jax_step()
    if jax_norms is not None:  # (kept by --quick, as the even-numbered peers are)
        jnp = installed("jax").numpy
        peers.append(("jax.jit(jax.vmap(jax.grad))", jax_norms,
                      ({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(x),
                       jnp.asarray(y))))
    for name, step, arguments in peers[::2] if quick else peers:
        def call(step=step, arguments=arguments):
            return step(*arguments)
        try:
            wall, cpu, result = _first_call(call)
            check([result], [expected], TOLERANCE)
        except Exception as error:  # (a peer that cannot compile it is reported, not fatal)
            compile_times[name] = f"fails: {type(error).__name__}: {str(error)[:120]}"
            continue
        compile_times[name] = f"first call {wall:7.3f} s (calling thread's CPU {cpu:7.3f} s)"
        calls[name] = call
    seconds = median_times(calls, Timing(repeats=200, budget=3.0 if quick else 10.0))
    fastest = seconds["tracer batched (vmap pass)"]
    out = [f"per-sample gradient norms, MLP {FEATURES}→{HIDDEN}→{CLASSES}, batch {BATCH}, "
           f"float32 (median of interleaved rounds; ratio = time / tracer batched)"]
    for name, text in compile_times.items():
        run = (f"run {seconds[name] * 1e6:9.1f} µs  ({seconds[name] / fastest:6.2f}x)"
               if name in seconds else "")
        out.append(f"  {name:38s} {text}  {run}")
    counts = [sum(" = " in line for line in step.ir(*ours, stage="optimized").splitlines())
              for step in ((batched,) if quick else (batched, unrolled))]
    out.append(f"  instructions after optimization: {counts}, batched then unrolled")
    return out


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as directory:
        os.environ["TRACER_CACHE_DIR"] = f"{directory}/tracer"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{directory}/inductor"
        print("\n".join(lines(quick="--quick" in sys.argv)))


if __name__ == "__main__":
    main()
