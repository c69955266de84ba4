"""Random integers and permutations from the generator `tr.manual_seed` seeds (eager only: a
traced function would bake the numbers in, so there they raise, as tr.randn does)."""
from __future__ import annotations

import builtins

import numpy as np

from tracer.errors import ArgumentError
from tracer.tensor import Tensor, _leaf, _shape_arguments, as_dtype, eager_generator, int64


def randint(*args, size=None, dtype=int64, requires_grad: builtins.bool = False) -> Tensor:
    """Uniform integers in [low, high): `randint(high, size)` or `randint(low, high, size)`."""
    if size is None:
        if not args or not isinstance(args[-1], (tuple, list)):
            raise ArgumentError("randint takes (high, size) or (low, high, size), size a tuple")
        *args, size = args
    if len(args) not in (1, 2):
        raise ArgumentError("randint takes (high, size) or (low, high, size)")
    low, high = (0, args[0]) if len(args) == 1 else args
    if high <= low:
        raise ArgumentError(f"randint needs low < high, got low={low}, high={high}")
    generator = eager_generator("randint")
    sample = generator.integers(low, high, _shape_arguments((size,)), dtype=np.int64)
    return _leaf(sample.astype(as_dtype(dtype)), requires_grad)


def randperm(n: int, dtype=int64, requires_grad: builtins.bool = False) -> Tensor:
    """A random permutation of 0 .. n-1."""
    if n < 0:
        raise ArgumentError(f"randperm needs n >= 0, got {n}")
    sample = eager_generator("randperm").permutation(n)
    return _leaf(sample.astype(as_dtype(dtype)), requires_grad)


def bernoulli_mask(shape: tuple[int, ...], keep: float) -> np.ndarray:
    """True with probability `keep`, for dropout (eager only)."""
    return eager_generator("nn.functional.dropout").random(shape) < keep
