"""`tr.pure_callback`: NumPy or SciPy code that a program calls with declared result shapes
(JAX's `jax.pure_callback`).

`pure_callback(callback, result_shape_dtypes, *args)` calls `callback` on numpy arrays of `args`
and returns its results as tensors of the declared shapes and dtypes. Eagerly it runs at once;
under `@trace` it is a `host_callback` instruction (ir/host.py) that the compiled step calls back
into Python for, while everything around it stays compiled and fused -- and, unlike a custom
Function whose forward reads `.numpy()` (tracer/host_function.py), it does not run while the step
is traced: the declared shapes are its result types. A result of another shape or dtype raises
HostCallbackError naming the line of the call. It is not differentiable (as in JAX): a gradient
that reaches it raises HostCallbackError; a Function whose backward computes the gradient
(another pure_callback, or tensor operations) makes it differentiable.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from tracer.autograd import Node
from tracer.context import is_grad_enabled
from tracer.dispatch import current_handles, as_tensor, from_data
from tracer.dtypes import as_dtype
from tracer.errors import ArgumentError, HostCallbackError, user_line
from tracer.ir.host import HostCallback
from tracer.ir.types import TensorType, is_float
from tracer.tensor import Tensor


class ShapeDtypeStruct:
    """A declared result of `pure_callback`: its shape and dtype (JAX's `jax.ShapeDtypeStruct`).
    Anything with `.shape` and `.dtype` serves too: a numpy array, a Tensor."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype) -> None:
        self.shape = tuple(int(n) for n in shape)
        self.dtype = as_dtype(dtype)

    def __repr__(self) -> str:
        return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype})"


def _declared_types(result_shape_dtypes) -> tuple[list[TensorType], bool]:
    """The result types declared, and whether the callback returns a tuple of them."""
    multiple = isinstance(result_shape_dtypes, (tuple, list))
    declared = list(result_shape_dtypes) if multiple else [result_shape_dtypes]
    types = []
    for place, spec in enumerate(declared):
        if not (hasattr(spec, "shape") and hasattr(spec, "dtype")):
            raise ArgumentError(
                f"pure_callback: result {place} is declared as a {type(spec).__name__}; declare "
                f"each result by its shape and dtype, e.g. tr.ShapeDtypeStruct((3, 4), "
                f"tr.float32) or an array of that shape and dtype")
        types.append(TensorType(tuple(int(n) for n in spec.shape), as_dtype(spec.dtype)))
    if not types:
        raise ArgumentError("pure_callback: declare at least one result")
    return types, multiple


def _checked_run(callback: Callable, types: list[TensorType], multiple: bool, name: str,
                 line: str) -> Callable[..., tuple]:
    """`callback` as a host callback's run: its results checked against the declared types."""
    def run(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        returned = callback(*arrays)
        results = list(returned) if multiple and isinstance(returned, (tuple, list)) else [returned]
        if len(results) != len(types):
            raise HostCallbackError(f"pure_callback: {name} returned {len(results)} result(s) "
                                    f"where {len(types)} are declared", line)
        checked = []
        for place, (result, declared) in enumerate(zip(results, types)):
            array = np.asarray(result)
            if array.shape != declared.shape or array.dtype != declared.dtype:
                raise HostCallbackError(
                    f"pure_callback: {name} returned shape {list(array.shape)} and dtype "
                    f"{array.dtype} as result {place}, where shape {list(declared.shape)} and "
                    f"dtype {declared.dtype} are declared; return what is declared (cast with "
                    f".astype) or declare what it returns", line)
            checked.append(array)
        return tuple(checked)
    return run


def pure_callback(callback: Callable, result_shape_dtypes, *args: Any):
    """Call `callback(*arrays)` on numpy arrays of `args` (tensors, arrays or numbers) and return
    its results as tensors of `result_shape_dtypes` (one declaration, or a tuple of them: then
    `callback` returns a tuple and so does this). Under `@tr.trace` the compiled step calls it on
    every call, and never while tracing."""
    types, multiple = _declared_types(result_shape_dtypes)
    line = user_line()
    tensors = [a if isinstance(a, Tensor) else
               from_data(a) if isinstance(a, np.ndarray) else as_tensor(a) for a in args]
    name = getattr(callback, "__qualname__", type(callback).__name__)
    label = re.sub(r"\W", "_", name)

    def gradient_error() -> Exception:
        return HostCallbackError(
            f"pure_callback: {name} is not differentiable; to differentiate through it, call "
            f"it in the forward of a tr.autograd.Function whose backward computes the gradient "
            f"(another pure_callback, or tensor operations)", line)

    host = HostCallback(f"pure_callback.{label}", _checked_run(callback, types, multiple, name,
                                                               line),
                        [TensorType(t.shape, t.dtype) for t in tensors], types, gradient_error)
    trace, builder, handles = current_handles(tensors)
    # eagerly the callback gets copies, as compiled code's does (runtime/callbacks.py): it may
    # keep or change them
    operands = handles if trace is not None else [array.copy() for array in handles]
    results = builder.emit("host_callback", operands, {"callback": host})
    recording = is_grad_enabled() and any(t.requires_grad for t in tensors)
    flags = [recording and is_float(t.dtype) for t in types]
    if trace is not None:
        outputs = [Tensor._make(r, trace, flag) for r, flag in zip(results, flags)]
    else:
        node = (Node("host_callback", {"callback": host}, tensors, handles, list(results))
                if any(flags) else None)
        outputs = [Tensor._make(r, None, flag, node if flag else None, output_index=place)
                   for place, (r, flag) in enumerate(zip(results, flags))]
        if node is not None:
            node.save_outputs(outputs)
    return tuple(outputs) if multiple else outputs[0]
