"""Gradients as functions: `grad` and `value_and_grad`, eager and inside `@trace`, and the traced
side of `Tensor.backward`."""
from __future__ import annotations

import functools
from typing import Callable, Sequence

from tracer.ir.autodiff import gradient_path, reaches, trace_directive
from tracer.autograd import changed_for_backward, run_backward, values_read
from tracer.context import enable_grad, state
from tracer.errors import ArgumentError
from tracer.tensor import Tensor, as_tensor, ones, zeros_like
from tracer.tracing import escaped_error


def traced_gradients(output: Tensor, seed: Tensor, wrt: Sequence[Tensor]) -> list:
    """Record a `gradient` directive (the autodiff pass puts its backward in place when the trace
    is compiled) and return the gradient values, None where no gradient flows. A leaf changed in
    place under no_grad has held several values: its gradient sums theirs."""
    trace = output._trace
    groups = [trace.leaf_values(t) for t in wrt]
    values = [v for group in groups for v in group]
    _check_unchanged(trace, output, values)
    operands = [output._handle, trace.handle_of(seed), *values]
    directive_outputs = trace.builder.emit("gradient", operands, {})
    flowing = trace_directive(trace.function, directive_outputs[0].producer)
    gradients = iter(zip(directive_outputs, flowing))
    totals = []
    for group in groups:
        total = None
        for value, flows in (next(gradients) for _ in group):
            if flows is not None:
                total = value if total is None else trace.builder.add(total, value)
        totals.append(total)
    return totals


def _check_unchanged(trace, output: Tensor, wrt_values: list) -> None:
    """As eager backward would now: a value that the backward reads must not have been changed in
    place since it was used (a saved tensor of a Function, or an operand of a primitive)."""
    instructions = trace.function.instructions
    path = gradient_path(instructions, output._handle, wrt_values)
    for ctx, values in trace.custom_calls:
        if any(id(v) in path for v in values):
            ctx.check_saved()
    for instruction in instructions:
        if not any(id(v) in path for v in instruction.outputs):
            continue
        reads_inputs, reads_outputs = values_read(
            instruction.primitive, [id(x) in path for x in instruction.inputs])
        read = [x for x, flag in zip(instruction.inputs, reads_inputs) if flag]
        read += instruction.outputs if reads_outputs else []
        for value in read:
            where, changing = trace.overwritten.get(id(value), (None, None))
            if where is not None and changing is not instruction:
                raise changed_for_backward(value.type.dtype, value.type.shape,
                                           instruction.primitive, where)


def traced_backward(output: Tensor, gradient: Tensor) -> None:
    """`output.backward(gradient)` inside a trace: accumulate into the `.grad` of traced leaves."""
    trace = output._trace
    if state.trace is not trace:
        raise escaped_error()
    leaves = list({id(t): t for t in trace.leaves if t.requires_grad}.values())
    groups = [trace.leaf_values(t) for t in leaves]
    flags = iter(reaches(trace.function.instructions, output._handle,
                         [v for group in groups for v in group]))
    leaves = [t for t, group in zip(leaves, groups) if any([next(flags) for _ in group])]
    if not leaves:
        return
    for leaf, handle in zip(leaves, traced_gradients(output, gradient, leaves)):
        if handle is None:  # a custom backward returned None for it: .grad stays as it is
            continue
        gradient_tensor = Tensor._make(handle, trace, False)
        if leaf.grad is None:
            leaf.grad = gradient_tensor
        else:
            leaf.grad._assign(leaf.grad + gradient_tensor, "gradient accumulation")


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
        arrays = run_backward([(output, seed._handle)], inputs=leaves)
        gradients = [zeros_like(x) if a is None else Tensor._make(a, None, False)
                     for x, a in zip(leaves, arrays)]
    else:
        gradients = [zeros_like(x) if h is None else Tensor._make(h, trace, False)
                     for x, h in zip(leaves, traced_gradients(output, seed, leaves))]
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
