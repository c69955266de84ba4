"""Gradients as functions: `grad` and `value_and_grad`, eager and inside `@trace`."""
from __future__ import annotations

import functools
from typing import Callable, Sequence

from tracer.autograd import run_backward
from tracer.backward import traced_gradients
from tracer.context import enable_grad, state
from tracer.creation import ones, zeros_like
from tracer.dispatch import as_tensor
from tracer.errors import ArgumentError
from tracer.tensor import Tensor


def _argnums(argnums: int | Sequence[int], count: int) -> tuple[int, ...]:
    numbers = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for n in numbers:
        if not -count <= n < count:
            raise ArgumentError(f"argnums {n} is out of range for {count} positional arguments")
    return tuple(n % count for n in numbers)


def _value_and_gradients(f: Callable, argnums, has_aux: bool, args, kwargs):
    if state.differentiating:
        raise ArgumentError("tr.grad inside a function that tr.grad differentiates (a higher-order "
                            "derivative) is not supported: the inner gradient would be taken as "
                            "a constant")
    state.differentiating = True
    try:
        return _differentiate(f, argnums, has_aux, args, kwargs)
    finally:
        state.differentiating = False


def _tree_map(function: Callable, tree):
    """`tree` (nested lists, tuples, named tuples and dicts: a pytree) with `function` applied to
    every other value in it, in order."""
    if isinstance(tree, (list, tuple)):
        items = [_tree_map(function, item) for item in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    if isinstance(tree, dict):
        return type(tree)((key, _tree_map(function, value)) for key, value in tree.items())
    return function(tree)


def _differentiate(f: Callable, argnums, has_aux: bool, args, kwargs):
    numbers = _argnums(argnums, len(args))
    args = list(args)
    trace = state.trace
    leaves = []

    def make_leaf(value, n: int) -> Tensor:
        x = as_tensor(value, accept_data=True)
        if x.dtype.kind != "f":
            raise ArgumentError(f"grad: argument {n} must be a float tensor (or a list, tuple or "
                                f"dict of them), got {x.dtype}")
        handle = x._handle if trace is None else trace.handle_of(x)
        leaf = Tensor._make(handle, trace, True, leaf=True)
        leaves.append(leaf)
        return leaf

    for n in numbers:
        args[n] = _tree_map(lambda value, n=n: make_leaf(value, n), args[n])
    with enable_grad():
        result = f(*args, **kwargs)
    output, aux = result if has_aux else (result, None)
    if not isinstance(output, Tensor) or output.numel() != 1 or output.dtype.kind != "f":
        raise ArgumentError("grad needs a function that returns a float tensor with one element"
                            + (" (and an aux value, with has_aux=True)" if has_aux else ""))
    seed = ones(*output.shape, dtype=output.dtype)
    if not output.requires_grad:
        gradients = [zeros_like(x) for x in leaves]
    elif trace is None:
        reached = {id(leaf): array for leaf, array in run_backward([(output, seed._handle)])}
        arrays = [reached.get(id(x)) for x in leaves]
        gradients = [zeros_like(x) if a is None else Tensor._make(a, None, False)
                     for x, a in zip(leaves, arrays)]
    else:
        gradients = [zeros_like(x) if g is None else g
                     for x, g in zip(leaves, traced_gradients(output, seed, leaves))]
    # the gradient of each differentiated argument has its structure
    flowing = iter(gradients)
    trees = tuple(_tree_map(lambda _: next(flowing), args[n]) for n in numbers)
    value = output.detach()
    return ((value, aux) if has_aux else value), (trees[0] if isinstance(argnums, int) else trees)


def value_and_grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """`f`'s value and its gradient with respect to the arguments `argnums` (as jax.value_and_grad);
    with has_aux, `f` returns (value, aux) and this returns ((value, aux), gradient)."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return _value_and_gradients(f, argnums, has_aux, args, kwargs)
    return wrapper


def grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The gradient of scalar-valued `f` with respect to the arguments `argnums` (as jax.grad)."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        value, gradients = _value_and_gradients(f, argnums, has_aux, args, kwargs)
        return (gradients, value[1]) if has_aux else gradients
    return wrapper
