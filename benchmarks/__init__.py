"""Benchmarks of user programs written with the public API (`import tracer as tr`), against
numpy written by hand, PyTorch eager and torch.compile, and jax.jit, in one run, with the
machine's own floors. Run `python -m benchmarks.run [--quick]` from the repository root."""
