"""Benchmarks of user programs written with the public API (`import tracer as tr`), against
numpy written by hand, PyTorch eager and torch.compile, and jax.jit, in one run, with the
machine's own floors. Run `python -m benchmarks.run [--quick]` from the repository root."""
import os

# numpy's OpenBLAS threads spin for 2^28 cycles (~0.1 s) after each call unless told otherwise:
# in a run that interleaves peers, the threads of a numpy peer's (or a BLAS floor's) call then
# take the second core from the next peer's timed call for longer than harness.SETTLE (measured
# 2026-11-28: the tracer's 512x1024 seed step took 39-44 ms in the run, 22-27 ms alone; torch's
# threads suffer alike). 2^22 cycles (~1.5 ms) still keeps them awake between the products of one
# numpy step. OpenBLAS reads it when numpy loads it: set here, before anything imports numpy.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "22")
