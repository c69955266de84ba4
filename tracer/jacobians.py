"""Whole derivatives, torch.func style: `jacrev` and `hessian`, eager and inside `@trace` (where
the loops below unroll into one graph, compiled as one native call)."""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np

from tracer.dispatch import from_data
from tracer.functional import stack
from tracer.creation import zeros_like
from tracer.transforms import _argnums, _float_outputs, tree_leaves, tree_map, vjp


def jacrev(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian of `f` with respect to the arguments `argnums` by reverse mode (as
    torch.func.jacrev): for an output of shape O and an argument of shape I, a tensor of shape
    O + I; a tuple over `argnums` when it is a tuple, nested in the output's structure."""
    @functools.wraps(f)
    def wrapper(*args):
        numbers = _argnums(argnums, len(args))

        def partial(*differentiated):
            full = list(args)
            for n, value in zip(numbers, differentiated):
                full[n] = value
            return f(*full)

        result = vjp(partial, *(args[n] for n in numbers), has_aux=has_aux)
        output, vjp_fn = result[0], result[1]
        outputs = _float_outputs(output, "jacrev")
        # one backward per output element, each seeded by a one-hot cotangent: rows of J
        rows_per_output = []
        for position, o in enumerate(outputs):
            rows = []
            for element in range(o.numel()):
                seeds = [zeros_like(other) for other in outputs]
                one_hot = np.zeros(o.shape, o.dtype)
                one_hot.reshape(-1)[element] = 1
                seeds[position] = from_data(one_hot)
                rows.append(tree_leaves(vjp_fn(_seeds_tree(output, seeds))))
            rows_per_output.append(rows)
        jacobians = []
        for o, rows in zip(outputs, rows_per_output):
            per_input = []
            for k, x in enumerate(tree_leaves(tuple(args[n] for n in numbers))):
                shape = tuple(o.shape) + tuple(x.shape)
                per_input.append(stack([row[k] for row in rows]).reshape(shape) if rows
                                 else zeros_like(o).reshape(shape))
            jacobians.append(per_input)
        flat = iter(jacobians)

        def by_argument(_):
            per_input = iter(next(flat))
            structure = tuple(args[n] for n in numbers)
            trees = tuple(tree_map(lambda _: next(per_input), tree) for tree in structure)
            return trees[0] if isinstance(argnums, int) else trees

        value = tree_map(by_argument, output)
        return (value, result[2]) if has_aux else value
    return wrapper


def _seeds_tree(output, seeds: list):
    flowing = iter(seeds)
    return tree_map(lambda _: next(flowing), output)


def hessian(f: Callable, argnums: int | Sequence[int] = 0) -> Callable:
    """The Hessian of scalar `f` with respect to the arguments `argnums` (as torch.func.hessian):
    the Jacobian of its gradient."""
    return jacrev(jacrev(f, argnums), argnums)
